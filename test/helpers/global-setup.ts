import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestProject } from 'vitest/node';
import { loadEnv } from '../../src/env.ts';
import { migrate, openDatabase } from '../../src/db/orm.ts';
import { seed } from '../../src/db/seed.ts';
import { createLogger } from '../../src/logger.ts';
import { Authenticator } from '../../src/auth/principal.ts';
import { SecretBox } from '../../src/auth/secret-box.ts';
import type { AppDeps } from '../../src/deps.ts';
import { createJobQueue } from '../../src/jobs/queue.ts';
import { jobQueueConnection } from '../../src/server.ts';
import { SUPERADMIN_PASSWORD, SUPERADMIN_USERNAME, TEST_SECRET_KEY } from './constants.ts';
import { scratchDatabase } from './scratch-db.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    databaseUrl: string;
    embeddedTemplate: string;
    scratchDir: string;
  }
}

/**
 * One database for the whole run, migrated and seeded (super admin) once: a fresh database on the
 * server named by TEST_DATABASE_URL, or else an embedded template that every test file loads.
 */
export default async function setup(project: TestProject) {
  const scratchDir = mkdtempSync(join(tmpdir(), 'dimas-test-'));
  const env = loadEnv({
    DIMAS_DATA_DIR: scratchDir,
    SUPERADMIN_USERNAME,
    SUPERADMIN_PASSWORD,
    DIMAS_SECRET_KEY: TEST_SECRET_KEY,
    SEED_DEMO: 'false',
  });
  let databaseUrl = '';
  let dropDatabase: (() => Promise<void>) | undefined;
  if (process.env.TEST_DATABASE_URL) {
    const controlPlane = scratchDatabase('test');
    await controlPlane.create();
    databaseUrl = controlPlane.url;
    dropDatabase = controlPlane.drop;
  }
  const db = await openDatabase({ databaseUrl: databaseUrl || undefined });
  await migrate(db.orm);
  const deps = {
    env,
    orm: db.orm,
    dbKind: db.kind,
    logger: createLogger({ level: 'silent' }),
    authenticator: new Authenticator({ cacheTtlMs: 0, sessionTtlMs: 3600_000 }),
    secrets: new SecretBox(TEST_SECRET_KEY),
    // Never started: seeding enqueues nothing.
    jobs: createJobQueue({
      orm: db.orm,
      logger: createLogger({ level: 'silent' }),
      connection: jobQueueConnection(db),
    }),
    startedAt: new Date(),
  } satisfies AppDeps;
  await seed(deps);
  let embeddedTemplate = '';
  if (db.embedded) {
    const dump = await db.embedded.dumpDataDir('gzip');
    embeddedTemplate = join(scratchDir, 'template.tar.gz');
    writeFileSync(embeddedTemplate, Buffer.from(await dump.arrayBuffer()));
  }
  await db.close();
  project.provide('databaseUrl', databaseUrl);
  project.provide('embeddedTemplate', embeddedTemplate);
  project.provide('scratchDir', scratchDir);
  return async () => {
    await dropDatabase?.();
    rmSync(scratchDir, { recursive: true, force: true });
  };
}
