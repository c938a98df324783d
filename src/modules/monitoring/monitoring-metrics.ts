import type { EntityManager } from '@mikro-orm/postgresql';
import { computeTableMetrics, type TableMetrics } from '../../quality/metrics.ts';
import type { CopyOutRunner } from '../../quality/sql.ts';
import type { IntrospectedTable, Warehouse, WarehouseTransaction } from '../../warehouse/warehouse.ts';
import { MetricSnapshot } from './monitoring.entity.ts';

/** Snapshots older than this are pruned when a newer one of the workspace is stored. */
const SNAPSHOT_RETENTION_DAYS = 90;
/** Tables measured at the same time (each is one statement on its own pooled connection). */
const CONCURRENCY = 4;

/**
 * The quality engines manage their own transaction (begin/commit, advisory locks), but a Warehouse
 * only lends a connection inside `transaction(fn)`. Inside it, the engine's transaction control is
 * the outer transaction's: its begin/commit/rollback are dropped and everything commits (or rolls
 * back) once, when `fn` ends.
 */
export function transactionRunner(tx: WarehouseTransaction): CopyOutRunner {
  return {
    copyOut: (sql) => tx.copyTo(sql),
    query: (sql, params) =>
      /^\s*(begin|commit|rollback)\s*;?\s*$/i.test(sql)
        ? Promise.resolve({ rows: [], rowCount: 0 })
        : tx.query(sql, params),
  };
}

/** Where a target schema's identity graph lives: a schema of its own next to it. */
export function identitySchemaName(targetSchema: string): string {
  return `${targetSchema.slice(0, 63 - '_identity'.length)}_identity`;
}

export interface TableMeasurement {
  table: IntrospectedTable;
  metrics: TableMetrics | null;
  error: string | null;
}

export interface MeasureOptions {
  /** statement_timeout of each table's statement; 0 = none (jobs). */
  timeoutMs: number;
  /** Freshness column per `schema.table` (from a table monitoring config); absent = detected. */
  timestampColumns?: Map<string, string>;
}

/**
 * Measures each table with one statement (src/quality/metrics.ts) in a read-only transaction. A
 * table that fails (gone meanwhile, timeout, a type the engine refuses) is reported, not thrown.
 */
export async function measureTables(
  warehouse: Warehouse,
  tables: IntrospectedTable[],
  options: MeasureOptions,
): Promise<TableMeasurement[]> {
  const results: TableMeasurement[] = new Array(tables.length);
  let next = 0;
  const worker = async () => {
    while (next < tables.length) {
      const i = next++;
      const table = tables[i];
      try {
        const metrics = await warehouse.transaction(async (tx) => {
          await tx.query('set transaction read only');
          await tx.query(`set local statement_timeout = ${Math.max(0, Math.floor(options.timeoutMs))}`);
          const freshness = options.timestampColumns?.get(`${table.schema}.${table.name}`);
          return computeTableMetrics(
            tx,
            { schema: table.schema, name: table.name },
            table.columns.map((c) => ({ name: c.name, type: c.type, base_type: c.base_type })),
            {
              estimatedRows: table.estimated_rows,
              ...(freshness !== undefined ? { timestampColumn: freshness } : {}),
            },
          );
        });
        results[i] = { table, metrics, error: null };
      } catch (error) {
        results[i] = { table, metrics: null, error: (error as Error).message };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(CONCURRENCY, tables.length) }, worker));
  return results;
}

export interface PreviousMeasurement {
  row_count: number;
  measured_at: Date;
}

/** The newest stored measurement of each table, before the ones about to be stored. */
export async function previousMeasurements(
  em: EntityManager,
  workspaceId: string,
  dataSource: string,
  tableNames: string[],
): Promise<Map<string, PreviousMeasurement>> {
  if (tableNames.length === 0) return new Map();
  const rows = await em.execute(
    `select distinct on (table_name) table_name, row_count, measured_at
       from monitoring_metric_snapshots
      where workspace_id = ? and data_source = ? and table_name in (${tableNames.map(() => '?').join(', ')})
      order by table_name, measured_at desc`,
    [workspaceId, dataSource, ...tableNames],
  );
  return new Map(
    rows.map((r: Record<string, unknown>) => [
      r.table_name as string,
      {
        row_count: Number(r.row_count),
        measured_at: r.measured_at instanceof Date ? r.measured_at : new Date(String(r.measured_at)),
      },
    ]),
  );
}

/** Stores the measurements for trends and prunes the workspace's snapshots past retention. */
export async function storeSnapshots(
  em: EntityManager,
  keys: { organizationId: string; workspaceId: string; dataSource: string; runId?: string | null },
  measured: TableMetrics[],
): Promise<void> {
  for (const m of measured)
    em.create(MetricSnapshot, {
      organization: keys.organizationId,
      workspace: keys.workspaceId,
      dataSource: keys.dataSource,
      tableName: m.table,
      rowCount: m.row_count,
      metrics: JSON.parse(JSON.stringify(m)) as Record<string, unknown>,
      measuredAt: m.measured_at,
      runId: keys.runId ?? null,
    });
  await em.flush();
  await em.execute(
    `delete from monitoring_metric_snapshots where workspace_id = ? and measured_at < now() - make_interval(days => ?)`,
    [keys.workspaceId, SNAPSHOT_RETENTION_DAYS],
  );
}

/** The REST/tRPC shape of one measured table. */
export function tableMetricsView(m: TableMetrics, previous: PreviousMeasurement | undefined) {
  return {
    table: m.table,
    row_count: m.row_count,
    columns: m.columns,
    freshness: m.freshness,
    last_change: m.last_change,
    measured_at: m.measured_at,
    duration_ms: m.duration_ms,
    previous: previous ?? null,
  };
}
