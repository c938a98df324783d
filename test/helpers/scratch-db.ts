import pg from 'pg';
import { unique } from './api.ts';

/**
 * The PostgreSQL server that holds the tests' own databases (warehouses, sources, the control planes
 * of child servers): the one of TEST_DATABASE_URL, else the local one, in both test modes.
 */
export const ADMIN_URL = process.env.TEST_DATABASE_URL ?? 'postgresql://postgres@127.0.0.1:5432/postgres';

/** The URL of database `name` on the ADMIN_URL server. */
function databaseUrl(name: string): string {
  const url = new URL(ADMIN_URL);
  url.pathname = `/${name}`;
  return url.toString();
}

// A type rather than an interface: it must pass where a Record<string, unknown> is asked for.
export type PgConfig = {
  type: 'postgres';
  host: string;
  port: number;
  database: string;
  user: string;
  password?: string;
};

/**
 * The connection config of database `database` on the ADMIN_URL server, as a workspace source or
 * target, a destination or the warehouse layer takes it; `overrides` adds or replaces fields.
 */
export function pgConfig<O extends Record<string, unknown> = Record<never, never>>(
  database: string,
  overrides?: O,
): PgConfig & O {
  const url = new URL(ADMIN_URL);
  const password = decodeURIComponent(url.password);
  return {
    type: 'postgres',
    host: url.hostname,
    port: Number(url.port || 5432),
    database,
    user: decodeURIComponent(url.username) || 'postgres',
    ...(password ? { password } : {}),
    ...(overrides as O),
  };
}

/** `fn` with a connection of its own to `url`, closed afterwards. */
export async function withClient<T>(
  url: string,
  fn: (client: pg.Client) => Promise<T>,
  config: Omit<pg.ClientConfig, 'connectionString'> = {},
): Promise<T> {
  const client = new pg.Client({ ...config, connectionString: url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/**
 * The rows of `text` run on a connection of its own to `url`. Without `params` the text may hold
 * several statements (simple protocol); their rows are then not returned.
 */
export function runSql<R extends Record<string, unknown> = Record<string, any>>(
  url: string,
  text: string,
  params: unknown[] = [],
): Promise<R[]> {
  return withClient(url, async (client) => (await client.query<R>(text, params)).rows);
}

export interface ScratchDatabase {
  /** Known before the database exists, so that configurations can name it at module level. */
  readonly name: string;
  readonly url: string;
  create(): Promise<void>;
  sql<R extends Record<string, unknown> = Record<string, any>>(
    text: string,
    params?: unknown[],
  ): Promise<R[]>;
  /** Drops it even while connections remain (a server under test may still hold some). */
  drop(): Promise<void>;
}

/** A database on the ADMIN_URL server named `dimas_<purpose>_…`, unique to this test; create() it before use. */
export function scratchDatabase(purpose: string): ScratchDatabase {
  const name = unique(`dimas_${purpose}_`).toLowerCase();
  const url = databaseUrl(name);
  return {
    name,
    url,
    create: async () => {
      await runSql(ADMIN_URL, `create database "${name}"`);
    },
    sql: (text, params) => runSql(url, text, params),
    drop: async () => {
      await runSql(ADMIN_URL, `drop database if exists "${name}" with (force)`);
    },
  };
}

/**
 * Why tests that need the PostgreSQL server itself (a proxy in front of it, a killed server process)
 * cannot run, or undefined when it answers.
 */
export async function postgresUnavailable(): Promise<string | undefined> {
  try {
    await withClient(ADMIN_URL, async () => {}, { connectionTimeoutMillis: 3000 });
    return undefined;
  } catch (error) {
    return `needs a PostgreSQL server (TEST_DATABASE_URL or 127.0.0.1:5432), none answered: ${(error as Error).message}`;
  }
}
