import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization, User } from '../users/users.entity.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';

export const MATERIALIZATION_STATUSES = ['never', 'queued', 'running', 'succeeded', 'failed'] as const;

export const DESTINATION_TYPES = ['csv', 'postgres', 'webhook'] as const;

export const EXPORT_SCHEDULES = ['manual', 'hourly', 'daily', 'weekly'] as const;
export type ExportSchedule = (typeof EXPORT_SCHEDULES)[number];

export const EXPORT_STATUSES = ['active', 'paused'] as const;

export interface MaterializedColumn {
  name: string;
  type: string;
  /**
   * The type of the values: a domain's base type (baseTypeSql), which a destination outside the target
   * database is created with (it has no such domain). Absent in materializations written before it.
   */
  base_type?: string;
}

export interface FieldMappingEntry {
  source: string;
  destination: string;
}

/**
 * A segment of a target table: a rule tree (compiled to parameterized SQL) or a read-only SELECT.
 * It is bound to the target database and schema it was created against, so switching the workspace
 * target hides it from the list instead of pointing it at another warehouse.
 */
export const Audience = defineEntity({
  name: 'Audience',
  tableName: 'audiences',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    name: p.string(),
    description: p.text().default(''),
    targetDatabase: p.string(),
    targetSchema: p.string(),
    targetTable: p.string(),
    definitionType: p.enum(['rules', 'sql']),
    rules: p.json<Record<string, unknown>>().nullable(),
    sql: p.text().nullable(),
    identifierColumns: p.json<string[]>(),
    attributeColumns: p.json<string[]>(),
    /** Bumped by every definition change; a materialization of an older version is stale. */
    definitionVersion: p.integer().default(1),
    /** When `definitionVersion` last changed; null for an audience changed before this was recorded. */
    definitionChangedAt: p
      .datetime()
      .nullable()
      .onCreate(() => new Date()),
    materializationStatus: p.enum(MATERIALIZATION_STATUSES).default('never'),
    materializedVersion: p.integer().nullable(),
    /** The versioned table holding the members, e.g. `a_<id>_v3`, in schema `materializedSchema`. */
    materializedTable: p.string().nullable(),
    /** The stable view swapped onto the newest version. */
    materializedView: p.string().nullable(),
    materializedSchema: p.string().nullable(),
    materializedColumns: p.json<MaterializedColumn[]>().nullable(),
    rowCount: p.bigint('number').nullable(),
    /**
     * Rows that matched the definition at the last materialization but are no members: every
     * identifier column NULL. Null for a materialization made before it was counted.
     */
    rowsWithoutIdentifier: p.bigint('number').nullable(),
    /**
     * Rows that matched with an identifier at the last materialization but were merged into a member
     * sharing all their identifier values. Null for a materialization made before it was counted.
     */
    rowsMerged: p.bigint('number').nullable(),
    materializedAt: p.datetime().nullable(),
    lastDurationMs: p.integer().nullable(),
    lastError: p.text().nullable(),
    lastRunId: p.uuid().nullable(),
    createdBy: () => p.manyToOne(User).nullable().deleteRule('set null'),
    ...timestamps(),
  },
  uniques: [{ properties: ['workspace', 'name'] }],
});

export type AudienceEntity = InferEntity<typeof Audience>;

/**
 * Why the audience's materialized table no longer holds what a materialization would write now, or
 * null (also when it was never materialized). Besides a changed definition, a table written by an
 * earlier dimas: one that kept blank and repeated identifiers as members records no `rows_merged`,
 * and one from before domain columns were followed records no `base_type` (its PostgreSQL exports
 * would create `text` columns). Nothing else marks those tables; exports and scheduled runs read it.
 */
export function staleReason(
  audience: Pick<
    AudienceEntity,
    'materializedVersion' | 'definitionVersion' | 'rowsMerged' | 'materializedColumns'
  >,
): string | null {
  if (audience.materializedVersion == null) return null;
  if (audience.materializedVersion !== audience.definitionVersion)
    return `its definition changed since it was materialized (version ${audience.materializedVersion} → ${audience.definitionVersion})`;
  if (audience.rowsMerged == null || (audience.materializedColumns ?? []).some((c) => !c.base_type))
    return 'it was materialized by an earlier version of dimas, whose members may hold blank or repeated identifiers and whose columns lack their base types';
  return null;
}

/** Whether the materialized table no longer holds what a materialization would write now. */
export const isStale = (audience: Parameters<typeof staleReason>[0]): boolean =>
  staleReason(audience) !== null;

export const AudienceExport = defineEntity({
  name: 'AudienceExport',
  tableName: 'audience_exports',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    audience: () => p.manyToOne(Audience).deleteRule('cascade').index(),
    name: p.string(),
    destinationType: p.enum(DESTINATION_TYPES),
    /** Secrets (database password, webhook header values) are sealed by SecretBox. */
    destinationConfig: p.json<Record<string, unknown>>(),
    fieldMapping: p.json<FieldMappingEntry[]>(),
    schedule: p.enum(EXPORT_SCHEDULES).default('manual'),
    status: p.enum(EXPORT_STATUSES).default('active'),
    nextRunAt: p.datetime().nullable(),
    lastRunId: p.uuid().nullable(),
    lastRunStatus: p.string().nullable(),
    lastRunAt: p.datetime().nullable(),
    lastError: p.text().nullable(),
    rowsExported: p.bigint('number').nullable(),
    filePath: p.text().nullable(),
    fileSize: p.bigint('number').nullable(),
    createdBy: () => p.manyToOne(User).nullable().deleteRule('set null'),
    ...timestamps(),
  },
});

export type AudienceExportEntity = InferEntity<typeof AudienceExport>;

/** One ad platform's daily figures for an audience and campaign; written by idempotent upsert. */
const AudiencePerformanceMetric = defineEntity({
  name: 'AudiencePerformanceMetric',
  tableName: 'audience_performance_metrics',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    audience: () => p.manyToOne(Audience).deleteRule('cascade'),
    adPlatform: p.string(),
    campaignId: p.string(),
    date: p.date(),
    impressions: p.bigint('number').default(0),
    clicks: p.bigint('number').default(0),
    spend: p.decimal('number').default(0),
    conversions: p.decimal('number').default(0),
    revenue: p.decimal('number').default(0),
    currency: p.string(),
    ...timestamps(),
  },
  uniques: [{ properties: ['audience', 'adPlatform', 'campaignId', 'date'] }],
});

/** A conversion of a member, deduplicated on its external id within the organization. */
const AudienceConversion = defineEntity({
  name: 'AudienceConversion',
  tableName: 'audience_conversions',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    audience: () => p.manyToOne(Audience).deleteRule('cascade').index(),
    customerId: p.string(),
    event: p.string(),
    value: p.decimal('number').default(0),
    currency: p.string(),
    occurredAt: p.datetime(),
    externalId: p.string(),
    adPlatform: p.string().nullable(),
    campaignId: p.string().nullable(),
    /**
     * Whether the customer was a member of the audience's materialization when the conversion was
     * posted; null for conversions posted before this was checked.
     */
    member: p.boolean().nullable(),
    createdAt: p.datetime().onCreate(() => new Date()),
  },
  uniques: [{ properties: ['organization', 'externalId'] }],
});

export const audienceEntities = [Audience, AudienceExport, AudiencePerformanceMetric, AudienceConversion];
