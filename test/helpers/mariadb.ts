import mysql from 'mysql2/promise';
import { unique } from './api.ts';

export const MARIADB = { host: '127.0.0.1', port: 3306, user: 'root' };

/** Why MariaDB tests cannot run (no server on 127.0.0.1:3306), or undefined when it answers. */
export async function mariadbUnavailable(): Promise<string | undefined> {
  try {
    const c = await mysql.createConnection({ ...MARIADB, connectTimeout: 3000 });
    await c.end();
    return undefined;
  } catch (error) {
    return `needs MariaDB/MySQL on 127.0.0.1:3306 as root without a password (.ci/run starts it): ${(error as Error).message}`;
  }
}

export interface ScratchMysql {
  readonly name: string;
  create(): Promise<void>;
  sql<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<R[]>;
  drop(): Promise<void>;
}

/** A database of its own on the local MariaDB, unique to the test. */
export function scratchMysql(purpose: string): ScratchMysql {
  const name = unique(`dimas_${purpose}_`).toLowerCase();
  const run = async <R>(text: string, params?: unknown[], database?: string) => {
    const c = await mysql.createConnection({ ...MARIADB, database, timezone: 'Z', dateStrings: true });
    try {
      await c.query("set time_zone = '+00:00'");
      // Zero dates and other legacy values the loader must cope with are accepted only without strict mode.
      await c.query("set sql_mode = ''");
      return (await c.query(text, params))[0] as R[];
    } finally {
      await c.end();
    }
  };
  return {
    name,
    create: async () => {
      await run(`create database \`${name}\` character set utf8mb4`);
    },
    sql: (text, params) => run(text, params, name),
    drop: async () => {
      await run(`drop database if exists \`${name}\``);
    },
  };
}
