import { createHash } from 'node:crypto';
import net from 'node:net';
import type { Readable } from 'node:stream';
import mysql from 'mysql2';
import type { Pool, PoolConnection, FieldPacket } from 'mysql2';
import { AppError } from '../app-error.ts';
import { type ConnectionConfig, type ConnectionWarning, portOf } from './config.ts';
import { assertMysqlReadOnly } from './mysql-guard.ts';
import { mysqlProfileTable } from './mysql-profile.ts';
import { mapMysqlType } from './mysql-types.ts';
import { resolveCheckedAddress, type NetworkGuardSettings } from './network-guard.ts';
import { tableFilter } from './introspect.ts';
import type { ProfileColumnInput, ProfileQueryOptions, ColumnProfile } from '../llm/profile.ts';
import type {
  AggregateOptions,
  IntrospectedSchema,
  IntrospectedTable,
  IntrospectOptions,
  QueryResult,
  ReadOptions,
  SampleValue,
  StreamOptions,
  TableRef,
  Warehouse,
  WarehouseTransaction,
} from './warehouse.ts';

export interface MysqlSettings {
  statementTimeoutMs: number;
  rowCap: number;
  resultByteCap: number;
  network: NetworkGuardSettings;
  refuseSuperuser: boolean;
  poolMax: number;
}

/** A source column as the loader needs it: the MySQL type besides the PostgreSQL one it maps to. */
export interface MysqlColumn {
  name: string;
  columnType: string;
  json: boolean;
  autoIncrement: boolean;
  nullable: boolean;
}

export const quoteMysqlIdent = (name: string) => `\`${name.replaceAll('`', '``')}\``;
export const mysqlQualified = (t: TableRef) => `${quoteMysqlIdent(t.schema)}.${quoteMysqlIdent(t.name)}`;

/** For mysql configs, `schemas` lists databases; the PostgreSQL default (`public`) means the config's database. */
export function mysqlSchemas(config: ConnectionConfig): string[] {
  return config.schemas.length === 1 && config.schemas[0] === 'public' ? [config.database] : config.schemas;
}

const NETWORK_CODES = new Set([
  'ENOTFOUND',
  'EAI_AGAIN',
  'ECONNREFUSED',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ECONNRESET',
  'PROTOCOL_CONNECTION_LOST',
]);

type ErrorContext = 'connect' | 'user-sql' | 'internal';

/** Driver errors → AppError, as postgres.ts does: reaching/logging in is 422, rejected user SQL is 400. */
function translate(error: unknown, config: ConnectionConfig, context: ErrorContext): AppError {
  if (error instanceof AppError) return error;
  const e = error as Error & { code?: string; errno?: number; sqlMessage?: string };
  const where = `${config.host}:${portOf(config)}/${config.database}`;
  const code = e.code ?? '';
  if (
    NETWORK_CODES.has(code) ||
    context === 'connect' ||
    code === 'ER_ACCESS_DENIED_ERROR' ||
    code === 'ER_BAD_DB_ERROR'
  )
    return new AppError(
      'UNPROCESSABLE_CONTENT',
      `Cannot connect to ${where} as ${config.user}: ${e.message}`,
      {
        reason: code || 'CONNECTION_FAILED',
      },
    );
  // 3024 (MySQL max_execution_time), 1969 (MariaDB max_statement_time).
  if (e.errno === 3024 || e.errno === 1969)
    return new AppError(
      'UNPROCESSABLE_CONTENT',
      `The query was cancelled by the statement timeout: ${e.message}`,
      {
        reason: 'STATEMENT_TIMEOUT',
      },
    );
  if (e.errno === 1792)
    return new AppError(
      'BAD_REQUEST',
      `The source refused a write in a read-only transaction: ${e.message}`,
      {
        reason: 'NOT_READ_ONLY',
      },
    );
  if (context === 'user-sql' && e.sqlMessage)
    return new AppError('BAD_REQUEST', `The database rejected the query: ${e.sqlMessage}`, { reason: code });
  return new AppError(
    'UNPROCESSABLE_CONTENT',
    `The source at ${where} failed: ${e.message ?? String(error)}`,
    {
      reason: code || undefined,
    },
  );
}

interface PoolEntry {
  config: ConnectionConfig;
  pool?: Pool;
  opening?: Promise<Pool>;
  /** MariaDB spells the statement timeout differently from MySQL. */
  mariadb?: boolean;
  superuser?: boolean;
}

function poolKey(config: ConnectionConfig): string {
  const identity = [
    config.host,
    portOf(config),
    config.database,
    config.user,
    config.password ?? '',
    config.ssl,
  ];
  return createHash('sha256').update(JSON.stringify(identity)).digest('hex');
}

/** The MySQL side of the warehouse registry: one pool per distinct connection, opened through the network guard. */
export class MysqlPools {
  #pools = new Map<string, PoolEntry>();
  constructor(readonly settings: MysqlSettings) {}

  open(config: ConnectionConfig): MysqlWarehouse {
    const key = poolKey(config);
    let entry = this.#pools.get(key);
    if (!entry) this.#pools.set(key, (entry = { config }));
    return new MysqlWarehouse(config, entry, this.settings, () => this.#pool(entry));
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

  #pool(entry: PoolEntry): Promise<Pool> {
    if (entry.pool) return Promise.resolve(entry.pool);
    entry.opening ??= (async () => {
      try {
        const address = await resolveCheckedAddress(entry.config.host, this.settings.network);
        const pool = mysql.createPool({
          // Connected to the checked address; the host name stays for the TLS certificate check.
          host: address.kind === 'ip' && address.servername ? address.servername : address.address,
          port: portOf(entry.config),
          stream: () =>
            address.kind === 'ip'
              ? net.connect(portOf(entry.config), address.address)
              : net.connect(`${address.address}/mysql.sock`),
          user: entry.config.user,
          password: entry.config.password,
          database: entry.config.database,
          ssl: entry.config.ssl ? { rejectUnauthorized: true, verifyIdentity: true } : undefined,
          connectionLimit: this.settings.poolMax,
          maxIdle: 1,
          idleTimeout: 30_000,
          connectTimeout: 10_000,
          charset: 'utf8mb4',
          timezone: 'Z',
          dateStrings: true,
          supportBigNumbers: true,
          bigNumberStrings: true,
          decimalNumbers: false,
          multipleStatements: false,
        });
        // Every connection reads times in UTC, so timestamp columns mean the same instant everywhere.
        pool.on('connection', (c) => {
          c.query("set time_zone = '+00:00'");
          // MySQL's default (1024 bytes) would cut the profile's sampled values.
          c.query('set session group_concat_max_len = 1048576');
        });
        await this.#checkRole(entry, pool);
        entry.pool = pool;
        return pool;
      } finally {
        entry.opening = undefined;
      }
    })();
    return entry.opening;
  }

  /** The server's flavour and whether the user holds SUPER (refused when the operator says so). */
  async #checkRole(entry: PoolEntry, pool: Pool) {
    let rows: { version: string; super: number | string }[];
    try {
      [rows] = (await pool.promise().query(
        `select version() as version,
                (select count(*) from information_schema.user_privileges
                  where privilege_type = 'SUPER'
                    and grantee = concat("'", substring_index(current_user(), '@', 1), "'@'", substring_index(current_user(), '@', -1), "'")) as super`,
      )) as unknown as [{ version: string; super: number | string }[]];
    } catch (error) {
      await pool
        .promise()
        .end()
        .catch(() => {});
      throw translate(error, entry.config, 'connect');
    }
    entry.mariadb = /mariadb/i.test(rows[0].version);
    entry.superuser = Number(rows[0].super) > 0;
    if (entry.superuser && this.settings.refuseSuperuser) {
      await pool
        .promise()
        .end()
        .catch(() => {});
      throw new AppError(
        'UNPROCESSABLE_CONTENT',
        `User ${entry.config.user} holds the SUPER privilege, which this server refuses for warehouse connections (WAREHOUSE_REFUSE_SUPERUSER)`,
        { reason: 'PRIVILEGED_ROLE' },
      );
    }
  }
}

interface RawColumnRow {
  schema: string;
  table: string;
  name: string;
  position: number;
  column_type: string;
  nullable: string;
  default: string | null;
  description: string;
  extra: string;
}

/** A MySQL / MariaDB source behind the Warehouse interface (read side only; targets are PostgreSQL). */
export class MysqlWarehouse implements Warehouse {
  readonly dialect = 'mysql' as const;
  constructor(
    readonly config: ConnectionConfig,
    private readonly entry: PoolEntry,
    private readonly settings: MysqlSettings,
    private readonly pool: () => Promise<Pool>,
  ) {}

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

  /** The session statement timeout in each flavour's spelling (MariaDB: seconds, for every statement). */
  #timeoutSql(ms: number): string {
    const value = Math.max(0, Math.floor(ms));
    return this.entry.mariadb
      ? `set session max_statement_time = ${value / 1000}`
      : `set session max_execution_time = ${value}`;
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
      await q.query(this.#timeoutSql(timeoutMs));
      await q.query('start transaction read only');
      const result = await fn(connection);
      await q.query('commit');
      await q.query(this.#timeoutSql(0));
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

  /** Columns with their MySQL types, for the loader (one catalog query for all the tables). */
  async sourceColumns(tables: TableRef[]): Promise<Map<string, MysqlColumn[]>> {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (c) => {
        const schemas = [...new Set(tables.map((t) => t.schema))];
        const { columns, json } = await this.#columns(c, schemas);
        const wanted = new Set(tables.map((t) => `${t.schema}.${t.name}`));
        const out = new Map<string, MysqlColumn[]>();
        for (const col of columns) {
          const key = `${col.schema}.${col.table}`;
          if (!wanted.has(key)) continue;
          if (!out.has(key)) out.set(key, []);
          out.get(key)!.push({
            name: col.name,
            columnType: col.column_type,
            json: json.has(`${key}.${col.name}`),
            autoIncrement: /auto_increment/i.test(col.extra),
            nullable: col.nullable === 'YES',
          });
        }
        return out;
      },
      'internal',
    );
  }

  async #columns(c: PoolConnection, schemas: string[]) {
    const columns = await this.#rows<RawColumnRow>(
      c,
      `select table_schema as \`schema\`, table_name as \`table\`, column_name as name, ordinal_position as position,
              column_type, is_nullable as nullable, column_default as \`default\`, column_comment as description, extra
         from information_schema.columns where table_schema in (?)
        order by table_schema, table_name, ordinal_position`,
      [schemas],
    );
    // MariaDB's json is longtext with a json_valid() check named after the column.
    const json = new Set<string>();
    if (this.entry.mariadb) {
      const checks = await this.#rows<{ schema: string; table: string; clause: string }>(
        c,
        `select constraint_schema as \`schema\`, table_name as \`table\`, check_clause as clause
           from information_schema.check_constraints where constraint_schema in (?) and check_clause like 'json_valid(%'`,
        [schemas],
      );
      for (const k of checks) {
        const m = /^json_valid\(`((?:[^`]|``)+)`\)$/.exec(k.clause.trim());
        if (m) json.add(`${k.schema}.${k.table}.${m[1].replaceAll('``', '`')}`);
      }
    }
    return { columns, json };
  }

  /** Four catalog queries whatever the number of tables, like the PostgreSQL introspection. */
  introspect(options: IntrospectOptions = {}): Promise<IntrospectedSchema> {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (c) => {
        const schemas = options.schemas ?? mysqlSchemas(this.config);
        const keep = tableFilter(options.tables ?? this.config.tables);
        const present = await this.#rows<{ name: string }>(
          c,
          'select schema_name as name from information_schema.schemata where schema_name in (?)',
          [schemas],
        );
        const relations = await this.#rows<{
          schema: string;
          name: string;
          type: string;
          description: string;
          rows: number | string | null;
        }>(
          c,
          `select table_schema as \`schema\`, table_name as name, table_type as type, table_comment as description,
                  table_rows as \`rows\`
             from information_schema.tables where table_schema in (?) order by table_schema, table_name`,
          [schemas],
        );
        const { columns, json } = await this.#columns(c, schemas);
        const keys = await this.#rows<{
          schema: string;
          table: string;
          name: string;
          kind: string;
          column: string;
          ref_schema: string | null;
          ref_table: string | null;
          ref_column: string | null;
        }>(
          c,
          `select k.table_schema as \`schema\`, k.table_name as \`table\`, k.constraint_name as name,
                  t.constraint_type as kind, k.column_name as \`column\`, k.referenced_table_schema as ref_schema,
                  k.referenced_table_name as ref_table, k.referenced_column_name as ref_column
             from information_schema.key_column_usage k
             join information_schema.table_constraints t
               on t.constraint_schema = k.constraint_schema and t.constraint_name = k.constraint_name
              and t.table_schema = k.table_schema and t.table_name = k.table_name
            where k.table_schema in (?) and t.constraint_type in ('PRIMARY KEY', 'FOREIGN KEY')
            order by k.table_schema, k.table_name, k.constraint_name, k.ordinal_position`,
          [schemas],
        );
        const tables = new Map<string, IntrospectedTable>();
        for (const r of relations) {
          if (!keep(r.schema, r.name) || r.type === 'SEQUENCE') continue;
          tables.set(`${r.schema}.${r.name}`, {
            schema: r.schema,
            name: r.name,
            kind: r.type === 'VIEW' ? 'view' : 'table',
            description: r.description || null,
            // InnoDB's estimate; views have none.
            estimated_rows: r.rows === null ? null : Number(r.rows),
            primary_key: [],
            foreign_keys: [],
            columns: [],
          });
        }
        for (const col of columns) {
          const key = `${col.schema}.${col.table}`;
          tables.get(key)?.columns.push({
            name: col.name,
            type: mapMysqlType(col.column_type, json.has(`${key}.${col.name}`)).pg,
            nullable: col.nullable === 'YES',
            default: col.default,
            description: col.description || null,
            position: Number(col.position),
          });
        }
        for (const k of keys) {
          const table = tables.get(`${k.schema}.${k.table}`);
          if (!table) continue;
          if (k.kind === 'PRIMARY KEY') table.primary_key.push(k.column);
          else {
            let fk = table.foreign_keys.find((f) => f.name === k.name);
            if (!fk) {
              fk = {
                name: k.name,
                columns: [],
                references: { schema: k.ref_schema ?? '', table: k.ref_table ?? '', columns: [] },
              };
              table.foreign_keys.push(fk);
            }
            fk.columns.push(k.column);
            fk.references.columns.push(k.ref_column ?? '');
          }
        }
        const found = new Set(present.map((p) => p.name));
        return {
          database: this.config.database,
          schemas: schemas.filter((s) => found.has(s)),
          tables: [...tables.values()],
        };
      },
      'internal',
    );
  }

  async sampleValues(table: TableRef, column: string, limit = 20): Promise<SampleValue[]> {
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000)
      throw new AppError('BAD_REQUEST', 'limit must be an integer between 1 and 1000');
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (c) => {
        const exists = await this.#rows(
          c,
          'select 1 from information_schema.columns where table_schema = ? and table_name = ? and column_name = ?',
          [table.schema, table.name, column],
        );
        if (!exists.length)
          throw new AppError('NOT_FOUND', `Column ${table.schema}.${table.name}.${column} not found`);
        const col = quoteMysqlIdent(column);
        const rows = await this.#rows<{ value: string; count: string | number }>(
          c,
          `select cast(${col} as char) as value, count(*) as count from ${mysqlQualified(table)}
            where ${col} is not null group by 1 order by 2 desc, 1 limit ?`,
          [limit],
        );
        return rows.map((r) => ({ value: String(r.value), count: Number(r.count) }));
      },
      'internal',
    );
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
      await q.query(this.#timeoutSql(options.timeoutMs ?? this.settings.statementTimeoutMs));
      await q.query('start transaction read only');
      const { rows, fields, stopped } = await new Promise<{
        rows: Record<string, unknown>[];
        fields: FieldPacket[];
        stopped: boolean;
      }>((resolve, reject) => {
        const rows: Record<string, unknown>[] = [];
        let fields: FieldPacket[] = [];
        let bytes = 0;
        let done = false;
        const query = connection.query({ sql: statement, values: options.params });
        query.on('fields', (f: FieldPacket[]) => (fields = f));
        query.on('result', (row: Record<string, unknown>) => {
          if (done) return;
          if (rows.length === cap) {
            done = true;
            return resolve({ rows: [...rows, row], fields, stopped: true });
          }
          for (const v of Object.values(row))
            bytes += typeof v === 'string' ? v.length : Buffer.isBuffer(v) ? v.length : 8;
          if (bytes > byteCap) {
            done = true;
            return reject(
              new AppError(
                'PAYLOAD_TOO_LARGE',
                `The result is larger than ${byteCap} bytes (WAREHOUSE_RESULT_BYTE_CAP) after ${rows.length} rows: select fewer rows or columns, or aggregate`,
                { reason: 'RESULT_TOO_LARGE' },
              ),
            );
          }
          rows.push(row);
        });
        query.on('error', (error: Error) => {
          if (!done) reject(error);
          done = true;
        });
        query.on('end', () => {
          if (!done) resolve({ rows, fields, stopped: false });
          done = true;
        });
      });
      const truncated = rows.length > cap;
      if (truncated) rows.length = cap;
      if (stopped) connection.destroy();
      else {
        await q.query('commit');
        await q.query(this.#timeoutSql(0));
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
    assertMysqlReadOnly(sql);
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
        await connection.promise().query(this.#timeoutSql(0));
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
      await connection.promise().query(this.#timeoutSql(0));
      await connection.promise().query('start transaction with consistent snapshot, read only');
    } catch (error) {
      connection.destroy();
      throw translate(error, this.config, 'internal');
    }
    const rows = connection
      .query({ sql, values: params, typeCast: false, rowsAsArray: true })
      .stream({ highWaterMark: 2000 });
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

const FIELD_TYPES: Record<number, string> = {
  0: 'numeric',
  1: 'smallint',
  2: 'smallint',
  3: 'integer',
  4: 'real',
  5: 'double precision',
  7: 'timestamp with time zone',
  8: 'bigint',
  9: 'integer',
  10: 'date',
  11: 'interval',
  12: 'timestamp without time zone',
  13: 'smallint',
  16: 'bigint',
  245: 'jsonb',
  246: 'numeric',
  247: 'text',
  248: 'text[]',
  252: 'text',
  253: 'text',
  254: 'text',
  255: 'bytea',
};

/** A result column's type in the PostgreSQL spelling the rest of dimas reads. */
function fieldTypeName(f: FieldPacket): string {
  const type =
    (f as { columnType?: number; type?: number }).columnType ?? (f as { type?: number }).type ?? -1;
  // Binary charset (63) on a string type means bytes.
  if ((type === 252 || type === 253 || type === 254) && (f as { characterSet?: number }).characterSet === 63)
    return 'bytea';
  return FIELD_TYPES[type] ?? 'text';
}
