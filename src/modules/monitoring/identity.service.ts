import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../../deps.ts';
import { isFeatureEnabledFor } from '../../features.ts';
import {
  createIdentitySchema,
  identityGraphStats,
  resolveIdentities,
  type IdentifierColumn,
  type IdentitySource,
} from '../../quality/identity-graph.ts';
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

export interface IdentityResolutionSettings {
  max_cluster_size: number;
  max_degree: number;
  max_merge_jump_ratio: number;
}

export const IDENTITY_DEFAULTS: IdentityResolutionSettings = {
  max_cluster_size: 1000,
  max_degree: 100,
  max_merge_jump_ratio: 0.5,
};

/** Per-workspace limits, from the workspace settings key `identity_resolution` when present. */
export function identitySettings(workspace: WorkspaceEntity): IdentityResolutionSettings {
  const raw = (workspace.settings?.identity_resolution ?? {}) as Record<string, unknown>;
  const positive = (v: unknown, fallback: number, integer = true) =>
    typeof v === 'number' && v > 0 && (!integer || Number.isInteger(v)) ? v : fallback;
  return {
    max_cluster_size: positive(raw.max_cluster_size, IDENTITY_DEFAULTS.max_cluster_size),
    max_degree: positive(raw.max_degree, IDENTITY_DEFAULTS.max_degree),
    max_merge_jump_ratio: positive(raw.max_merge_jump_ratio, IDENTITY_DEFAULTS.max_merge_jump_ratio, false),
  };
}

type SchemaColumn = TargetSchema['tables'][number]['columns'][number];

export function identifierOf(column: SchemaColumn): IdentifierColumn | null {
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
export async function identitySources(
  em: EntityManager,
  workspace: WorkspaceEntity,
  targetSchema: string,
  present: IntrospectedTable[],
): Promise<IdentitySource[]> {
  const schema = targetSchemaOf(workspace);
  if (!schema) return [];
  const mapped = new Set(
    (await em.find(TableMapping, { organization: workspace.organization.id, workspace: workspace.id })).map(
      (m) => m.tableName,
    ),
  );
  const sources: IdentitySource[] = [];
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
      rule: 'same_record',
    });
  }
  return sources;
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

/** Statistics and the largest clusters with their identifiers (read only). */
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
    return { stats, largest };
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
  const targetSchema = config.schemas[0];
  const warehouse = await warehouses(deps).open(config, `${workspace.id}:target`);
  const present = (await warehouse.introspect({ schemas: [targetSchema] })).tables;
  const sources = await identitySources(em, workspace, targetSchema, present);
  const used = sources.map((s) => ({
    table: `${s.table.schema}.${s.table.name}`,
    identifiers: s.identifiers.map((i) => ({ column: i.column, type: i.type })),
    key_column: s.keyColumn ?? null,
  }));
  graph ??= em.create(IdentityGraph, { organization, workspace: workspace.id, database, schemaName: schema });
  if (sources.length === 0) {
    graph.lastRunId = request.runId;
    graph.lastResult = {
      skipped: 'no mapped table of the target schema has identifier columns (e-mail, phone or person ids)',
    };
    await em.flush();
    return graph.lastResult;
  }
  const limits = identitySettings(workspace);
  const result = await warehouse.transaction((tx) =>
    resolveIdentities(transactionRunner(tx), {
      schema,
      sources,
      maxClusterSize: limits.max_cluster_size,
      maxDegree: limits.max_degree,
    }),
  );
  const { stats } = await graphStatistics(warehouse, schema, 0);
  const health = evaluateIdentityHealth(schema, stats, { maxMergeJumpRatio: limits.max_merge_jump_ratio });
  const alerts = await recordCheckResults(em, health, {
    organizationId: organization,
    workspaceId: workspace.id,
    runId: request.runId,
    kinds: ['identity'],
  });
  const summary = { ...result, built_at: result.built_at.toISOString(), sources: used };
  graph.lastRunId = request.runId;
  graph.lastBuiltAt = result.built_at;
  graph.lastResult = summary;
  await em.flush();
  return { ...summary, health: health.map((h) => ({ check: h.check, status: h.status })), alerts };
}
