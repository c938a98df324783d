import { createHash } from 'node:crypto';
import pg from 'pg';
import Cursor from 'pg-cursor';
import { from as copyFrom, to as copyTo } from 'pg-copy-streams';
import { AppError } from '../app-error.ts';
import type { AppDeps } from '../deps.ts';
import type { ConnectionConfig, ConnectionWarning } from './config.ts';
import { introspectCatalog } from './introspect.ts';
import { MysqlPools } from './mysql.ts';
import {
  DEFAULT_BLOCKED_NETWORKS,
  networkGuardSettings,
  parseNetworkList,
  resolveCheckedAddress,
  type CheckedAddress,
  type NetworkGuardSettings,
} from './network-guard.ts';
import { assertReadOnlySql, catalogVerdictSql, refusedRoutine, type CalledRoutines } from './sql-guard.ts';
import type {
  AggregateOptions,
  IntrospectOptions,
  QueryResult,
  ReadOptions,
  SampleValue,
  StreamOptions,
  TableRef,
  Warehouse,
  WarehouseTransaction,
} from './warehouse.ts';

export const SAMPLE_LIMIT_DEFAULT = 20;
export const SAMPLE_LIMIT_MAX = 1000;

export interface WarehouseSettings {
  statementTimeoutMs: number;
  rowCap: number;
  /** Most bytes of row values a read-only query may return (default 16 MiB); more answers 413. */
  resultByteCap?: number;
  /** The control plane's identity: a workspace connection that reaches that database is refused. */
  controlPlane?: ServerIdentity | Promise<ServerIdentity>;
  /** Networks refused and whether socket paths are allowed (default: the built-in blocked networks, no sockets). */
  network?: NetworkGuardSettings;
  /** Refuse roles that are superusers or bypass row-level security (otherwise they are only flagged). */
  refuseSuperuser?: boolean;
  /** Connections per pool. */
  poolMax?: number;
  /** A pool nobody used for this long is closed. */
  poolIdleMs?: number;
}

/** Quotes an identifier the way PostgreSQL's quote_ident does (always, so case and keywords survive). */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

export function qualified(table: TableRef): string {
  return `${quoteIdent(table.schema)}.${quoteIdent(table.name)}`;
}

// Dates and times stay as PostgreSQL prints them: a `date` must not shift through a JS Date.
const RAW_TEXT_TYPES = new Set([1082, 1083, 1114, 1184, 1186, 1266]);
const typeParsers = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
    RAW_TEXT_TYPES.has(oid)
      ? (value: string) => value
      : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
};

type ErrorContext = 'connect' | 'user-sql' | 'internal';

const NETWORK_REASONS: Record<string, string> = {
  ENOTFOUND: 'unknown host',
  EAI_AGAIN: 'the host name could not be resolved',
  ECONNREFUSED: 'connection refused',
  ETIMEDOUT: 'connection timed out',
  EHOSTUNREACH: 'host unreachable',
  ENETUNREACH: 'network unreachable',
  ECONNRESET: 'connection reset by the server',
};

/**
 * Driver errors → AppError: anything about reaching or logging into the database is 422 with the
 * driver's reason; SQL the user wrote that the database rejects is 400 with the database's message.
 */
function translate(error: unknown, config: ConnectionConfig, context: ErrorContext): AppError {
  if (error instanceof AppError) return error;
  const e = error as Error & { code?: string; position?: string };
  const code = e.code ?? '';
  const where = `${config.host}:${config.port}/${config.database}`;
  if (NETWORK_REASONS[code])
    return new AppError(
      'UNPROCESSABLE_CONTENT',
      `Cannot connect to ${where}: ${NETWORK_REASONS[code]} (${e.message})`,
      {
        reason: code,
      },
    );
  const unreachable =
    /^(08|28|3D|53|57P)/.test(code) ||
    (!/^[0-9A-Z]{5}$/.test(code) &&
      (context === 'connect' || /timeout expired|Connection terminated|SSL/i.test(e.message)));
  if (unreachable)
    return new AppError(
      'UNPROCESSABLE_CONTENT',
      `Cannot connect to ${where} as ${config.user}: ${e.message}`,
      {
        reason: code || 'CONNECTION_FAILED',
      },
    );
  if (code === '57014')
    return new AppError(
      'UNPROCESSABLE_CONTENT',
      `The query was cancelled by the statement timeout: ${e.message}`,
      {
        reason: 'STATEMENT_TIMEOUT',
      },
    );
  if (context === 'user-sql' && /^[0-9A-Z]{5}$/.test(code)) {
    const at = e.position ? ` (position ${e.position})` : '';
    return new AppError('BAD_REQUEST', `The database rejected the query: ${e.message}${at}`, {
      reason: code,
    });
  }
  return new AppError(
    'UNPROCESSABLE_CONTENT',
    `The warehouse at ${where} failed: ${e.message ?? String(error)}`,
    {
      reason: code || undefined,
    },
  );
}

/**
 * Who a database is: the cluster's system identifier (shared only by the cluster and its physical
 * copies: replicas, restored base backups) and the database's oid inside it. Equal identities are the
 * same data, however the host was written.
 */
export interface ServerIdentity {
  systemIdentifier: string;
  databaseOid: string;
}

/** What the identity check learns about the connection's role. */
export interface RoleFacts {
  superuser: boolean;
  bypassRls: boolean;
}

// Every name schema-qualified: a function or view the role put earlier on its search_path cannot answer
// instead. pg_control_system() is executable by PUBLIC unless an administrator revoked it.
const IDENTITY_SQL = `select s.system_identifier::text as system_identifier, d.oid::text as database_oid,
    r.rolsuper as superuser, r.rolbypassrls as bypass_rls
  from pg_catalog.pg_control_system() s, pg_catalog.pg_database d, pg_catalog.pg_roles r
  where d.datname = pg_catalog.current_database() and r.rolname = current_user`;

interface IdentityRow {
  system_identifier: string;
  database_oid: string;
  superuser: boolean;
  bypass_rls: boolean;
}

/** The control plane's own identity (read once at start, through the ORM's connection). */
export async function readControlPlaneIdentity(orm: AppDeps['orm']): Promise<ServerIdentity> {
  let rows: IdentityRow[];
  try {
    rows = await orm.em.getConnection().execute<IdentityRow[]>(IDENTITY_SQL);
  } catch (error) {
    throw new Error(
      `dimas cannot read its own database's identity (pg_control_system()), which it needs to refuse workspace connections to that database: ${(error as Error).message}. Grant it: grant execute on function pg_catalog.pg_control_system() to <dimas role>`,
      { cause: error },
    );
  }
  return { systemIdentifier: rows[0].system_identifier, databaseOid: rows[0].database_oid };
}

/** The warnings a role's privileges deserve (shown with the connection's config and test answers). */
export function roleWarnings(facts: RoleFacts | undefined): ConnectionWarning[] {
  const warnings: ConnectionWarning[] = [];
  if (facts?.superuser)
    warnings.push({
      code: 'SUPERUSER',
      message:
        'The connection logs in as a superuser: it can read and change everything on that server. Use a role with only the privileges dimas needs',
    });
  if (facts?.bypassRls)
    warnings.push({
      code: 'BYPASS_RLS',
      message: 'The connection role bypasses row-level security: policies on its tables do not apply to it',
    });
  return warnings;
}

/** What a row weighs in the answer: string and buffer lengths, 8 bytes for other scalars. */
function sizeOfRow(row: Record<string, unknown>): number {
  let size = 0;
  for (const value of Object.values(row)) {
    if (typeof value === 'string') size += value.length;
    else if (Buffer.isBuffer(value)) size += value.length;
    else if (value !== null && typeof value === 'object') size += JSON.stringify(value).length;
    else size += 8;
  }
  return size;
}

/**
 * A 'data' listener that follows the protocol's message framing (type byte, 4-byte length) from a
 * message boundary and calls `onOversized` as soon as a header announces a message longer than
 * `maxBytes`: the bytes of such a message are never gathered. It only counts; pg parses as before.
 */
function messageSizeLimit(maxBytes: number, onOversized: () => void): (chunk: Buffer) => void {
  let bodyLeft = 0;
  const header = Buffer.alloc(5);
  let headerFill = 0;
  let stopped = false;
  return (chunk) => {
    let offset = 0;
    while (!stopped && offset < chunk.length) {
      if (bodyLeft > 0) {
        const skip = Math.min(bodyLeft, chunk.length - offset);
        bodyLeft -= skip;
        offset += skip;
        continue;
      }
      const take = Math.min(5 - headerFill, chunk.length - offset);
      chunk.copy(header, headerFill, offset, offset + take);
      headerFill += take;
      offset += take;
      if (headerFill < 5) return;
      headerFill = 0;
      bodyLeft = header.readInt32BE(1) - 4;
      if (bodyLeft > maxBytes) {
        stopped = true;
        onOversized();
      }
    }
  };
}

interface PoolEntry {
  key: string;
  config: ConnectionConfig;
  /** The pool once its host was resolved and checked (see #pool). */
  pool?: pg.Pool;
  opening?: Promise<pg.Pool>;
  lastUsed: number;
  /** Type OID → name, filled as result columns are described. */
  typeNames: Map<number, string>;
}

function poolKey(config: ConnectionConfig): string {
  const identity = [
    config.host,
    config.port,
    config.database,
    config.user,
    config.password ?? '',
    config.ssl,
  ];
  return createHash('sha256').update(JSON.stringify(identity)).digest('hex');
}

/** A role on a database (no password: what a role may do does not depend on how it logged in). */
function roleKey(config: Pick<ConnectionConfig, 'host' | 'port' | 'database' | 'user'>): string {
  return JSON.stringify([config.host, Number(config.port), config.database, config.user]);
}

const ROLE_FACTS_KEPT = 1000;
const IDENTITY_TIMEOUT_MS = 10_000;

/**
 * One bounded pool per distinct connection (keyed by a hash of what the connection is made of, so a
 * source and a target on the same database share it). A pool unused for a while is closed; so is an
 * owner's previous pool when its config changes.
 *
 * The trust boundary lives here, the one gate every area opens user connections through: a pool's
 * host is resolved once and checked (network-guard.ts), the pool connects to that address, and every
 * new physical connection asks the server who it is before anyone can use it.
 */
export class WarehouseRegistry {
  readonly settings: Required<Omit<WarehouseSettings, 'controlPlane'>> & {
    controlPlane?: ServerIdentity | Promise<ServerIdentity>;
  };
  #pools = new Map<string, PoolEntry>();
  #owners = new Map<string, string>();
  /** What the last identity check saw of each connection's role (outlives its pool, bounded). */
  #roles = new Map<string, RoleFacts>();
  #sweeper: NodeJS.Timeout;
  /** MySQL / MariaDB sources: pools of their own, behind the same network guard and settings. */
  #mysql: MysqlPools;

  constructor(settings: WarehouseSettings) {
    this.settings = {
      poolMax: 5,
      poolIdleMs: 10 * 60_000,
      resultByteCap: 16 * 1024 * 1024,
      refuseSuperuser: false,
      network: { blocked: parseNetworkList(DEFAULT_BLOCKED_NETWORKS.join(',')), allowSocketPaths: false },
      ...settings,
    };
    this.#mysql = new MysqlPools(this.settings);
    this.#sweeper = setInterval(() => void this.#sweep(), Math.min(60_000, this.settings.poolIdleMs)).unref();
  }

  /**
   * A warehouse over `config`; `owner` (e.g. `<workspace id>:source`) lets a changed config close the
   * old pool. Nothing connects yet: the checks run on first use and refuse with a 422 there.
   */
  async open(config: ConnectionConfig, owner?: string): Promise<Warehouse> {
    if (config.type === 'mysql') return this.#mysql.open(config);
    const key = poolKey(config);
    let entry = this.#pools.get(key);
    if (!entry) {
      entry = { key, config, lastUsed: Date.now(), typeNames: new Map() };
      this.#pools.set(key, entry);
    }
    if (owner) {
      const previous = this.#owners.get(owner);
      this.#owners.set(owner, key);
      if (previous && previous !== key && ![...this.#owners.values()].includes(previous))
        await this.#end(previous);
    }
    entry.lastUsed = Date.now();
    return new PostgresWarehouse(config, entry, this.settings, () => this.#pool(entry));
  }

  /**
   * Warnings about the role of `config` as its last identity check saw it (superuser, bypasses RLS):
   * no connection is made, so a connection not used since the server started has none yet.
   */
  warningsFor(config: Pick<ConnectionConfig, 'host' | 'port' | 'database' | 'user'>): ConnectionWarning[] {
    if ('type' in config && config.type === 'mysql')
      return this.#mysql.warningsFor(config as ConnectionConfig);
    return roleWarnings(this.#roles.get(roleKey(config)));
  }

  /** Pools currently open (for tests and system info). */
  get size(): number {
    return this.#pools.size;
  }

  async close(): Promise<void> {
    clearInterval(this.#sweeper);
    await this.#mysql.close();
    await Promise.all([...this.#pools.keys()].map((key) => this.#end(key)));
    this.#owners.clear();
  }

  /** The entry's pool, created on first use once its host resolved to allowed addresses. */
  #pool(entry: PoolEntry): Promise<pg.Pool> {
    if (entry.pool) return Promise.resolve(entry.pool);
    entry.opening ??= resolveCheckedAddress(entry.config.host, this.settings.network).then(
      (address) => {
        entry.opening = undefined;
        // A pool closed (config changed, idle sweep) while its host was being resolved stays closed.
        if (this.#pools.get(entry.key) !== entry)
          throw new AppError('UNPROCESSABLE_CONTENT', 'The connection was closed while it was being opened', {
            reason: 'CONNECTION_CLOSED',
          });
        entry.pool = this.#createPool(entry, address);
        return entry.pool;
      },
      (error: unknown) => {
        // Not remembered: a host that failed to resolve is looked up again on the next use.
        entry.opening = undefined;
        throw error;
      },
    );
    return entry.opening;
  }

  #createPool(entry: PoolEntry, address: CheckedAddress): pg.Pool {
    const { config } = entry;
    const pool = new pg.Pool({
      host: address.address,
      port: config.port,
      database: config.database,
      user: config.user,
      password: config.password,
      // Connected by address; the certificate is still verified against the name that was written.
      ssl: config.ssl ? { rejectUnauthorized: true, servername: address.servername } : undefined,
      max: this.settings.poolMax,
      idleTimeoutMillis: 30_000,
      connectionTimeoutMillis: 10_000,
      application_name: 'dimas',
      keepAlive: true,
      types: typeParsers,
      // Every new physical connection, before anyone uses it: the address a pool keeps may later
      // belong to another server. One query per connection, none per statement.
      onConnect: (client) => this.#checkIdentity(entry, client),
    });
    // An idle connection dropped by the server must not crash the process; the next query reconnects.
    pool.on('error', () => {});
    return pool;
  }

  async #checkIdentity(entry: PoolEntry, client: pg.ClientBase): Promise<void> {
    let row: IdentityRow | undefined;
    let unknown: string | undefined;
    try {
      // Bounded like the connection itself: a server that never answers must not hold the request.
      const query = { text: IDENTITY_SQL, query_timeout: IDENTITY_TIMEOUT_MS } as pg.QueryConfig;
      row = (await client.query<IdentityRow>(query)).rows[0];
    } catch (error) {
      const code = (error as { code?: string }).code;
      // 42501: EXECUTE revoked; 42883/0A000: a PostgreSQL-compatible server without the function.
      if (code === '42501')
        unknown = `Role ${entry.config.user} cannot execute pg_control_system(), which dimas needs to tell this database from its own; grant it with: grant execute on function pg_catalog.pg_control_system() to ${quoteIdent(entry.config.user)}`;
      else if (code === '42883' || code === '0A000')
        unknown = `This server has no pg_control_system(), which dimas needs to tell it from its own database`;
      else throw error;
    }
    // Refused rather than guessed: nothing else an unprivileged role can read tells a replica or a
    // restored copy of dimas's own database from an unrelated server.
    if (!row)
      throw new AppError('UNPROCESSABLE_CONTENT', unknown ?? 'The server did not say who it is', {
        reason: 'SERVER_IDENTITY_UNKNOWN',
      });
    const controlPlane = await this.settings.controlPlane;
    if (
      controlPlane &&
      row.system_identifier === controlPlane.systemIdentifier &&
      row.database_oid === controlPlane.databaseOid
    )
      throw new AppError(
        'UNPROCESSABLE_CONTENT',
        "This connection reaches dimas's own database, which is never reachable through a workspace, however the host is written",
        { reason: 'CONTROL_PLANE_DATABASE' },
      );
    const facts = { superuser: row.superuser, bypassRls: row.bypass_rls };
    const key = roleKey(entry.config);
    this.#roles.delete(key);
    this.#roles.set(key, facts);
    if (this.#roles.size > ROLE_FACTS_KEPT) this.#roles.delete(this.#roles.keys().next().value!);
    if (this.settings.refuseSuperuser && (facts.superuser || facts.bypassRls))
      throw new AppError(
        'UNPROCESSABLE_CONTENT',
        `Role ${entry.config.user} is a superuser or bypasses row-level security, which this server refuses for warehouse connections (WAREHOUSE_REFUSE_SUPERUSER)`,
        { reason: 'PRIVILEGED_ROLE' },
      );
  }

  async #end(key: string) {
    const entry = this.#pools.get(key);
    if (!entry) return;
    this.#pools.delete(key);
    for (const [owner, k] of this.#owners) if (k === key) this.#owners.delete(owner);
    await entry.pool?.end().catch(() => {});
  }

  async #sweep() {
    const cutoff = Date.now() - this.settings.poolIdleMs;
    for (const entry of [...this.#pools.values()])
      if (
        entry.lastUsed < cutoff &&
        !entry.opening &&
        (!entry.pool || (entry.pool.waitingCount === 0 && entry.pool.idleCount === entry.pool.totalCount))
      )
        await this.#end(entry.key);
  }
}

function readCursor(
  cursor: Cursor,
  count: number,
): Promise<{ rows: Record<string, unknown>[]; fields: pg.FieldDef[] }> {
  return new Promise((resolve, reject) =>
    cursor.read(count, (error, rows, result) =>
      error ? reject(error) : resolve({ rows, fields: result?.fields ?? [] }),
    ),
  );
}

class PostgresWarehouse implements Warehouse {
  constructor(
    readonly config: ConnectionConfig,
    private readonly entry: PoolEntry,
    private readonly settings: { statementTimeoutMs: number; rowCap: number; resultByteCap: number },
    private readonly pool: () => Promise<pg.Pool>,
  ) {}

  /** A checked connection: the pool's address passed the network guard and the server its identity check. */
  async #connect(): Promise<pg.PoolClient> {
    this.entry.lastUsed = Date.now();
    try {
      return await (await this.pool()).connect();
    } catch (error) {
      throw translate(error, this.config, 'connect');
    }
  }

  /** One client for `fn`; a client that saw an error is discarded rather than reused. */
  async #withClient<T>(fn: (client: pg.PoolClient) => Promise<T>, context: ErrorContext): Promise<T> {
    const client = await this.#connect();
    try {
      const result = await fn(client);
      client.release();
      return result;
    } catch (error) {
      client.release(true);
      throw translate(error, this.config, context);
    }
  }

  /**
   * READ ONLY transaction with a statement timeout around `fn`. With `calls` (what user SQL calls),
   * the same round trip asks the catalog which of them may not run, and refuses before running it;
   * the connection is then reset (`discard all`) after the commit, so nothing the statement did to its
   * session outlives it.
   */
  #readOnly<T>(
    timeoutMs: number,
    fn: (client: pg.PoolClient) => Promise<T>,
    context: ErrorContext,
    calls?: CalledRoutines,
  ): Promise<T> {
    return this.#withClient(async (client) => {
      await this.#begin(client, timeoutMs, calls);
      const result = await fn(client);
      await client.query('commit');
      // DISCARD ALL cannot share a multi-statement query (an implicit transaction): its own round trip.
      if (calls) await client.query('discard all');
      return result;
    }, context);
  }

  async #begin(client: pg.PoolClient, timeoutMs: number, calls?: CalledRoutines) {
    const verdict = calls ? catalogVerdictSql(calls) : null;
    // One round trip (no parameters: the simple protocol takes several statements).
    const results = (await client.query(
      `begin transaction read only; set local statement_timeout = ${Math.max(0, Math.floor(timeoutMs))}` +
        (verdict ? `; ${verdict}` : ''),
    )) as unknown as pg.QueryResult[] | pg.QueryResult;
    const refused = verdict && Array.isArray(results) ? results[2]?.rows[0] : undefined;
    if (refused) throw refusedRoutine(refused as { routine: string; kind: string });
  }

  async ping() {
    return this.#withClient(async (client) => {
      const { rows } = await client.query(
        `select current_setting('server_version') as server_version, current_database() as database, current_user as user`,
      );
      return rows[0] as { server_version: string; database: string; user: string };
    }, 'connect');
  }

  async catalogs() {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (client) => {
        const databases = await client.query<{ name: string }>(
          `select datname as name from pg_database
            where datallowconn and not datistemplate and has_database_privilege(datname, 'CONNECT')
            order by datname`,
        );
        const schemas = await client.query<{ name: string }>(
          `select nspname as name from pg_namespace
            where nspname !~ '^pg_' and nspname <> 'information_schema' and has_schema_privilege(nspname, 'USAGE')
            order by nspname`,
        );
        return { databases: databases.rows.map((r) => r.name), schemas: schemas.rows.map((r) => r.name) };
      },
      'internal',
    );
  }

  introspect(options?: IntrospectOptions) {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      (client) =>
        introspectCatalog(
          async <R>(sql: string, params: unknown[]) => (await client.query(sql, params)).rows as R[],
          { schemas: this.config.schemas, tables: this.config.tables },
          options,
        ),
      'internal',
    );
  }

  async sampleValues(table: TableRef, column: string, limit = SAMPLE_LIMIT_DEFAULT): Promise<SampleValue[]> {
    if (!Number.isInteger(limit) || limit < 1 || limit > SAMPLE_LIMIT_MAX)
      throw new AppError('BAD_REQUEST', `limit must be an integer between 1 and ${SAMPLE_LIMIT_MAX}`);
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (client) => {
        const exists = await client.query(
          `select 1 from pg_attribute a join pg_class c on c.oid = a.attrelid
             join pg_namespace n on n.oid = c.relnamespace
            where n.nspname = $1 and c.relname = $2 and a.attname = $3 and a.attnum > 0 and not a.attisdropped`,
          [table.schema, table.name, column],
        );
        if (!exists.rowCount)
          throw new AppError('NOT_FOUND', `Column ${table.schema}.${table.name}.${column} not found`);
        const col = quoteIdent(column);
        // Grouped on the text form so every type (json included) can be counted.
        const { rows } = await client.query<{ value: string; count: string }>(
          `select ${col}::text as value, count(*) as count from ${qualified(table)}
            where ${col} is not null group by 1 order by 2 desc, 1 limit $1`,
          [limit],
        );
        return rows.map((r) => ({ value: r.value, count: Number(r.count) }));
      },
      'internal',
    );
  }

  async readOnlyQuery(sql: string, options: ReadOptions = {}): Promise<QueryResult> {
    const { kind, statement, calls } = await assertReadOnlySql(sql);
    const cap = Math.min(options.limit ?? this.settings.rowCap, this.settings.rowCap);
    const started = performance.now();
    return this.#readOnly(
      options.timeoutMs ?? this.settings.statementTimeoutMs,
      async (client) => {
        // One row past the cap tells that the result was truncated. The cap is a LIMIT around the
        // statement rather than a cursor: PostgreSQL never runs a portal read with a row limit in
        // parallel, and aggregates over large tables need their parallel workers.
        const text =
          kind === 'EXPLAIN' ? statement : `select * from (\n${statement}\n) as capped limit ${cap + 1}`;
        const { rows, fields } = await this.#readCapped(client, text, options.params);
        const truncated = rows.length > cap;
        if (truncated) rows.length = cap;
        return {
          columns: await this.#describe(client, fields),
          rows,
          row_count: rows.length,
          truncated,
          duration_ms: Math.round(performance.now() - started),
        };
      },
      'user-sql',
      calls,
    );
  }

  /**
   * Runs `text`, keeping its rows as they arrive and counting their bytes: past the byte cap it stops
   * keeping them and answers 413 at once; the connection, which the server may still be filling,
   * is then dropped rather than reused. pg reads each protocol message whole before it parses it, so a
   * single row larger than the cap is stopped on its message header, before its bytes are held.
   */
  #readCapped(
    client: pg.PoolClient,
    text: string,
    params: unknown[] | undefined,
  ): Promise<{ rows: Record<string, unknown>[]; fields: pg.FieldDef[] }> {
    const byteCap = this.settings.resultByteCap;
    const socket = (client as unknown as pg.Client).connection.stream;
    return new Promise((resolve, reject) => {
      const rows: Record<string, unknown>[] = [];
      let bytes = 0;
      let over = false;
      const tooLarge = () => {
        over = true;
        reject(
          new AppError(
            'PAYLOAD_TOO_LARGE',
            `The result is larger than ${byteCap} bytes (WAREHOUSE_RESULT_BYTE_CAP) after ${rows.length} rows: select fewer rows or columns, or aggregate`,
            { reason: 'RESULT_TOO_LARGE' },
          ),
        );
      };
      const watchMessages = messageSizeLimit(byteCap, () => {
        if (!over) tooLarge();
        socket.destroy();
      });
      socket.prependListener('data', watchMessages);
      const done = () => socket.off('data', watchMessages);
      const query = new pg.Query(text, params);
      query.on('row', (row: Record<string, unknown>) => {
        if (over) return;
        bytes += sizeOfRow(row);
        if (bytes > byteCap) return tooLarge();
        rows.push(row);
      });
      query.on('error', (error: Error) => {
        done();
        if (!over) reject(error);
      });
      query.on('end', (result: pg.QueryResult) => {
        done();
        if (!over) resolve({ rows, fields: result.fields });
      });
      client.query(query);
    });
  }

  async assertUserSqlAllowed(sql: string): Promise<void> {
    const { calls } = await assertReadOnlySql(sql);
    await this.#readOnly(this.settings.statementTimeoutMs, async () => undefined, 'user-sql', calls);
  }

  async aggregate(sql: string, options: AggregateOptions = {}): Promise<Record<string, unknown>[]> {
    // Generated SQL carries users' expressions (metrics, filters, mapping expressions): the functions
    // it calls pass the same catalog rule as user SQL, and the connection is reset afterwards. What
    // can fail at run time (a cast, a division) is a 400 with the database's message, as for user SQL.
    const { calls } = await assertReadOnlySql(sql);
    return this.#readOnly(
      options.timeoutMs ?? this.settings.statementTimeoutMs,
      async (client) => (await client.query(sql, options.params)).rows,
      'user-sql',
      calls,
    );
  }

  async #describe(client: pg.PoolClient, fields: pg.FieldDef[]) {
    const unknown = [...new Set(fields.map((f) => f.dataTypeID))].filter(
      (oid) => !this.entry.typeNames.has(oid),
    );
    if (unknown.length) {
      const { rows } = await client.query<{ oid: number; name: string }>(
        'select oid::int as oid, format_type(oid, null) as name from pg_type where oid = any($1::oid[])',
        [unknown],
      );
      for (const r of rows) this.entry.typeNames.set(r.oid, r.name);
    }
    return fields.map((f) => ({ name: f.name, type: this.entry.typeNames.get(f.dataTypeID) ?? 'unknown' }));
  }

  async *stream(sql: string, options: StreamOptions = {}): AsyncGenerator<Record<string, unknown>[]> {
    const { calls } = await assertReadOnlySql(sql);
    const client = await this.#connect();
    let clean = false;
    try {
      try {
        await this.#begin(client, options.timeoutMs ?? 0, calls);
      } catch (error) {
        throw translate(error, this.config, 'user-sql');
      }
      const cursor = client.query(new Cursor(sql, options.params));
      const batchSize = options.batchSize ?? 1000;
      for (;;) {
        let rows: Record<string, unknown>[];
        try {
          rows = (await readCursor(cursor, batchSize)).rows;
        } catch (error) {
          throw translate(error, this.config, 'user-sql');
        }
        if (!rows.length) break;
        yield rows;
      }
      await cursor.close();
      await client.query('commit');
      await client.query('discard all');
      clean = true;
    } finally {
      // A consumer that stopped early leaves an open portal: drop that connection instead of reusing it.
      client.release(clean ? undefined : true);
    }
  }

  async transaction<T>(fn: (tx: WarehouseTransaction) => Promise<T>): Promise<T> {
    return this.#withClient(async (client) => {
      await client.query('begin');
      try {
        const result = await fn({
          query: async <R extends Record<string, unknown>>(text: string, params?: unknown[]) => {
            const res = await client.query<R>(text, params);
            return { rows: res.rows, rowCount: res.rowCount ?? 0 };
          },
          copyFrom: (text: string) => client.query(copyFrom(text)),
          copyTo: (text: string) => client.query(copyTo(text)),
        });
        await client.query('commit');
        return result;
      } catch (error) {
        await client.query('rollback').catch(() => {});
        throw error;
      }
    }, 'user-sql');
  }
}

const registries = new WeakMap<AppDeps, WarehouseRegistry>();

/** The server's warehouse pools (one registry per running server, created on first use). */
export function warehouses(deps: AppDeps): WarehouseRegistry {
  let registry = registries.get(deps);
  if (!registry) {
    // Servers read it at start; deps built without startServer (scripts) read it on first use.
    const controlPlane = deps.controlPlane ?? readControlPlaneIdentity(deps.orm);
    if (controlPlane instanceof Promise) controlPlane.catch(() => {});
    registry = new WarehouseRegistry({
      statementTimeoutMs: deps.env.WAREHOUSE_STATEMENT_TIMEOUT_MS,
      rowCap: deps.env.WAREHOUSE_ROW_CAP,
      resultByteCap: deps.env.WAREHOUSE_RESULT_BYTE_CAP,
      controlPlane,
      network: networkGuardSettings(deps.env),
      refuseSuperuser: deps.env.WAREHOUSE_REFUSE_SUPERUSER,
    });
    registries.set(deps, registry);
  }
  return registry;
}

/** Closes every pool the server opened (server shutdown). */
export async function closeWarehouses(deps: AppDeps): Promise<void> {
  await registries.get(deps)?.close();
  registries.delete(deps);
}
