import { defineEntity, p } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../users/users.entity.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';

/** What one model of the project was generated from, so drift can say which table changed and why. */
export interface ProjectModelInput {
  table_name: string;
  committed_version: number;
  mapping_fingerprint: string;
  schema_fingerprint: string;
}

/** The generated transformation project of a workspace (one per workspace). */
export const TransformationProject = defineEntity({
  name: 'TransformationProject',
  tableName: 'transformation_projects',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    files: p.json<{ path: string; content: string }[]>(),
    fingerprint: p.string(),
    models: p.json<ProjectModelInput[]>(),
    generatedBy: p.string().nullable(),
    generatedAt: p.datetime(),
    ...timestamps(),
  },
  uniques: [{ properties: ['workspace'] }],
});

export const pipelineEntities = [TransformationProject];
