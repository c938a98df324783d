import { createHash } from 'node:crypto';
import net from 'node:net';
import mysql from 'mysql2';
import type { Pool } from 'mysql2';
import { AppError } from '../app-error.ts';
import { type ConnectionConfig, portOf } from './config.ts';
import { LEXING_SQL_MODE } from './mysql-guard.ts';
import { resolveCheckedAddress, type NetworkGuardSettings } from './network-guard.ts';
import type { TableRef } from './warehouse.ts';

/**
 * The connection side of MySQL / MariaDB sources: settings, identifier quoting, driver errors as
 * AppErrors, and the pools (opened through the network guard, then checked for the server's flavour
 * and the user's SUPER privilege before anyone uses them).
 */

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

export type ErrorContext = 'connect' | 'user-sql' | 'internal';

/** Driver errors → AppError, as postgres.ts does: reaching/logging in is 422, rejected user SQL is 400. */
export function translate(error: unknown, config: ConnectionConfig, context: ErrorContext): AppError {
  if (error instanceof AppError) return error;
  // The driver's error stays the cause: its errno tells a job whether a retry can help (job-types).
  return Object.assign(translated(error, config, context), { cause: error });
}

function translated(error: unknown, config: ConnectionConfig, context: ErrorContext): AppError {
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
  // Deadlock and lock wait timeout: lost to concurrent work, the same request can succeed when retried.
  if (e.errno === 1213 || e.errno === 1205)
    return new AppError(
      'SERVICE_UNAVAILABLE',
      `The source aborted the query because of concurrent work; retry: ${e.message}`,
      { reason: code },
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

export interface PoolEntry {
  config: ConnectionConfig;
  pool?: Pool;
  opening?: Promise<Pool>;
  /** MariaDB spells the statement timeout differently from MySQL. */
  mariadb?: boolean;
  superuser?: boolean;
}

export function poolKey(config: ConnectionConfig): string {
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

/** The entry's pool, opened on first use through the network guard and checked before it is kept. */
export function entryPool(entry: PoolEntry, settings: MysqlSettings): Promise<Pool> {
  if (entry.pool) return Promise.resolve(entry.pool);
  entry.opening ??= (async () => {
    try {
      const address = await resolveCheckedAddress(entry.config.host, settings.network);
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
        connectionLimit: settings.poolMax,
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
        c.query(LEXING_SQL_MODE);
        c.query("set time_zone = '+00:00'");
        // MySQL's default (1024 bytes) would cut the profile's sampled values.
        c.query('set session group_concat_max_len = 1048576');
      });
      await checkRole(entry, pool, settings);
      entry.pool = pool;
      return pool;
    } finally {
      entry.opening = undefined;
    }
  })();
  return entry.opening;
}

/** The server's flavour and whether the user holds SUPER (refused when the operator says so). */
async function checkRole(entry: PoolEntry, pool: Pool, settings: MysqlSettings) {
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
  if (entry.superuser && settings.refuseSuperuser) {
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

/** The session statement timeout in each flavour's spelling (MariaDB: seconds, for every statement). */
export function timeoutSql(entry: Pick<PoolEntry, 'mariadb'>, ms: number): string {
  const value = Math.max(0, Math.floor(ms));
  return entry.mariadb
    ? `set session max_statement_time = ${value / 1000}`
    : `set session max_execution_time = ${value}`;
}
