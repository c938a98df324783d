import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { AppError } from '../app-error.ts';
import { mysqlErrorIsDeterministic, mysqlServerErrno } from '../jobs/job-types.ts';
import { type ConnectionConfig, portOf } from './config.ts';
import { type MysqlColumn, type MysqlWarehouse, mysqlQualified, quoteMysqlIdent } from './mysql.ts';
import { CopyEncoder, mapMysqlType, mayLoadAsNull, unloadableDateBytes } from './mysql-types.ts';
import { quoteIdent } from './postgres.ts';
import { translate } from './postgres-sql.ts';
import type { IntrospectedTable, Warehouse, WarehouseTransaction } from './warehouse.ts';

/**
 * Extract–load: the selected tables of a MySQL / MariaDB source copied into `raw_<database>` (or the
 * config's raw_schema) of the PostgreSQL target, streamed from a mysql2 query stream into COPY FROM
 * STDIN, one target transaction per table (a killed load leaves each table as it was before it, or
 * fully loaded). `<raw>._dimas_loads` records, per table, the cursor column and the highest value
 * loaded; an incremental load then reads only rows past it and replaces them by primary key.
 *
 * Deletes on the source are not seen by an incremental load (nothing marks a deleted row): the raw
 * copy keeps them until a full reload, which rebuilds every table.
 *
 * A raw table and its columns keep the source's names (mappings and the generated project use them).
 * PostgreSQL truncates names past 63 bytes, so a table whose name or a column name is longer, or two
 * source tables of one name (in two source databases), are refused and listed in the result's
 * `refused`, never truncated into one another. Dates PostgreSQL has no value for load as NULL, so
 * date columns are never NOT NULL in the raw copy; a primary key that then holds a NULL is not
 * created (the table's `without_primary_key` says why) and incremental loads of that table run in full.
 *
 * The raw schema records the source it holds (`<raw>._dimas_source`: the server as it names itself,
 * the database, the address it was reached at, and the workspace that loaded it first): a workspace
 * whose source is another database (`Shop` and `shop` on one server, or two servers) is refused with a
 * 409 instead of overwriting that copy, while another spelling of the same server's address
 * (`localhost`, `127.0.0.1`) is the same source; raw_schema in its source config gives it a schema of
 * its own.
 *
 * A zero or invalid date (`0000-00-00`, `2024-02-30`) is no cursor position: the cursor value is the
 * highest valid one, and each table says how many rows it read with an invalid one. A table dropped
 * on the source while the load runs is refused (named, with why) and the rest loads.
 *
 * Views load like tables without a primary key (their rows read by a SELECT of the view). A view the
 * source cannot select (a table or function it reads was dropped, its definer is gone, it signals an
 * error) is refused with the server's message, and the other tables load: a broken view is common in
 * legacy databases and says nothing about the rest.
 */

export type LoadMode = 'full' | 'incremental';

interface LoadProgress {
  table: string;
  tables_done: number;
  tables_total: number;
  rows_loaded: number;
}

export interface LoadOptions {
  mode: LoadMode;
  /** The workspace loading: recorded in the raw schema, which loads of another source may not use. */
  loader: RawSchemaLoader;
  signal?: AbortSignal;
  onProgress?: (progress: LoadProgress) => Promise<void>;
}

interface TableLoad {
  table: string;
  mode: LoadMode;
  /** Why an incremental request loaded this table in full. */
  full_because: string | null;
  rows: number;
  cursor_column: string | null;
  cursor_value: string | null;
  /**
   * Rows read whose date cursor is a date PostgreSQL has none for (zero dates, `2024-02-30`): no
   * position, so never the cursor value; an incremental load sees such a row again only once its
   * cursor holds a real date (a full load reloads it).
   */
  invalid_cursor_rows: number;
  /** Why the raw copy has no primary key although the source table has one. */
  without_primary_key: string | null;
}

interface RefusedTable {
  schema: string;
  table: string;
  reason: string;
}

export interface LoadResult {
  raw_schema: string;
  tables: TableLoad[];
  /** Tables not loaded, and why (names PostgreSQL would truncate, two tables for one raw name). */
  refused: RefusedTable[];
  /** Tables that cursor_columns names and the source does not have: their entries are not used. */
  unknown_cursor_tables: string[];
  rows: number;
}

/** A failed table's error: names the table (and the column and row when PostgreSQL says which). */
class TableLoadError extends AppError {}

/** A view the source answered with an error that every attempt would get: refused, not failed. */
class UnreadableView extends AppError {}

const STATE_TABLE = '_dimas_loads';
/** One row: the source whose copy the raw schema holds, and the workspace that loaded it first. */
const SOURCE_TABLE = '_dimas_source';
const PROGRESS_EVERY_ROWS = 20_000;
const UPDATED_NAMES = ['updated_at', 'modified_at', 'last_modified', 'updated', 'modified', 'last_update'];
/** PostgreSQL keeps the first 63 bytes of a name (NAMEDATALEN - 1) and drops the rest without a word. */
const PG_NAME_BYTES = 63;
const NO_KEY_FOR_NULLS =
  'a primary-key column holds dates PostgreSQL has no value for (zero or invalid dates, loaded as NULL)';

/** The first 63 bytes of a name, cut at a character boundary: what PostgreSQL makes of it. */
function clipName(name: string): string {
  if (Buffer.byteLength(name) <= PG_NAME_BYTES) return name;
  let out = '';
  let bytes = 0;
  for (const ch of name) {
    bytes += Buffer.byteLength(ch);
    if (bytes > PG_NAME_BYTES) break;
    out += ch;
  }
  return out;
}

/** Who loads a raw schema: the workspace, and its organization (named only to its own members). */
export interface RawSchemaLoader {
  workspace_id: string;
  workspace_name: string;
  organization_id: string;
}

interface RawSchemaClaim extends RawSchemaLoader {
  /** The address the loading workspace configured, for people to read. */
  source: string;
  /** The server as it names itself, and the database: what decides whether two sources are one. */
  server: string | null;
}

/** A source database: the address it was reached at, and who it is. */
interface SourceIdentity {
  address: string;
  server: string;
}

/**
 * The source a raw copy comes from. MySQL database names are case-sensitive on most servers (`Shop`
 * and `shop` are two databases) while the raw schema's name is lowercase, and two servers may hold
 * databases of one name: both would load into one raw schema. The server is told by its own word,
 * not by the host spelling (`localhost` and `127.0.0.1` are one server; two servers behind one name
 * over time are two).
 */
async function sourceIdentity(source: MysqlWarehouse): Promise<SourceIdentity> {
  const { config } = source;
  return {
    address: `${config.host.toLowerCase()}:${portOf(config)}/${config.database}`,
    server: `${await source.serverIdentity()}/${config.database}`,
  };
}

/**
 * Why `loader` may not load `source` into the raw schema that `claim` holds, else null. The
 * workspace that holds it may change its source (a moved server); another workspace may load the same
 * source (the same rows); a different source of another workspace would overwrite its tables. A claim
 * recorded before servers were identified compares by address.
 */
function claimConflict(
  raw: string,
  claim: RawSchemaClaim | undefined,
  source: SourceIdentity,
  loader: RawSchemaLoader,
): AppError | null {
  if (!claim || claim.workspace_id === loader.workspace_id) return null;
  if (claim.server ? claim.server === source.server : claim.source === source.address) return null;
  const holder =
    claim.organization_id === loader.organization_id
      ? `workspace ${claim.workspace_name} (source ${claim.source})`
      : `a workspace of another organization (source ${claim.source})`;
  return new AppError(
    'CONFLICT',
    `Raw schema ${raw} of the target holds the copy loaded by ${holder}; workspace ${loader.workspace_name} loads source ${source.address}, a different database, and would overwrite its tables. Set raw_schema in the source config of workspace ${loader.workspace_name} to a schema of its own (or drop schema ${raw} in the target if that copy is no longer needed)`,
    { reason: 'RAW_SCHEMA_TAKEN' },
  );
}

const readClaim = async (tx: WarehouseTransaction, raw: string) =>
  (
    await tx.query<RawSchemaClaim & Record<string, unknown>>(
      `select * from ${quoteIdent(raw)}.${SOURCE_TABLE}`,
    )
  ).rows.map((row) => ({ ...row, server: row.server ?? null }))[0];

/**
 * The raw schema recorded as holding `source`, or a 409 when another source's copy is there.
 * A raw schema from before the record is claimed by its next load (nothing is renamed); one that a
 * deleted workspace loaded stays that workspace's copy until someone drops it (the 409 says so).
 */
async function claimRawSchema(
  tx: WarehouseTransaction,
  raw: string,
  source: SourceIdentity,
  loader: RawSchemaLoader,
) {
  await tx.query('select pg_advisory_xact_lock(hashtext($1))', [`dimas-raw-schema:${raw}`]);
  await tx.query(
    `create table if not exists ${quoteIdent(raw)}.${SOURCE_TABLE} (
       one boolean primary key default true check (one), source text not null, workspace_id text not null,
       workspace_name text not null, organization_id text not null, claimed_at timestamptz not null default now())`,
  );
  // Records written before servers were identified have no server until their holder loads again.
  await tx.query(`alter table ${quoteIdent(raw)}.${SOURCE_TABLE} add column if not exists server text`);
  const claim = await readClaim(tx, raw);
  const conflict = claimConflict(raw, claim, source, loader);
  if (conflict) throw conflict;
  // Another workspace loading the same source leaves the record to the first one.
  if (claim && claim.workspace_id !== loader.workspace_id) return;
  await tx.query(
    `insert into ${quoteIdent(raw)}.${SOURCE_TABLE} (source, server, workspace_id, workspace_name, organization_id)
     values ($1, $2, $3, $4, $5)
     on conflict (one) do update
       set source = excluded.source, server = excluded.server, workspace_name = excluded.workspace_name`,
    [source.address, source.server, loader.workspace_id, loader.workspace_name, loader.organization_id],
  );
}

/**
 * The 409 a load would end with because the raw schema holds another source's copy, checked before
 * the load is queued; null when it may load (or the target or source cannot be read now: the load
 * checks again).
 */
export async function rawSchemaConflict(
  target: Warehouse,
  source: MysqlWarehouse,
  loader: RawSchemaLoader,
): Promise<AppError | null> {
  const raw = rawSchemaOf(source.config);
  try {
    const identity = await sourceIdentity(source);
    return await target.transaction(async (tx) => {
      const found = await tx.query(`select to_regclass($1) as t`, [`${quoteIdent(raw)}.${SOURCE_TABLE}`]);
      if (!found.rows[0].t) return null;
      return claimConflict(raw, await readClaim(tx, raw), identity, loader);
    });
  } catch {
    return null;
  }
}

export function rawSchemaOf(config: Pick<ConnectionConfig, 'raw_schema' | 'database'>): string {
  return clipName((config.raw_schema ?? `raw_${config.database}`).toLowerCase());
}

/**
 * Why a table cannot be copied under its own names (null when it can): PostgreSQL would truncate a
 * table or column name longer than 63 bytes, so two long names could land in one table or column.
 */
function nameProblem(table: IntrospectedTable, columns: MysqlColumn[]): string | null {
  if (table.name === STATE_TABLE || table.name === SOURCE_TABLE)
    return `its name is the one of dimas's load-state table ${table.name} in the raw schema`;
  const long = (name: string) => Buffer.byteLength(name) > PG_NAME_BYTES;
  const problems: string[] = [];
  if (long(table.name))
    problems.push(`the ${kindOf(table)} name is ${Buffer.byteLength(table.name)} bytes long`);
  const columnNames = columns.filter((c) => long(c.name)).map((c) => c.name);
  if (columnNames.length)
    problems.push(`column names are longer than ${PG_NAME_BYTES} bytes: ${columnNames.join(', ')}`);
  if (!problems.length) return null;
  return `${problems.join('; ')}. PostgreSQL truncates names to ${PG_NAME_BYTES} bytes, so the raw copy cannot keep the source's names: rename them on the source, or leave the ${kindOf(table)} out of the source config's tables`;
}

const ER_NO_SUCH_TABLE = 1146;

const droppedMidLoad = (table: IntrospectedTable, raw: string) =>
  `table ${table.schema}.${table.name} was dropped on the source while the load ran (after it listed the source's tables); a raw copy from an earlier load stays in ${raw} as it was`;

const kindOf = (table: IntrospectedTable) => (table.kind === 'view' ? 'view' : 'table');

/**
 * Whether the source answered a view's SELECT with an error every attempt would get: its definition
 * (a dropped table, column or function, a definer that no longer exists, missing rights) or what it
 * computes (a SIGNAL, a conversion it refuses). Lost connections (fatal), killed queries (70),
 * deadlocks (40) and the transient errnos fail the load as for a table, and the job is retried.
 */
function viewFault(error: unknown): error is { sqlMessage: string } {
  const e = error as { sqlMessage?: string; sqlState?: string; fatal?: boolean };
  if (!e.sqlMessage || e.fatal || mysqlErrorIsDeterministic(error) === false) return false;
  return !/^(08|40|70)/.test(e.sqlState ?? '');
}

const unreadable = (table: IntrospectedTable, message: string) =>
  `view ${table.schema}.${table.name} cannot be selected on the source: ${message}. Fix or drop the view on the source, or leave it out of the source config's tables; a raw copy from an earlier load stays as it was`;

/**
 * Why a view whose columns the catalog does not list cannot be loaded: MariaDB lists none for a view
 * whose table or function was dropped, and selecting it tells why.
 */
async function viewWithoutColumns(source: MysqlWarehouse, table: IntrospectedTable): Promise<string> {
  const probe = await source.openExtract(`select * from ${mysqlQualified(table)} limit 0`);
  let ok = false;
  try {
    for await (const _ of probe.rows);
    ok = true;
  } catch (error) {
    if (!viewFault(error)) throw probe.translate(error);
    return unreadable(table, error.sqlMessage);
  } finally {
    await probe.finish(ok);
  }
  return `view ${table.schema}.${table.name} has no columns in information_schema.COLUMNS, so the raw copy cannot be created`;
}

/**
 * The column whose growth marks new and changed rows: the config's choice, else an updated_at-like
 * date column, else the auto-increment key (new rows only). Null: the table reloads in full each time.
 */
function proposeCursor(columns: MysqlColumn[], configured?: string): string | null {
  if (configured) return columns.some((c) => c.name === configured) ? configured : null;
  const dated = columns.find(
    (c) => UPDATED_NAMES.includes(c.name.toLowerCase()) && /^(datetime|timestamp)/i.test(c.columnType),
  );
  return dated?.name ?? columns.find((c) => c.autoIncrement)?.name ?? null;
}

interface State {
  table_name: string;
  cursor_column: string | null;
  cursor_value: string | null;
  signature: string;
}

export async function extractLoad(
  source: MysqlWarehouse,
  target: Warehouse,
  options: LoadOptions,
): Promise<LoadResult> {
  const raw = rawSchemaOf(source.config);
  const schema = await source.introspect();
  const tables = schema.tables.filter((t) => t.kind === 'table' || t.kind === 'view');
  const columnsOf = await source.sourceColumns(tables);
  const identity = await sourceIdentity(source);
  // A raw table is named after its source table alone: two source databases with a table of one name
  // would overwrite each other's copy.
  const sharing = new Map<string, IntrospectedTable[]>();
  for (const t of tables) sharing.set(t.name, [...(sharing.get(t.name) ?? []), t]);
  await target.transaction(async (tx) => {
    await tx.query(`create schema if not exists ${quoteIdent(raw)}`);
    await tx.query(
      `create table if not exists ${quoteIdent(raw)}.${STATE_TABLE} (
         table_name text primary key, cursor_column text, cursor_value text, signature text not null,
         mode text not null, rows_loaded bigint not null, loaded_at timestamptz not null default now())`,
    );
    await claimRawSchema(tx, raw, identity, options.loader);
  });
  const names = new Set(tables.map((t) => t.name));
  const result: LoadResult = {
    raw_schema: raw,
    tables: [],
    refused: [],
    unknown_cursor_tables: Object.keys(source.config.cursor_columns ?? {}).filter((name) => !names.has(name)),
    rows: 0,
  };
  let rowsSoFar = 0;
  for (const [i, table] of tables.entries()) {
    options.signal?.throwIfAborted();
    const columns = columnsOf.get(`${table.schema}.${table.name}`) ?? [];
    // A table without columns was dropped since the catalog was read; a view without any is broken.
    if (!columns.length && table.kind !== 'view') {
      result.refused.push({ schema: table.schema, table: table.name, reason: droppedMidLoad(table, raw) });
      continue;
    }
    const namesakes = sharing.get(table.name)!;
    const refusal =
      namesakes.length > 1
        ? `${namesakes.map((t) => `${t.schema}.${t.name}`).join(' and ')} would all load into ${raw}.${table.name}: list one of them as database.table in the source config's tables`
        : (nameProblem(table, columns) ?? (columns.length ? null : await viewWithoutColumns(source, table)));
    if (refusal) result.refused.push({ schema: table.schema, table: table.name, reason: refusal });
    else {
      const progress = async (rows: number) => {
        await options.onProgress?.({
          table: table.name,
          tables_done: i,
          tables_total: tables.length,
          rows_loaded: rowsSoFar + rows,
        });
      };
      // Progress names the table being loaded from its start (a failure then points at it).
      await progress(0);
      let loaded: TableLoad | null = null;
      try {
        loaded = await loadTable(source, target, raw, table, columns, options, progress);
      } catch (error) {
        if (options.signal?.aborted) throw error;
        if (error instanceof UnreadableView)
          result.refused.push({ schema: table.schema, table: table.name, reason: error.message });
        // Dropped after the catalog was read (the catalog says it is gone, not only the SELECT): the
        // user dropped it, and a retry of the whole load would skip it anyway.
        else if (
          table.kind === 'table' &&
          mysqlServerErrno(error) === ER_NO_SUCH_TABLE &&
          !(await source.sourceColumns([table])).get(`${table.schema}.${table.name}`)?.length
        )
          result.refused.push({
            schema: table.schema,
            table: table.name,
            reason: droppedMidLoad(table, raw),
          });
        else throw tableError(error, table, raw, target);
      }
      if (loaded) {
        rowsSoFar += loaded.rows;
        result.tables.push(loaded);
        result.rows += loaded.rows;
      }
    }
    await options.onProgress?.({
      table: table.name,
      tables_done: i + 1,
      tables_total: tables.length,
      rows_loaded: rowsSoFar,
    });
  }
  return result;
}

async function loadTable(
  source: MysqlWarehouse,
  target: Warehouse,
  raw: string,
  table: IntrospectedTable,
  columns: MysqlColumn[],
  options: LoadOptions,
  progress: (rows: number) => Promise<void>,
): Promise<TableLoad> {
  const mapped = columns.map((c) => {
    const type = mapMysqlType(c.columnType, c.json);
    // A date column may receive NULL for a date PostgreSQL has no value for: never NOT NULL.
    return { ...c, ...type, notNull: !c.nullable && !mayLoadAsNull(type.kind) };
  });
  const configuredCursor = source.config.cursor_columns?.[table.name];
  const cursor = proposeCursor(columns, configuredCursor);
  const cursorKind = cursor ? mapped.find((c) => c.name === cursor)!.kind : null;
  // Zero and invalid dates (`0000-00-00`, `2024-02-30`) are no position in time: never a cursor value.
  const dateCursor = cursorKind !== null && mayLoadAsNull(cursorKind);
  const signature = JSON.stringify([mapped.map((c) => [c.name, c.pg, c.notNull]), table.primary_key]);
  const rawTable = `${quoteIdent(raw)}.${quoteIdent(table.name)}`;
  const pk = table.primary_key;
  // Key columns that may receive NULL: a key holding one cannot be a PostgreSQL primary key.
  const nullableKey = pk.filter((k) => mapped.some((c) => c.name === k && !c.notNull));
  const keyHasNull = async (tx: WarehouseTransaction, relation: string) =>
    nullableKey.length > 0 &&
    (
      await tx.query(
        `select 1 from ${relation} where ${nullableKey.map((k) => `${quoteIdent(k)} is null`).join(' or ')} limit 1`,
      )
    ).rows.length > 0;

  // Why this incremental request loads the table in full after all (a first attempt found out).
  let forceFull: string | null = null;
  for (;;) {
    const attempt = await target.transaction(async (tx) => {
      try {
        return await loadInto(tx);
      } catch (error) {
        throw options.signal?.aborted ? error : tableError(error, table, raw, target);
      }
    });
    if (!('reloadInFull' in attempt)) return attempt;
    // A full load never asks again: the loop runs at most twice.
    forceFull = attempt.reloadInFull;
  }

  async function loadInto(tx: WarehouseTransaction): Promise<TableLoad | { reloadInFull: string }> {
    // One load of a table at a time: a second one waits here instead of interleaving its rows.
    await tx.query('select pg_advisory_xact_lock(hashtext($1))', [`dimas-load:${raw}.${table.name}`]);
    const [state] = (
      await tx.query<State & Record<string, unknown>>(
        `select table_name, cursor_column, cursor_value, signature from ${quoteIdent(raw)}.${STATE_TABLE} where table_name = $1`,
        [table.name],
      )
    ).rows;
    const exists = (
      await tx.query(`select to_regclass($1) as t`, [`${quoteIdent(raw)}.${quoteIdent(table.name)}`])
    ).rows[0].t;
    let fullBecause: string | null = null;
    if (options.mode === 'incremental') {
      if (forceFull) fullBecause = forceFull;
      else if (!state || !exists) fullBecause = 'first load';
      else if (!cursor)
        fullBecause = configuredCursor
          ? `cursor_columns names ${configuredCursor}, which ${table.kind} ${table.name} does not have`
          : 'no cursor column (updated_at-like or auto-increment key)';
      else if (state.signature !== signature)
        fullBecause = 'the source columns (or how they are loaded) changed';
      else if (state.cursor_column !== cursor) fullBecause = 'the cursor column changed';
      // Saved before invalid dates stopped being cursor values: comparing against one is no position.
      else if (
        dateCursor &&
        state.cursor_value !== null &&
        unloadableDateBytes(Buffer.from(state.cursor_value))
      )
        fullBecause = `the saved cursor value ${state.cursor_value} is not a valid date`;
      else if (!pk.length && cursorKind !== 'int')
        fullBecause = `${table.kind === 'view' ? 'a view has ' : ''}no primary key to replace changed rows by`;
      else if (pk.length && !(await hasPrimaryKey(tx, rawTable)))
        fullBecause = `the raw copy has no primary key to replace changed rows by: ${NO_KEY_FOR_NULLS}`;
    }
    const incremental = options.mode === 'incremental' && !fullBecause;
    // FLOAT as a double: the text protocol prints a float with six significant digits.
    const select = mapped
      .map((c) => (c.asDouble ? `${quoteMysqlIdent(c.name)} + 0e0` : quoteMysqlIdent(c.name)))
      .join(', ');
    let sql = `select ${select} from ${mysqlQualified(table)}`;
    const params: unknown[] = [];
    if (incremental && state.cursor_value !== null) {
      // A date cursor re-reads its last instant (rows written in the same second after the last load);
      // an auto-increment key only moves forward.
      sql += ` where ${quoteMysqlIdent(cursor!)} ${cursorKind === 'int' ? '>' : '>='} ?`;
      params.push(state.cursor_value);
    }
    let into = rawTable;
    if (incremental) {
      await tx.query(`create temp table _dimas_stage (like ${rawTable}) on commit drop`);
      // The raw key made its columns NOT NULL; a date among them may receive a NULL (checked below).
      if (nullableKey.length)
        await tx.query(
          `alter table _dimas_stage ${nullableKey.map((k) => `alter column ${quoteIdent(k)} drop not null`).join(', ')}`,
        );
      into = '_dimas_stage';
    } else {
      await tx.query(`drop table if exists ${rawTable}`);
      const defs = mapped.map((c) => `${quoteIdent(c.name)} ${c.pg}${c.notNull ? ' not null' : ''}`);
      await tx.query(`create table ${rawTable} (${defs.join(', ')})`);
      await tx.query(
        `comment on table ${rawTable} is ${literal(`Raw copy of MySQL ${table.kind === 'view' ? 'view ' : ''}${table.schema}.${table.name}, loaded by dimas`)}`,
      );
    }
    const cursorIndex = cursor ? mapped.findIndex((c) => c.name === cursor) : -1;
    // The highest cursor value as the server's bytes (compared without decoding each row's value).
    const numericCursor = cursorKind === 'int' || cursorKind === 'numeric';
    let maxBytes: Buffer | null =
      incremental && state.cursor_value !== null ? Buffer.from(state.cursor_value, 'latin1') : null;
    let rows = 0;
    let invalidCursorRows = 0;
    // Rows are encoded from the server's bytes as they arrive, inside one Transform: no per-row
    // promise, no decoding of values to JS strings.
    let encoder: CopyEncoder;
    const encode = new Transform({
      writableObjectMode: true,
      readableObjectMode: false,
      construct(done) {
        encoder = new CopyEncoder(
          mapped.map((c) => c.kind),
          (chunk) => this.push(chunk),
        );
        done();
      },
      transform(row: (Buffer | null)[], _encoding, done) {
        encoder.row(row);
        if (cursorIndex >= 0) {
          const value = row[cursorIndex];
          if (value !== null && dateCursor && unloadableDateBytes(value)) invalidCursorRows++;
          else if (value !== null && (maxBytes === null || greater(value, maxBytes, numericCursor)))
            maxBytes = value;
        }
        rows++;
        if (rows % PROGRESS_EVERY_ROWS === 0) progress(rows).then(() => done(), done);
        else done();
      },
      flush(done) {
        encoder.flush();
        done();
      },
    });
    const extract = await source.openExtract(sql, params);
    let ok = false;
    try {
      await pipeline(extract.rows, encode, tx.copyFrom(`copy ${into} from stdin`), {
        signal: options.signal,
      });
      ok = true;
    } catch (error) {
      const e = error as { sqlMessage?: string; errno?: number };
      if (table.kind === 'view' && !options.signal?.aborted && viewFault(error))
        throw new UnreadableView('BAD_REQUEST', unreadable(table, error.sqlMessage));
      throw e.sqlMessage || e.errno ? extract.translate(error) : error;
    } finally {
      await extract.finish(ok);
    }
    const max = maxBytes === null ? null : maxBytes.toString('latin1');
    let withoutKey: string | null = null;
    if (!incremental && pk.length) {
      if (await keyHasNull(tx, rawTable)) withoutKey = NO_KEY_FOR_NULLS;
      // The key is built once after the copy rather than maintained row by row during it.
      else await tx.query(`alter table ${rawTable} add primary key (${pk.map(quoteIdent).join(', ')})`);
    }
    if (incremental) {
      // A changed row whose key now holds a NULL cannot go into the keyed raw copy: the table is loaded
      // again in full (this transaction changed nothing but the staging table).
      if (await keyHasNull(tx, '_dimas_stage'))
        return { reloadInFull: `new or changed rows: ${NO_KEY_FOR_NULLS}` };
      if (pk.length) {
        const on = pk.map((k) => `t.${quoteIdent(k)} = s.${quoteIdent(k)}`).join(' and ');
        await tx.query(`delete from ${rawTable} t using _dimas_stage s where ${on}`);
      }
      await tx.query(`insert into ${rawTable} select * from _dimas_stage`);
    }
    await saveState(
      tx,
      raw,
      {
        table_name: table.name,
        cursor_column: cursor,
        cursor_value: max,
        signature,
      },
      incremental ? 'incremental' : 'full',
      rows,
    );
    return {
      table: table.name,
      mode: incremental ? 'incremental' : 'full',
      full_because: options.mode === 'incremental' ? fullBecause : null,
      rows,
      cursor_column: cursor,
      cursor_value: max,
      invalid_cursor_rows: invalidCursorRows,
      without_primary_key: withoutKey,
    };
  }
}

async function hasPrimaryKey(tx: WarehouseTransaction, relation: string): Promise<boolean> {
  const { rows } = await tx.query(
    'select 1 from pg_index where indrelid = to_regclass($1) and indisprimary',
    [relation],
  );
  return rows.length > 0;
}

/**
 * The error of a table that failed to load, naming it, and the column and row of the extract when
 * PostgreSQL tells (a COPY error's context, a not-null violation's column).
 */
function tableError(error: unknown, table: IntrospectedTable, raw: string, target: Warehouse): AppError {
  if (error instanceof TableLoadError || error instanceof UnreadableView) return error;
  const e = error as { column?: string; where?: string };
  const copy = /^COPY .*?, line (\d+)(?:, column (.+?))?(?::|$)/m.exec(e.where ?? '');
  const column = copy?.[2] ?? e.column;
  const at = [column && `column ${column}`, copy && `row ${copy[1]} of the extract`].filter(Boolean);
  const cause = error instanceof AppError ? error : translate(error, target.config, 'user-sql');
  return Object.assign(
    new TableLoadError(
      cause.code,
      `Loading ${kindOf(table)} ${table.schema}.${table.name} into ${raw}.${table.name} failed${at.length ? ` (${at.join(', ')})` : ''}: ${cause.message}`,
      cause.details,
    ),
    { cause },
  );
}

const INTEGER = /^-?\d+$/;
const digitsOnly = (v: Buffer) => {
  for (let i = 0; i < v.length; i++) if (v[i] < 0x30 || v[i] > 0x39) return false;
  return true;
};

function greater(a: Buffer, b: Buffer, numeric: boolean): boolean {
  if (numeric) {
    // Unsigned integers as the server prints them (no sign; zerofill pads to one width): the longer is
    // the greater, then byte order. Anything else (a sign, decimals) is compared as a number.
    if (!digitsOnly(a) || !digitsOnly(b)) {
      const x = a.toString('latin1');
      const y = b.toString('latin1');
      return INTEGER.test(x) && INTEGER.test(y) ? BigInt(x) > BigInt(y) : Number(x) > Number(y);
    }
    if (a.length !== b.length) return a.length > b.length;
  }
  // Dates and datetimes arrive in one fixed-width format: byte order is time order.
  return a.compare(b) > 0;
}

const literal = (text: string) => `'${text.replaceAll("'", "''")}'`;

async function saveState(tx: WarehouseTransaction, raw: string, state: State, mode: LoadMode, rows: number) {
  await tx.query(
    `insert into ${quoteIdent(raw)}.${STATE_TABLE} (table_name, cursor_column, cursor_value, signature, mode, rows_loaded, loaded_at)
     values ($1, $2, $3, $4, $5, $6, now())
     on conflict (table_name) do update set cursor_column = excluded.cursor_column, cursor_value = excluded.cursor_value,
       signature = excluded.signature, mode = excluded.mode, rows_loaded = excluded.rows_loaded, loaded_at = excluded.loaded_at`,
    [state.table_name, state.cursor_column, state.cursor_value, state.signature, mode, rows],
  );
}
