/**
 * A realistic mix of API traffic against one server, with a discovery and a materialization under
 * way during the load.
 *
 *   npm run bench -- load
 *
 * BENCH_DATABASE_URL (else TEST_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres)
 * names a server on which two scratch databases are created and dropped afterwards: the control
 * plane and a warehouse holding the demo shop (seeds/demo-source) with its empty target schema. The
 * server runs as a child process. One organization's admin drives every route: authenticated reads
 * (session, workspaces, saved queries, audiences, a mapping), writes (saved queries, performance
 * metrics: each with a unique key), 64 connections in all and LOAD_REQUESTS (default 12,000)
 * requests; meanwhile discoveries (SSE) and materializations run one after the other.
 *
 * Printed: throughput and p50/p99 per route and overall. Any connection error, timeout or answer
 * other than 2xx fails the benchmark, and so does a discovery or materialization that does not end
 * well.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { createParser } from 'eventsource-parser';
import { demoSchemaSql, demoSourceStatements } from '../seeds/demo-source/generate.ts';
import {
  benchDatabaseUrl,
  createAdmin,
  materialize,
  postgresConfig,
  runIfMain,
  serverEnv,
  setUpMapping,
  signIn,
  startServer,
  stopServer,
  urlFor,
  withClient,
  type JsonApi,
} from './harness.ts';

const CONNECTIONS = 64;
const PASSWORD = 'timing-password-long-enough';
const TABLE = 'customers_clean';

interface Route {
  label: string;
  method: 'GET' | 'POST';
  path: string;
  /** The body of the n-th request (unique names and keys per request). */
  body?: (n: number) => Record<string, unknown>;
  /** Shares of the connections and of the requests. */
  weight: number;
}

interface RouteResult {
  label: string;
  requests: number;
  seconds: number;
  latencies: number[];
  statuses: Map<number, number>;
  errors: number;
  timeouts: number;
}

const percentile = (sorted: number[], p: number) =>
  sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;

async function drive(url: string, token: string, route: Route, connections: number, amount: number) {
  const latencies: number[] = [];
  const statuses = new Map<number, number>();
  let sent = 0;
  const started = performance.now();
  const run = autocannon({
    url,
    connections,
    amount,
    requests: [
      {
        method: route.method,
        path: route.path,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        setupRequest: (request) => {
          if (route.body) request.body = JSON.stringify(route.body(sent));
          sent++;
          return request;
        },
      },
    ],
  });
  run.on('response', (_client, statusCode, _bytes, responseTime) => {
    latencies.push(responseTime);
    statuses.set(statusCode, (statuses.get(statusCode) ?? 0) + 1);
  });
  const result = await run;
  return {
    label: route.label,
    requests: result.requests.total,
    seconds: (performance.now() - started) / 1000,
    latencies: latencies.sort((a, b) => a - b),
    statuses,
    errors: result.errors,
    timeouts: result.timeouts,
  } satisfies RouteResult;
}

/** POST /api/workspaces/discover read to its end as a client does; returns the last event's type. */
async function discover(baseUrl: string, token: string): Promise<{ type: string; events: number }> {
  const res = await fetch(new URL('/api/workspaces/discover', baseUrl), {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: '{}',
  });
  if (!res.headers.get('content-type')?.startsWith('text/event-stream'))
    throw new Error(`discovery answered ${res.status}: ${await res.text()}`);
  const events: { type: string }[] = [];
  const parser = createParser({ onEvent: (message) => events.push(JSON.parse(message.data)) });
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) parser.feed(chunk.value);
  return { type: events.at(-1)?.type ?? 'none', events: events.length };
}

/** Runs `task` again and again until `done()`; every run must end, and at least one must. */
async function repeatUntil<T>(done: () => boolean, task: () => Promise<T>): Promise<T[]> {
  const results: T[] = [];
  do results.push(await task());
  while (!done());
  return results;
}

export default async function main() {
  const base = benchDatabaseUrl();
  const total = Number(process.env.LOAD_REQUESTS ?? 12_000);
  const tag = `${process.pid}_${Date.now()}`;
  const [controlDb, warehouseDb] = ['cp', 'wh'].map((k) => `dimas_bench_load_${k}_${tag}`);
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-'));
  let server: Awaited<ReturnType<typeof startServer>> | undefined;
  await withClient(base, async (c) => {
    for (const db of [controlDb, warehouseDb]) await c.query(`create database "${db}"`);
  });
  try {
    console.log('seeding the demo shop into a warehouse database…');
    await withClient(urlFor(base, warehouseDb), async (c) => {
      await c.query(demoSchemaSql());
      for (const statement of demoSourceStatements()) await c.query(statement);
      await c.query('analyze');
    });
    const controlUrl = urlFor(base, controlDb);
    server = await startServer(serverEnv(controlUrl, dataDir));
    const admin = { domain: `load-${tag}.test`.replaceAll('_', '-'), username: 'bench', password: PASSWORD };
    await createAdmin(controlUrl, admin);
    const { api, token } = await signIn(server.url, admin);
    const warehouse = postgresConfig(base, warehouseDb, ['shop']);
    await setUpMapping(api, {
      workspace: 'load',
      sourceConfig: warehouse,
      targetConfig: { ...warehouse, schemas: ['analytics'] },
      table: TABLE,
      primaryKey: ['customer_id'],
      sourceTable: 'shop.customers',
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false, sourceField: 'customers.customer_id' },
        { name: 'email', type: 'text', expression: 'lower(trim(customers.email))' },
        {
          name: 'country',
          type: 'text',
          expression: `upper(coalesce(nullif(trim(customers.country), ''), 'XX'))`,
        },
        { name: 'signup_date', type: 'date', sourceField: 'customers.signup_date' },
      ],
    });
    console.log('workspace mapped; first materialization…');
    // The target table exists after a first run; the audience and its metrics build on it.
    await materialize(api, TABLE);
    const audience = await api('POST', '/api/api/audiences', {
      name: 'load',
      target_table: TABLE,
      definition: { type: 'rules', rules: { all: [] } },
    });

    const routes: Route[] = [
      { label: 'GET /api/auth/session', method: 'GET', path: '/api/auth/session', weight: 3 },
      { label: 'GET /api/workspaces', method: 'GET', path: '/api/workspaces', weight: 2 },
      { label: 'GET /api/queries', method: 'GET', path: '/api/queries?limit=20', weight: 2 },
      { label: 'GET /api/api/audiences', method: 'GET', path: '/api/api/audiences', weight: 2 },
      { label: `GET /api/mappings/${TABLE}`, method: 'GET', path: `/api/mappings/${TABLE}`, weight: 1 },
      {
        label: 'POST /api/queries',
        method: 'POST',
        path: '/api/queries',
        body: (n) => ({
          name: `load ${process.pid} ${n}`,
          sql: `select customer_id, email from analytics.${TABLE} limit 10`,
        }),
        weight: 2,
      },
      {
        label: 'POST /api/api/audiences/performance-metrics',
        method: 'POST',
        path: '/api/api/audiences/performance-metrics',
        body: (n) => ({
          audience_segment_id: audience.id,
          ad_platform: 'google',
          campaign_id: `c-${n}`,
          date: '2026-01-01',
          impressions: 1000,
          clicks: 25,
          spend: 12.5,
          conversions: 2,
          revenue: 80,
        }),
        weight: 2,
      },
    ];
    const weights = routes.reduce((sum, r) => sum + r.weight, 0);

    console.log(`load: ${total} requests over ${CONNECTIONS} connections…`);
    let loading = true;
    const background = Promise.all([
      repeatUntil(
        () => !loading,
        () => discover(server!.url, token),
      ),
      repeatUntil(
        () => !loading,
        () => materialize(api as JsonApi, TABLE),
      ),
    ]);
    const started = performance.now();
    const results = await Promise.all(
      routes.map((route) =>
        drive(
          server!.url,
          token,
          route,
          Math.round((CONNECTIONS * route.weight) / weights),
          Math.ceil((total * route.weight) / weights),
        ),
      ),
    ).finally(() => (loading = false));
    const seconds = (performance.now() - started) / 1000;
    const [discoveries, materializations] = await background;

    const line = (label: string, requests: number, secs: number, sorted: number[]) =>
      `${label.padEnd(46)} ${(requests / secs).toFixed(0).padStart(6)} req/s   p50 ${percentile(sorted, 50)
        .toFixed(1)
        .padStart(6)} ms   p99 ${percentile(sorted, 99).toFixed(1).padStart(7)} ms   (${requests} requests)`;
    console.log(`${CONNECTIONS} connections, ${seconds.toFixed(1)} s`);
    for (const r of results) console.log(line(r.label, r.requests, r.seconds, r.latencies));
    const all = results.flatMap((r) => r.latencies).sort((a, b) => a - b);
    const requests = results.reduce((sum, r) => sum + r.requests, 0);
    console.log(line('overall', requests, seconds, all));
    const tally = (values: unknown[]) => {
      const counts = new Map<string, number>();
      for (const v of values) counts.set(String(v), (counts.get(String(v)) ?? 0) + 1);
      return [...counts].map(([v, n]) => `${n}× ${v}`).join(', ');
    };
    console.log(
      `during the load: ${discoveries.length} discoveries (${tally(discoveries.map((d) => `${d.type} after ${d.events} events`))}), ` +
        `${materializations.length} materializations (${tally(materializations.map((m) => `${m.result.rows_written} rows`))})`,
    );

    const problems = results.flatMap((r) => {
      const bad = [...r.statuses].filter(([status]) => status < 200 || status >= 300);
      return [
        ...(r.errors || r.timeouts ? [`${r.label}: ${r.errors} errors, ${r.timeouts} timeouts`] : []),
        ...bad.map(([status, n]) => `${r.label}: ${n} answers ${status}`),
      ];
    });
    for (const d of discoveries)
      if (d.type !== 'completed') problems.push(`a discovery ended with ${d.type}`);
    if (requests < 10_000) problems.push(`only ${requests} requests`);
    if (problems.length) throw new Error(`the load failed:\n  ${problems.join('\n  ')}`);
    console.log('0 errors, 0 timeouts, 0 non-2xx answers: OK');
  } finally {
    if (server) await stopServer(server.child);
    rmSync(dataDir, { recursive: true, force: true });
    await withClient(base, async (c) => {
      for (const db of [controlDb, warehouseDb])
        await c.query(`drop database if exists "${db}" with (force)`);
    });
  }
}

runIfMain(import.meta.url, main);
