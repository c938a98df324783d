import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ConnectionConfig } from './config.ts';
import { type MysqlColumn, type MysqlWarehouse, mysqlQualified, quoteMysqlIdent } from './mysql.ts';
import { CopyEncoder, mapMysqlType } from './mysql-types.ts';
import { quoteIdent } from './postgres.ts';
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
}

export interface LoadResult {
  raw_schema: string;
  tables: TableLoad[];
  rows: number;
}

const STATE_TABLE = '_dimas_loads';
const PROGRESS_EVERY_ROWS = 20_000;
const UPDATED_NAMES = ['updated_at', 'modified_at', 'last_modified', 'updated', 'modified', 'last_update'];

export function rawSchemaOf(config: Pick<ConnectionConfig, 'raw_schema' | 'database'>): string {
  return (config.raw_schema ?? `raw_${config.database}`).toLowerCase().slice(0, 63);
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
  const tables = schema.tables.filter((t) => t.kind === 'table');
  const columnsOf = await source.sourceColumns(tables);
  await target.transaction(async (tx) => {
    await tx.query(`create schema if not exists ${quoteIdent(raw)}`);
    await tx.query(
      `create table if not exists ${quoteIdent(raw)}.${STATE_TABLE} (
         table_name text primary key, cursor_column text, cursor_value text, signature text not null,
         mode text not null, rows_loaded bigint not null, loaded_at timestamptz not null default now())`,
    );
  });
  const result: LoadResult = { raw_schema: raw, tables: [], rows: 0 };
  let rowsSoFar = 0;
  for (const [i, table] of tables.entries()) {
    options.signal?.throwIfAborted();
    const columns = columnsOf.get(`${table.schema}.${table.name}`) ?? [];
    if (!columns.length) continue;
    const loaded = await loadTable(source, target, raw, table, columns, options, async (rows) => {
      await options.onProgress?.({
        table: table.name,
        tables_done: i,
        tables_total: tables.length,
        rows_loaded: rowsSoFar + rows,
      });
    });
    rowsSoFar += loaded.rows;
    result.tables.push(loaded);
    result.rows += loaded.rows;
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
  const mapped = columns.map((c) => ({ ...c, ...mapMysqlType(c.columnType, c.json) }));
  const cursor = proposeCursor(columns, source.config.cursor_columns?.[table.name]);
  const cursorKind = cursor ? mapped.find((c) => c.name === cursor)!.kind : null;
  const signature = JSON.stringify([mapped.map((c) => [c.name, c.pg]), table.primary_key]);
  const rawTable = `${quoteIdent(raw)}.${quoteIdent(table.name)}`;
  const pk = table.primary_key;

  return target.transaction(async (tx) => {
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
      if (!state || !exists) fullBecause = 'first load';
      else if (!cursor) fullBecause = 'no cursor column (updated_at-like or auto-increment key)';
      else if (state.signature !== signature) fullBecause = 'the source columns changed';
      else if (state.cursor_column !== cursor) fullBecause = 'the cursor column changed';
      else if (!pk.length && cursorKind !== 'int') fullBecause = 'no primary key to replace changed rows by';
    }
    const incremental = options.mode === 'incremental' && !fullBecause;
    const select = mapped.map((c) => quoteMysqlIdent(c.name)).join(', ');
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
      into = '_dimas_stage';
    } else {
      await tx.query(`drop table if exists ${rawTable}`);
      const defs = mapped.map((c) => `${quoteIdent(c.name)} ${c.pg}${c.nullable ? '' : ' not null'}`);
      await tx.query(`create table ${rawTable} (${defs.join(', ')})`);
      await tx.query(
        `comment on table ${rawTable} is ${literal(`Raw copy of MySQL ${table.schema}.${table.name}, loaded by dimas`)}`,
      );
    }
    const cursorIndex = cursor ? mapped.findIndex((c) => c.name === cursor) : -1;
    // The highest cursor value as the server's bytes (compared without decoding each row's value).
    const numericCursor = cursorKind === 'int' || cursorKind === 'numeric';
    let maxBytes: Buffer | null =
      incremental && state.cursor_value !== null ? Buffer.from(state.cursor_value, 'latin1') : null;
    let rows = 0;
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
          if (value !== null && (maxBytes === null || greater(value, maxBytes, numericCursor)))
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
      throw e.sqlMessage || e.errno ? extract.translate(error) : error;
    } finally {
      await extract.finish(ok);
    }
    const max = maxBytes === null ? null : maxBytes.toString('latin1');
    if (!incremental && pk.length)
      // The key is built once after the copy rather than maintained row by row during it.
      await tx.query(`alter table ${rawTable} add primary key (${pk.map(quoteIdent).join(', ')})`);
    if (incremental) {
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
    };
  });
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
