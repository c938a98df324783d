import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../users/users.entity.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';

/**
 * One measurement of one table (the full metrics document), kept so trends can be shown and a
 * run can compare with the previous measurement (volume change). `data_source` is `target`,
 * `source` or `connection:<reverse-ETL connection name>`.
 */
export const MetricSnapshot = defineEntity({
  name: 'MetricSnapshot',
  tableName: 'monitoring_metric_snapshots',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    dataSource: p.string(),
    tableName: p.string(),
    rowCount: p.bigint('number'),
    metrics: p.json<Record<string, unknown>>(),
    measuredAt: p.datetime(),
    runId: p.uuid().nullable(),
    createdAt: p.datetime().onCreate(() => new Date()),
  },
});

/**
 * A workspace's identity graph: where its tables live in the target warehouse (created by
 * create-schema) and the outcome of the newest build. Its presence opts the workspace into builds
 * after materializations and into identity health checks.
 */
export const IdentityGraph = defineEntity({
  name: 'IdentityGraph',
  tableName: 'identity_graphs',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade').unique(),
    database: p.string(),
    schemaName: p.string(),
    createdBy: p.string().nullable(),
    lastRunId: p.uuid().nullable(),
    lastBuiltAt: p.datetime().nullable(),
    lastResult: p.json<Record<string, unknown>>().nullable(),
    ...timestamps(),
  },
});
export type IdentityGraphEntity = InferEntity<typeof IdentityGraph>;

/**
 * A default monitor once proposed for a workspace (primary-key tests, freshness). Remembered so a
 * later sync never re-adds a default the user has since removed.
 */
export const DefaultMonitor = defineEntity({
  name: 'DefaultMonitor',
  tableName: 'monitoring_default_monitors',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    monitorKey: p.string(),
    config: p.json<Record<string, unknown>>(),
    createdAt: p.datetime().onCreate(() => new Date()),
  },
  uniques: [{ properties: ['workspace', 'monitorKey'] }],
});

export const monitoringEntities = [MetricSnapshot, IdentityGraph, DefaultMonitor];
