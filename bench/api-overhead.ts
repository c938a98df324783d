import { mkdtempSync, rmSync } from 'node:fs';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import express from 'express';
import type { EntityManager } from '@mikro-orm/postgresql';
import { loadEnv } from '../src/env.ts';
import { startServer } from '../src/server.ts';
import { createLogger, flushLogFile } from '../src/logger.ts';
import { generateToken } from '../src/auth/tokens.ts';
import { createOrganizationRecord } from '../src/modules/auth/auth.service.ts';
import { createUser } from '../src/modules/users/users.service.ts';
import { Organization } from '../src/modules/users/users.entity.ts';
import { formatResult, load, median, runIfMain, signIn, type LoadResult } from './harness.ts';

/**
 * What the framework costs per request: an authenticated GET /api/auth/session (helmet, cors,
 * request logging, body parser, the REST adapter, the tRPC procedure with its guard and output
 * validation) against a bare express 5 JSON route, both served by this process and loaded the same
 * way. Target: at least 0.5 of bare express.
 *
 * Environment: DATABASE_URL (a PostgreSQL database; unset = embedded in a temporary directory),
 * BENCH_DURATION seconds per run (10), BENCH_ROUNDS (3, medians are reported), BENCH_CONNECTIONS (50),
 * LOG_LEVEL (info: request logs go to the log file as in production), AUTH_CACHE_TTL_MS (5000).
 */
export default async function apiOverhead(): Promise<void> {
  const durationSeconds = Number(process.env.BENCH_DURATION ?? 10);
  const rounds = Number(process.env.BENCH_ROUNDS ?? 3);
  const connections = Number(process.env.BENCH_CONNECTIONS ?? 50);
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-'));
  const env = loadEnv({
    PORT: '0',
    DIMAS_DATA_DIR: dataDir,
    SEED_DEMO: 'false',
    SUPERADMIN_PASSWORD: generateToken(15),
    LOG_LEVEL: process.env.LOG_LEVEL ?? 'info',
    ...(process.env.DATABASE_URL ? { DATABASE_URL: process.env.DATABASE_URL } : {}),
    ...(process.env.AUTH_CACHE_TTL_MS ? { AUTH_CACHE_TTL_MS: process.env.AUTH_CACHE_TTL_MS } : {}),
  });
  // The production logger and its log file, without the copy on stdout, which would drown the figures.
  const logger = createLogger({ level: env.LOG_LEVEL, logDir: join(dataDir, 'logs'), stdout: false });
  const dimas = await startServer(env, { logger });
  const em = dimas.deps.orm.em.fork() as EntityManager;
  const domain = `bench-${Date.now().toString(36)}.local`;
  const org = await createOrganizationRecord(em, { name: `Benchmark ${domain}`, domain });
  const password = generateToken(15);
  await createUser(
    { em, deps: dimas.deps },
    {
      organizationId: org.id,
      isSuperAdmin: false,
      username: 'bench',
      password,
      roles: ['viewer'],
      must_change_password: false,
    },
  );
  const { token } = await signIn(dimas.url, { domain, username: 'bench', password });

  const bare = express();
  bare.get('/session', (_req, res) => {
    res.json({
      kind: 'user',
      expires_at: new Date().toISOString(),
      user: { id: org.id, username: 'bench', organization_id: org.id, permissions: ['workspace.read'] },
    });
  });
  const bareServer: Server = await new Promise((resolve) => {
    const s = bare.listen(0, '127.0.0.1', () => resolve(s));
  });
  const bareUrl = `http://127.0.0.1:${(bareServer.address() as AddressInfo).port}/session`;
  const dimasTarget = {
    url: `${dimas.url}/api/auth/session`,
    headers: { authorization: `Bearer ${token}` },
  };

  try {
    console.log(
      `database: ${dimas.deps.dbKind}; ${connections} connections; ${rounds} rounds of ${durationSeconds} s; ` +
        `log level ${env.LOG_LEVEL}; auth cache ${env.AUTH_CACHE_TTL_MS} ms; node ${process.version}`,
    );
    await load('warm-up', { url: bareUrl, connections, durationSeconds: 2 });
    await load('warm-up', { ...dimasTarget, connections, durationSeconds: 2 });
    const bareRuns: LoadResult[] = [];
    const dimasRuns: LoadResult[] = [];
    // Interleaved, so that a change in the machine's load hits both sides alike.
    for (let i = 0; i < rounds; i++) {
      bareRuns.push(await load('bare express 5 JSON route', { url: bareUrl, connections, durationSeconds }));
      console.log(formatResult(bareRuns.at(-1)!));
      dimasRuns.push(
        await load('GET /api/auth/session (Bearer)', { ...dimasTarget, connections, durationSeconds }),
      );
      console.log(formatResult(dimasRuns.at(-1)!));
    }
    const bareRps = median(bareRuns.map((r) => r.requestsPerSecond));
    const dimasRps = median(dimasRuns.map((r) => r.requestsPerSecond));
    const ratios = bareRuns.map((b, i) => dimasRuns[i].requestsPerSecond / b.requestsPerSecond);
    console.log(`\nbare express (median)         ${bareRps.toFixed(0)} req/s`);
    console.log(`GET /api/auth/session (median) ${dimasRps.toFixed(0)} req/s`);
    console.log(
      `ratio ${(dimasRps / bareRps).toFixed(2)} of bare express (per round: ${ratios
        .map((r) => r.toFixed(2))
        .join(', ')}; target >= 0.50)`,
    );
    const bareCpu = median(bareRuns.map((r) => r.cpuMicrosPerRequest));
    const dimasCpu = median(dimasRuns.map((r) => r.cpuMicrosPerRequest));
    console.log(
      `CPU per request: bare ${bareCpu.toFixed(0)} µs, dimas ${dimasCpu.toFixed(0)} µs; ` +
        `CPU ratio ${(bareCpu / dimasCpu).toFixed(2)} (what the throughput ratio is on an otherwise idle machine ` +
        `when the server, not the load generator, is the bottleneck)`,
    );
  } finally {
    bareServer.close();
    await em.fork().nativeDelete(Organization, { id: org.id });
    await dimas.close();
    await flushLogFile(logger);
    rmSync(dataDir, { recursive: true, force: true });
  }
}

runIfMain(import.meta.url, apiOverhead);
