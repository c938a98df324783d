import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../auth/auth.entity.ts';

export const Workspace = defineEntity({
  name: 'Workspace',
  tableName: 'workspaces',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    name: p.string(),
    description: p.text().default(''),
    ...timestamps(),
  },
  uniques: [{ properties: ['organization', 'name'] }],
});

export type WorkspaceEntity = InferEntity<typeof Workspace>;
