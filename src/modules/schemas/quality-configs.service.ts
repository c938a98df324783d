import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import {
  columnMonitoringConfigSchema,
  columnTestConfigSchema,
  tableMonitoringConfigSchema,
  type ColumnMonitoringConfig,
  type ColumnTestConfig,
  type KeyTest,
  type TableMonitoringConfig,
} from '../../quality/rules.ts';
import { portableFamily } from '../../warehouse/types.ts';
import type { IntrospectedTable } from '../../warehouse/warehouse.ts';
import { workspaceWarehouse } from '../sources/sources.service.ts';
import {
  connectionConfig,
  currentWorkspace,
  targetSchemaOf,
  type WorkspaceEntity,
} from '../workspaces/workspaces.service.ts';
import { replaceTargetSchema } from '../workspaces/workspaces-schema.service.ts';
import { SchemaConfig, type SchemaConfigEntity, type SchemaSide } from './schemas.entity.ts';
import type { TargetSchema } from './schemas.schemas.ts';
import {
  columnTestProblems,
  rangeProblems,
  refuseProblems,
  storedTestProblems,
  TEMPORAL,
  type ColumnInfo,
} from './column-test-problems.ts';
import { impliedTests, tableTests, type TableColumnTests } from '../../quality/table-tests.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';

/*
 * Column tests live on the schema.json column (`tests`), where the transformation project reads them
 * (src/transform/dbt.ts); monitoring thresholds are SchemaConfig rows, so editing them never makes the
 * project drift. Every config is checked against the schema it names: an unknown table or column → 404.
 */

type ColumnTest = ReturnType<typeof columnTestConfigSchema.parse>;
type ColumnMonitoring = ReturnType<typeof columnMonitoringConfigSchema.parse>;
type TableMonitoring = ReturnType<typeof tableMonitoringConfigSchema.parse>;

interface ResolvedTable {
  /** How configs name the table: bare for the target, schema.table for the source. */
  name: string;
  columns: ColumnInfo[];
}

const badConfig = (path: (string | number)[], message: string) =>
  new AppError('BAD_REQUEST', message, { issues: [{ path: ['config', ...path], message }] });

function requireSchema(workspace: WorkspaceEntity): TargetSchema {
  const schema = targetSchemaOf(workspace);
  if (!schema)
    throw new AppError('NOT_FOUND', `Workspace ${workspace.name} has no schema.json; assign a schema first`);
  return schema;
}

function targetTable(workspace: WorkspaceEntity, tableName: string): ResolvedTable {
  const table = requireSchema(workspace).tables.find((t) => t.name === tableName);
  if (!table) throw notFound(`Table ${tableName} of the target schema`);
  return {
    name: table.name,
    columns: table.columns.map((c) => ({ name: c.name, family: portableFamily(c.type) })),
  };
}

/** A source table (`schema.table`, or a bare name found in the source config's schemas in order). */
async function sourceTable(scope: CallerScope, tableName: string): Promise<ResolvedTable> {
  const { config, warehouse } = await workspaceWarehouse(scope, 'source');
  const dot = tableName.indexOf('.');
  const schemas = dot > 0 ? [tableName.slice(0, dot)] : config.schemas;
  const bare = dot > 0 ? tableName.slice(dot + 1) : tableName;
  const found = await warehouse.introspect({ schemas, tables: [bare] });
  const table = schemas
    .map((s) => found.tables.find((t: IntrospectedTable) => t.schema === s && t.name === bare))
    .find(Boolean);
  if (!table) throw notFound(`Table ${tableName} of the source database`);
  return {
    name: `${table.schema}.${table.name}`,
    // A domain column is tested as the type it is over (a range on a domain over numeric).
    columns: table.columns.map((c) => ({ name: c.name, family: portableFamily(c.base_type) })),
  };
}

const resolveTable = (scope: CallerScope, workspace: WorkspaceEntity, side: SchemaSide, name: string) =>
  side === 'target' ? Promise.resolve(targetTable(workspace, name)) : sourceTable(scope, name);

function column(table: ResolvedTable, side: SchemaSide, name: string): ColumnInfo {
  const found = table.columns.find((c) => c.name === name);
  if (!found) throw notFound(`Column ${table.name}.${name} of the ${side} schema`);
  return found;
}

// ---- column tests (target schema.json) ----

function testView(
  workspace: WorkspaceEntity,
  tableName: string,
  columnName: string,
  tests: unknown,
  problems: string[] = [],
) {
  const parsed = tests === undefined ? null : columnTestConfigSchema.safeParse(tests);
  const table = requireSchema(workspace).tables.find((t) => t.name === tableName)!;
  return {
    workspace_name: workspace.name,
    schema_type: 'target' as const,
    table_name: tableName,
    column_name: columnName,
    configured: !!parsed?.success,
    config: parsed?.success ? parsed.data : null,
    implied: impliedTests(table, columnName),
    problems,
  };
}

function schemaColumn(workspace: WorkspaceEntity, tableName: string, columnName: string) {
  targetTable(workspace, tableName);
  const table = requireSchema(workspace).tables.find((t) => t.name === tableName)!;
  const col = table.columns.find((c) => c.name === columnName);
  if (!col) throw notFound(`Column ${tableName}.${columnName} of the target schema`);
  return col;
}

export async function getColumnTest(scope: CallerScope, tableName: string, columnName: string) {
  const workspace = await currentWorkspace(scope);
  const stored = schemaColumn(workspace, tableName, columnName);
  const schema = requireSchema(workspace);
  // Tests saved before they were checked against the type still run (and fail there): say why.
  const problems = storedTestProblems(
    schema,
    schema.tables.find((t) => t.name === tableName)!,
    stored,
  );
  return testView(
    workspace,
    tableName,
    columnName,
    stored.tests,
    problems.map((p) => p.message),
  );
}

async function writeColumnTests(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  tableName: string,
  columnName: string,
  tests: ColumnTest | undefined,
) {
  const next = structuredClone(requireSchema(workspace));
  const col = next.tables.find((t) => t.name === tableName)!.columns.find((c) => c.name === columnName)!;
  if (tests) col.tests = tests;
  else delete col.tests;
  await replaceTargetSchema(scope, workspace, next, {
    template: workspace.schemaTemplate ?? null,
    customized: true,
  });
}

export const putColumnTest = concurrentEdit(async function putColumnTest(
  scope: CallerScope,
  tableName: string,
  columnName: string,
  input: ColumnTestConfig,
) {
  const workspace = await currentWorkspace(scope);
  const table = targetTable(workspace, tableName);
  const col = column(table, 'target', columnName);
  const config = columnTestConfigSchema.parse(input);
  refuseProblems(columnTestProblems(requireSchema(workspace), table.name, col, config));
  await writeColumnTests(scope, workspace, tableName, columnName, config);
  return testView(workspace, tableName, columnName, config);
});

export const deleteColumnTest = concurrentEdit(async function deleteColumnTest(
  scope: CallerScope,
  tableName: string,
  columnName: string,
) {
  const workspace = await currentWorkspace(scope);
  if (schemaColumn(workspace, tableName, columnName).tests === undefined)
    throw notFound(`Test configuration of column ${tableName}.${columnName}`);
  await writeColumnTests(scope, workspace, tableName, columnName, undefined);
  return testView(workspace, tableName, columnName, undefined);
});

// ---- monitoring configs (SchemaConfig rows) ----

type MonitoringKind = 'column_monitoring' | 'table_monitoring';

function configRow(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  side: SchemaSide,
  tableName: string,
  columnName: string,
  kind: MonitoringKind,
) {
  return scope.em.findOne(SchemaConfig, {
    organization: organizationOf(scope.principal),
    workspace: workspace.id,
    schemaType: side,
    tableName,
    columnName,
    kind,
  });
}

async function upsert(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  key: { side: SchemaSide; tableName: string; columnName: string; kind: MonitoringKind },
  config: Record<string, unknown>,
) {
  let row = await configRow(scope, workspace, key.side, key.tableName, key.columnName, key.kind);
  const updatedBy = scope.principal.username;
  if (row) Object.assign(row, { config, updatedBy });
  else
    row = scope.em.create(SchemaConfig, {
      organization: organizationOf(scope.principal),
      workspace: workspace.id,
      schemaType: key.side,
      tableName: key.tableName,
      columnName: key.columnName,
      kind: key.kind,
      config,
      updatedBy,
    });
  await scope.em.flush();
  return row;
}

function columnMonitoringView(
  workspace: WorkspaceEntity,
  side: SchemaSide,
  tableName: string,
  columnName: string,
  row: SchemaConfigEntity | null,
) {
  return {
    workspace_name: workspace.name,
    schema_type: side,
    table_name: tableName,
    column_name: columnName,
    configured: !!row,
    config: row ? columnMonitoringConfigSchema.parse(row.config) : null,
    updated_at: row?.updatedAt ?? null,
  };
}

function tableMonitoringView(
  workspace: WorkspaceEntity,
  side: SchemaSide,
  tableName: string,
  row: SchemaConfigEntity | null,
) {
  return {
    workspace_name: workspace.name,
    schema_type: side,
    table_name: tableName,
    configured: !!row,
    config: row ? tableMonitoringConfigSchema.parse(row.config) : null,
    updated_at: row?.updatedAt ?? null,
  };
}

interface ColumnKey {
  table_name: string;
  column_name: string;
  schema_type: SchemaSide;
}

export async function getColumnMonitoring(scope: CallerScope, key: ColumnKey) {
  const workspace = await currentWorkspace(scope);
  const table = await resolveTable(scope, workspace, key.schema_type, key.table_name);
  const col = column(table, key.schema_type, key.column_name);
  const row = await configRow(scope, workspace, key.schema_type, table.name, col.name, 'column_monitoring');
  return columnMonitoringView(workspace, key.schema_type, table.name, col.name, row);
}

export const putColumnMonitoring = concurrentEdit(async function putColumnMonitoring(
  scope: CallerScope,
  key: ColumnKey,
  input: ColumnMonitoringConfig,
) {
  const workspace = await currentWorkspace(scope);
  const table = await resolveTable(scope, workspace, key.schema_type, key.table_name);
  const col = column(table, key.schema_type, key.column_name);
  const config = columnMonitoringConfigSchema.parse(input);
  refuseProblems(rangeProblems(config.range, table.name, col));
  const { min, max } = config.distinct ?? {};
  if (min !== undefined && max !== undefined && min > max)
    throw badConfig(['distinct'], 'distinct.min is greater than distinct.max');
  const row = await upsert(
    scope,
    workspace,
    { side: key.schema_type, tableName: table.name, columnName: col.name, kind: 'column_monitoring' },
    config,
  );
  return columnMonitoringView(workspace, key.schema_type, table.name, col.name, row);
});

export async function deleteColumnMonitoring(scope: CallerScope, key: ColumnKey) {
  const workspace = await currentWorkspace(scope);
  const table = await resolveTable(scope, workspace, key.schema_type, key.table_name);
  const col = column(table, key.schema_type, key.column_name);
  const row = await configRow(scope, workspace, key.schema_type, table.name, col.name, 'column_monitoring');
  if (!row) throw notFound(`Monitoring configuration of column ${table.name}.${col.name}`);
  await scope.em.remove(row).flush();
  return columnMonitoringView(workspace, key.schema_type, table.name, col.name, null);
}

interface TableKey {
  table_name: string;
  schema_type: SchemaSide;
}

export async function getTableMonitoring(scope: CallerScope, key: TableKey) {
  const workspace = await currentWorkspace(scope);
  const table = await resolveTable(scope, workspace, key.schema_type, key.table_name);
  const row = await configRow(scope, workspace, key.schema_type, table.name, '', 'table_monitoring');
  return tableMonitoringView(workspace, key.schema_type, table.name, row);
}

export const putTableMonitoring = concurrentEdit(async function putTableMonitoring(
  scope: CallerScope,
  key: TableKey,
  input: TableMonitoringConfig,
) {
  const workspace = await currentWorkspace(scope);
  const table = await resolveTable(scope, workspace, key.schema_type, key.table_name);
  const config = tableMonitoringConfigSchema.parse(input);
  const freshnessColumn = config.freshness?.column;
  if (freshnessColumn !== undefined) {
    const col = table.columns.find((c) => c.name === freshnessColumn);
    if (!col)
      throw badConfig(
        ['freshness', 'column'],
        `freshness.column: ${table.name} has no column ${freshnessColumn}`,
      );
    if (!TEMPORAL.has(col.family))
      throw badConfig(
        ['freshness', 'column'],
        `freshness.column: ${freshnessColumn} is ${col.family}, not a date or timestamp`,
      );
  }
  const { min_rows: minRows, max_rows: maxRows } = config.volume ?? {};
  if (minRows !== undefined && maxRows !== undefined && minRows > maxRows)
    throw badConfig(['volume'], 'volume.min_rows is greater than volume.max_rows');
  const row = await upsert(
    scope,
    workspace,
    { side: key.schema_type, tableName: table.name, columnName: '', kind: 'table_monitoring' },
    config,
  );
  return tableMonitoringView(workspace, key.schema_type, table.name, row);
});

export async function deleteTableMonitoring(scope: CallerScope, key: TableKey) {
  const workspace = await currentWorkspace(scope);
  const table = await resolveTable(scope, workspace, key.schema_type, key.table_name);
  const row = await configRow(scope, workspace, key.schema_type, table.name, '', 'table_monitoring');
  if (!row) throw notFound(`Monitoring configuration of table ${table.name}`);
  await scope.em.remove(row).flush();
  return tableMonitoringView(workspace, key.schema_type, table.name, null);
}

// ---- reading them all (the summary route, and the monitoring runner) ----

export interface QualityConfigs {
  workspace_name: string;
  /** The PostgreSQL schema target tables live in (the target config's first schema; 'public' without one). */
  target_schema: string;
  /**
   * What the runner runs on each target table: its tests as the transformation project writes them
   * (src/quality/table-tests.ts), stored and implied by the key and nullability.
   */
  table_tests: {
    table_name: string;
    columns: TableColumnTests[];
    key: KeyTest | null;
  }[];
  /** The stored column tests. Target table names are bare (in target_schema); source table names are `schema.table`. */
  column_tests: {
    schema_type: 'target';
    table_name: string;
    column_name: string;
    config: ColumnTest;
    orphaned: false;
  }[];
  column_monitoring: {
    schema_type: SchemaSide;
    table_name: string;
    column_name: string;
    config: ColumnMonitoring;
    /** The column is no longer in schema.json (target only; source configs are checked when written). */
    orphaned: boolean;
  }[];
  table_monitoring: {
    schema_type: SchemaSide;
    table_name: string;
    config: TableMonitoring;
    orphaned: boolean;
  }[];
}

/**
 * Every test and monitoring config of a workspace, parsed with the schemas of src/quality/rules.ts
 * (defaults such as severity filled in). For the monitoring runner: run what is not orphaned.
 */
export async function listQualityConfigs(
  scope: CallerScope,
  workspace: WorkspaceEntity,
): Promise<QualityConfigs> {
  const schema = targetSchemaOf(workspace);
  const columns = new Map<string, Set<string>>(
    (schema?.tables ?? []).map((t) => [t.name, new Set(t.columns.map((c) => c.name))]),
  );
  const columnTests: QualityConfigs['column_tests'] = [];
  for (const table of schema?.tables ?? [])
    for (const col of table.columns) {
      if (col.tests === undefined) continue;
      const parsed = columnTestConfigSchema.safeParse(col.tests);
      if (parsed.success)
        columnTests.push({
          schema_type: 'target',
          table_name: table.name,
          column_name: col.name,
          config: parsed.data,
          orphaned: false,
        });
    }
  const rows = await scope.em.find(
    SchemaConfig,
    {
      organization: organizationOf(scope.principal),
      workspace: workspace.id,
      kind: { $in: ['column_monitoring', 'table_monitoring'] },
    },
    { orderBy: { schemaType: 'asc', tableName: 'asc', columnName: 'asc' } },
  );
  const orphaned = (row: SchemaConfigEntity) =>
    row.schemaType === 'target' &&
    (!columns.has(row.tableName) ||
      (row.columnName !== '' && !columns.get(row.tableName)!.has(row.columnName)));
  return {
    workspace_name: workspace.name,
    target_schema: connectionConfig(scope, workspace, 'target')?.schemas[0] ?? 'public',
    table_tests: (schema?.tables ?? []).flatMap((table) => {
      const tests = tableTests(table);
      return tests.columns.length || tests.key ? [{ table_name: table.name, ...tests }] : [];
    }),
    column_tests: columnTests,
    column_monitoring: rows
      .filter((r) => r.kind === 'column_monitoring')
      .map((r) => ({
        schema_type: r.schemaType,
        table_name: r.tableName,
        column_name: r.columnName,
        config: columnMonitoringConfigSchema.parse(r.config),
        orphaned: orphaned(r),
      })),
    table_monitoring: rows
      .filter((r) => r.kind === 'table_monitoring')
      .map((r) => ({
        schema_type: r.schemaType,
        table_name: r.tableName,
        config: tableMonitoringConfigSchema.parse(r.config),
        orphaned: orphaned(r),
      })),
  };
}

const TEST_KINDS = ['not_null', 'unique', 'accepted_values', 'relationships', 'range', 'regex'] as const;

export async function qualityConfigsSummary(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const all = await listQualityConfigs(scope, workspace);
  const testsByKind: Record<string, number> = Object.fromEntries(TEST_KINDS.map((k) => [k, 0]));
  for (const t of all.column_tests)
    for (const k of TEST_KINDS) if (t.config[k] !== undefined && t.config[k] !== false) testsByKind[k]++;
  const tables = new Set(
    [...all.column_tests, ...all.column_monitoring, ...all.table_monitoring].map(
      (c) => `${c.schema_type}:${c.table_name}`,
    ),
  );
  return {
    workspace_name: workspace.name,
    totals: {
      column_tests: all.column_tests.length,
      column_monitoring: all.column_monitoring.length,
      table_monitoring: all.table_monitoring.length,
      tables_covered: tables.size,
      orphaned: [...all.column_monitoring, ...all.table_monitoring].filter((c) => c.orphaned).length,
    },
    tests_by_kind: testsByKind,
    column_tests: all.column_tests,
    column_monitoring: all.column_monitoring,
    table_monitoring: all.table_monitoring,
  };
}
