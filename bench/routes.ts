/**
 * Real routes against the SQL they run: each route of a representative set is loaded on dimas and on
 * a bare express + `pg` handler that runs the very statements dimas sent for one request of that
 * route (recorded from the driver), inside one `begin` / `set_config` (role and organization, as the
 * row-level security of migration row_level_security expects) / `commit`, and answers the last
 * statement's rows as JSON. Both are served by this process and loaded the same way, one after the
 * other, so the ratio holds on a busy machine.
 *
 *   npm run bench -- routes
 *
 * Printed per route: dimas and bare throughput, the ratio, and the SQL round trips of one request of
 * each (dimas counts every `begin`, `set_config` and `commit` it sends). The last line is
 * `routes: min ratio <r> of bare (<route>)`; target: every route at least 0.5.
 *
 * Environment: BENCH_DATABASE_URL (else TEST_DATABASE_URL, else the local server) on which a control
 * plane and a small warehouse database are created and dropped; BENCH_DURATION seconds per run (3),
 * BENCH_CONNECTIONS (20), BENCH_ROUNDS (3: dimas and bare alternate, each keeps its best), ROUTES (a comma-separated subset of labels, for profiling one route),
 * BENCH_SHOW_SQL (print the statements of one request of each route), BENCH_PROFILE (a directory: a CPU profile of this process during each route's dimas run only, for
 * Chrome DevTools or any .cpuprofile reader).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import express from 'express';
import pg from 'pg';
import type { EntityManager } from '@mikro-orm/postgresql';
import { loadEnv } from '../src/env.ts';
import { startServer } from '../src/server.ts';
import { createLogger } from '../src/logger.ts';
import { createUser } from '../src/modules/users/users.service.ts';
import type { Scope } from '../src/deps.ts';
import {
  addAdmin,
  benchDatabaseUrl,
  formatResult,
  load,
  postgresConfig,
  runIfMain,
  setUpMapping,
  signIn,
  urlFor,
  withClient,
} from './harness.ts';

interface Statement {
  text: string;
  values?: unknown[];
}

/** Every statement any pg client of this process sends while `recording` is set. */
let recording: Statement[] | null = null;
// MikroORM brings its own copy of `pg`; both are recorded.
const ormPg = createRequire(fileURLToPath(import.meta.resolve('@mikro-orm/postgresql')))('pg') as typeof pg;
for (const Client of new Set([pg.Client, ormPg.Client])) {
  const query = Client.prototype.query;
  Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    if (recording) {
      const [first, second] = args as [string | { text: string; values?: unknown[] }, unknown];
      const text = typeof first === 'string' ? first : first.text;
      // The job queue's own polling (pg-boss) runs on its timers, not for the request.
      if (/\bpgboss\./.test(text)) return (query as (...a: unknown[]) => unknown).apply(this, args);
      const values = typeof first === 'string' ? (Array.isArray(second) ? second : undefined) : first.values;
      recording.push({ text, values });
    }
    return (query as (...a: unknown[]) => unknown).apply(this, args);
  } as typeof query;
}

/** Transaction control and the row-level-security setting: the bare handler sends its own, once. */
const CONTROL = /^\s*(begin|commit|rollback|savepoint|release savepoint|start transaction)\b/i;
const SESSION = /^\s*select set_config\(/i;

interface BenchRoute {
  label: string;
  method: 'GET' | 'PUT' | 'POST';
  path: string;
  body?: Record<string, unknown>;
}

export default async function routes(): Promise<boolean> {
  const durationSeconds = Number(process.env.BENCH_DURATION ?? 3);
  const connections = Number(process.env.BENCH_CONNECTIONS ?? 20);
  const rounds = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 3));
  const base = benchDatabaseUrl();
  const tag = `${process.pid}_${Date.now()}`;
  const [controlDb, warehouseDb] = ['cp', 'wh'].map((k) => `dimas_bench_routes_${k}_${tag}`);
  await withClient(base, async (c) => {
    for (const db of [controlDb, warehouseDb]) await c.query(`create database "${db}"`);
  });
  await withClient(urlFor(base, warehouseDb), async (c) => {
    await c.query(`create schema shop; create schema analytics;
      create table shop.customers (customer_id integer primary key, email text, country text, signup_date date);
      insert into shop.customers select g, 'c' || g || '@example.com', 'DE', date '2026-01-01' + g
        from generate_series(1, 200) g;`);
  });
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-'));
  const controlUrl = urlFor(base, controlDb);
  const env = loadEnv({
    PORT: '0',
    DATABASE_URL: controlUrl,
    DIMAS_DATA_DIR: dataDir,
    DIMAS_SECRET_KEY: '1f'.repeat(32),
    SEED_DEMO: 'false',
    SUPERADMIN_PASSWORD: 'timing-root-password',
    LOG_LEVEL: 'warn',
  });
  const dimas = await startServer(env, { logger: createLogger({ level: 'warn', stdout: false }) });
  const bare = new pg.Pool({ connectionString: controlUrl, max: 10 });
  let bareServer: Server | undefined;
  try {
    const em = dimas.deps.orm.em.fork() as EntityManager;
    const admin = {
      domain: `routes-${tag}.test`.replaceAll('_', '-'),
      username: 'bench',
      password: 'timing-password-long',
    };
    const org = await addAdmin(em, admin);
    for (let i = 0; i < 19; i++)
      await createUser({ em } as Scope, {
        organizationId: org.id,
        isSuperAdmin: false,
        username: `member${String(i).padStart(2, '0')}`,
        password: 'timing-password-long',
        roles: ['viewer'],
        must_change_password: false,
      });
    const { api, token } = await signIn(dimas.url, admin);
    const warehouse = postgresConfig(base, warehouseDb, ['shop']);
    const table = 'customers_clean';
    await setUpMapping(api, {
      workspace: 'routes',
      sourceConfig: warehouse,
      targetConfig: { ...warehouse, schemas: ['analytics'] },
      table,
      primaryKey: ['customer_id'],
      sourceTable: 'shop.customers',
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false, sourceField: 'customers.customer_id' },
        { name: 'email', type: 'text', expression: 'lower(trim(customers.email))' },
        { name: 'country', type: 'text', sourceField: 'customers.country' },
        { name: 'signup_date', type: 'date', sourceField: 'customers.signup_date' },
      ],
    });
    const ids: string[] = [];
    for (let i = 0; i < 20; i++)
      ids.push(
        (
          await api('POST', '/api/queries', {
            name: `query ${String(i).padStart(2, '0')}`,
            sql: `select customer_id, email from analytics.${table} limit ${i + 1}`,
            visibility: i % 2 ? 'shared' : 'private',
          })
        ).id,
      );

    const all: BenchRoute[] = [
      { label: 'GET /api/queries (20 rows)', method: 'GET', path: '/api/queries?limit=50' },
      { label: 'GET /api/queries/{id}', method: 'GET', path: `/api/queries/${ids[3]}` },
      { label: `GET /api/mappings/{table}`, method: 'GET', path: `/api/mappings/${table}` },
      { label: 'GET /api/api/audiences/dashboard', method: 'GET', path: '/api/api/audiences/dashboard' },
      {
        label: 'PUT /api/queries/{id}',
        method: 'PUT',
        path: `/api/queries/${ids[4]}`,
        body: { description: 'changed by the benchmark' },
      },
      { label: 'GET /api/admin/users (20 rows)', method: 'GET', path: '/api/admin/users' },
      { label: 'GET /api/workspaces', method: 'GET', path: '/api/workspaces' },
    ];
    const only = process.env.ROUTES?.split(',').map((s) => s.trim());
    const chosen = only ? all.filter((r) => only.some((o) => r.label.includes(o))) : all;

    // The bare handlers: the route's recorded statements, replayed in one transaction.
    let firstError: string | undefined;
    const replays = new Map<string, { setup: Statement; statements: Statement[] }>();
    const app = express();
    app.use(express.json());
    app.all('/bare/:n', async (req, res) => {
      const replay = replays.get(req.params.n)!;
      const client = await bare.connect();
      try {
        await client.query('begin');
        await client.query(replay.setup.text, replay.setup.values);
        let rows: unknown[] = [];
        for (const s of replay.statements) rows = (await client.query(s.text, s.values)).rows;
        await client.query('commit');
        res.json({ rows });
      } catch (error) {
        await client.query('rollback').catch(() => {});
        firstError ??= `${req.params.n}: ${String(error)}`;
        res.status(500).json({ error: String(error) });
      } finally {
        client.release();
      }
    });
    bareServer = await new Promise<Server>((resolve) => {
      const s = app.listen(0, '127.0.0.1', () => resolve(s));
    });
    const bareBase = `http://127.0.0.1:${(bareServer.address() as AddressInfo).port}`;
    const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };

    console.log(
      `database: server; ${connections} connections; ${durationSeconds} s per run; node ${process.version}`,
    );
    const lines: { label: string; ratio: number }[] = [];
    for (const [n, route] of chosen.entries()) {
      const target = (url: string) => ({
        url,
        method: route.method,
        headers,
        body: route.body ? JSON.stringify(route.body) : undefined,
      });
      const call = async () => {
        const res = await fetch(new URL(route.path, dimas.url), {
          method: route.method,
          headers,
          body: route.body ? JSON.stringify(route.body) : undefined,
        });
        if (res.status !== 200) throw new Error(`${route.label}: ${res.status} ${await res.text()}`);
        await res.arrayBuffer();
      };
      await call(); // caches warm, as under load
      // The job queue's sweeps share the process and the pool: of three recordings, the shortest is
      // the request's own.
      let sent: Statement[] = [];
      for (let i = 0; i < 3; i++) {
        recording = [];
        await call();
        if (i === 0 || recording.length < sent.length) sent = recording;
        recording = null;
      }
      if (process.env.BENCH_SHOW_SQL)
        for (const s of sent) console.log(`  sql: ${s.text.replace(/\s+/g, ' ').slice(0, 160)}`);
      const setup = sent.find((s) => SESSION.test(s.text));
      if (!setup)
        throw new Error(`${route.label}: no row-level-security setting among ${sent.length} statements`);
      replays.set(String(n), {
        setup,
        statements: sent.filter((s) => !CONTROL.test(s.text) && !SESSION.test(s.text)),
      });
      const bareTrips = replays.get(String(n))!.statements.length + 3;

      await load('warm-up', { ...target(`${dimas.url}${route.path}`), connections, durationSeconds: 1 });
      const runDimas = async (profile: boolean) => {
        const profiler = profile && process.env.BENCH_PROFILE ? new Session() : undefined;
        if (profiler) {
          profiler.connect();
          await profiler.post('Profiler.enable');
          await profiler.post('Profiler.start');
        }
        const result = await load(route.label, {
          ...target(`${dimas.url}${route.path}`),
          connections,
          durationSeconds,
        });
        if (profiler) {
          const { profile: cpuProfile } = await profiler.post('Profiler.stop');
          const file = join(process.env.BENCH_PROFILE!, `routes-${n}.cpuprofile`);
          writeFileSync(file, JSON.stringify(cpuProfile));
          profiler.disconnect();
          console.log(`  CPU profile of the dimas run: ${file}`);
        }
        return result;
      };
      const runBare = () =>
        load('  bare, same SQL', { ...target(`${bareBase}/bare/${n}`), connections, durationSeconds }).catch(
          (error: unknown) => {
            throw new Error(`${String(error)}; first failure of the bare handler: ${firstError}`);
          },
        );
      // Rounds alternate which side goes first, and each side keeps its best round: what other work
      // on the machine takes from a run is noise in one direction only, so the best of each is the
      // figure least moved by it.
      let d: Awaited<ReturnType<typeof runDimas>> | undefined;
      let b: Awaited<ReturnType<typeof runBare>> | undefined;
      const roundRatios: string[] = [];
      for (let round = 0; round < rounds; round++) {
        const [dr, br] =
          round % 2 === 0
            ? [await runDimas(round === 0), await runBare()]
            : await (async () => {
                const first = await runBare();
                return [await runDimas(false), first] as const;
              })();
        roundRatios.push((dr.requestsPerSecond / br.requestsPerSecond).toFixed(2));
        if (!d || dr.requestsPerSecond > d.requestsPerSecond) d = dr;
        if (!b || br.requestsPerSecond > b.requestsPerSecond) b = br;
      }
      const ratio = d!.requestsPerSecond / b!.requestsPerSecond;
      console.log(formatResult(d!));
      console.log(formatResult(b!));
      console.log(
        `  ratio ${ratio.toFixed(2)} (best of ${rounds} rounds each; per round ${roundRatios.join(', ')}); round trips per request: dimas ${sent.length}, bare ${bareTrips}`,
      );
      lines.push({ label: route.label, ratio });
    }
    const worst = lines.reduce((a, b) => (b.ratio < a.ratio ? b : a));
    console.log(`routes: min ratio ${worst.ratio.toFixed(2)} of bare (${worst.label})`);
    return worst.ratio >= 0.5;
  } finally {
    bareServer?.close();
    await bare.end();
    await dimas.close();
    rmSync(dataDir, { recursive: true, force: true });
    await withClient(base, async (c) => {
      for (const db of [controlDb, warehouseDb])
        await c.query(`drop database if exists "${db}" with (force)`);
    });
  }
}

runIfMain(import.meta.url, routes);
