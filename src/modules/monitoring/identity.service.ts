import { isDeepStrictEqual } from 'node:util';
import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../../deps.ts';
import { isFeatureEnabledFor } from '../../features.ts';
import { resolveIdentities, updateIdentities } from '../../quality/identity-graph.ts';
import {
  createIdentitySchema,
  defaultNormalizer,
  identityGraphStats,
  type IdentifierColumn,
} from '../../quality/identity-schema.ts';
import {
  DEFAULT_SURVIVORSHIP_RULE,
  PROFILE_TABLE,
  buildGoldenRecords,
  recordedProfileCounts,
  type ProfileField,
  type ProfileSource,
} from '../../quality/golden-records.ts';
import { profileTable, type ColumnProfile } from '../../llm/profile.ts';
import { shareOf } from '../../llm/value-patterns.ts';
import {
  identityResolutionSettings,
  type IdentityResolutionSettings,
} from '../workspaces/workspaces.schemas.ts';
import { evaluateIdentityHealth } from '../../quality/rules.ts';
import { quoteIdent, toNumber } from '../../quality/sql.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import type { ConnectionConfig } from '../../warehouse/config.ts';
import type { IntrospectedTable, Warehouse } from '../../warehouse/warehouse.ts';
import { TableMapping } from '../mappings/mappings.entity.ts';
import type { TargetSchema } from '../schemas/schemas.schemas.ts';
import { Workspace, type WorkspaceEntity } from '../workspaces/workspaces.entity.ts';
import { connectionConfig, targetSchemaOf } from '../workspaces/workspaces.service.ts';
import { recordCheckResults } from '../alerts/alerts.service.ts';
import { identitySchemaName, transactionRunner } from './monitoring-metrics.ts';
import { IdentityGraph, type IdentityGraphEntity } from './monitoring.entity.ts';

/*
 * Identifier columns are chosen from the target schema (schema.json), by name and type:
 *   - e-mail: a text column whose name contains "email"/"e_mail" → type `email` (lower-cased, trimmed,
 *     kept only when it looks like an address);
 *   - phone: a column whose name contains phone, mobile, msisdn or telephone → type `phone` (digits only,
 *     at least 6);
 *   - person/device ids: a column named like customer_id, user_id, account_id, member_id, contact_id,
 *     profile_id, client_id, device_id, cookie_id, anonymous_id, visitor_id, subscriber_id, lead_id,
 *     loyalty_id, external_id, crm_id (also …_key / …_uuid / …_number), or any column flagged `pii` whose
 *     name ends in _id/_key/_uuid/_number (national_id, passport_number) → its own name as the type, so the
 *     same id column in two tables links them.
 * Surrogate keys of non-person rows (order_id, event_id) are not identifiers: they would chain every
 * order of a customer into the graph as nodes of their own without linking anything new.
 * Tables: those of schema.json with a mapping (the mapped tables); a workspace without any mapping
 * (tables loaded by other means) uses every schema.json table. Tables missing in the warehouse are
 * skipped. A table's single-column primary key links its records to clusters (identity_profiles).
 */

const EMAIL = /e_?mail/i;
const PHONE = /(phone|mobile|msisdn|telephone)/i;
const PERSON_ID =
  /^(customer|cust|user|account|member|person|contact|profile|client|device|cookie|anonymous|anon|visitor|subscriber|lead|loyalty|external|crm|guest|patient|household)_?(id|key|uuid|number|no)$/i;
const PII_ID = /_(id|key|uuid|number)$/i;
const TYPE_NAME = /^[a-z][a-z0-9_]{0,62}$/;

export interface IdentityLimits {
  max_cluster_size: number;
  max_degree: number;
  max_merge_jump_ratio: number;
}

const IDENTITY_DEFAULTS: IdentityLimits = {
  max_cluster_size: 1000,
  max_degree: 100,
  max_merge_jump_ratio: 0.5,
};

/** The workspace's `identity_resolution` admin setting (validated when it was written). */
function identityConfig(workspace: WorkspaceEntity): IdentityResolutionSettings {
  const parsed = identityResolutionSettings.safeParse(workspace.settings?.identity_resolution ?? {});
  return parsed.success ? parsed.data : {};
}

/** Per-workspace limits, from the workspace's admin setting `identity_resolution` when present. */
function identitySettings(workspace: WorkspaceEntity): IdentityLimits {
  const raw = identityConfig(workspace);
  return {
    max_cluster_size: raw.max_cluster_size ?? IDENTITY_DEFAULTS.max_cluster_size,
    max_degree: raw.max_degree ?? IDENTITY_DEFAULTS.max_degree,
    max_merge_jump_ratio: raw.max_merge_jump_ratio ?? IDENTITY_DEFAULTS.max_merge_jump_ratio,
  };
}

type SchemaColumn = TargetSchema['tables'][number]['columns'][number];

function identifierOf(column: SchemaColumn): IdentifierColumn | null {
  const name = column.name;
  const type = column.type.toLowerCase();
  if (EMAIL.test(name) && type === 'text') return { column: name, type: 'email', normalize: 'email' };
  if (PHONE.test(name) && ['text', 'bigint', 'numeric', 'integer'].includes(type))
    return { column: name, type: 'phone', normalize: 'phone' };
  if (PERSON_ID.test(name) || (column.pii === true && PII_ID.test(name))) {
    const idType = name.toLowerCase();
    if (TYPE_NAME.test(idType)) return { column: name, type: idType, normalize: 'trim' };
  }
  return null;
}

/** The mapped tables of the target schema that exist in the warehouse, with their identifier columns. */
async function identitySources(
  em: EntityManager,
  workspace: WorkspaceEntity,
  targetSchema: string,
  present: IntrospectedTable[],
): Promise<ProfileSource[]> {
  const schema = targetSchemaOf(workspace);
  if (!schema) return [];
  const mapped = new Set(
    (await em.find(TableMapping, { organization: workspace.organization.id, workspace: workspace.id })).map(
      (m) => m.tableName,
    ),
  );
  const sources: ProfileSource[] = [];
  for (const table of schema.tables) {
    if (mapped.size > 0 && !mapped.has(table.name)) continue;
    const found = present.find((t) => t.schema === targetSchema && t.name === table.name);
    if (!found) continue;
    const existing = new Set(found.columns.map((c) => c.name));
    const identifiers = table.columns
      .filter((c) => existing.has(c.name))
      .map(identifierOf)
      .filter((x): x is IdentifierColumn => x !== null);
    if (identifiers.length === 0) continue;
    const key =
      table.primary_key.length === 1 && existing.has(table.primary_key[0]) ? table.primary_key[0] : undefined;
    sources.push({
      table: { schema: targetSchema, name: table.name },
      identifiers,
      ...(key ? { keyColumn: key } : {}),
      ...timestampOf(found),
      rule: 'same_record',
    });
  }
  return sources;
}

const TIMESTAMP_NAMES = [
  'updated_at',
  'last_activity_at',
  'last_modified_at',
  'modified_at',
  'last_updated',
  'updated',
  'created_at',
  'created',
];

/** A record's recency: the first column named like an update or creation time with a time type. */
function timestampOf(table: IntrospectedTable): { timestampColumn?: string } {
  for (const name of TIMESTAMP_NAMES) {
    const column = table.columns.find((c) => c.name.toLowerCase() === name);
    if (column && /^(timestamp|date)/.test(column.base_type)) return { timestampColumn: column.name };
  }
  return {};
}

/** Share of sampled values above which a column's values say what it holds, whatever its name. */
const PATTERN_SHARE = 0.8;

/**
 * Identifier columns of a source table, from its profile: e-mail and phone by name or by what the
 * values look like, person ids by name (the table's own key excepted: it identifies the record).
 */
function profiledIdentifiers(table: IntrospectedTable, profiles: ColumnProfile[]): IdentifierColumn[] {
  const ownKey = table.primary_key.length === 1 ? table.primary_key[0] : null;
  const found: IdentifierColumn[] = [];
  for (const profile of profiles) {
    const name = profile.column;
    const textual = /char|text/.test(profile.type);
    if ((EMAIL.test(name) && textual) || shareOf(profile.patterns, 'email') >= PATTERN_SHARE)
      found.push({ column: name, type: 'email', normalize: 'email' });
    else if (PHONE.test(name) || (textual && shareOf(profile.patterns, 'phone') >= PATTERN_SHARE))
      found.push({ column: name, type: 'phone', normalize: 'phone' });
    else if (PERSON_ID.test(name) && name !== ownKey)
      found.push({ column: name, type: name.toLowerCase(), normalize: 'trim' });
  }
  return found;
}

const sameDatabase = (a: ConnectionConfig, b: ConnectionConfig) =>
  a.host.toLowerCase() === b.host.toLowerCase() && a.port === b.port && a.database === b.database;

export interface IdentityPlan {
  origin: 'confirmed' | 'proposed';
  sources: ProfileSource[];
  fields: ProfileField[];
  sourcePriority: string[];
  /** Why a table was left out. */
  notes: string[];
}

/**
 * What the build reads: the confirmed sources of the `identity_resolution` setting, else a proposal:
 * the mapped target tables and, when the source database is the target database (the tables are
 * then reachable by the same SQL), every selected source table whose profile shows e-mail or phone
 * columns. The unified profile gets a field per identifier type, the configured fields, and the
 * columns that two or more sources share.
 */
async function planIdentity(
  deps: AppDeps,
  em: EntityManager,
  workspace: WorkspaceEntity,
  target: ConnectionConfig,
  warehouse: Warehouse,
): Promise<IdentityPlan> {
  const settings = identityConfig(workspace);
  const source = connectionConfig({ em, deps }, workspace, 'source');
  const notes: string[] = [];
  const shared = source && sameDatabase(source, target);
  const schemas = [...new Set([target.schemas[0], ...(shared ? source.schemas : [])])];
  const present = (await warehouse.introspect({ schemas })).tables;
  const find = (name: string) => present.find((t) => `${t.schema}.${t.name}` === name);
  let sources: ProfileSource[] = [];
  if (settings.sources) {
    for (const configured of settings.sources) {
      const table = find(configured.table);
      if (!table) {
        notes.push(`${configured.table}: not found in ${target.database} (schemas ${schemas.join(', ')})`);
        continue;
      }
      const key =
        configured.key_column ?? (table.primary_key.length === 1 ? table.primary_key[0] : undefined);
      sources.push({
        table: { schema: table.schema, name: table.name },
        identifiers: configured.identifiers,
        ...(key ? { keyColumn: key } : {}),
        ...(configured.timestamp_column
          ? { timestampColumn: configured.timestamp_column }
          : timestampOf(table)),
        rule: 'same_record',
      });
    }
  } else {
    sources = await identitySources(em, workspace, target.schemas[0], present);
    if (source && !shared)
      notes.push(
        `source tables are not proposed: the source database is not the target database (load them into the target first)`,
      );
    if (shared) {
      const selected = source.tables?.length ? new Set(source.tables) : null;
      const run = (sql: string, params: unknown[]) => warehouse.aggregate(sql, { params });
      for (const table of present) {
        if (!source.schemas.includes(table.schema) || table.kind !== 'table') continue;
        if (selected && !selected.has(table.name) && !selected.has(`${table.schema}.${table.name}`)) continue;
        if (sources.some((s) => s.table.schema === table.schema && s.table.name === table.name)) continue;
        // Profiled by base type: a domain over text is text to the identifier rules.
        const columns = table.columns.map((c) => ({ name: c.name, type: c.base_type }));
        const profiles = await profileTable(run, table.schema, table.name, columns, { rowLimit: 1000 });
        const identifiers = profiledIdentifiers(table, profiles);
        if (!identifiers.some((i) => i.type === 'email' || i.type === 'phone')) continue;
        const key = table.primary_key.length === 1 ? table.primary_key[0] : undefined;
        sources.push({
          table: { schema: table.schema, name: table.name },
          identifiers,
          ...(key ? { keyColumn: key } : {}),
          ...timestampOf(table),
          rule: 'same_record',
        });
      }
    }
  }
  for (const s of sources)
    if (!s.keyColumn)
      notes.push(`${s.table.schema}.${s.table.name}: no one-column record key, so it adds to no profile`);
  return {
    origin: settings.sources ? 'confirmed' : 'proposed',
    sources,
    fields: profileFields(settings, sources, present),
    sourcePriority: settings.source_priority ?? [],
    notes,
  };
}

/** The unified profile's fields: one per identifier type, the configured ones, and shared columns. */
function profileFields(
  settings: IdentityResolutionSettings,
  sources: ProfileSource[],
  present: IntrospectedTable[],
): ProfileField[] {
  const keyed = sources.map((s, i) => ({ s, i })).filter(({ s }) => s.keyColumn);
  const fields: ProfileField[] = [];
  const taken = new Set<string>();
  const add = (field: ProfileField) => {
    if (taken.has(field.name) || field.columns.length === 0) return;
    taken.add(field.name);
    fields.push(field);
  };
  const types = [...new Set(keyed.flatMap(({ s }) => s.identifiers.map((id) => id.type)))];
  for (const type of types)
    add({
      name: type,
      rule: settings.profile_fields?.find((f) => f.name === type)?.rule ?? DEFAULT_SURVIVORSHIP_RULE,
      columns: keyed.flatMap(({ s, i }) =>
        s.identifiers
          .filter((id) => id.type === type)
          .map((id) => ({
            source: i,
            column: id.column,
            normalize: id.normalize ?? defaultNormalizer(id.type),
          })),
      ),
    });
  const columnsOf = (i: number) =>
    present.find((t) => t.schema === sources[i].table.schema && t.name === sources[i].table.name)?.columns ??
    [];
  const identifierColumns = (i: number) => new Set(sources[i].identifiers.map((id) => id.column));
  for (const configured of settings.profile_fields ?? []) {
    const columns = configured.columns
      ? configured.columns.flatMap(({ table, column }) =>
          keyed
            .filter(({ s }) => `${s.table.schema}.${s.table.name}` === table)
            .map(({ i }) => ({ source: i, column })),
        )
      : keyed
          .filter(({ i }) => columnsOf(i).some((c) => c.name === configured.name))
          .map(({ i }) => ({ source: i, column: configured.name }));
    add({ name: configured.name, rule: configured.rule ?? DEFAULT_SURVIVORSHIP_RULE, columns });
  }
  const counts = new Map<string, number[]>();
  for (const { i } of keyed)
    for (const column of columnsOf(i))
      if (!identifierColumns(i).has(column.name) && column.name !== sources[i].keyColumn)
        counts.set(column.name, [...(counts.get(column.name) ?? []), i]);
  for (const [name, indexes] of counts)
    if (indexes.length >= 2 && /^[a-z][a-z0-9_]{0,62}$/.test(name))
      add({
        name,
        rule: DEFAULT_SURVIVORSHIP_RULE,
        columns: indexes.map((i) => ({ source: i, column: name })),
      });
  return fields;
}

/** Where the workspace's graph lives: as created by create-schema, else next to the target schema. */
export function graphLocation(config: ConnectionConfig, graph: IdentityGraphEntity | null) {
  return {
    database: graph?.database ?? config.database,
    schema: graph?.schemaName ?? identitySchemaName(config.schemas[0]),
  };
}

export async function createGraphSchema(warehouse: Warehouse, schema: string): Promise<{ created: boolean }> {
  return warehouse.transaction(async (tx) => {
    const { rows } = await tx.query<{ present: boolean }>('select to_regclass($1) is not null as present', [
      `${quoteIdent(schema)}.identity_runs`,
    ]);
    await createIdentitySchema(transactionRunner(tx), schema);
    return { created: !rows[0]?.present };
  });
}

/**
 * Statistics, the largest clusters with their identifiers and the unified profiles' counts as their
 * build recorded them (read only).
 */
export async function graphStatistics(warehouse: Warehouse, schema: string, timeoutMs: number) {
  return warehouse.transaction(async (tx) => {
    await tx.query('set transaction read only');
    await tx.query(`set local statement_timeout = ${Math.max(0, Math.floor(timeoutMs))}`);
    const runner = transactionRunner(tx);
    const stats = await identityGraphStats(runner, schema);
    let largest: {
      cluster_id: number;
      size: number;
      records: number;
      identifiers: Record<string, string[]>;
    }[] = [];
    const profiles = stats.built ? await recordedProfileCounts(runner, schema) : null;
    if (stats.built) {
      const { rows } = await runner.query(
        `select cluster_id, size, records, identifiers from ${quoteIdent(schema)}.identity_profiles
          where size > 1 order by size desc, cluster_id limit 10`,
      );
      largest = rows.map((r) => ({
        cluster_id: toNumber(r.cluster_id)!,
        size: toNumber(r.size)!,
        records: toNumber(r.records) ?? 0,
        identifiers: (r.identifiers ?? {}) as Record<string, string[]>,
      }));
    }
    return { stats, largest, profiles };
  });
}

export interface BuildRequest {
  organizationId: string;
  workspaceId: string;
  runId: string | null;
}

/**
 * The resolution job's work: rebuild the graph from the mapped tables, record the outcome on the
 * workspace's IdentityGraph row and turn the health checks into alerts.
 */
export async function buildIdentityGraph(deps: AppDeps, request: BuildRequest) {
  const em = deps.orm.em.fork() as EntityManager;
  const organization = request.organizationId;
  const workspace = await em.findOne(Workspace, { id: request.workspaceId, organization });
  if (!workspace) return { skipped: 'the workspace was deleted' };
  if (!(await isFeatureEnabledFor(em, organization, 'identity_resolution')))
    return { skipped: 'identity resolution is disabled for the organization (feature identity_resolution)' };
  const config = connectionConfig({ em, deps }, workspace, 'target');
  if (!config) return { skipped: `workspace ${workspace.name} has no target warehouse` };
  let graph = await em.findOne(IdentityGraph, { organization, workspace: workspace.id });
  const { database, schema } = graphLocation(config, graph);
  const warehouse = await warehouses(deps).open(config, `${workspace.id}:target`);
  const plan = await planIdentity(deps, em, workspace, config, warehouse);
  const { sources } = plan;
  const used = sources.map((s) => ({
    table: `${s.table.schema}.${s.table.name}`,
    identifiers: s.identifiers.map((i) => ({ column: i.column, type: i.type })),
    key_column: s.keyColumn ?? null,
    timestamp_column: s.timestampColumn ?? null,
  }));
  graph ??= em.create(IdentityGraph, { organization, workspace: workspace.id, database, schemaName: schema });
  if (sources.length === 0) {
    graph.lastRunId = request.runId;
    graph.lastResult = {
      skipped:
        'no table has identifier columns (e-mail, phone or person ids): no mapped target table, ' +
        'and no source table in the target database',
      notes: plan.notes,
    };
    await em.flush();
    return graph.lastResult;
  }
  const limits = identitySettings(workspace);
  const options = {
    schema,
    sources,
    maxClusterSize: limits.max_cluster_size,
    maxDegree: limits.max_degree,
    inProcessLimit: deps.env.IDENTITY_IN_PROCESS_IDENTIFIERS,
  };
  // Append-only sources (the `incremental` setting) read only the records added since the last
  // build, when that build read the same sources the same way; otherwise the graph is rebuilt.
  // Compared by value: the recorded result comes back from jsonb with its keys reordered.
  const incremental = identityConfig(workspace).incremental === true;
  const sameSources = incremental && isDeepStrictEqual(graph.lastResult?.sources ?? null, used);
  const { result, profiles } = await warehouse.transaction(async (tx) => {
    const runner = transactionRunner(tx);
    const built = sameSources
      ? await updateIdentities(runner, options)
      : incremental
        ? {
            ...(await resolveIdentities(runner, options)),
            full_reason: graph.lastResult ? ('sources_changed' as const) : ('no_previous_build' as const),
          }
        : await resolveIdentities(runner, options);
    const profilesStarted = performance.now();
    const profiles = await buildGoldenRecords(
      runner,
      { schema, sources, fields: plan.fields, sourcePriority: plan.sourcePriority },
      built.mode === 'incremental',
    );
    return { result: built, profiles: { ...profiles, ms: Math.round(performance.now() - profilesStarted) } };
  });
  const { stats } = await graphStatistics(warehouse, schema, 0);
  const health = evaluateIdentityHealth(schema, stats, {
    maxMergeJumpRatio: limits.max_merge_jump_ratio,
    profiles: {
      schema,
      table: PROFILE_TABLE,
      recordsWithoutProfileBySource: profiles.recordsWithoutProfileBySource,
    },
  });
  const alerts = await recordCheckResults(em, health, {
    organizationId: organization,
    workspaceId: workspace.id,
    runId: request.runId,
    kinds: ['identity'],
  });
  const summary = {
    ...result,
    built_at: result.built_at.toISOString(),
    sources: used,
    sources_origin: plan.origin,
    notes: plan.notes,
    profile_table: `${schema}.${PROFILE_TABLE}`,
    profiles: profiles.profiles,
    records_without_profile: profiles.recordsWithoutProfile,
    records_without_profile_by_source: profiles.recordsWithoutProfileBySource,
    profiles_mode: profiles.mode,
    profiles_ms: profiles.ms,
    profile_fields: plan.fields.map((f) => ({
      name: f.name,
      rule: f.rule,
      columns: f.columns.map((c) => ({
        table: used[c.source].table,
        column: c.column,
        ...(c.normalize ? { normalize: c.normalize } : {}),
      })),
    })),
    source_priority: plan.sourcePriority,
  };
  graph.lastRunId = request.runId;
  graph.lastBuiltAt = result.built_at;
  graph.lastResult = summary;
  await em.flush();
  return { ...summary, health: health.map((h) => ({ check: h.check, status: h.status })), alerts };
}
