import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { isFeatureEnabled } from '../../features.ts';
import { connectionConfigSchema, type ConnectionConfig } from '../../warehouse/config.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import type { IntrospectedTable, Warehouse } from '../../warehouse/warehouse.ts';
import { enqueueIdentityResolution, IDENTITY_RESOLUTION_KIND } from './monitoring.jobs.ts';
import { listQualityConfigs } from '../schemas/quality-configs.service.ts';
import { tableAssignments, workspaceDestinations } from '../schemas/reverse-etl.service.ts';
import {
  connectionConfig,
  requiredConnectionConfig,
  currentWorkspace,
  targetSchemaOf,
  type WorkspaceEntity,
} from '../workspaces/workspaces.service.ts';
import { createGraphSchema, graphLocation, graphStatistics } from './identity.service.ts';
import {
  measureTables,
  previousMeasurements,
  storeSnapshots,
  tableMetricsView,
} from './monitoring-metrics.ts';
import { IdentityGraph } from './monitoring.entity.ts';
import { PROFILE_TABLE } from '../../quality/golden-records.ts';

/** Tables one metrics request measures; more are reported as `truncated` (monitoring runs measure all configured ones). */
const MAX_TABLES_PER_REQUEST = 100;

function requireTarget(scope: CallerScope, workspace: WorkspaceEntity): ConnectionConfig {
  const config = requiredConnectionConfig(scope, workspace, 'target');
  return config;
}

const byName = (a: IntrospectedTable, b: IntrospectedTable) =>
  a.schema.localeCompare(b.schema) || a.name.localeCompare(b.name);

/** Freshness columns named by the workspace's table monitoring configs (target side). */
async function configuredTimestampColumns(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  targetSchema: string,
) {
  const configs = await listQualityConfigs(scope, workspace);
  const columns = new Map<string, string>();
  for (const t of configs.table_monitoring) {
    const column = t.config.freshness?.column;
    if (!column || t.orphaned) continue;
    columns.set(t.schema_type === 'target' ? `${targetSchema}.${t.table_name}` : t.table_name, column);
  }
  return columns;
}

async function measure(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  input: {
    warehouse: Warehouse;
    database: string;
    schemas: string[];
    dataSource: string;
    tables: IntrospectedTable[];
    missing: string[];
    timestampColumns?: Map<string, string>;
  },
) {
  const truncated = input.tables.length > MAX_TABLES_PER_REQUEST;
  const tables = input.tables.slice(0, MAX_TABLES_PER_REQUEST);
  // Only a column the table still has: a stale config must not fail the whole measurement.
  const timestampColumns = new Map(
    [...(input.timestampColumns ?? [])].filter(([label, column]) =>
      tables.some((t) => `${t.schema}.${t.name}` === label && t.columns.some((c) => c.name === column)),
    ),
  );
  const labels = tables.map((t) => `${t.schema}.${t.name}`);
  const previous = await previousMeasurements(scope.em, workspace.id, input.dataSource, labels);
  const measuredAt = new Date();
  const results = await measureTables(input.warehouse, tables, {
    timeoutMs: scope.deps.env.WAREHOUSE_STATEMENT_TIMEOUT_MS,
    timestampColumns,
  });
  const measured = results.flatMap((r) => (r.metrics ? [r.metrics] : []));
  await storeSnapshots(
    scope.em,
    {
      organizationId: organizationOf(scope.principal),
      workspaceId: workspace.id,
      dataSource: input.dataSource,
    },
    measured,
  );
  return {
    workspace_name: workspace.name,
    data_source: input.dataSource,
    database: input.database,
    schemas: input.schemas,
    measured_at: measuredAt,
    tables: measured.map((m) => tableMetricsView(m, previous.get(m.table))),
    missing_tables: input.missing,
    errors: results.flatMap((r) =>
      r.error ? [{ table: `${r.table.schema}.${r.table.name}`, message: r.error }] : [],
    ),
    truncated,
  };
}

/**
 * Metrics of the workspace's target tables: those of schema.json (in its order) in the target
 * schema, or every table of the target schema when there is no schema.json yet.
 */
export async function workspaceMetrics(scope: CallerScope, input: { first_table_only: boolean }) {
  const workspace = await currentWorkspace(scope);
  const config = requireTarget(scope, workspace);
  const targetSchema = config.schemas[0];
  const warehouse = await warehouses(scope.deps).open(config, `${workspace.id}:target`);
  let names = targetSchemaOf(workspace)?.tables.map((t) => t.name) ?? null;
  if (names && input.first_table_only) names = names.slice(0, 1);
  let tables: IntrospectedTable[] = [];
  let missing: string[] = [];
  if (names === null) {
    tables = (await warehouse.introspect({ schemas: [targetSchema] })).tables.sort(byName);
    if (input.first_table_only) tables = tables.slice(0, 1);
  } else if (names.length > 0) {
    const found = (await warehouse.introspect({ schemas: [targetSchema], tables: names })).tables;
    tables = names.flatMap((n) => found.filter((t) => t.name === n));
    missing = names.filter((n) => !found.some((t) => t.name === n));
  }
  // The identity graph's unified profiles are a table of the target too, once built.
  const graph = input.first_table_only ? null : await graphOf(scope, workspace);
  const profiles = graph
    ? (await warehouse.introspect({ schemas: [graph.schemaName], tables: [PROFILE_TABLE] })).tables
    : [];
  tables = [...tables, ...profiles];
  return measure(scope, workspace, {
    warehouse,
    database: config.database,
    schemas: profiles.length ? [targetSchema, graph!.schemaName] : [targetSchema],
    dataSource: 'target',
    tables,
    missing,
    timestampColumns: await configuredTimestampColumns(scope, workspace, targetSchema),
  });
}

/** A reverse-ETL connection of the workspace as a warehouse connection (postgres destinations only). */
async function reverseEtlConfig(scope: CallerScope, workspace: WorkspaceEntity, name: string) {
  const { destinations } = await workspaceDestinations(scope, workspace);
  const destination = destinations.find((d) => d.name === name) as Record<string, unknown> | undefined;
  if (!destination)
    throw notFound(`Data source ${name} (use source, target or a reverse-ETL connection name)`);
  if (destination.type !== 'postgres')
    throw new AppError(
      'BAD_REQUEST',
      `Connection ${name} is a ${String(destination.type)} destination: only database connections have tables to measure`,
    );
  const password = typeof destination.password === 'string' ? destination.password : undefined;
  const parsed = connectionConfigSchema.safeParse({
    type: 'postgres',
    host: destination.host,
    port: destination.port,
    database: destination.database,
    user: destination.user,
    ...(password ? { password: scope.deps.secrets.decrypt(password) } : {}),
    schemas: [destination.schema ?? 'public'],
    ssl: destination.ssl ?? false,
  });
  if (!parsed.success)
    throw new AppError('UNPROCESSABLE_CONTENT', `Connection ${name} is not a complete database connection`);
  return parsed.data;
}

/** Metrics of a data source of the current workspace: its source, its target or a reverse-ETL connection. */
export async function datasourceMetrics(scope: CallerScope, configName: string) {
  const workspace = await currentWorkspace(scope);
  let config: ConnectionConfig;
  let owner: string;
  let dataSource: string;
  let only: string[] | undefined;
  if (configName === 'source' || configName === 'target') {
    const found = connectionConfig(scope, workspace, configName);
    if (!found)
      throw new AppError(
        'CONFLICT',
        `Workspace ${workspace.name} has no ${configName === 'source' ? 'source database' : 'target warehouse'} configured`,
        { reason: configName === 'source' ? 'NO_SOURCE_CONFIG' : 'NO_TARGET_CONFIG' },
      );
    config = found;
    owner = `${workspace.id}:${configName}`;
    dataSource = configName;
  } else {
    config = await reverseEtlConfig(scope, workspace, configName);
    owner = `${workspace.id}:reverse-etl:${configName}`;
    dataSource = `connection:${configName}`;
    // The tables assigned to this connection; none assigned → every table of its schema.
    const assigned = (await tableAssignments(scope, workspace)).filter(
      (a) => a.connection_name === configName,
    );
    if (assigned.length > 0) only = assigned.map((a) => a.destination_table || a.table_name);
  }
  const warehouse = await warehouses(scope.deps).open(config, owner);
  const introspected = await warehouse.introspect(only ? { schemas: config.schemas, tables: only } : {});
  const tables = introspected.tables.sort(byName);
  const missing = (only ?? []).filter(
    (n) => !tables.some((t) => t.name === n || `${t.schema}.${t.name}` === n),
  );
  return measure(scope, workspace, {
    warehouse,
    database: config.database,
    schemas: introspected.schemas,
    dataSource,
    tables,
    missing,
  });
}

// ---- identity graph ----

async function graphOf(scope: CallerScope, workspace: WorkspaceEntity) {
  return scope.em.findOne(IdentityGraph, {
    organization: organizationOf(scope.principal),
    workspace: workspace.id,
  });
}

export async function identityGraphWorkspace(scope: CallerScope, input: { database?: string }) {
  const workspace = await currentWorkspace(scope);
  const config = requireTarget(scope, workspace);
  const graph = await graphOf(scope, workspace);
  const { database, schema } = graphLocation(config, graph);
  if (input.database !== undefined && input.database !== database)
    throw notFound(
      `Database ${input.database} (the identity graph of ${workspace.name} lives in ${database})`,
    );
  // The run before the graph: a build commits the graph before its run is marked ended, so a run
  // read as ended comes with its graph (read the other way round, a poll could see the build
  // succeeded beside the graph as it was before).
  const [run] = await scope.deps.jobs.listRuns(
    organizationOf(scope.principal),
    { workspaceId: workspace.id, kind: IDENTITY_RESOLUTION_KIND, limit: 1 },
    scope.em,
  );
  const warehouse = await warehouses(scope.deps).open(config, `${workspace.id}:target`);
  const { stats, largest, profiles } = await graphStatistics(
    warehouse,
    schema,
    scope.deps.env.WAREHOUSE_STATEMENT_TIMEOUT_MS,
  );
  const lastBuild = run ? { run_id: run.id, status: run.status, error: run.error, result: run.result } : null;
  let message: string;
  if (stats.built) message = `Built at ${stats.last_built_at!.toISOString()}`;
  else if (!graph && !stats.built)
    message =
      'Never built: POST /api/monitoring/identity-graph/create-schema creates the tables and queues a build';
  else if (run && (run.status === 'queued' || run.status === 'running'))
    message = 'Never built: a build is under way';
  else if (run?.status === 'failed')
    message = `Never built: the last build failed: ${run.error ?? 'unknown error'}`;
  else if (typeof run?.result?.skipped === 'string') message = `Never built: ${run.result.skipped}`;
  else message = 'Never built';
  return {
    workspace_name: workspace.name,
    database,
    schema,
    schema_created: !!graph,
    built: stats.built,
    message,
    last_built_at: stats.last_built_at,
    identifiers: stats.identifiers,
    identifiers_by_type: stats.identifiers_by_type,
    edges: stats.edges,
    ignored_edges: stats.ignored_edges,
    flagged_identifiers: stats.flagged_identifiers,
    identifiers_near_max_degree: stats.identifiers_near_max_degree,
    near_max_degree_from: stats.near_max_degree_from,
    clusters: stats.clusters,
    singletons: stats.singletons,
    largest_cluster: stats.largest_cluster,
    cluster_size_distribution: stats.cluster_size_distribution,
    largest_clusters: largest,
    recent_runs: stats.recent_runs,
    unified_profiles: profiles && {
      table: `${schema}.${PROFILE_TABLE}`,
      profiles: profiles.profiles,
      records_without_profile: profiles.recordsWithoutProfile,
      records_without_profile_by_source: profiles.recordsWithoutProfileBySource,
    },
    last_build: lastBuild,
  };
}

const IDENTITY_TABLES = [
  'identity_nodes',
  'identity_edges',
  'identity_records',
  'identity_clusters',
  'identity_runs',
];

/** Creates the identity tables (idempotent) and, with identity resolution on, queues a build. */
export async function createIdentityGraphSchema(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const config = requireTarget(scope, workspace);
  const organization = organizationOf(scope.principal);
  let graph = await graphOf(scope, workspace);
  const { database, schema } = graphLocation(config, graph);
  const warehouse = await warehouses(scope.deps).open(config, `${workspace.id}:target`);
  const { created } = await createGraphSchema(warehouse, schema);
  graph ??= scope.em.create(IdentityGraph, {
    organization,
    workspace: workspace.id,
    database,
    schemaName: schema,
    createdBy: scope.principal.username,
  });
  await scope.em.flush();
  const enabled = await isFeatureEnabled(scope, 'identity_resolution');
  const build = enabled
    ? await enqueueIdentityResolution(scope.deps, {
        organizationId: organization,
        workspaceId: workspace.id,
        reason: 'create_schema',
      })
    : null;
  return {
    workspace_name: workspace.name,
    database,
    schema,
    created,
    tables: IDENTITY_TABLES.map((t) => `${schema}.${t}`),
    view: `${schema}.identity_profiles`,
    build,
    message: `${created ? 'Created' : 'Already present'}: ${schema} in ${database}. ${
      build
        ? 'A build of the graph from the mapped tables is queued.'
        : 'Identity resolution is disabled for this organization (feature identity_resolution): no build was queued.'
    }`,
  };
}
