import { randomBytes } from 'node:crypto';
import {
  appendFileSync,
  chmodSync,
  existsSync,
  mkdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import type { Server } from 'node:net';
import { join } from 'node:path';
import { PGlite } from '@electric-sql/pglite';
import { PGLiteSocketServer } from '@electric-sql/pglite-socket';
import type { Logger } from '../logger.ts';
import type { ConnectionConfig } from './config.ts';
import { startAuthenticatingFront } from './demo-auth.ts';
import { createDataDirInChildProcess, embeddedInstanceOptions } from '../db/embedded.ts';
import {
  DEMO_SOURCE_SCHEMA,
  DEMO_TARGET_SCHEMA,
  demoSchemaSql,
  demoSourceStatements,
} from '../../seeds/demo-source/generate.ts';

/**
 * The embedded mode's demo warehouse: a second PGlite instance (never the control-plane database)
 * behind a pg-wire socket on 127.0.0.1, so the same `pg` implementation serves it as any warehouse.
 * PGlite runs one statement at a time and ignores statement_timeout; it is demo data, not production.
 */
export interface DemoWarehouse {
  host: string;
  port: number;
  database: string;
  user: string;
  /** Kept in `<data dir>/warehouse.password` and written to credentials.txt at first start. */
  password: string;
  /** The port of the previous start, which configs stored then still name. */
  previousPort: number;
  sourceConfig: ConnectionConfig;
  targetConfig: ConnectionConfig;
  close(): Promise<void>;
}

// Above the pool size (5) times the few pools that may point at it (source, target, tests).
const MAX_CONNECTIONS = 32;

async function isSeeded(db: PGlite): Promise<boolean> {
  const { rows } = await db.query<{ n: number }>(
    `select count(*)::int as n from pg_namespace where nspname = $1`,
    [DEMO_SOURCE_SCHEMA],
  );
  return rows[0].n > 0;
}

/** Creates the shop and the empty target schema once, in one transaction (a half-seeded demo never stays). */
async function seedDemo(db: PGlite, logger: Logger) {
  if (await isSeeded(db)) return;
  const started = Date.now();
  await db.transaction(async (tx) => {
    await tx.exec(demoSchemaSql());
    for (const statement of demoSourceStatements()) await tx.exec(statement);
  });
  // Estimated row counts come from the planner's statistics.
  await db.exec('analyze');
  logger.info({ ms: Date.now() - started }, 'demo warehouse seeded');
}

/** Starts (and seeds on first use) the demo warehouse in `<dataDir>/warehouse`; reuses its last port when free. */
export async function startDemoWarehouse(options: {
  dataDir: string;
  logger: Logger;
  port?: number;
}): Promise<DemoWarehouse> {
  const dir = join(options.dataDir, 'warehouse');
  await createDataDirInChildProcess(dir);
  const db = await PGlite.create(dir, await embeddedInstanceOptions());
  await seedDemo(db, options.logger);
  // PGlite's socket server trusts every client: it listens only on a Unix socket in a directory
  // only the owner may enter, behind a TCP front that asks for the password.
  const socketDir = join(options.dataDir, 'warehouse-socket');
  mkdirSync(socketDir, { recursive: true, mode: 0o700 });
  chmodSync(socketDir, 0o700);
  const socketPath = join(socketDir, '.s.PGSQL.5432');
  rmSync(socketPath, { force: true });
  const backend = new PGLiteSocketServer({ db, path: socketPath, maxConnections: MAX_CONNECTIONS });
  await backend.start();
  const password = demoPassword(options.dataDir);
  const portFile = join(options.dataDir, 'warehouse.port');
  const remembered = existsSync(portFile) ? Number(readFileSync(portFile, 'utf8')) || 0 : 0;
  const host = '127.0.0.1';
  let front: Server;
  try {
    front = await startAuthenticatingFront({
      host,
      port: options.port ?? remembered,
      password,
      backendPath: socketPath,
    });
  } catch (error) {
    if (options.port) throw error;
    // The remembered port is taken: any free one does; the demo workspace is re-pointed below.
    front = await startAuthenticatingFront({ host, port: 0, password, backendPath: socketPath });
  }
  const address = front.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  writeFileSync(portFile, String(port));
  const base = {
    type: 'postgres' as const,
    host,
    port,
    database: 'postgres',
    user: 'postgres',
    password,
    ssl: false,
  };
  return {
    host,
    port,
    database: base.database,
    user: base.user,
    password,
    previousPort: remembered,
    sourceConfig: { ...base, schemas: [DEMO_SOURCE_SCHEMA] },
    targetConfig: { ...base, schemas: [DEMO_TARGET_SCHEMA] },
    async close() {
      await new Promise((resolve) => front.close(resolve));
      await backend.stop();
      await db.close();
    },
  };
}

/** The demo warehouse's password: generated once, kept readable by the owner only, noted in credentials.txt. */
function demoPassword(dataDir: string): string {
  const file = join(dataDir, 'warehouse.password');
  if (existsSync(file)) return readFileSync(file, 'utf8').trim();
  const password = randomBytes(18).toString('base64url');
  writeFileSync(file, password, { mode: 0o600 });
  appendFileSync(
    join(dataDir, 'credentials.txt'),
    `demo warehouse: user postgres, password ${password} (127.0.0.1, port in warehouse.port)\n`,
    { mode: 0o600 },
  );
  return password;
}
