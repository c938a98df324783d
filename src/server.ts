import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import type { Env } from './env.ts';
import type { AppDeps } from './deps.ts';
import { createLogger, flushLogFile, type Logger } from './logger.ts';
import { migrate, openDatabase, type Database } from './db/orm.ts';
import { seed, type SeedReport } from './db/seed.ts';
import { Authenticator } from './auth/principal.ts';
import { SecretBox, loadSecretKey } from './auth/secret-box.ts';
import { createApp } from './app.ts';
import { closeWarehouses, readControlPlaneIdentity } from './warehouse/postgres.ts';
import { createJobQueue, type JobQueueConnection } from './jobs/queue.ts';
import { llmManager } from './llm/provider.ts';
import { outboundHttp } from './outbound-http.ts';
import { registerAnalyticsJobs } from './modules/analytics/analytics.jobs.ts';
import { registerAudienceJobs } from './modules/audiences/audiences.jobs.ts';
import { registerMappingJobs } from './modules/mappings/mappings.jobs.ts';
import { registerMonitoringJobs } from './modules/monitoring/monitoring.jobs.ts';
import { registerSourceJobs } from './modules/sources/sources.jobs.ts';

/** Runs of one kind a server on PostgreSQL works on at once (JOB_CONCURRENCY). */
const DEFAULT_JOB_CONCURRENCY = 4;

export interface RunningServer {
  url: string;
  deps: AppDeps;
  db: Database;
  server: Server;
  seedReport: SeedReport;
  close(): Promise<void>;
}

export interface StartOptions {
  logger?: Logger;
  /** A ready database (tests hand one in); otherwise opened from the environment. */
  db?: Database;
  seed?: boolean;
}

/** env → database (server or embedded) → migrate → seed → listen. */
export async function startServer(env: Env, options: StartOptions = {}): Promise<RunningServer> {
  const logger = options.logger ?? createLogger({ level: env.LOG_LEVEL, logDir: join(env.dataDir, 'logs') });
  const db =
    options.db ??
    (await openDatabase({
      databaseUrl: env.DATABASE_URL,
      dataDir: env.DATABASE_URL ? undefined : join(env.dataDir, 'pg'),
    }));
  await migrate(db.orm);
  // The process-level LLM mode starts from the environment; set-llm-mode changes it later.
  llmManager.setMode(env.LLM_MODE);
  llmManager.useOutbound(outboundHttp(env));
  const deps: AppDeps = {
    env,
    orm: db.orm,
    dbKind: db.kind,
    logger,
    authenticator: new Authenticator({
      cacheTtlMs: env.AUTH_CACHE_TTL_MS,
      sessionTtlMs: env.SESSION_TTL_HOURS * 3600_000,
    }),
    secrets: new SecretBox(loadSecretKey(env.DIMAS_SECRET_KEY, env.dataDir)),
    jobs: createJobQueue({
      orm: db.orm,
      logger,
      connection: jobQueueConnection(db),
      heartbeatTimeoutSeconds: env.JOB_HEARTBEAT_TIMEOUT_SECONDS,
      // The embedded database serves one transaction at a time: runs side by side would only queue
      // behind each other's statements there.
      concurrency: env.JOB_CONCURRENCY ?? (db.kind === 'embedded' ? 1 : DEFAULT_JOB_CONCURRENCY),
      retentionDays: env.JOB_RUNS_RETENTION_DAYS,
    }),
    startedAt: new Date(),
    controlPlane: await readControlPlaneIdentity(db.orm),
  };
  const seedReport = options.seed === false ? { lines: [] } : await seed(deps);
  // Embedded mode with the demo: a second PGlite as the demo workspace's source/target warehouse.
  if (db.kind === 'embedded' && env.SEED_DEMO) {
    // Loaded only here: PGlite's module is not worth its memory to a server-mode process.
    const { startDemoWarehouse } = await import('./warehouse/demo.ts');
    const { connectDemoWorkspace } = await import('./db/demo-workspace.ts');
    deps.demoWarehouse = await startDemoWarehouse({
      dataDir: env.dataDir,
      logger,
      port: env.DEMO_WAREHOUSE_PORT,
    });
    await connectDemoWorkspace(deps, deps.demoWarehouse);
  }
  await registerJobHandlers(deps);
  await deps.jobs.start();
  const server = createApp(deps).listen(env.PORT, env.HOST);
  // Idle keep-alive connections stay open longer than the clients' and proxies' own idle timeouts
  // (60 s for most load balancers): with Node's 5 s a client could reuse a connection the server was
  // closing at that moment and see ECONNRESET, which a busy machine made frequent.
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 66_000;
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${env.HOST}:${port}`,
    deps,
    db,
    server,
    seedReport,
    async close() {
      // Stop accepting, let in-flight requests finish (bounded), then close the database.
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeIdleConnections();
      const force = setTimeout(() => server.closeAllConnections(), 10_000);
      await closed;
      clearTimeout(force);
      await deps.jobs.stop();
      await closeWarehouses(deps);
      await deps.demoWarehouse?.close();
      await db.close();
      await flushLogFile(logger);
    },
  };
}

/**
 * Every area's job kinds and periodic work, registered in one place before the queue starts: runs
 * queued before a restart are picked up at once, and the queue itself knows no area.
 */
async function registerJobHandlers(deps: AppDeps): Promise<void> {
  await registerAudienceJobs(deps);
  await registerMonitoringJobs(deps);
  await registerAnalyticsJobs(deps);
  await registerMappingJobs(deps);
  await registerSourceJobs(deps);
}

/** The queue lives in the control-plane database: the same PGlite instance, or the same server. */
export function jobQueueConnection(db: Database): JobQueueConnection {
  return db.embedded
    ? { embedded: db.embedded }
    : { connectionString: db.orm.config.get('clientUrl') as string };
}
