import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError, notFound, type AppErrorIssue } from '../../app-error.ts';
import type { CallerScope, Scope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import { portableFamily } from '../../warehouse/ddl.ts';
import {
  parseExpression,
  parseTableKey,
  planMapping,
  splitSourceField,
  type ExpressionNode,
  type JoinType,
  type Mapping,
  type MappingTable,
  type TargetTable,
} from '../../transform/mapping.ts';
import { invalidateWorkspaceCaches, mappingCache } from '../workspaces/workspaces-cache.ts';
import {
  connectionConfig,
  currentWorkspace,
  targetSchemaOf,
  type WorkspaceEntity,
} from '../workspaces/workspaces.service.ts';
import {
  registerWorkspaceExtension,
  type StaleConnection,
  type WorkspaceFile,
} from '../workspaces/workspace-extensions.ts';
import type { JobRunView } from '../../jobs/queue.ts';
import {
  MappingCommit,
  TableMapping,
  type MappingDecision,
  type StoredConnection,
  type StoredTransformation,
  type TableMappingEntity,
} from './mappings.entity.ts';
import {
  hasUncommittedChanges,
  mergeDiscovery,
  canonicalMapping,
  type DiscoveredMapping,
} from './mappings-merge.ts';
import type { Warehouse } from '../../warehouse/warehouse.ts';
import { fanOutProblems, measureFanOut } from './mappings-fanout.ts';

/** The job kind of a table materialization (src/jobs/materialize.ts). */
export const MATERIALIZE_MAPPING_KIND = 'mapping-materialize';

/** `table.*` → `*`: every target column filled from the column of the same name. */
export const WILDCARD_FIELD = '*';

// ---- the source catalog ----

export interface CatalogTable {
  key: string;
  schema: string;
  name: string;
  columns: Map<string, string>;
}

export interface SourceCatalog {
  tables: CatalogTable[];
  byKey: Map<string, CatalogTable>;
}

const CATALOG_KEY = 'source-catalog';

function buildCatalog(tables: { schema: string; name: string; columns: { name: string; type: string }[] }[]) {
  const list = tables.map((t) => ({
    key: `${t.schema}.${t.name}`,
    schema: t.schema,
    name: t.name,
    columns: new Map(t.columns.map((c) => [c.name, c.type])),
  }));
  return { tables: list, byKey: new Map(list.map((t) => [t.key, t])) };
}

/**
 * The source database's relations and columns, what every mapping write is checked against. Cached
 * briefly per workspace (config changes invalidate it); `refresh` re-reads it, so a column created a
 * moment ago is found before a write is refused.
 */
export async function sourceCatalog(
  scope: Scope,
  workspace: WorkspaceEntity,
  options: { refresh?: boolean } = {},
): Promise<SourceCatalog> {
  const org = workspace.organization.id;
  if (!options.refresh) {
    const hit = (await mappingCache.get(
      { em: scope.em, organizationId: org },
      `${workspace.id}:${CATALOG_KEY}`,
    )) as SourceCatalog | undefined;
    if (hit) return hit;
  }
  const warehouse = await sourceWarehouseOf(scope, workspace);
  // Every relation of the configured schemas: a mapping may use a table outside the selection.
  const introspected = await warehouse.introspect({ tables: [] });
  const catalog = buildCatalog(introspected.tables);
  await mappingCache.set({ em: scope.em, organizationId: org }, `${workspace.id}:${CATALOG_KEY}`, catalog);
  return catalog;
}

/** `customers` or `shop.customers` → the catalog table; null when the source has none (or several). */
function findSourceTable(catalog: SourceCatalog, written: string): CatalogTable | 'ambiguous' | null {
  const exact = catalog.byKey.get(written);
  if (exact) return exact;
  if (written.includes('.')) return null;
  const matches = catalog.tables.filter((t) => t.name === written);
  if (matches.length > 1) return 'ambiguous';
  return matches[0] ?? null;
}

/** The canonical key (`schema.table`) of a source table, refreshing the catalog once before refusing. */
async function resolveSourceTable(
  scope: Scope,
  workspace: WorkspaceEntity,
  written: string,
  catalog: SourceCatalog,
): Promise<{ table: CatalogTable; catalog: SourceCatalog }> {
  let found = findSourceTable(catalog, written);
  if (!found) {
    catalog = await sourceCatalog(scope, workspace, { refresh: true });
    found = findSourceTable(catalog, written);
  }
  if (found === 'ambiguous')
    throw new AppError(
      'BAD_REQUEST',
      `Source table ${written} exists in several schemas (${catalog.tables
        .filter((t) => t.name === written)
        .map((t) => t.key)
        .join(', ')}); write it as schema.table`,
    );
  if (!found)
    throw new AppError('BAD_REQUEST', `Source table ${written} does not exist in the source database`);
  return { table: found, catalog };
}

// ---- target schema ----

export function targetTableOf(workspace: WorkspaceEntity, tableName: string): TargetTable {
  const schema = targetSchemaOf(workspace);
  if (!schema)
    throw new AppError(
      'CONFLICT',
      `Workspace ${workspace.name} has no target schema: assign one first (POST /api/workspaces/target-schema/assign)`,
      { reason: 'NO_TARGET_SCHEMA' },
    );
  const table = schema.tables.find((t) => t.name === tableName);
  if (!table) throw notFound(`Table ${tableName} of the target schema ${schema.name}`);
  return table as TargetTable;
}

function targetColumn(table: TargetTable, field: string) {
  return table.columns.find((c) => c.name === field);
}

// ---- loading and viewing ----

export async function findMapping(
  em: EntityManager,
  workspace: WorkspaceEntity,
  tableName: string,
): Promise<TableMappingEntity | null> {
  return em.findOne(TableMapping, {
    organization: workspace.organization.id,
    workspace: workspace.id,
    tableName,
  });
}

/** A mapping of the current workspace; 404 when the table has none. */
export async function requireMapping(scope: CallerScope, tableName: string) {
  const workspace = await currentWorkspace(scope);
  const mapping = await findMapping(scope.em, workspace, tableName);
  if (!mapping) {
    // Say which of the two is missing: the table, or its mapping.
    targetTableOf(workspace, tableName);
    throw notFound(`Mapping of table ${tableName}`);
  }
  return { workspace, mapping };
}

async function latestRun(
  scope: Scope,
  workspace: WorkspaceEntity,
  tableName: string,
): Promise<JobRunView | null> {
  const [row] = await scope.em.execute(
    `select id from job_runs where organization_id = ? and kind = ? and singleton_key = ? order by created_at desc limit 1`,
    [workspace.organization.id, MATERIALIZE_MAPPING_KIND, materializeKey(workspace, tableName)],
  );
  return row ? scope.deps.jobs.getRun(row.id, workspace.organization.id) : null;
}

export const materializeKey = (workspace: WorkspaceEntity, tableName: string) =>
  `${workspace.id}:${tableName}`;

export function runView(run: JobRunView) {
  return {
    run_id: run.id,
    status: run.status,
    progress: run.progress,
    result: run.result,
    error: run.error,
    retry_count: run.retry_count,
    created_at: run.created_at,
    started_at: run.started_at,
    finished_at: run.finished_at,
    duration_ms: run.duration_ms,
  };
}

/** The mapping document as it is stored and shown (mappings/<table>.json carries the same). */
export function mappingDocument(mapping: TableMappingEntity) {
  return {
    table_name: mapping.tableName,
    tables: mapping.tables,
    connections: mapping.connections,
    transformations: mapping.transformations,
    ambiguities: mapping.ambiguities,
    version: mapping.version,
    committed_version: mapping.committedVersion ?? null,
  };
}

/** The mapping the newest commit of a table recorded (null before the first commit). */
export async function committedMapping(
  em: EntityManager,
  workspace: WorkspaceEntity,
  tableName: string,
): Promise<Record<string, unknown> | null> {
  const commit = await em.findOne(
    MappingCommit,
    { organization: workspace.organization.id, workspace: workspace.id, tableName },
    { orderBy: { version: 'desc' }, fields: ['mapping'] },
  );
  return commit?.mapping ?? null;
}

/** The one definition of "changed since the last commit" (view, transformation-diff, drift). */
export async function mappingChanged(
  em: EntityManager,
  workspace: WorkspaceEntity,
  mapping: TableMappingEntity,
) {
  if (mapping.committedVersion == null) return true;
  return hasUncommittedChanges(mapping, await committedMapping(em, workspace, mapping.tableName));
}

export async function mappingView(scope: Scope, workspace: WorkspaceEntity, mapping: TableMappingEntity) {
  const run = await latestRun(scope, workspace, mapping.tableName);
  return {
    ...mappingDocument(mapping),
    decisions: mapping.decisions ?? [],
    has_uncommitted_changes: await mappingChanged(scope.em, workspace, mapping),
    materialization: {
      materialized_version: mapping.materializedVersion ?? null,
      materialized_at: mapping.materializedAt ?? null,
      rows: mapping.materializedRows ?? null,
      last_run: run ? runView(run) : null,
    },
    created_at: mapping.createdAt,
    updated_at: mapping.updatedAt,
  };
}

function emptyView(tableName: string) {
  return {
    table_name: tableName,
    tables: {},
    connections: [],
    transformations: {},
    ambiguities: [],
    version: 0,
    committed_version: null,
    decisions: [],
    has_uncommitted_changes: false,
    materialization: { materialized_version: null, materialized_at: null, rows: null, last_run: null },
    created_at: null,
    updated_at: null,
  };
}

export async function listMappings(scope: CallerScope, input: { include_workspace: boolean }) {
  const workspace = await currentWorkspace(scope);
  const mappings = await scope.em.find(
    TableMapping,
    { organization: organizationOf(scope.principal), workspace: workspace.id },
    { orderBy: { tableName: 'asc' } },
  );
  const views = [];
  for (const m of mappings) views.push(await mappingView(scope, workspace, m));
  const schema = targetSchemaOf(workspace);
  const mapped = new Set(mappings.map((m) => m.tableName));
  return {
    workspace_name: workspace.name,
    mappings: views,
    ...(input.include_workspace
      ? {
          workspace: {
            name: workspace.name,
            description: workspace.description,
            source_configured: !!workspace.sourceConfig,
            target_configured: !!workspace.targetConfig,
            schema_name: schema?.name ?? null,
            schema_tables: schema?.tables.map((t) => t.name) ?? [],
            unmapped_tables: schema?.tables.map((t) => t.name).filter((t) => !mapped.has(t)) ?? [],
          },
        }
      : {}),
  };
}

export async function getMapping(scope: CallerScope, tableName: string) {
  const workspace = await currentWorkspace(scope);
  const mapping = await findMapping(scope.em, workspace, tableName);
  if (mapping) return mappingView(scope, workspace, mapping);
  targetTableOf(workspace, tableName);
  return emptyView(tableName);
}

// ---- writing ----

/**
 * Loads (or starts) the mapping of a table of the current workspace, lets `change` edit it and
 * stores it with its version bumped. The target table must exist in the schema (404 otherwise).
 */
async function editMapping<T>(
  scope: CallerScope,
  tableName: string,
  change: (ctx: {
    workspace: WorkspaceEntity;
    target: TargetTable;
    mapping: TableMappingEntity;
  }) => Promise<T>,
  options: { create?: boolean } = { create: true },
): Promise<{ mapping: TableMappingEntity; workspace: WorkspaceEntity; result: T }> {
  const workspace = await currentWorkspace(scope);
  const target = targetTableOf(workspace, tableName);
  let mapping = await findMapping(scope.em, workspace, tableName);
  if (!mapping) {
    if (!options.create) throw notFound(`Mapping of table ${tableName}`);
    mapping = scope.em.create(TableMapping, {
      organization: workspace.organization.id,
      workspace: workspace.id,
      tableName,
      tables: {},
      connections: [],
      transformations: {},
      ambiguities: [],
      version: 0,
    });
  }
  const result = await change({ workspace, target, mapping });
  mapping.version += 1;
  await scope.em.flush();
  invalidateWorkspaceCaches(workspace.organization.id, workspace.id);
  return { mapping, workspace, result };
}

/** The workspace's source database; 409 when none is configured. */
export async function sourceWarehouseOf(scope: Scope, workspace: WorkspaceEntity): Promise<Warehouse> {
  const config = connectionConfig(scope, workspace, 'source');
  if (!config)
    throw new AppError(
      'CONFLICT',
      `Workspace ${workspace.name} has no source database configured (POST /api/workspaces/source-config); mappings are checked against it`,
      { reason: 'NO_SOURCE_CONFIG' },
    );
  return warehouses(scope.deps).open(config, `${workspace.id}:source`);
}

/** Resolves a table written in an expression (by key or bare name) among the mapping's tables. */
function mappingTableResolver(keys: string[]) {
  const byName = new Map<string, string>();
  for (const key of keys) {
    byName.set(key.toLowerCase(), key);
    byName.set(parseTableKey(key).name.toLowerCase(), key);
  }
  return (written: string) => byName.get(written.toLowerCase());
}

/**
 * An expression (transformation or join ON) checked against the mapping's tables and the source
 * columns: 400 with the parser's message and position, or naming the unknown table or column.
 */
async function checkExpression(
  expression: string,
  tableKeys: string[],
  catalog: SourceCatalog,
  what: string,
): Promise<{ ast: ExpressionNode; tables: Set<string> }> {
  let parsed: Awaited<ReturnType<typeof parseExpression>>;
  try {
    parsed = await parseExpression(expression);
  } catch (error) {
    if (error instanceof AppError)
      throw new AppError('BAD_REQUEST', `${what}: ${error.message}`, error.details);
    throw error;
  }
  const resolve = mappingTableResolver(tableKeys);
  const problems: string[] = [];
  const used = new Set<string>();
  for (const ref of parsed.refs) {
    let key: string | undefined;
    if (ref.length === 1) {
      if (tableKeys.length !== 1) {
        problems.push(
          tableKeys.length === 0
            ? `column ${ref[0]} has no table: add a source table to the mapping first`
            : `qualify column ${ref[0]} with its table`,
        );
        continue;
      }
      key = tableKeys[0];
    } else {
      const written = ref.slice(0, -1).join('.');
      key = resolve(written);
      if (!key) {
        problems.push(
          `${ref.join('.')} names table ${written}, which is not a table of this mapping (${tableKeys.join(', ') || 'none yet'})`,
        );
        continue;
      }
    }
    used.add(key);
    const column = ref.at(-1)!;
    const table = catalog.byKey.get(key);
    if (table && !table.columns.has(column)) problems.push(`source table ${key} has no column ${column}`);
  }
  if (problems.length) throw new AppError('BAD_REQUEST', `${what}: ${problems.join('; ')}`);
  return { ast: parsed.ast, tables: used };
}

export async function addConnection(
  scope: CallerScope,
  input: {
    table_name: string;
    connection: {
      source_field: string;
      target_field: string;
      status: 'suggested' | 'confirmed';
      confidence?: number | null;
    };
  },
) {
  const { connection } = input;
  const { mapping, workspace } = await editMapping(
    scope,
    input.table_name,
    async ({ workspace, target, mapping }) => {
      const split = splitSourceField(connection.source_field)!;
      const wildcard = split.column === WILDCARD_FIELD;
      if (wildcard !== (connection.target_field === WILDCARD_FIELD))
        throw new AppError(
          'BAD_REQUEST',
          'A wildcard connection maps "table.*" to target_field "*"; neither side may be a wildcard alone',
        );
      if (!wildcard && !targetColumn(target, connection.target_field))
        throw new AppError(
          'BAD_REQUEST',
          `Target table ${target.name} has no column ${connection.target_field}`,
        );
      let catalog = await sourceCatalog(scope, workspace);
      const resolved = await resolveSourceTable(scope, workspace, split.table, catalog);
      catalog = resolved.catalog;
      const table = resolved.table;
      if (!wildcard && !table.columns.has(split.column)) {
        const fresh = await sourceCatalog(scope, workspace, { refresh: true });
        if (!fresh.byKey.get(table.key)?.columns.has(split.column))
          throw new AppError('BAD_REQUEST', `Source table ${table.key} has no column ${split.column}`);
      }
      if (!mapping.tables[table.key]) {
        if (Object.keys(mapping.tables).length > 0)
          throw new AppError(
            'BAD_REQUEST',
            `Source table ${table.key} is not part of the mapping of ${target.name}: add it first with POST /api/mappings/${target.name}/tables (relationship "join" with join_on)`,
          );
        mapping.tables = { [table.key]: { relationship: 'primary' } };
      }
      const sourceField = `${table.key}.${split.column}`;
      const stored: StoredConnection = {
        source_field: sourceField,
        target_field: connection.target_field,
        status: connection.status,
        confidence: connection.confidence ?? null,
      };
      const others = mapping.connections.filter(
        (c) => !(c.source_field === sourceField && c.target_field === connection.target_field),
      );
      mapping.connections = [...others, stored];
      mapping.decisions = withoutDecisions(mapping, connection.target_field, sourceField);
      if (connection.status === 'confirmed')
        mapping.ambiguities = mapping.ambiguities.filter((a) => a.target_field !== connection.target_field);
    },
  );
  return mappingView(scope, workspace, mapping);
}

/** The mapping's refusals minus "no source" for the field and the refusal of this source for it. */
function withoutDecisions(mapping: TableMappingEntity, targetField: string, sourceField: string) {
  return (mapping.decisions ?? []).filter(
    (d) => !(d.target_field === targetField && (d.source_field === null || d.source_field === sourceField)),
  );
}

/** Records a person's refusal once; discovery reads it (mergeDiscovery). */
function withDecision(mapping: TableMappingEntity, decision: MappingDecision) {
  const others = (mapping.decisions ?? []).filter(
    (d) => !(d.target_field === decision.target_field && d.source_field === decision.source_field),
  );
  return [...others, decision];
}

/** A source field as written (bare or qualified table) → its stored spelling, if the mapping has it. */
function storedSourceField(mapping: TableMappingEntity, written: string): string {
  const split = splitSourceField(written);
  if (!split) return written;
  const key = mappingTableResolver(Object.keys(mapping.tables))(split.table);
  return key ? `${key}.${split.column}` : written;
}

export async function deleteConnection(
  scope: CallerScope,
  input: { table_name: string; source_field: string; target_field: string },
) {
  const { mapping, workspace } = await editMapping(
    scope,
    input.table_name,
    async ({ mapping }) => {
      const sourceField = storedSourceField(mapping, input.source_field);
      const kept = mapping.connections.filter(
        (c) => !(c.source_field === sourceField && c.target_field === input.target_field),
      );
      if (kept.length === mapping.connections.length)
        throw notFound(`Connection ${input.source_field} → ${input.target_field} of ${input.table_name}`);
      mapping.connections = kept;
      // Removing a connection by hand refuses it: a later discovery does not bring it back.
      if (input.target_field !== WILDCARD_FIELD)
        mapping.decisions = withDecision(mapping, {
          target_field: input.target_field,
          source_field: sourceField,
        });
    },
    { create: false },
  );
  return mappingView(scope, workspace, mapping);
}

export async function setTransformation(
  scope: CallerScope,
  input: {
    table_name: string;
    transformation: { target_field: string; expression: string; description?: string | null };
  },
) {
  const { transformation } = input;
  const { mapping, workspace } = await editMapping(
    scope,
    input.table_name,
    async ({ workspace, target, mapping }) => {
      if (!targetColumn(target, transformation.target_field))
        throw new AppError(
          'BAD_REQUEST',
          `Target table ${target.name} has no column ${transformation.target_field}`,
        );
      const tableKeys = Object.keys(mapping.tables);
      let catalog = await sourceCatalog(scope, workspace);
      try {
        await checkExpression(
          transformation.expression,
          tableKeys,
          catalog,
          `Transformation for ${transformation.target_field}`,
        );
      } catch (error) {
        // A column created since the catalog was read: look again before refusing.
        if (!(error instanceof AppError) || !/has no column/.test(error.message)) throw error;
        catalog = await sourceCatalog(scope, workspace, { refresh: true });
        await checkExpression(
          transformation.expression,
          tableKeys,
          catalog,
          `Transformation for ${transformation.target_field}`,
        );
      }
      const stored: StoredTransformation = {
        expression: transformation.expression,
        description: transformation.description ?? null,
      };
      mapping.transformations = { ...mapping.transformations, [transformation.target_field]: stored };
    },
  );
  return mappingView(scope, workspace, mapping);
}

export async function deleteTransformation(
  scope: CallerScope,
  input: { table_name: string; target_field: string },
) {
  const { mapping, workspace } = await editMapping(
    scope,
    input.table_name,
    async ({ mapping }) => {
      if (!mapping.transformations[input.target_field])
        throw notFound(`Transformation of ${input.table_name}.${input.target_field}`);
      const { [input.target_field]: _removed, ...rest } = mapping.transformations;
      mapping.transformations = rest;
    },
    { create: false },
  );
  return mappingView(scope, workspace, mapping);
}

// ---- table relationships ----

function tablesList(mapping: TableMappingEntity | null) {
  const entries = Object.entries(mapping?.tables ?? {}).map(([key, t]) => ({
    source_table: key,
    relationship: t.relationship,
    join_type: t.relationship === 'join' ? (t.join_type ?? 'left') : null,
    join_on: t.relationship === 'join' ? (t.join_on ?? null) : null,
    accept_fan_out: t.relationship === 'join' && t.accept_fan_out === true,
  }));
  return entries.sort(
    (a, b) =>
      Number(a.relationship === 'join') - Number(b.relationship === 'join') ||
      a.source_table.localeCompare(b.source_table),
  );
}

export async function getTables(scope: CallerScope, tableName: string) {
  const workspace = await currentWorkspace(scope);
  targetTableOf(workspace, tableName);
  const mapping = await findMapping(scope.em, workspace, tableName);
  const tables = tablesList(mapping);
  return {
    table_name: tableName,
    primary_table: tables.find((t) => t.relationship === 'primary')?.source_table ?? null,
    tables,
  };
}

export async function setTable(
  scope: CallerScope,
  input: {
    table_name: string;
    source_table: string;
    relationship: 'primary' | 'join';
    join_type?: string;
    join_on?: string;
    accept_fan_out?: boolean;
  },
) {
  await editMapping(scope, input.table_name, async ({ workspace, mapping }) => {
    const { table, catalog } = await resolveSourceTable(
      scope,
      workspace,
      input.source_table,
      await sourceCatalog(scope, workspace),
    );
    const entry: MappingTable = { relationship: input.relationship };
    if (input.relationship === 'join') {
      if (!input.join_on)
        throw new AppError(
          'BAD_REQUEST',
          `A join needs join_on: a condition such as customers.id = orders.customer_id`,
        );
      const keys = [...new Set([...Object.keys(mapping.tables), table.key])];
      const { tables } = await checkExpression(input.join_on, keys, catalog, `Join ON of ${table.key}`);
      if (!tables.has(table.key))
        throw new AppError('BAD_REQUEST', `Join ON of ${table.key} does not use ${table.key}`);
      entry.join_type = (input.join_type ?? 'left') as JoinType;
      entry.join_on = input.join_on;
      if (input.accept_fan_out) entry.accept_fan_out = true;
    } else if (input.join_type || input.join_on || input.accept_fan_out !== undefined) {
      throw new AppError(
        'BAD_REQUEST',
        'join_type, join_on and accept_fan_out apply to a join, not to the primary table',
      );
    }
    const tables = { ...mapping.tables };
    // A table written by its bare name replaces the same table stored under its qualified key.
    delete tables[input.source_table];
    tables[table.key] = entry;
    mapping.tables = tables;
  });
  return getTables(scope, input.table_name);
}

export async function removeTable(scope: CallerScope, input: { table_name: string; source_table: string }) {
  const { mapping, workspace, result } = await editMapping(
    scope,
    input.table_name,
    async ({ mapping }) => {
      const key = mappingTableResolver(Object.keys(mapping.tables))(input.source_table);
      if (!key) throw notFound(`Source table ${input.source_table} in the mapping of ${input.table_name}`);
      const { [key]: _removed, ...rest } = mapping.tables;
      mapping.tables = rest;
      const removed = mapping.connections.filter((c) => splitSourceField(c.source_field)?.table === key);
      mapping.connections = mapping.connections.filter((c) => !removed.includes(c));
      return removed;
    },
    { create: false },
  );
  return { ...(await mappingView(scope, workspace, mapping)), removed_connections: result };
}

function walkNodes(node: unknown, visit: (kind: string, value: Record<string, any>) => void) {
  if (Array.isArray(node)) {
    for (const item of node) walkNodes(item, visit);
    return;
  }
  if (!node || typeof node !== 'object') return;
  for (const [kind, value] of Object.entries(node as Record<string, unknown>)) {
    if (value && typeof value === 'object' && /^[A-Z]/.test(kind)) visit(kind, value as Record<string, any>);
    walkNodes(value, visit);
  }
}

const NUMERIC = new Set(['integer', 'bigint', 'numeric']);
const TIMES = new Set(['date', 'timestamp', 'timestamptz']);
function comparable(a: string, b: string): boolean {
  const fa = portableFamily(a);
  const fb = portableFamily(b);
  return fa === fb || (NUMERIC.has(fa) && NUMERIC.has(fb)) || (TIMES.has(fa) && TIMES.has(fb));
}

/**
 * Every problem of the table relationships at once: exactly one primary, joins reachable, tables
 * and join columns present in the source, the columns compared by `=` of comparable types.
 */
export async function validateTables(scope: CallerScope, tableName: string) {
  const workspace = await currentWorkspace(scope);
  targetTableOf(workspace, tableName);
  const mapping = await findMapping(scope.em, workspace, tableName);
  const problems: AppErrorIssue[] = [];
  const tables = mapping?.tables ?? {};
  if (Object.keys(tables).length === 0)
    problems.push({ path: ['tables'], message: 'The mapping has no tables' });
  const catalog = await sourceCatalog(scope, workspace, { refresh: true });
  for (const key of Object.keys(tables))
    if (!catalog.byKey.has(key))
      problems.push({
        path: ['tables', key],
        message: `Source table ${key} does not exist in the source database`,
      });
  // The relationship rules of the generator, on the tables alone.
  try {
    await planMapping({ table_name: tableName, tables, connections: [] }, { name: tableName, columns: [] });
  } catch (error) {
    if (!(error instanceof AppError)) throw error;
    problems.push(...(error.details.issues ?? [{ path: ['tables'], message: error.message }]));
  }
  const resolve = mappingTableResolver(Object.keys(tables));
  const columnType = (fields: string[]): { name: string; type: string | null; problem?: string } => {
    const column = fields.at(-1)!;
    const written = fields.slice(0, -1).join('.');
    const key =
      fields.length === 1
        ? Object.keys(tables).length === 1
          ? Object.keys(tables)[0]
          : undefined
        : resolve(written);
    const name = fields.join('.');
    if (!key) return { name, type: null };
    const table = catalog.byKey.get(key);
    if (!table) return { name, type: null };
    const type = table.columns.get(column);
    return type
      ? { name, type }
      : { name, type: null, problem: `Source table ${key} has no column ${column}` };
  };
  for (const [key, relation] of Object.entries(tables)) {
    if (relation.relationship !== 'join' || !relation.join_on) continue;
    let ast: ExpressionNode;
    try {
      ast = (await parseExpression(relation.join_on)).ast;
    } catch {
      continue; // reported by the generator's rules above
    }
    const columnRefs: string[][] = [];
    walkNodes(ast, (kind, value) => {
      if (kind === 'ColumnRef')
        columnRefs.push((value.fields as any[]).filter((f) => f.String).map((f) => f.String.sval));
    });
    for (const fields of columnRefs) {
      const { problem } = columnType(fields);
      if (problem)
        problems.push({ path: ['tables', key, 'join_on'], message: `Join ON of ${key}: ${problem}` });
    }
    walkNodes(ast, (kind, value) => {
      if (kind !== 'A_Expr' || value.kind !== 'AEXPR_OP') return;
      const op = value.name?.[0]?.String?.sval;
      if (!['=', '<>', '!=', '<', '>', '<=', '>='].includes(op)) return;
      const side = (n: any) =>
        n?.ColumnRef
          ? columnType(n.ColumnRef.fields.filter((f: any) => f.String).map((f: any) => f.String.sval))
          : null;
      const left = side(value.lexpr);
      const right = side(value.rexpr);
      if (left?.type && right?.type && !comparable(left.type, right.type))
        problems.push({
          path: ['tables', key, 'join_on'],
          message: `Join ON of ${key}: ${left.name} (${left.type}) and ${right.name} (${right.type}) are not comparable types`,
        });
    });
  }
  // Fan-out only means something for joins that are otherwise sound.
  const fanOut = problems.length
    ? []
    : await measureFanOut(await sourceWarehouseOf(scope, workspace), tableName, tables);
  problems.push(...fanOutProblems(fanOut));
  return { table_name: tableName, valid: problems.length === 0, problems, fan_out: fanOut };
}

// ---- wildcard ----

/** Target columns filled by name from the wildcard tables; explicit connections and transformations win. */
export function wildcardFields(
  mapping: TableMappingEntity,
  target: TargetTable,
  catalog: SourceCatalog | null,
) {
  const wildcards = mapping.connections
    .filter((c) => c.target_field === WILDCARD_FIELD && !c.stale)
    .map((c) => splitSourceField(c.source_field)!.table);
  return target.columns.map((column) => {
    const transformation = mapping.transformations[column.name];
    if (transformation && !transformation.stale)
      return {
        target_field: column.name,
        source_field: null,
        expression: transformation.expression,
        origin: 'transformation' as const,
        status: 'confirmed' as const,
      };
    const explicit = mapping.connections.filter((c) => c.target_field === column.name && !c.stale);
    const best =
      explicit.find((c) => c.status === 'confirmed') ??
      [...explicit].sort((a, b) => (b.confidence ?? 0) - (a.confidence ?? 0))[0];
    if (best)
      return {
        target_field: column.name,
        source_field: best.source_field,
        expression: null,
        origin: 'connection' as const,
        status: best.status,
      };
    for (const key of wildcards) {
      const columns = catalog?.byKey.get(key)?.columns;
      const match = columns && [...columns.keys()].find((c) => c.toLowerCase() === column.name.toLowerCase());
      if (match)
        return {
          target_field: column.name,
          source_field: `${key}.${match}`,
          expression: null,
          origin: 'wildcard' as const,
          status: 'confirmed' as const,
        };
    }
    return {
      target_field: column.name,
      source_field: null,
      expression: null,
      origin: 'unmapped' as const,
      status: null,
    };
  });
}

export async function effectiveWildcard(scope: CallerScope, tableName: string) {
  const { workspace, mapping } = await requireMapping(scope, tableName);
  const target = targetTableOf(workspace, tableName);
  const wildcardTables = mapping.connections
    .filter((c) => c.target_field === WILDCARD_FIELD)
    .map((c) => splitSourceField(c.source_field)!.table);
  const catalog = wildcardTables.length ? await sourceCatalog(scope, workspace) : null;
  return {
    table_name: tableName,
    wildcard_tables: wildcardTables,
    fields: wildcardFields(mapping, target, catalog),
  };
}

/**
 * The mapping as the generators take it: wildcards expanded into connections, stale entries (fields
 * the schema no longer has) left out.
 */
export async function generationInput(
  scope: Scope,
  workspace: WorkspaceEntity,
  mapping: TableMappingEntity,
): Promise<{ mapping: Mapping; target: TargetTable }> {
  const target = targetTableOf(workspace, mapping.tableName);
  const hasWildcard = mapping.connections.some((c) => c.target_field === WILDCARD_FIELD);
  const connections = mapping.connections
    .filter((c) => !c.stale && c.target_field !== WILDCARD_FIELD)
    .map(({ source_field, target_field, status, confidence }) => ({
      source_field,
      target_field,
      status,
      confidence,
    }));
  if (hasWildcard) {
    const catalog = await sourceCatalog(scope, workspace);
    for (const field of wildcardFields(mapping, target, catalog))
      if (field.origin === 'wildcard')
        connections.push({
          source_field: field.source_field!,
          target_field: field.target_field,
          status: 'confirmed',
          confidence: 1,
        });
  }
  const transformations = Object.fromEntries(
    Object.entries(mapping.transformations)
      .filter(([, t]) => !t.stale)
      .map(([field, t]) => [field, { expression: t.expression, description: t.description }]),
  );
  return {
    mapping: { table_name: mapping.tableName, tables: mapping.tables, connections, transformations },
    target,
  };
}

// ---- ambiguities ----

export async function resolveAmbiguity(
  scope: CallerScope,
  input: { resolve_input: { table_name: string; target_field: string; source_field: string | null } },
) {
  const { table_name, target_field, source_field } = input.resolve_input;
  const { mapping, workspace } = await editMapping(
    scope,
    table_name,
    async ({ mapping }) => {
      const ambiguity = mapping.ambiguities.find((a) => a.target_field === target_field);
      if (!ambiguity) throw notFound(`Open ambiguity for ${table_name}.${target_field}`);
      const candidates = ambiguity.candidates.map((c) => storedSourceField(mapping, c.source_field));
      const chosen = source_field === null ? null : storedSourceField(mapping, source_field);
      if (chosen !== null && !candidates.includes(chosen))
        throw new AppError(
          'BAD_REQUEST',
          `${source_field} is not a candidate for ${target_field}; choose one of ${candidates.join(', ')} or null for none`,
        );
      // The candidates that lost are suggestions no longer; the choice becomes a confirmed connection.
      mapping.connections = mapping.connections.filter(
        (c) =>
          !(
            c.target_field === target_field &&
            (candidates.includes(c.source_field) || c.source_field === chosen)
          ),
      );
      if (chosen) {
        const candidate = ambiguity.candidates[candidates.indexOf(chosen)];
        mapping.connections.push({
          source_field: chosen,
          target_field,
          status: 'confirmed',
          confidence: candidate.confidence ?? null,
        });
        const table = splitSourceField(chosen)?.table;
        if (table && Object.keys(mapping.tables).length === 0)
          mapping.tables = { [table]: { relationship: 'primary' } };
      } else mapping.decisions = withDecision(mapping, { target_field, source_field: null });
      mapping.ambiguities = mapping.ambiguities.filter((a) => a !== ambiguity);
    },
    { create: false },
  );
  return mappingView(scope, workspace, mapping);
}

// ---- discovery writes (used by the discovery agent and setup-environment) ----

/**
 * Writes discovery's suggestions into a table's mapping under the person's decisions
 * (mergeDiscovery). The version moves only when the mapping changed. Runs on the given em (the
 * caller's transaction) and leaves the flush to it.
 */
export async function writeSuggestions(
  scope: Scope,
  workspace: WorkspaceEntity,
  tableName: string,
  found: DiscoveredMapping,
  options: { autoConfirm?: number | null } = {},
) {
  let mapping = await findMapping(scope.em, workspace, tableName);
  if (!mapping)
    mapping = scope.em.create(TableMapping, {
      organization: workspace.organization.id,
      workspace: workspace.id,
      tableName,
      tables: {},
      connections: [],
      transformations: {},
      ambiguities: [],
      version: 0,
    });
  const before = mapping.version === 0 ? null : canonicalMapping(mapping);
  const merged = mergeDiscovery(mapping, found, options);
  const changed = before !== canonicalMapping({ ...merged, transformations: mapping.transformations });
  if (changed) {
    mapping.tables = merged.tables;
    mapping.connections = merged.connections;
    mapping.ambiguities = merged.ambiguities;
    mapping.version += 1;
    invalidateWorkspaceCaches(workspace.organization.id, workspace.id);
  }
  return { mapping, changed, kept: merged.kept };
}

// ---- clear-all ----

export async function clearAll(scope: CallerScope, input: { confirm_workspace_name?: string }) {
  const workspace = await currentWorkspace(scope);
  if (input.confirm_workspace_name !== workspace.name)
    throw new AppError(
      'BAD_REQUEST',
      `Clearing removes every mapping and committed transformation of workspace ${workspace.name}; confirm by passing confirm_workspace_name=${workspace.name}`,
    );
  const where = { organization: workspace.organization.id, workspace: workspace.id };
  const { deletedMappings, deletedCommits } = await scope.em.transactional(async (em) => ({
    deletedCommits: await em.nativeDelete(MappingCommit, where),
    deletedMappings: await em.nativeDelete(TableMapping, where),
  }));
  invalidateWorkspaceCaches(workspace.organization.id, workspace.id);
  return {
    success: true as const,
    workspace_name: workspace.name,
    deleted_mappings: deletedMappings,
    deleted_commits: deletedCommits,
  };
}

// ---- the workspace's files, facts and schema reconciliation ----

export async function latestCommits(em: EntityManager, workspace: WorkspaceEntity) {
  const commits = await em.find(
    MappingCommit,
    { organization: workspace.organization.id, workspace: workspace.id },
    { orderBy: { tableName: 'asc', version: 'desc' } },
  );
  const latest = new Map<string, (typeof commits)[number]>();
  for (const c of commits) if (!latest.has(c.tableName)) latest.set(c.tableName, c);
  return latest;
}

export const mappingFilePath = (tableName: string) => `mappings/${tableName}.json`;
export const sqlFilePath = (tableName: string) => `mappings/${tableName}.sql`;

export async function mappingFiles(scope: Scope, workspace: WorkspaceEntity): Promise<WorkspaceFile[]> {
  const mappings = await scope.em.find(TableMapping, {
    organization: workspace.organization.id,
    workspace: workspace.id,
  });
  const files: WorkspaceFile[] = mappings.map((m) => ({
    path: mappingFilePath(m.tableName),
    content: JSON.stringify(mappingDocument(m), null, 2) + '\n',
  }));
  for (const [table, commit] of await latestCommits(scope.em, workspace))
    files.push({
      path: sqlFilePath(table),
      content: `-- ${table}, committed version ${commit.version}: ${commit.message.split('\n')[0]}\n${commit.sql}\n`,
    });
  return files;
}

registerWorkspaceExtension({
  name: 'mappings',
  files: mappingFiles,
  async facts(scope, workspace) {
    const mappings = await scope.em.find(TableMapping, {
      organization: workspace.organization.id,
      workspace: workspace.id,
    });
    let mappedTables = 0;
    let mappedFields = 0;
    let confirmed = 0;
    let suggested = 0;
    let ambiguities = 0;
    let materialized = 0;
    let last: Date | null = null;
    for (const m of mappings) {
      const fields = new Set<string>();
      for (const c of m.connections) {
        if (c.stale) continue;
        if (c.status === 'confirmed') confirmed++;
        else suggested++;
        if (c.target_field !== WILDCARD_FIELD) fields.add(c.target_field);
      }
      for (const [field, t] of Object.entries(m.transformations)) if (!t.stale) fields.add(field);
      if (fields.size) mappedTables++;
      mappedFields += fields.size;
      ambiguities += m.ambiguities.length;
      if (m.materializedAt) {
        materialized++;
        if (!last || m.materializedAt > last) last = m.materializedAt;
      }
    }
    return {
      mapped_tables: mappedTables,
      mapped_fields: mappedFields,
      confirmed_connections: confirmed,
      suggested_connections: suggested,
      open_ambiguities: ambiguities,
      materialized_tables: materialized,
      last_materialized_at: last,
    };
  },
  async reconcileSchema(scope, workspace, schema) {
    const mappings = await scope.em.find(TableMapping, {
      organization: workspace.organization.id,
      workspace: workspace.id,
    });
    const stale: StaleConnection[] = [];
    for (const m of mappings) {
      const table = schema?.tables.find((t) => t.name === m.tableName);
      const columns = new Set(table?.columns.map((c) => c.name) ?? []);
      const why = (field: string) =>
        !table
          ? `table ${m.tableName} is no longer in the schema`
          : columns.has(field)
            ? null
            : `column ${m.tableName}.${field} is no longer in the schema`;
      let changed = false;
      const connections = m.connections.map((c) => {
        const reason =
          c.target_field === WILDCARD_FIELD ? (table ? null : why(c.target_field)) : why(c.target_field);
        if (reason)
          stale.push({
            target_table: m.tableName,
            target_field: c.target_field,
            source_field: c.source_field,
            reason,
          });
        if ((c.stale ?? null) !== reason) changed = true;
        return reason ? { ...c, stale: reason } : (({ stale: _s, ...rest }) => rest)(c);
      });
      const transformations = Object.fromEntries(
        Object.entries(m.transformations).map(([field, t]) => {
          const reason = why(field);
          if (reason)
            stale.push({ target_table: m.tableName, target_field: field, source_field: null, reason });
          if ((t.stale ?? null) !== reason) changed = true;
          return [field, reason ? { ...t, stale: reason } : (({ stale: _s, ...rest }) => rest)(t)];
        }),
      );
      if (changed) {
        m.connections = connections;
        m.transformations = transformations;
        m.version += 1;
      }
    }
    return stale;
  },
});
