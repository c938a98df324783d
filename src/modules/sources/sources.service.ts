import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import type { ConnectionConfig } from '../../warehouse/config.ts';
import { mysqlSchemas } from '../../warehouse/mysql.ts';
import { piiPolicyOf } from './pii-policy.service.ts';
import { effectiveAdminSettings } from '../workspaces/workspaces-settings.service.ts';
import { quoteIdent, warehouses } from '../../warehouse/postgres.ts';
import { sampleValuesSql } from '../../warehouse/postgres-sql.ts';
import {
  SAMPLE_VALUE_MAX_LENGTH,
  sampleValue,
  type IntrospectedSchema,
  type IntrospectedTable,
  type Warehouse,
} from '../../warehouse/warehouse.ts';
import {
  connectionConfig,
  requiredConnectionConfig,
  currentWorkspace,
  workspaceByName,
  type WorkspaceEntity,
} from '../workspaces/workspaces.service.ts';

type Side = 'source' | 'target';

/** The current workspace's warehouse on one side; a missing config → 409 saying how to set it. */
export async function workspaceWarehouse(
  scope: CallerScope,
  side: Side,
): Promise<{ workspace: WorkspaceEntity; config: ConnectionConfig; warehouse: Warehouse }> {
  const workspace = await currentWorkspace(scope);
  const config = requiredConnectionConfig(scope, workspace, side);
  const warehouse = await warehouses(scope.deps).open(config, `${workspace.id}:${side}`);
  return { workspace, config, warehouse };
}

type Cte = NonNullable<ConnectionConfig['ctes']>[number];

/**
 * A CTE's query as a subquery: a trailing `;` would end the statement it is embedded in, and it is set
 * on lines of its own so that a comment ending its last line ends there (the source's own dialect:
 * not parsed here).
 */
const cteSql = (cte: Cte) => `\n${cte.sql.trim().replace(/;+\s*$/, '')}\n`;

function tableView(table: IntrospectedTable): SourceTableView {
  const references = new Map<string, { schema: string; table: string; column: string }>();
  for (const fk of table.foreign_keys)
    fk.columns.forEach((column, i) =>
      references.set(column, {
        schema: fk.references.schema,
        table: fk.references.table,
        column: fk.references.columns[i],
      }),
    );
  const key = new Set(table.primary_key);
  return {
    name: table.name,
    schema: table.schema,
    qualified_name: `${table.schema}.${table.name}`,
    kind: table.kind,
    description: table.description,
    estimated_rows: table.estimated_rows,
    primary_key: table.primary_key,
    foreign_keys: table.foreign_keys,
    columns: table.columns.map((c) => ({
      ...c,
      is_primary_key: key.has(c.name),
      references: references.get(c.name) ?? null,
    })),
  };
}

interface SourceTableView {
  name: string;
  schema: string | null;
  qualified_name: string;
  kind: IntrospectedTable['kind'] | 'cte';
  description: string | null;
  estimated_rows: number | null;
  primary_key: string[];
  foreign_keys: IntrospectedTable['foreign_keys'];
  columns: (IntrospectedTable['columns'][number] & {
    is_primary_key: boolean;
    references: { schema: string; table: string; column: string } | null;
  })[];
  sql?: string;
  error?: string;
}

/** A CTE's columns come from running it with no rows; one that fails is listed with its error. */
async function cteView(warehouse: Warehouse, cte: Cte): Promise<SourceTableView> {
  const base: SourceTableView = {
    name: cte.name,
    schema: null,
    qualified_name: cte.name,
    kind: 'cte',
    description: cte.description ?? null,
    estimated_rows: null,
    primary_key: [],
    foreign_keys: [],
    columns: [],
    sql: cte.sql,
  };
  try {
    const result = await warehouse.readOnlyQuery(
      `select * from (${cteSql(cte)}) as ${quoteIdent(cte.name)}`,
      {
        limit: 1,
      },
    );
    base.columns = result.columns.map((c, i) => ({
      name: c.name,
      // A result column of a domain type is described by its base type already (the row description).
      type: c.type,
      base_type: c.type,
      nullable: true,
      default: null,
      generated: null,
      description: null,
      position: i + 1,
      is_primary_key: false,
      references: null,
    }));
  } catch (error) {
    // A CTE the database rejects is listed with the reason; an unreachable database fails the request.
    const unreachable =
      error instanceof AppError &&
      error.code === 'UNPROCESSABLE_CONTENT' &&
      error.details.reason !== 'STATEMENT_TIMEOUT';
    if (!(error instanceof AppError) || unreachable) throw error;
    base.error = error.message;
  }
  return base;
}

function head(
  workspace: WorkspaceEntity,
  side: Side,
  config: ConnectionConfig,
  schema: IntrospectedSchema,
  tables: SourceTableView[],
) {
  const configured = config.type === 'mysql' ? mysqlSchemas(config) : config.schemas;
  return {
    workspace_name: workspace.name,
    schema_type: side,
    database: schema.database,
    schemas: schema.schemas,
    // A misspelt schema (names are case-sensitive) gave an empty listing and nothing else.
    missing_schemas: configured.filter((name) => !schema.schemas.includes(name)),
    table_count: tables.length,
    column_count: tables.reduce((n, t) => n + t.columns.length, 0),
  };
}

function flattenTables(tables: SourceTableView[]) {
  return tables.flatMap((t) =>
    t.columns.map((c) => ({
      table: t.qualified_name,
      schema: t.schema,
      table_kind: t.kind,
      column: c.name,
      type: c.type,
      base_type: c.base_type,
      nullable: c.nullable,
      description: c.description,
      position: c.position,
      is_primary_key: c.is_primary_key,
      references: c.references,
    })),
  );
}

/** Every relation of the configured schemas, CTEs of the config first; `flatten` → one row per column. */
export async function unifiedSchema(scope: CallerScope, input: { schema_type: Side; flatten: boolean }) {
  const { workspace, config, warehouse } = await workspaceWarehouse(scope, input.schema_type);
  const schema = await warehouse.introspect({ tables: [] });
  const ctes: SourceTableView[] = [];
  for (const cte of config.ctes ?? []) ctes.push(await cteView(warehouse, cte));
  const tables = [...ctes, ...schema.tables.map(tableView)];
  const summary = head(workspace, input.schema_type, config, schema, tables);
  return input.flatten
    ? { ...summary, flatten: true, columns: flattenTables(tables) }
    : { ...summary, flatten: false, tables };
}

/** The tables selected in the source config (all of its schemas when none are selected). */
export async function sourceSchema(scope: CallerScope) {
  const { workspace, config, warehouse } = await workspaceWarehouse(scope, 'source');
  const schema = await warehouse.introspect();
  const tables = schema.tables.map(tableView);
  return {
    ...head(workspace, 'source', config, schema, tables),
    selected_tables: config.tables ?? null,
    tables,
  };
}

/** `schema.table`, or a bare name looked up in the config's schemas in order. */
async function resolveTable(warehouse: Warehouse, config: ConnectionConfig, name: string) {
  const dot = name.indexOf('.');
  if (dot > 0) return { schema: name.slice(0, dot), name: name.slice(dot + 1) };
  const schema = await warehouse.introspect({ tables: [name] });
  const found = (config.type === 'mysql' ? mysqlSchemas(config) : config.schemas)
    .map((s) => schema.tables.find((t) => t.schema === s && t.name === name))
    .find(Boolean);
  if (!found) throw notFound(`Table ${name}`);
  return { schema: found.schema, name: found.name };
}

export async function sampleValues(
  scope: CallerScope,
  input: { table_name: string; column_name: string; limit: number },
) {
  const { workspace, config, warehouse } = await workspaceWarehouse(scope, 'source');
  const cte = input.table_name.includes('.')
    ? undefined
    : config.ctes?.find((c) => c.name === input.table_name);
  let values;
  if (cte) {
    const described = await cteView(warehouse, cte);
    if (described.error) throw new AppError('BAD_REQUEST', `CTE ${cte.name} fails: ${described.error}`);
    if (!described.columns.some((c) => c.name === input.column_name))
      throw notFound(`Column ${cte.name}.${input.column_name}`);
    const result = await warehouse.readOnlyQuery(
      sampleValuesSql(`(${cteSql(cte)}) as ${quoteIdent(cte.name)}`, input.column_name),
      { limit: input.limit },
    );
    values = result.rows.map((r) => sampleValue(r.value, r.truncated, r.count));
  } else {
    const table = await resolveTable(warehouse, config, input.table_name);
    values = await warehouse.sampleValues(table, input.column_name, input.limit);
  }
  const { rows, masked } = (await piiPolicyOf(scope, workspace)).rows(
    [input.column_name],
    values.map((v) => ({ [input.column_name]: v.value, count: v.count })),
  );
  return {
    table_name: input.table_name,
    column_name: input.column_name,
    limit: input.limit,
    masked: masked.length > 0,
    value_max_length: SAMPLE_VALUE_MAX_LENGTH,
    truncated_values: values.filter((v) => v.truncated).length,
    values: masked.length
      ? rows.map((r) => ({ value: String(r[input.column_name]), count: r.count }))
      : values.map((v) => ({ value: v.value, count: v.count })),
  };
}

/**
 * A person's ad-hoc statement on one side of the current workspace (source queries, analytics
 * execute). The workspace's `query_row_limit` and `query_timeout_seconds` apply, within the
 * operator's WAREHOUSE_ROW_CAP and WAREHOUSE_STATEMENT_TIMEOUT_MS, which no workspace may raise.
 */
export async function adHocQuery(scope: CallerScope, side: Side, input: { sql: string; limit?: number }) {
  const { workspace, warehouse } = await workspaceWarehouse(scope, side);
  const settings = await effectiveAdminSettings(scope, workspace.name);
  const { WAREHOUSE_ROW_CAP, WAREHOUSE_STATEMENT_TIMEOUT_MS } = scope.deps.env;
  const cap = Math.min(settings.query_row_limit, WAREHOUSE_ROW_CAP);
  if (input.limit !== undefined && input.limit > cap)
    throw new AppError(
      'BAD_REQUEST',
      `limit must be at most ${cap} (${
        cap === WAREHOUSE_ROW_CAP ? 'WAREHOUSE_ROW_CAP' : "the workspace's query_row_limit"
      })`,
    );
  const limit = input.limit ?? cap;
  const timeoutMs = Math.min(settings.query_timeout_seconds * 1000, WAREHOUSE_STATEMENT_TIMEOUT_MS);
  return { ...(await warehouse.readOnlyQuery(input.sql, { limit, timeoutMs })), limit };
}

export const executeQuery = (scope: CallerScope, input: { sql: string; limit?: number }) =>
  adHocQuery(scope, 'source', input);

// ---- connection checks, for the workspaces area's routes (database/check|test|catalogs, test-stored-password) ----

async function reachability(scope: CallerScope, workspace: WorkspaceEntity, side: Side) {
  const config = connectionConfig(scope, workspace, side);
  if (!config)
    return { configured: false, reachable: false, server_version: null, error: null, warnings: [] };
  const registry = warehouses(scope.deps);
  try {
    const warehouse = await registry.open(config, `${workspace.id}:${side}`);
    const { server_version } = await warehouse.ping();
    return {
      configured: true,
      reachable: true,
      server_version,
      error: null,
      warnings: registry.warningsFor(config),
    };
  } catch (error) {
    if (!(error instanceof AppError)) throw error;
    return {
      configured: true,
      reachable: false,
      server_version: null,
      error: error.message,
      warnings: registry.warningsFor(config),
    };
  }
}

/** GET /api/workspaces/{workspace}/database/check: are the source and target configured and reachable? */
export async function databaseCheck(scope: CallerScope, workspaceName: string) {
  const workspace = await workspaceByName(scope, workspaceName);
  return {
    workspace_name: workspace.name,
    source: await reachability(scope, workspace, 'source'),
    target: await reachability(scope, workspace, 'target'),
  };
}

/**
 * The config to test: the one sent (its password, or else the stored target password for the same
 * server and user) or the stored target config. Tested on a pool of its own that the next test replaces, so nothing is saved.
 */
async function configUnderTest(scope: CallerScope, workspace: WorkspaceEntity, sent?: ConnectionConfig) {
  const stored = connectionConfig(scope, workspace, 'target');
  // The stored password only ever goes back to the server it belongs to, never to a host someone typed.
  const sameServer =
    !!sent &&
    !!stored &&
    (['host', 'port', 'database', 'user'] as const).every((key) => sent[key] === stored[key]);
  const config = sent
    ? { ...sent, password: sent.password ?? (sameServer ? stored!.password : undefined) }
    : stored;
  if (!config)
    throw new AppError(
      'CONFLICT',
      `Workspace ${workspace.name} has no target warehouse configured; send one to test`,
      {
        reason: 'NO_TARGET_CONFIG',
      },
    );
  const warehouse = await warehouses(scope.deps).open(
    config,
    sent ? `${workspace.id}:test` : `${workspace.id}:target`,
  );
  return { config, warehouse };
}

/** POST /api/workspaces/{workspace}/database/test: connects with the target config (or the one sent). 422 with the reason. */
export async function databaseTest(scope: CallerScope, workspaceName: string, config?: ConnectionConfig) {
  const workspace = await workspaceByName(scope, workspaceName);
  const tested = await configUnderTest(scope, workspace, config);
  const started = performance.now();
  const info = await tested.warehouse.ping();
  return {
    success: true as const,
    ...info,
    latency_ms: Math.round(performance.now() - started),
    warnings: warehouses(scope.deps).warningsFor(tested.config),
  };
}

/** POST /api/workspaces/{workspace}/database/catalogs: databases and schemas the credentials can see. */
export async function databaseCatalogs(scope: CallerScope, workspaceName: string, config?: ConnectionConfig) {
  const workspace = await workspaceByName(scope, workspaceName);
  const { warehouse } = await configUnderTest(scope, workspace, config);
  return { workspace_name: workspace.name, ...(await warehouse.catalogs()) };
}

/** POST /api/workspaces/test-stored-password: does the stored source password still work? 422 with the reason. */
export async function testStoredPassword(scope: CallerScope) {
  const { workspace, config, warehouse } = await workspaceWarehouse(scope, 'source');
  const info = await warehouse.ping();
  return {
    success: true as const,
    workspace_name: workspace.name,
    password_set: !!config.password,
    message: `Connected to ${config.host}:${config.port}/${info.database} as ${info.user}`,
    warnings: warehouses(scope.deps).warningsFor(config),
  };
}
