import { rm } from 'node:fs/promises';
import { isDeepStrictEqual } from 'node:util';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import { assertReadOnlySql } from '../../warehouse/sql-guard.ts';
import type { ConnectionConfig } from '../../warehouse/config.ts';
import { enqueueMaterialization } from './audience-materialize.job.ts';
import { exportFilePath } from './audience-export.job.ts';
import {
  UUID,
  requiredConnectionConfig,
  currentWorkspace,
  selectedWorkspaceGone,
  selectedWorkspaceIdOrFail,
  targetSchemaOf,
  type WorkspaceEntity,
} from '../workspaces/workspaces.service.ts';
import { compileRules } from './audiences-rules.ts';
import { qualifiedName, schemaTable } from './audiences-sql.ts';
import { Audience, AudienceExport, isStale, staleReason, type AudienceEntity } from './audiences.entity.ts';

// ---- shared look-ups ----

export interface Target {
  config: ConnectionConfig;
  database: string;
  schema: string;
}

/** The workspace's target warehouse; 409 when none is configured (nothing to select from). */
function requireTarget(scope: CallerScope, workspace: WorkspaceEntity): Target {
  const config = requiredConnectionConfig(scope, workspace, 'target');
  return { config, database: config.database, schema: config.schemas[0] };
}

/** The audience's warehouse, refused when the workspace's target moved to another database or schema. */
export function audienceWarehouseConfig(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  audience: AudienceEntity,
) {
  const target = requireTarget(scope, workspace);
  if (target.database !== audience.targetDatabase || target.schema !== audience.targetSchema)
    throw new AppError(
      'CONFLICT',
      `Audience ${audience.name} belongs to ${audience.targetDatabase}/${audience.targetSchema}, but the workspace target is now ${target.database}/${target.schema}`,
      { reason: 'TARGET_CHANGED' },
    );
  return target.config;
}

/** An audience of the caller's organization and current workspace; anything else → 404. */
export async function findAudience(scope: CallerScope, id: string, workspace?: WorkspaceEntity) {
  const ws = workspace ?? (await currentWorkspace(scope));
  if (!UUID.test(id)) throw notFound('Audience');
  const audience = await scope.em.findOne(Audience, {
    id,
    organization: organizationOf(scope.principal),
    workspace: ws.id,
  });
  if (!audience) throw notFound('Audience');
  return { audience, workspace: ws };
}

function audienceView(audience: AudienceEntity) {
  const materialized = !!audience.materializedView && !!audience.materializedSchema;
  return {
    id: audience.id,
    name: audience.name,
    description: audience.description,
    target_database: audience.targetDatabase,
    target_schema: audience.targetSchema,
    target_table: audience.targetTable,
    definition: {
      type: audience.definitionType,
      rules: audience.rules ?? null,
      sql: audience.sql ?? null,
    },
    identifier_columns: audience.identifierColumns,
    attribute_columns: audience.attributeColumns,
    definition_version: audience.definitionVersion,
    materialization: {
      status: audience.materializationStatus,
      stale: isStale(audience),
      materialized_version: audience.materializedVersion ?? null,
      table: materialized ? `${audience.materializedSchema}.${audience.materializedView}` : null,
      versioned_table: materialized ? `${audience.materializedSchema}.${audience.materializedTable}` : null,
      columns: audience.materializedColumns ?? [],
      row_count: audience.rowCount ?? null,
      rows_without_identifier: audience.rowsWithoutIdentifier ?? null,
      rows_merged: audience.rowsMerged ?? null,
      materialized_at: audience.materializedAt ?? null,
      duration_ms: audience.lastDurationMs ?? null,
      error: audience.lastError ?? null,
      run_id: audience.lastRunId ?? null,
    },
    created_at: audience.createdAt,
    updated_at: audience.updatedAt,
  };
}

// ---- definitions ----

interface DefinitionInput {
  target_table: string;
  definition: { type: 'rules' | 'sql'; rules?: Record<string, unknown>; sql?: string };
  identifier_columns?: string[];
  attribute_columns?: string[];
}

/**
 * Checks a definition against the workspace's schema.json and returns it normalized (canonical
 * column names). Every field of a rule tree must be a column of the target table and every operator
 * must fit its type; a SQL definition must be one read-only SELECT.
 */
async function checkDefinition(workspace: WorkspaceEntity, input: DefinitionInput) {
  const schema = targetSchemaOf(workspace);
  if (!schema)
    throw new AppError('CONFLICT', `Workspace ${workspace.name} has no target schema: assign one first`, {
      reason: 'NO_TARGET_SCHEMA',
    });
  const table = schemaTable(schema, input.target_table);
  if (!table) {
    const message = `Unknown target table ${input.target_table} (tables of the target schema: ${schema.tables.map((t) => t.name).join(', ')})`;
    throw new AppError('BAD_REQUEST', message, { issues: [{ path: ['target_table'], message }] });
  }
  const byLower = new Map(table.columns.map((c) => [c.name.toLowerCase(), c.name]));
  const { type } = input.definition;
  const canonical = (names: string[], path: string) =>
    names.map((name, i) => {
      const found = table.columns.some((c) => c.name === name) ? name : byLower.get(name.toLowerCase());
      // A SELECT may compute or rename columns: its output is checked when it runs.
      if (found || type === 'sql') return found ?? name;
      throw new AppError('BAD_REQUEST', `Unknown field ${name} in table ${table.name}`, {
        issues: [{ path: [path, i], message: `Unknown field ${name} in table ${table.name}` }],
      });
    });
  const identifiers = [
    ...new Set(canonical(input.identifier_columns ?? table.primary_key ?? [], 'identifier_columns')),
  ];
  if (!identifiers.length) {
    const message = `identifier_columns is required: table ${table.name} has no primary key to identify members by`;
    throw new AppError('BAD_REQUEST', message, { issues: [{ path: ['identifier_columns'], message }] });
  }
  const attributes = [...new Set(canonical(input.attribute_columns ?? [], 'attribute_columns'))].filter(
    (c) => !identifiers.includes(c),
  );
  let rules: Record<string, unknown> | null = null;
  let sql: string | null = null;
  if (type === 'rules') {
    if (!input.definition.rules)
      throw new AppError('BAD_REQUEST', 'definition.rules is required for a rules definition', {
        issues: [
          { path: ['definition', 'rules'], message: 'definition.rules is required for a rules definition' },
        ],
      });
    compileRules(input.definition.rules, table.columns, { table: table.name });
    rules = input.definition.rules;
  } else {
    if (!input.definition.sql?.trim())
      throw new AppError('BAD_REQUEST', 'definition.sql is required for a sql definition', {
        issues: [{ path: ['definition', 'sql'], message: 'definition.sql is required for a sql definition' }],
      });
    const { kind } = await assertReadOnlySql(input.definition.sql);
    if (kind !== 'SELECT')
      throw new AppError('BAD_REQUEST', `An audience is defined by a SELECT; got ${kind}`, {
        issues: [{ path: ['definition', 'sql'], message: `An audience is defined by a SELECT; got ${kind}` }],
      });
    sql = input.definition.sql;
  }
  return {
    targetTable: table.name,
    definitionType: type,
    rules,
    sql,
    identifierColumns: identifiers,
    attributeColumns: attributes,
  };
}

async function assertNameFree(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  name: string,
  exceptId?: string,
) {
  const existing = await scope.em.findOne(Audience, { workspace: workspace.id, name }, { fields: ['id'] });
  if (existing && existing.id !== exceptId)
    throw new AppError('CONFLICT', `An audience named ${name} already exists in workspace ${workspace.name}`);
}

// ---- routes ----

export async function listAudiences(scope: CallerScope, input: { limit: number; offset: number }) {
  const organization = organizationOf(scope.principal);
  const workspaceId = await selectedWorkspaceIdOrFail(scope);
  // One statement: the selected workspace, its target (audiences of another target database or schema
  // are not listed), the page and the total; the workspace row alone when the page is empty.
  const rows: Record<string, unknown>[] = await scope.em.execute(
    `select w.name as workspace_name, w.target_config->>'database' as workspace_target_database,
            w.target_config->'schemas'->>0 as workspace_target_schema, page.*
       from workspaces w
       left join lateral (
         select a.*, count(*) over () as total_count
           from audiences a
          where a.organization_id = w.organization_id and a.workspace_id = w.id
            and (w.target_config->>'database' is null
                 or (a.target_database = w.target_config->>'database'
                     and a.target_schema = w.target_config->'schemas'->>0))
          order by a.name asc
          limit ? offset ?
       ) page on true
      where w.id = ? and w.organization_id = ?`,
    [input.limit, input.offset, workspaceId, organization],
  );
  if (!rows.length) throw selectedWorkspaceGone(scope);
  const [first] = rows;
  const page = rows.filter((r) => r.id != null);
  // Past the last page the window has no row to carry the total: count on its own (rare).
  const total = page.length
    ? Number(page[0].total_count)
    : input.offset > 0
      ? await scope.em.count(Audience, {
          organization,
          workspace: workspaceId,
          ...(first.workspace_target_database != null
            ? {
                targetDatabase: String(first.workspace_target_database),
                targetSchema: String(first.workspace_target_schema),
              }
            : {}),
        })
      : 0;
  return {
    workspace_name: String(first.workspace_name),
    target_database: (first.workspace_target_database as string | null) ?? null,
    target_schema: (first.workspace_target_schema as string | null) ?? null,
    total,
    audiences: page.map((r) => {
      const {
        workspace_name: _name,
        workspace_target_database: _database,
        workspace_target_schema: _schema,
        total_count: _total,
        ...columns
      } = r;
      return audienceView(scope.em.map(Audience, columns));
    }),
  };
}

export async function getAudience(scope: CallerScope, id: string) {
  return audienceView((await findAudience(scope, id)).audience);
}

export async function createAudience(
  scope: CallerScope,
  input: DefinitionInput & { name: string; description?: string },
) {
  const workspace = await currentWorkspace(scope);
  const target = requireTarget(scope, workspace);
  const definition = await checkDefinition(workspace, input);
  await assertNameFree(scope, workspace, input.name);
  const audience = scope.em.create(Audience, {
    organization: organizationOf(scope.principal),
    workspace: workspace.id,
    name: input.name,
    description: input.description ?? '',
    targetDatabase: target.database,
    targetSchema: target.schema,
    ...definition,
    definitionVersion: 1,
    materializationStatus: 'never',
    createdBy: scope.principal.kind === 'user' ? scope.principal.id : null,
  });
  await scope.em.flush();
  return audienceView(audience);
}

export async function updateAudience(
  scope: CallerScope,
  input: Partial<DefinitionInput> & { audience_id: string; name?: string; description?: string },
) {
  const { audience, workspace } = await findAudience(scope, input.audience_id);
  if (input.name !== undefined && input.name !== audience.name) {
    await assertNameFree(scope, workspace, input.name, audience.id);
    audience.name = input.name;
  }
  if (input.description !== undefined) audience.description = input.description;
  const touchesDefinition =
    input.target_table !== undefined ||
    input.definition !== undefined ||
    input.identifier_columns !== undefined ||
    input.attribute_columns !== undefined;
  if (touchesDefinition) {
    const next = await checkDefinition(workspace, {
      target_table: input.target_table ?? audience.targetTable,
      definition: input.definition ?? {
        type: audience.definitionType,
        rules: audience.rules ?? undefined,
        sql: audience.sql ?? undefined,
      },
      identifier_columns:
        input.identifier_columns ??
        (input.target_table !== undefined ? undefined : audience.identifierColumns),
      attribute_columns:
        input.attribute_columns ?? (input.target_table !== undefined ? undefined : audience.attributeColumns),
    });
    const changed = (Object.keys(next) as (keyof typeof next)[]).some(
      // Compared as JSON values: stored definitions come back from jsonb with their keys reordered.
      (key) =>
        !isDeepStrictEqual(
          JSON.parse(JSON.stringify(next[key] ?? null)),
          JSON.parse(JSON.stringify(audience[key] ?? null)),
        ),
    );
    if (changed) {
      Object.assign(audience, next);
      // The materialized members no longer match: stale until the next materialization.
      audience.definitionVersion += 1;
      audience.definitionChangedAt = new Date();
    }
  }
  await scope.em.flush();
  return audienceView(audience);
}

export async function deleteAudience(scope: CallerScope, id: string) {
  const { audience, workspace } = await findAudience(scope, id);
  const organization = organizationOf(scope.principal);
  if (audience.lastRunId && ['queued', 'running'].includes(audience.materializationStatus))
    await scope.deps.jobs.cancel(audience.lastRunId, organization);
  const dropped: string[] = [];
  let warehouseError: string | null = null;
  if (audience.materializedSchema && (audience.materializedView || audience.materializedTable)) {
    try {
      const warehouse = await warehouses(scope.deps).open(
        audienceWarehouseConfig(scope, workspace, audience),
        `${workspace.id}:target`,
      );
      await warehouse.transaction(async (tx) => {
        if (audience.materializedView) {
          await tx.query(
            `drop view if exists ${qualifiedName(audience.materializedSchema!, audience.materializedView)}`,
          );
          dropped.push(`${audience.materializedSchema}.${audience.materializedView}`);
        }
        if (audience.materializedTable) {
          await tx.query(
            `drop table if exists ${qualifiedName(audience.materializedSchema!, audience.materializedTable)}`,
          );
          dropped.push(`${audience.materializedSchema}.${audience.materializedTable}`);
        }
      });
    } catch (error) {
      // The audience goes either way: an unreachable warehouse must not make it undeletable.
      dropped.length = 0;
      warehouseError = error instanceof Error ? error.message : String(error);
    }
  }
  const files = await scope.em.find(
    AudienceExport,
    { audience: audience.id, organization },
    { fields: ['id'] },
  );
  await scope.em.remove(audience).flush();
  for (const file of files)
    await rm(exportFilePath(scope.deps, organization, file.id), { force: true }).catch(() => undefined);
  return {
    success: true as const,
    message: `Audience ${audience.name} deleted`,
    dropped,
    warehouse_error: warehouseError,
  };
}

export async function materialize(scope: CallerScope, id: string) {
  const { audience, workspace } = await findAudience(scope, id);
  audienceWarehouseConfig(scope, workspace, audience);
  const { run, created } = await enqueueMaterialization(scope.deps, scope.em, {
    audienceId: audience.id,
    organizationId: organizationOf(scope.principal),
    workspaceId: workspace.id,
  });
  return { audience_id: audience.id, run_id: run.id, status: run.status, created };
}

export async function audienceSize(scope: CallerScope, id: string) {
  const { audience } = await findAudience(scope, id);
  const materialized = audience.materializedVersion != null && audience.rowCount != null;
  const stale = isStale(audience);
  let message: string;
  if (!materialized)
    message =
      audience.materializationStatus === 'failed'
        ? `Never materialized successfully: ${audience.lastError ?? 'the last run failed'}`
        : 'Never materialized: POST …/materialize to count its members';
  else if (stale) message = `Stale: ${staleReason(audience)}`;
  else message = 'Up to date';
  return {
    audience_id: audience.id,
    row_count: materialized ? Number(audience.rowCount) : null,
    rows_without_identifier:
      materialized && audience.rowsWithoutIdentifier != null ? Number(audience.rowsWithoutIdentifier) : null,
    rows_merged: materialized && audience.rowsMerged != null ? Number(audience.rowsMerged) : null,
    materialized,
    stale,
    status: audience.materializationStatus,
    materialized_at: audience.materializedAt ?? null,
    definition_version: audience.definitionVersion,
    materialized_version: audience.materializedVersion ?? null,
    message,
  };
}

// ---- dashboard ----

/** Ratios over summed figures; null where the denominator is zero. Shared with the summary. */
export const RATIOS_SQL = `
  round(clicks::numeric / nullif(impressions, 0), 6) as ctr,
  round(spend / nullif(clicks, 0), 6) as cpc,
  round(spend / nullif(conversions, 0), 6) as cpa,
  round(conversions / nullif(clicks, 0), 6) as conversion_rate,
  round(revenue / nullif(spend, 0), 6) as roas`;

/**
 * A conversion's figures, over `audience_conversions` rows grouped as the caller wants: those of members
 * (and those posted before membership was checked, `member` null), and those of no member apart.
 */
export const CONVERSION_FIGURES_SQL = `
  count(*) filter (where member is not false) as recorded_conversions,
  coalesce(sum(value) filter (where member is not false), 0) as recorded_conversion_value,
  count(*) filter (where member is false) as unmatched_conversions,
  coalesce(sum(value) filter (where member is false), 0) as unmatched_conversion_value`;

const num = (v: unknown) => (v == null ? 0 : Number(v));
const ratio = (v: unknown) => (v == null ? null : Number(v));

export function figuresOf(row: Record<string, unknown>) {
  return {
    impressions: num(row.impressions),
    clicks: num(row.clicks),
    spend: num(row.spend),
    conversions: num(row.conversions),
    revenue: num(row.revenue),
    ctr: ratio(row.ctr),
    cpc: ratio(row.cpc),
    cpa: ratio(row.cpa),
    conversion_rate: ratio(row.conversion_rate),
    roas: ratio(row.roas),
    recorded_conversions: num(row.recorded_conversions),
    recorded_conversion_value: num(row.recorded_conversion_value),
    unmatched_conversions: num(row.unmatched_conversions),
    unmatched_conversion_value: num(row.unmatched_conversion_value),
  };
}

const asDate = (v: unknown) => (v == null ? null : v instanceof Date ? v : new Date(v as string));

/**
 * Every audience of the workspace with size, freshness, exports and performance in one statement:
 * each side table is aggregated once (grouped by audience) and joined, never queried per audience.
 */
/**
 * One statement: the selected workspace (its name, and whether it still exists) joined with every
 * audience's figures, so the dashboard costs one transaction under row-level security.
 */
export async function dashboard(scope: CallerScope) {
  const workspaceId = await selectedWorkspaceIdOrFail(scope);
  const organization = organizationOf(scope.principal);
  const scopeParams = [organization, workspaceId];
  const rows = await scope.em.execute(
    `select w.name as workspace_name, y.* from workspaces w left join (select x.*, ${RATIOS_SQL}
       from (
         select a.id, a.name, a.target_table, a.definition_type, a.row_count, a.rows_without_identifier,
                a.rows_merged,
                a.materialization_status,
                a.definition_version, a.materialized_version, a.materialized_at,
                extract(epoch from now() - a.materialized_at)::bigint as freshness_seconds,
                coalesce(e.export_count, 0) as export_count, coalesce(e.active_count, 0) as active_export_count,
                e.last_export_at,
                coalesce(m.impressions, 0) as impressions, coalesce(m.clicks, 0) as clicks,
                coalesce(m.spend, 0) as spend, coalesce(m.conversions, 0) as conversions,
                coalesce(m.revenue, 0) as revenue,
                coalesce(c.recorded_conversions, 0) as recorded_conversions,
                coalesce(c.recorded_conversion_value, 0) as recorded_conversion_value,
                coalesce(c.unmatched_conversions, 0) as unmatched_conversions,
                coalesce(c.unmatched_conversion_value, 0) as unmatched_conversion_value
           from audiences a
           left join (select audience_id, count(*) as export_count,
                             count(*) filter (where status = 'active') as active_count,
                             max(last_run_at) as last_export_at
                        from audience_exports where organization_id = ? and workspace_id = ?
                       group by audience_id) e on e.audience_id = a.id
           left join (select audience_id, sum(impressions) as impressions, sum(clicks) as clicks,
                             sum(spend) as spend, sum(conversions) as conversions, sum(revenue) as revenue
                        from audience_performance_metrics where organization_id = ? and workspace_id = ?
                       group by audience_id) m on m.audience_id = a.id
           left join (select audience_id, ${CONVERSION_FIGURES_SQL}
                        from audience_conversions where organization_id = ? and workspace_id = ?
                       group by audience_id) c on c.audience_id = a.id
          where a.organization_id = ? and a.workspace_id = ?
       ) x) y on true
      where w.id = ? and w.organization_id = ?
      order by y.name`,
    [...scopeParams, ...scopeParams, ...scopeParams, ...scopeParams, workspaceId, organization],
  );
  if (!rows.length) throw selectedWorkspaceGone(scope);
  return {
    workspace_name: String(rows[0].workspace_name),
    audiences: rows
      .filter((r: Record<string, unknown>) => r.id != null)
      .map((r: Record<string, unknown>) => ({
        id: String(r.id),
        name: String(r.name),
        target_table: String(r.target_table),
        definition_type: r.definition_type as 'rules' | 'sql',
        size: r.materialized_version == null || r.row_count == null ? null : Number(r.row_count),
        rows_without_identifier:
          r.materialized_version == null || r.rows_without_identifier == null
            ? null
            : Number(r.rows_without_identifier),
        rows_merged: r.materialized_version == null || r.rows_merged == null ? null : Number(r.rows_merged),
        materialization_status: r.materialization_status as AudienceEntity['materializationStatus'],
        stale:
          r.materialized_version != null && Number(r.materialized_version) !== Number(r.definition_version),
        materialized_at: asDate(r.materialized_at),
        freshness_seconds: r.freshness_seconds == null ? null : Number(r.freshness_seconds),
        export_count: Number(r.export_count),
        active_export_count: Number(r.active_export_count),
        last_export_at: asDate(r.last_export_at),
        performance: figuresOf(r),
      })),
  };
}
