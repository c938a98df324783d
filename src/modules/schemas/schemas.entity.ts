import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../users/users.entity.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';

export type SchemaSide = 'target' | 'source';
export type SchemaConfigKind = 'column_monitoring' | 'table_monitoring' | 'reverse_etl_connection';

/**
 * A configuration attached to a table or column of a workspace's schema: monitoring thresholds and
 * reverse-ETL assignments. Column test configs are not here: they live on schema.json columns
 * (`tests`), where the transformation project reads them. Table-level rows have column_name ''.
 */
export const SchemaConfig = defineEntity({
  name: 'SchemaConfig',
  tableName: 'schema_configs',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    schemaType: p.enum(['target', 'source'] as const satisfies readonly SchemaSide[]),
    tableName: p.string(),
    columnName: p.string().default(''),
    kind: p.enum([
      'column_monitoring',
      'table_monitoring',
      'reverse_etl_connection',
    ] as const satisfies readonly SchemaConfigKind[]),
    config: p.json<Record<string, unknown>>(),
    updatedBy: p.string().nullable(),
    ...timestamps(),
  },
  uniques: [
    {
      name: 'schema_configs_unique',
      properties: ['workspace', 'schemaType', 'tableName', 'columnName', 'kind'],
    },
  ],
});

export type SchemaConfigEntity = InferEntity<typeof SchemaConfig>;

/** An applied schema sync: what ran, what was left for an explicit flag, and the schema it matched. */
export const SchemaSyncRun = defineEntity({
  name: 'SchemaSyncRun',
  tableName: 'schema_sync_runs',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade').index(),
    /** Fingerprint of the table structure of schema.json that was synced. */
    schemaFingerprint: p.string(),
    targetSchema: p.string(),
    statements: p.json<string[]>(),
    skipped: p.json<string[]>(),
    allowDestructive: p.boolean().default(false),
    triggeredBy: p.string().nullable(),
    createdAt: p.datetime().onCreate(() => new Date()),
  },
});

export const schemaEntities = [SchemaConfig, SchemaSyncRun];
