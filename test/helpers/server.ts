import { mkdirSync, mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { inject } from 'vitest';
import { loadEnv, type Env } from '../../src/env.ts';
import { openDatabase } from '../../src/db/orm.ts';
import { createLogger, type Logger } from '../../src/logger.ts';
import { startServer, type RunningServer } from '../../src/server.ts';
import { SUPERADMIN_PASSWORD, SUPERADMIN_USERNAME, TEST_SECRET_KEY } from './constants.ts';

export type TestServer = RunningServer;

function sharedDataDir(): string {
  const dir = join(inject('scratchDir'), 'shared-server-data');
  mkdirSync(dir, { recursive: true });
  return dir;
}

/**
 * A real server on a random port over the run's database: the PostgreSQL server of
 * TEST_DATABASE_URL, or a private embedded copy of the migrated template. With `databaseUrl`, over
 * that database instead, migrated and seeded (its own super admin) at start.
 */
export async function startTestServer(
  overrides: Record<string, string> = {},
  options: { logger?: Logger; databaseUrl?: string } = {},
): Promise<TestServer> {
  const databaseUrl = options.databaseUrl ?? inject('databaseUrl');
  // Servers over the run's shared PostgreSQL database share a data directory, as a deployment's
  // processes do: any of them may end another's dead run (one queue), and removes its files there.
  const dataDir =
    databaseUrl && !options.databaseUrl
      ? sharedDataDir()
      : mkdtempSync(join(inject('scratchDir'), 'server-'));
  const env: Env = loadEnv({
    PORT: '0',
    DIMAS_DATA_DIR: dataDir,
    DIMAS_SECRET_KEY: TEST_SECRET_KEY,
    SUPERADMIN_USERNAME,
    SUPERADMIN_PASSWORD,
    SEED_DEMO: 'false',
    LOG_LEVEL: 'silent',
    AUTH_CACHE_TTL_MS: '0',
    LOGIN_MAX_FAILURES_PER_ADDRESS: '100000',
    ...(databaseUrl ? { DATABASE_URL: databaseUrl } : {}),
    ...overrides,
  });
  const db = databaseUrl
    ? await openDatabase({ databaseUrl })
    : await openDatabase({ loadDataDir: new Blob([readFileSync(inject('embeddedTemplate'))]) });
  return startServer(env, {
    db,
    seed: options.databaseUrl !== undefined,
    logger: options.logger ?? createLogger({ level: env.LOG_LEVEL }),
  });
}
