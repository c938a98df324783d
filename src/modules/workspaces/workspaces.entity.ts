import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../users/users.entity.ts';

/** A stored connection config: the shape of src/warehouse/config.ts with the password sealed by SecretBox. */
export type StoredConnectionConfig = Record<string, unknown> & { password?: string };

export interface WorkflowTaskState {
  completed: boolean;
  completed_at: string | null;
  data: Record<string, unknown>;
}

export const Workspace = defineEntity({
  name: 'Workspace',
  tableName: 'workspaces',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    name: p.string(),
    description: p.text().default(''),
    sourceConfig: p.json<StoredConnectionConfig>().nullable(),
    targetConfig: p.json<StoredConnectionConfig>().nullable(),
    /** schema.json of DESIGN §5 (validated by targetSchemaSchema before it is stored). */
    targetSchema: p.json<Record<string, unknown>>().nullable(),
    /** The library template the schema came from, if any. */
    schemaTemplate: p.string().nullable(),
    /** False while the schema is the library template as assigned; true once copied or edited. */
    schemaCustomized: p.boolean().default(false),
    /** Admin settings of this workspace (overrides of the organization's global admin settings). */
    // onCreate, not default('{}'): MikroORM gives an omitted property its default as the value, and a
    // JSON property stored the string '{}' as the JSON string "{}".
    settings: p.json<Record<string, unknown>>().onCreate(() => ({})),
    workflowState: p.json<Record<string, WorkflowTaskState>>().onCreate(() => ({})),
    systemPrompt: p.text().nullable(),
    successCriteriaPrompt: p.text().nullable(),
    /** Bumped by every write of the row; a write of an older revision fails (src/db/concurrent-edit.ts). */
    revision: p.integer().version(),
    ...timestamps(),
  },
  uniques: [{ properties: ['organization', 'name'] }],
});

export type WorkspaceEntity = InferEntity<typeof Workspace>;

/** Settings that belong to the organization rather than one workspace. */
export const OrganizationSettings = defineEntity({
  name: 'OrganizationSettings',
  tableName: 'organization_settings',
  properties: {
    organization: () => p.oneToOne(Organization).primary().deleteRule('cascade'),
    globalSettings: p.json<Record<string, unknown>>().onCreate(() => ({})),
    /** Admin settings that apply to every workspace without its own. */
    adminSettings: p.json<Record<string, unknown>>().onCreate(() => ({})),
    /** Bumped by every write of the row; a write of an older revision fails (src/db/concurrent-edit.ts). */
    revision: p.integer().version(),
    ...timestamps(),
  },
});

export type OrganizationSettingsEntity = InferEntity<typeof OrganizationSettings>;

/**
 * A snapshot of a workspace's file projection. `git-diff` compares the current projection with the
 * newest one; commits are recorded by whoever commits (mappings, VCS push).
 */
export const WorkspaceCommit = defineEntity({
  name: 'WorkspaceCommit',
  tableName: 'workspace_commits',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade').index(),
    message: p.text(),
    author: p.string().nullable(),
    files: p.json<{ path: string; content: string }[]>(),
    createdAt: p.datetime().onCreate(() => new Date()),
  },
});
