import type { Readable } from 'node:stream';
import type { Pool, PoolConnection } from 'mysql2';
import { AppError } from '../app-error.ts';
import type { ConnectionConfig, ConnectionWarning } from './config.ts';
import {
  type ErrorContext,
  type MysqlColumn,
  type MysqlSettings,
  type PoolEntry,
  entryPool,
  mysqlQualified,
  poolKey,
  quoteMysqlIdent,
  timeoutSql,
  translate,
} from './mysql-connection.ts';
import { assertMysqlReadOnly, calledFunctions } from './mysql-guard.ts';
import { mysqlIntrospect, mysqlSourceColumns } from './mysql-introspect.ts';
import { mysqlProfileTable } from './mysql-profile.ts';
import { bytesAsJson, fieldTypeName, readCapped } from './mysql-query.ts';
import type { ProfileColumnInput, ProfileQueryOptions, ColumnProfile } from '../llm/profile.ts';
import type {
  AggregateOptions,
  IntrospectedSchema,
  IntrospectOptions,
  QueryResult,
  ReadOptions,
  SampleValue,
  StreamOptions,
  TableRef,
  Warehouse,
  WarehouseTransaction,
} from './warehouse.ts';
import { SAMPLE_VALUE_CUT, SAMPLE_VALUE_MAX_LENGTH, sampleValue } from './warehouse.ts';

export {
  type MysqlColumn,
  type MysqlSettings,
  mysqlQualified,
  mysqlSchemas,
  quoteMysqlIdent,
} from './mysql-connection.ts';

/** The MySQL side of the warehouse registry: one pool per distinct connection, opened through the network guard. */
export class MysqlPools {
  #pools = new Map<string, PoolEntry>();
  readonly settings: MysqlSettings;

  constructor(settings: MysqlSettings) {
    this.settings = settings;
  }

  open(config: ConnectionConfig): MysqlWarehouse {
    const key = poolKey(config);
    let entry = this.#pools.get(key);
    if (!entry) this.#pools.set(key, (entry = { config }));
    return new MysqlWarehouse(config, entry, this.settings, () => entryPool(entry, this.settings));
  }

  warningsFor(config: ConnectionConfig): ConnectionWarning[] {
    const entry = this.#pools.get(poolKey(config));
    return entry?.superuser
      ? [
          {
            code: 'SUPERUSER',
            message:
              'The connection logs in with the SUPER privilege: it can change everything on that server. Use a user with only SELECT on the source databases',
          },
        ]
      : [];
  }

  async close() {
    await Promise.all(
      [...this.#pools.values()].map((e) =>
        e.pool
          ?.promise()
          .end()
          .catch(() => {}),
      ),
    );
    this.#pools.clear();
  }
}

/**
 * Rows an extract holds while COPY catches up, before it pauses the connection (a socket read's rows
 * still come in). Each row is an array of views of the read's buffer: rows waiting across COPY's awaits
 * are promoted by V8's young collections and keep those buffers alive with them. 2,000 grew the server
 * to 410 MB with four loads at once, 100 to about 315 MB, as fast (bench/mysql-load.ts).
 */
const EXTRACT_BUFFERED_ROWS = 100;

/** A MySQL / MariaDB source behind the Warehouse interface (read side only; targets are PostgreSQL). */
export class MysqlWarehouse implements Warehouse {
  readonly dialect = 'mysql' as const;
  readonly config: ConnectionConfig;
  private readonly entry: PoolEntry;
  private readonly settings: MysqlSettings;
  private readonly pool: () => Promise<Pool>;

  constructor(
    config: ConnectionConfig,
    entry: PoolEntry,
    settings: MysqlSettings,
    pool: () => Promise<Pool>,
  ) {
    this.config = config;
    this.entry = entry;
    this.settings = settings;
    this.pool = pool;
  }

  async #connect(): Promise<PoolConnection> {
    try {
      const pool = await this.pool();
      return await new Promise<PoolConnection>((resolve, reject) =>
        pool.getConnection((error, connection) => (error ? reject(error) : resolve(connection))),
      );
    } catch (error) {
      throw translate(error, this.config, 'connect');
    }
  }

  /**
   * `fn` on one connection inside START TRANSACTION READ ONLY with the statement timeout; a connection
   * that saw an error (or was left mid-result) is destroyed rather than reused.
   */
  async #readOnly<T>(
    timeoutMs: number,
    fn: (c: PoolConnection) => Promise<T>,
    context: ErrorContext,
  ): Promise<T> {
    const connection = await this.#connect();
    const q = connection.promise();
    try {
      await q.query(timeoutSql(this.entry, timeoutMs));
      await q.query('start transaction read only');
      const result = await fn(connection);
      await q.query('commit');
      await q.query(timeoutSql(this.entry, 0));
      connection.release();
      return result;
    } catch (error) {
      connection.destroy();
      throw translate(error, this.config, context);
    }
  }

  #rows = async <R>(c: PoolConnection, sql: string, params: unknown[] = []): Promise<R[]> =>
    (await c.promise().query(sql, params))[0] as R[];

  async ping() {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (c) => {
        const [row] = await this.#rows<{ server_version: string; database: string; user: string }>(
          c,
          'select version() as server_version, database() as `database`, current_user() as `user`',
        );
        return row;
      },
      'connect',
    );
  }

  /**
   * The server as it names itself, whatever host spelling reached it: MySQL's `server_uuid` (kept in
   * its data directory), MariaDB's `server_uid` (derived from the machine's hardware address and the
   * port); a server with neither is named by its own host name and port.
   */
  async serverIdentity(): Promise<string> {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (c) => {
        const rows = await this.#rows<{ Variable_name: string; Value: string }>(
          c,
          "show global variables where variable_name in ('server_uuid', 'server_uid', 'hostname', 'port')",
        );
        const value = Object.fromEntries(rows.map((r) => [r.Variable_name.toLowerCase(), r.Value]));
        if (value.server_uuid) return `server_uuid ${value.server_uuid}`;
        if (value.server_uid) return `server_uid ${value.server_uid}`;
        return `hostname ${value.hostname}:${value.port}`;
      },
      'connect',
    );
  }

  async catalogs() {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (c) => {
        const rows = await this.#rows<{ name: string }>(
          c,
          `select schema_name as name from information_schema.schemata
            where schema_name not in ('information_schema', 'performance_schema', 'mysql', 'sys') order by 1`,
        );
        const names = rows.map((r) => r.name);
        return { databases: names, schemas: names };
      },
      'internal',
    );
  }

  async sourceColumns(tables: TableRef[]): Promise<Map<string, MysqlColumn[]>> {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      (c) => mysqlSourceColumns(this.#on(c), !!this.entry.mariadb, tables),
      'internal',
    );
  }

  /** Four catalog queries whatever the number of tables, like the PostgreSQL introspection. */
  introspect(options: IntrospectOptions = {}): Promise<IntrospectedSchema> {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      (c) => mysqlIntrospect(this.#on(c), !!this.entry.mariadb, this.config, options),
      'internal',
    );
  }

  #on =
    (c: PoolConnection) =>
    <R>(sql: string, params?: unknown[]) =>
      this.#rows<R>(c, sql, params);

  async sampleValues(table: TableRef, column: string, limit = 20): Promise<SampleValue[]> {
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000)
      throw new AppError('BAD_REQUEST', 'limit must be an integer between 1 and 1000');
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (c) => {
        const [found] = await this.#rows<{ type: string }>(
          c,
          'select data_type as type from information_schema.columns where table_schema = ? and table_name = ? and column_name = ?',
          [table.schema, table.name, column],
        );
        if (!found)
          throw new AppError('NOT_FOUND', `Column ${table.schema}.${table.name}.${column} not found`);
        const col = quoteMysqlIdent(column);
        // As query results show them: a BIT as its number, bytes as \x hex (cast to char read them as
        // text in the connection's charset, mojibake).
        const type = String(found.type).toLowerCase();
        const text =
          type === 'bit'
            ? `cast(${col} + 0 as char)`
            : /^(tiny|medium|long)?blob$|^(var)?binary$/.test(type)
              ? `concat('\\\\x', lower(hex(${col})))`
              : `cast(${col} as char)`;
        // Grouped on the whole value so that long ones sharing a beginning keep their own counts, and
        // shown cut (see SAMPLE_VALUE_MAX_LENGTH).
        const max = SAMPLE_VALUE_MAX_LENGTH;
        const rows = await this.#rows<{ value: string; truncated: number; count: string | number }>(
          c,
          `select case when char_length(v) > ${max} then concat(left(v, ${max}), '${SAMPLE_VALUE_CUT}') else v end as value,
                  char_length(v) > ${max} as truncated, count(*) as count
             from (select ${text} as v from ${mysqlQualified(table)} where ${col} is not null) as sampled
            group by v order by count(*) desc, v limit ?`,
          [limit],
        );
        return rows.map((r) => sampleValue(r.value, r.truncated, r.count));
      },
      'internal',
    );
  }

  /**
   * A 400 when user SQL calls a stored function of the source. The guard cannot see what a function
   * does, and the catalog cannot tell either: SQL_DATA_ACCESS (NO SQL, READS SQL DATA) and
   * IS_DETERMINISTIC are declarations MySQL does not enforce, and a function that truly reads no table
   * may still take a named lock (GET_LOCK, kept past the transaction), read a file (LOAD_FILE), write
   * one (SELECT … INTO OUTFILE) or change session state. Any function listed in
   * information_schema.ROUTINES is refused; the built-in functions are not listed there.
   */
  async #refuseStoredFunctions(c: PoolConnection, statement: string): Promise<void> {
    const calls = calledFunctions(statement);
    if (!calls.length) return;
    const functions = await this.#rows<{ schema: string; name: string }>(
      c,
      `select routine_schema as \`schema\`, routine_name as name from information_schema.routines
        where routine_type = 'FUNCTION' and routine_name in (?)`,
      [[...new Set(calls.map((f) => f.name))]],
    );
    // Compared regardless of case: a database name's case matters on some servers only; refusing
    // too much is the safe side.
    const same = (a: string, b: string) => a.toLowerCase() === b.toLowerCase();
    for (const call of calls) {
      const found = functions.find(
        (f) => same(f.name, call.name) && same(f.schema, call.schema ?? this.config.database),
      );
      if (found)
        throw new AppError(
          'BAD_REQUEST',
          `The query calls stored function ${found.schema}.${found.name}, which may not run on the source: MySQL does not enforce what a stored function declares (NO SQL, READS SQL DATA), and one can take locks (GET_LOCK), read or write files or change the session. Query the tables it reads instead`,
          { reason: 'NOT_READ_ONLY' },
        );
    }
  }

  /**
   * User SQL: checked by the MySQL guard, then streamed inside READ ONLY with the timeout; rows and
   * bytes are counted as they arrive and the connection is dropped at either cap.
   */
  async readOnlyQuery(sql: string, options: ReadOptions = {}): Promise<QueryResult> {
    const statement = assertMysqlReadOnly(sql);
    const cap = Math.min(options.limit ?? this.settings.rowCap, this.settings.rowCap);
    const byteCap = this.settings.resultByteCap;
    const started = performance.now();
    const connection = await this.#connect();
    const q = connection.promise();
    try {
      await q.query(timeoutSql(this.entry, options.timeoutMs ?? this.settings.statementTimeoutMs));
      await q.query('start transaction read only');
      await this.#refuseStoredFunctions(connection, statement);
      const { rows, fields, stopped } = await readCapped(connection, statement, options.params, cap, byteCap);
      // Only an OK packet came back (what a statement the guard should have refused answers).
      if (!fields?.length)
        throw new AppError(
          'BAD_REQUEST',
          'The statement returned no result set: only queries that return rows run on the source',
          {
            reason: 'NO_RESULT_SET',
          },
        );
      const truncated = rows.length > cap;
      if (truncated) rows.length = cap;
      bytesAsJson(rows, fields);
      if (stopped) connection.destroy();
      else {
        await q.query('commit');
        await q.query(timeoutSql(this.entry, 0));
        connection.release();
      }
      return {
        columns: fields.map((f) => ({ name: f.name, type: fieldTypeName(f) })),
        rows,
        row_count: rows.length,
        truncated,
        duration_ms: Math.round(performance.now() - started),
      };
    } catch (error) {
      connection.destroy();
      throw translate(error, this.config, 'user-sql');
    }
  }

  async assertUserSqlAllowed(sql: string): Promise<void> {
    const statement = assertMysqlReadOnly(sql);
    // A statement that calls nothing by name needs no connection for the catalog lookup.
    if (!calledFunctions(statement).length) return;
    await this.#readOnly(
      this.settings.statementTimeoutMs,
      (c) => this.#refuseStoredFunctions(c, statement),
      'user-sql',
    );
  }

  /** Generated MySQL statements only (profiling, loader bounds). */
  async aggregate(sql: string, options: AggregateOptions = {}): Promise<Record<string, unknown>[]> {
    return this.#readOnly(
      options.timeoutMs ?? this.settings.statementTimeoutMs,
      (c) => this.#rows<Record<string, unknown>>(c, sql, options.params),
      'user-sql',
    );
  }

  /** Discovery's column profiles as MySQL SQL (same numbers as the PostgreSQL profile). */
  profileTable(
    schema: string,
    table: string,
    columns: readonly ProfileColumnInput[],
    options?: ProfileQueryOptions,
  ): Promise<ColumnProfile[]> {
    return mysqlProfileTable(
      (sql, params) => this.aggregate(sql, { params }),
      schema,
      table,
      columns,
      options,
    );
  }

  async *stream(sql: string, options: StreamOptions = {}): AsyncGenerator<Record<string, unknown>[]> {
    await this.assertUserSqlAllowed(sql);
    const statement = assertMysqlReadOnly(sql);
    yield* this.extract(statement, { params: options.params, batchSize: options.batchSize, raw: false });
  }

  /**
   * Rows of a statement dimas generated, streamed from the server (mysql2 reads row by row, paused
   * while a batch is being consumed) in a consistent-snapshot READ ONLY transaction. With `raw`,
   * values are the server's bytes (typeCast off), as the loader encodes them; rows are arrays then.
   */
  async *extract(
    sql: string,
    options: { params?: unknown[]; batchSize?: number; raw?: boolean; signal?: AbortSignal },
  ): AsyncGenerator<Record<string, unknown>[]> {
    const connection = await this.#connect();
    let clean = false;
    try {
      try {
        await connection.promise().query(timeoutSql(this.entry, 0));
        await connection.promise().query('start transaction with consistent snapshot, read only');
      } catch (error) {
        throw translate(error, this.config, 'user-sql');
      }
      const query = connection.query({
        sql,
        values: options.params,
        ...(options.raw ? { typeCast: false, rowsAsArray: true } : {}),
      });
      const stream = query.stream({ highWaterMark: options.batchSize ?? 1000 });
      const batchSize = options.batchSize ?? 1000;
      let batch: Record<string, unknown>[] = [];
      try {
        for await (const row of stream) {
          batch.push(row as Record<string, unknown>);
          if (batch.length >= batchSize) {
            yield batch;
            batch = [];
            if (options.signal?.aborted) throw options.signal.reason ?? new Error('aborted');
          }
        }
      } catch (error) {
        throw translate(error, this.config, 'user-sql');
      }
      if (batch.length) yield batch;
      await connection.promise().query('commit');
      clean = true;
    } finally {
      // Stopped early: the server may still be sending; that connection cannot be reused.
      if (clean) connection.release();
      else connection.destroy();
    }
  }

  /**
   * The rows of a statement dimas generated as an object stream of arrays of the server's bytes
   * (typeCast off), read in a consistent-snapshot READ ONLY transaction: the loader pipes it straight
   * into COPY. `finish(true)` commits and returns the connection; `finish(false)` drops it (the server
   * may still be sending).
   */
  async openExtract(
    sql: string,
    params: unknown[] = [],
  ): Promise<{ rows: Readable; finish(ok: boolean): Promise<void>; translate(error: unknown): AppError }> {
    const connection = await this.#connect();
    try {
      await connection.promise().query(timeoutSql(this.entry, 0));
      await connection.promise().query('start transaction with consistent snapshot, read only');
    } catch (error) {
      connection.destroy();
      throw translate(error, this.config, 'internal');
    }
    const rows = connection
      .query({ sql, values: params, typeCast: false, rowsAsArray: true })
      .stream({ highWaterMark: EXTRACT_BUFFERED_ROWS });
    return {
      rows,
      finish: async (ok) => {
        if (!ok) return void connection.destroy();
        await connection.promise().query('commit');
        connection.release();
      },
      translate: (error) => translate(error, this.config, 'internal'),
    };
  }

  async transaction<T>(_fn: (tx: WarehouseTransaction) => Promise<T>): Promise<T> {
    throw new AppError(
      'BAD_REQUEST',
      'A MySQL / MariaDB connection is a source only: dimas writes into the PostgreSQL target warehouse',
      { reason: 'SOURCE_ONLY' },
    );
  }
}
