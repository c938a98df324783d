import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError } from '../../app-error.ts';
import type { AppDeps } from '../../deps.ts';
import {
  failOnceWhenDeterministic,
  laterRunOfItsKey,
  PermanentJobError,
  type JobContext,
} from '../../jobs/queue.ts';
import { quoteIdent, qualified, warehouses } from '../../warehouse/postgres.ts';
import { generateDdl, type SchemaDocument } from '../../warehouse/ddl.ts';
import { pipeCopyText, type TableRef, type Warehouse } from '../../warehouse/warehouse.ts';
import { materializeSql, sourceTableSql, stagingTableNames } from '../../transform/sql.ts';
import { parseTableKey, type MappingTable } from '../../transform/mapping.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';
import { requiredConnectionConfig } from '../workspaces/workspaces.service.ts';
import { enqueueMonitoringRun } from '../monitoring/monitoring.jobs.ts';
import { mappedSourceConfig } from '../sources/source-copy.ts';
import { MappingCommit, TableMapping } from './mappings.entity.ts';
import { MATERIALIZE_MAPPING_KIND, materializeKey } from './mappings.service.ts';

interface MaterializeMappingPayload extends Record<string, unknown> {
  workspace_id: string;
  table_name: string;
  commit_id: string;
  version: number;
}

/** Rows per cursor read of the cross-database copy. */
const COPY_BATCH_ROWS = 2000;
/**
 * COPY data is handed on in pieces of about this many characters. A string above 128 kB would be
 * allocated in V8's large-object space, which only a full collection frees: a batch as one string
 * piled up there (15 MB over a million rows) between full collections.
 */
const COPY_CHUNK_CHARS = 32 * 1024;
const PROGRESS_EVERY_MS = 500;
/**
 * How long dropping an earlier run's staging table waits for its lock: a run that was cancelled or
 * taken for dead may still be loading into it, and the new run must not wait hours behind that load.
 */
const LEFTOVER_LOCK_TIMEOUT_MS = 2000;
/** A run's result names at most this many of the leftovers it dropped (the log names them all). */
const LISTED_LEFTOVERS = 20;

/**
 * A target without a primary key does not refuse duplicated rows: the load must not give a primary
 * row several rows unless a person accepted the fan-out of a join.
 */
async function checkRowCount(source: Warehouse, tables: Record<string, MappingTable>, rows: number) {
  const entries = Object.entries(tables);
  const primary = entries.find(([, t]) => t.relationship === 'primary')?.[0];
  const joins = entries.filter(([, t]) => t.relationship === 'join');
  if (!primary || joins.length === 0 || joins.some(([, t]) => t.accept_fan_out)) return;
  const [row] = await source.aggregate(`SELECT count(*) AS n FROM ${sourceTableSql(parseTableKey(primary))}`);
  const primaryRows = Number(row.n);
  if (rows > primaryRows)
    throw new PermanentJobError(
      `The load produced ${rows} rows from ${primaryRows} rows of the primary table ${primary}: a join gives some primary rows several rows, and the target has no primary key to refuse them. Join on a unique key, aggregate, or accept the fan-out on the table (accept_fan_out).`,
    );
}

/**
 * One database reached as one role, however the two hosts were written (by the servers' own
 * identity): the SELECT can run inside the target database itself.
 */
async function sameDatabase(source: Warehouse, target: Warehouse): Promise<boolean> {
  if (!source.reach || !target.reach) return false;
  const [a, b] = await Promise.all([source.reach(), target.reach()]);
  return a === b;
}

async function ensureTargetTable(
  warehouse: Warehouse,
  target: TableRef,
  table: SchemaDocument['tables'][number],
) {
  await warehouse.transaction(async (tx) => {
    const { rows } = await tx.query<{ t: string | null }>('select to_regclass($1)::text as t', [
      qualified(target),
    ]);
    if (rows[0].t) return;
    // Not synced yet: create it from the schema.json definition the SQL was committed against.
    for (const statement of generateDdl(
      { name: target.name, tables: [table] },
      { targetSchema: target.schema },
    ))
      await tx.query(statement);
  });
}

/**
 * Drops the staging tables that ended runs of this target table left in its schema: a run whose
 * worker died never ran its cleanup, nor did one that failed while the warehouse was unreachable, and
 * only a retry of the same run (whose staging table has the same name) would drop it. A table goes
 * only if its name is exactly the staging table's name of a failed or cancelled run of this table
 * (same organization and singleton key): a user's `customers__stg_manual`, or another table's
 * leftovers, stay. No other run of this table is queued or running (the singleton key), but one that
 * was cancelled or taken for dead may still be at work on its staging table: the drop waits for it
 * at most LEFTOVER_LOCK_TIMEOUT_MS, and that run drops its table itself when it stops. No `__old_`
 * table needs the same: the swap renames the target to it and drops it in one transaction.
 * Best effort: what fails is logged and the run goes on. The names dropped.
 */
async function dropLeftoverStagingTables(
  deps: AppDeps,
  em: EntityManager,
  warehouse: Warehouse,
  target: TableRef,
  singletonKey: string,
  context: JobContext,
): Promise<string[]> {
  const names = stagingTableNames(target.name);
  let leftovers: string[];
  try {
    // LIKE on a fixed prefix reads the catalog's index of names: 0.1 ms in a schema of 20,000 tables,
    // where starts_with reads them all (3.5 ms).
    const { rows } = await warehouse.transaction((tx) =>
      tx.query<{ name: string }>(
        `select c.relname::text as name from pg_class c join pg_namespace n on n.oid = c.relnamespace
          where n.nspname = $1 and c.relkind in ('r', 'p') and c.relname like $2`,
        [target.schema, `${names.prefix.replace(/[\\%_]/g, '\\$&')}%`],
      ),
    );
    const present = new Set(rows.map((r) => r.name));
    const digits = [...present]
      .map((name) => name.slice(names.prefix.length))
      .filter((tail) => /^[0-9a-f]{8}$/.test(tail));
    if (digits.length === 0) return [];
    // Asked only when such a table is present, and answering only the runs whose digits end one:
    // PostgreSQL hashes the table's failed runs for it (65 ms for 4,000) rather than sending them all.
    const runs = await em.execute<{ id: string }[]>(
      `select id from job_runs
        where organization_id = ? and kind = ? and singleton_key = ? and status in ('failed', 'cancelled')
          and id <> ? and ${names.digitsSql('id')} = any(?::text[])`,
      [
        context.organizationId,
        MATERIALIZE_MAPPING_KIND,
        singletonKey,
        context.runId,
        `{${digits.join(',')}}`,
      ],
    );
    leftovers = [...new Set(runs.map((r) => names.of(r.id)))].filter((name) => present.has(name));
  } catch (error) {
    deps.logger.warn({ err: error, runId: context.runId }, 'could not look for leftover staging tables');
    return [];
  }
  const dropped: string[] = [];
  for (const name of leftovers) {
    try {
      await warehouse.transaction(async (tx) => {
        await tx.query(`set local lock_timeout = ${LEFTOVER_LOCK_TIMEOUT_MS}`);
        // No IF EXISTS: a table gone meanwhile (renamed by a swap it waited for) is not reported dropped.
        await tx.query(`DROP TABLE ${qualified({ schema: target.schema, name })}`);
      });
      dropped.push(name);
    } catch (error) {
      deps.logger.warn(
        { err: error, runId: context.runId, table: `${target.schema}.${name}` },
        'could not drop the staging table an ended materialization left',
      );
    }
  }
  if (dropped.length)
    deps.logger.info(
      { runId: context.runId, schema: target.schema, tables: dropped },
      'dropped the staging tables ended materializations left',
    );
  return dropped;
}

/** A value in COPY's text format: backslash, tab and line breaks escaped; SQL NULL as `\N`. */
function copyField(value: unknown): string {
  if (value === null || value === undefined) return '\\N';
  return String(value).replace(/[\\\t\n\r]/g, (c) => COPY_ESCAPES[c]);
}
const COPY_ESCAPES: Record<string, string> = { '\\': '\\\\', '\t': '\\t', '\n': '\\n', '\r': '\\r' };

/**
 * The whole result streamed from the source into the staging table, in one COPY … FROM STDIN into
 * the target. Every value leaves the source as its text form and is parsed by the column's type in
 * the target, so nothing is lost in JavaScript. From a PostgreSQL source the source's own COPY … TO
 * STDOUT text goes through as it comes, in chunks, without a row being built here: as rows (a batch
 * of JS objects per cursor read, turned into COPY text) four copies at once grew the server to 480 MB
 * (bench/materialize.ts), the garbage of batches that outlived the copy's awaits. A source without
 * COPY (MySQL) still goes row by row. Either way the pipeline's backpressure keeps a chunk or a batch
 * or two in memory whatever the table size.
 */
async function streamedCopy(
  source: Warehouse,
  target: Warehouse,
  staging: TableRef,
  selectSql: string,
  columns: { name: string }[],
  context: JobContext,
): Promise<number> {
  const read = `SELECT ${columns.map((c, i) => `${quoteIdent(c.name)}::text AS c${i}`).join(', ')}\nFROM (\n${selectSql}\n) AS source_rows`;
  let written = 0;
  let reported = performance.now();
  const counted = async (rows: number) => {
    if (context.signal.aborted) throw new Error('The run was cancelled');
    written += rows;
    if (performance.now() - reported > PROGRESS_EVERY_MS) {
      reported = performance.now();
      await context.progress({ phase: 'copying', mode: 'streamed_copy', rows_written: written });
    }
  };
  async function* rowsAsCopyText() {
    const keys = columns.map((_, i) => `c${i}`);
    for await (const batch of source.stream(read, { batchSize: COPY_BATCH_ROWS })) {
      let chunk = '';
      for (const row of batch) {
        chunk += `${keys.map((k) => copyField(row[k])).join('\t')}\n`;
        if (chunk.length >= COPY_CHUNK_CHARS) {
          yield chunk;
          chunk = '';
        }
      }
      if (chunk) yield chunk;
      await counted(batch.length);
    }
  }
  await target.transaction((tx) => {
    const into = tx.copyFrom(
      `COPY ${qualified(staging)} (${columns.map((c) => quoteIdent(c.name)).join(', ')}) FROM STDIN`,
    );
    return source.copyOut
      ? pipeCopyText(source, read, into, counted)
      : pipeline(Readable.from(rowsAsCopyText(), { objectMode: false }), into);
  });
  return written;
}

/**
 * Writes a committed transformation's result into its target table. The rows go into a staging
 * table shaped like the target, which then replaces it in one short transaction: readers see the old
 * rows or the new ones, and a run that fails leaves the previous content as it was.
 */
async function materializeMapping(deps: AppDeps, payload: MaterializeMappingPayload, context: JobContext) {
  const started = performance.now();
  const em = deps.orm.em.fork() as EntityManager;
  const organization = context.organizationId;
  const workspace = await em.findOne(Workspace, { id: payload.workspace_id, organization });
  if (!workspace) return { skipped: 'the workspace was deleted' };
  const commit = await em.findOne(MappingCommit, {
    id: payload.commit_id,
    organization,
    workspace: workspace.id,
  });
  if (!commit) return { skipped: 'the mappings were cleared' };
  const scope = { em, deps };
  const sourceConfig =
    mappedSourceConfig(scope, workspace) ?? requiredConnectionConfig(scope, workspace, 'source');
  const targetConfig = requiredConnectionConfig(scope, workspace, 'target');

  const target: TableRef = { schema: targetConfig.schemas[0], name: commit.tableName };
  const targetWarehouse = await warehouses(deps).open(targetConfig, `${workspace.id}:target`);
  await ensureTargetTable(
    targetWarehouse,
    target,
    commit.targetTable as unknown as SchemaDocument['tables'][number],
  );
  const removedLeftovers = await dropLeftoverStagingTables(
    deps,
    em,
    targetWarehouse,
    target,
    materializeKey(workspace, commit.tableName),
    context,
  );
  const sourceWarehouse = await warehouses(deps).open(sourceConfig, `${workspace.id}:source`);
  const mode = (await sameDatabase(sourceWarehouse, targetWarehouse)) ? 'insert_select' : 'streamed_copy';
  const targetTable = commit.targetTable as { primary_key?: string[] | null };
  const keyless = !targetTable.primary_key?.length;
  const plan = materializeSql({
    target,
    columns: commit.columns.map((c) => c.name),
    selectSql: commit.sql,
    runId: context.runId,
  });
  const run = (statements: string[]) =>
    targetWarehouse.transaction(async (tx) => {
      for (const statement of statements) await tx.query(statement);
    });

  let rows: number;
  await run(plan.prepare);
  try {
    await context.progress({ phase: 'loading', mode, rows_written: 0 });
    if (mode === 'insert_select') {
      // The mapping's SELECT (with its user expressions) runs inside a write: the read-only rules first.
      await targetWarehouse.assertUserSqlAllowed(commit.sql);
      rows = await targetWarehouse.transaction(async (tx) => (await tx.query(plan.load)).rowCount);
    } else {
      rows = await streamedCopy(
        sourceWarehouse,
        targetWarehouse,
        plan.staging,
        commit.sql,
        commit.columns,
        context,
      );
    }
    if (keyless)
      await checkRowCount(
        sourceWarehouse,
        (commit.mapping as { tables?: Record<string, MappingTable> }).tables ?? {},
        rows,
      );
    await context.progress({ phase: 'swapping', mode, rows_written: rows });
    try {
      await run(plan.swap);
    } catch (error) {
      // Views or foreign keys depend on the target, so it cannot be dropped: replace its rows in
      // place instead, still in one transaction (readers keep the old rows until it commits).
      if (!(error instanceof AppError) || error.details.reason !== '2BP01') throw error;
      const columns = commit.columns.map((c) => quoteIdent(c.name)).join(', ');
      await run([
        `DELETE FROM ${qualified(target)}`,
        `INSERT INTO ${qualified(target)} (${columns}) SELECT ${columns} FROM ${qualified(plan.staging)}`,
        `DROP TABLE ${qualified(plan.staging)}`,
      ]);
    }
  } catch (error) {
    await run(plan.cleanup).catch(() => {});
    // The staging rows are gone and the target keeps its previous rows: the run wrote none, whatever
    // count it had reported on the way. Best effort: the run's own error is what must reach it.
    await context.recordLastProgress({ phase: 'rolled_back', mode, rows_written: 0 }).catch(() => false);
    throw error;
  }

  const durationMs = Math.round(performance.now() - started);
  // Recorded beside the mapping's document, not as an edit of it: a person editing the mapping while
  // this ran neither loses the edit nor makes the run fail.
  await (deps.orm.em.fork() as EntityManager).nativeUpdate(
    TableMapping,
    { organization, workspace: workspace.id, tableName: commit.tableName },
    {
      materializedVersion: commit.version,
      materializedAt: new Date(),
      materializedRows: rows,
      lastRunId: context.runId,
    },
  );
  // Fresh data is what monitoring checks; a failure to queue the check must not fail the load.
  await enqueueMonitoringRun(deps, {
    organizationId: organization,
    workspaceId: workspace.id,
    reason: 'materialization',
  }).catch((error) =>
    deps.logger.warn({ err: error }, 'could not queue a monitoring run after materialization'),
  );
  return {
    rows_written: rows,
    mode,
    target_table: `${target.schema}.${target.name}`,
    version: commit.version,
    duration_ms: durationMs,
    ...(removedLeftovers.length ? { removed_leftovers: removedLeftovers.slice(0, LISTED_LEFTOVERS) } : {}),
  };
}

/** The mappings area's job kind (a table's materialization). */
export async function registerMappingJobs(deps: AppDeps): Promise<void> {
  await deps.jobs.register<MaterializeMappingPayload>(
    MATERIALIZE_MAPPING_KIND,
    (payload, context) => materializeMapping(deps, payload, context).catch(failOnceWhenDeterministic),
    {
      retryLimit: 1,
      retryDelaySeconds: 2,
      retryBackoff: false,
      timeoutSeconds: 6 * 3600,
      retain: {
        namedBy: ['mappings'],
        // What `dropLeftoverStagingTables` reads: an ended run that did not succeed names a staging table
        // it may have left, until a later run of the same table succeeded (and dropped it).
        where: `run.status in ('failed', 'cancelled') and not ${laterRunOfItsKey(`later.status = 'succeeded'`)}`,
      },
      // Its worker died on the last attempt: its transactions rolled back with their connections, so
      // the target kept its rows and this run wrote none, as a failing handler records. Unless it had
      // reached the swap, which may have committed: then what it wrote is not known, and its count stays.
      async onAbandoned(run) {
        if (run.progress.phase === 'swapping') return;
        return { ...run.progress, phase: 'rolled_back', rows_written: 0 };
      },
    },
  );
}
