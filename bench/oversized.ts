/**
 * One tenant's oversized results against another tenant's latency. Organization A runs ad-hoc SQL
 * whose result is far over WAREHOUSE_RESULT_BYTE_CAP (`select repeat('x', 100000000) from
 * generate_series(1, 12)`: 1.2 GB if it were held), four clients at a time, for as long as the
 * measurement lasts; organization B meanwhile calls GET /api/auth/session. B's latency is measured
 * first alone, then under A's load, in the same run against the same server (a child process, so its
 * memory is its own).
 *
 *   npm run bench -- oversized
 *
 * Printed: B's throughput and p50/p99 alone and under the load, their ratios, how A's queries were
 * answered (every one must be the 413 RESULT_TOO_LARGE) and the server's peak RSS. Target: B's p99
 * under the load within 2× of alone; RSS stays far below the 1.2 GB a held result would need.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  benchDatabaseUrl,
  createAdmin,
  formatResult,
  load,
  postgresConfig,
  rssMb,
  runIfMain,
  serverEnv,
  signIn,
  startServer,
  stopServer,
  urlFor,
  withClient,
} from './harness.ts';

const PASSWORD = 'timing-password-long-enough';
const OVERSIZED_SQL = "select repeat('x', 100000000) from generate_series(1, 12)";
const HEAVY_CLIENTS = 4;

export default async function main() {
  const base = benchDatabaseUrl();
  const seconds = Number(process.env.BENCH_DURATION ?? 10);
  const tag = `${process.pid}_${Date.now()}`;
  const [controlDb, warehouseDb] = ['cp', 'wh'].map((k) => `dimas_bench_big_${k}_${tag}`);
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-'));
  let server: Awaited<ReturnType<typeof startServer>> | undefined;
  await withClient(base, async (c) => {
    for (const db of [controlDb, warehouseDb]) await c.query(`create database "${db}"`);
  });
  let ok = true;
  try {
    const controlUrl = urlFor(base, controlDb);
    server = await startServer(serverEnv(controlUrl, dataDir));
    const heavy = { domain: `heavy-${tag}.test`.replaceAll('_', '-'), username: 'a', password: PASSWORD };
    const quiet = { domain: `quiet-${tag}.test`.replaceAll('_', '-'), username: 'b', password: PASSWORD };
    await createAdmin(controlUrl, heavy);
    await createAdmin(controlUrl, quiet);
    const a = await signIn(server.url, heavy);
    const b = await signIn(server.url, quiet);
    const warehouse = postgresConfig(base, warehouseDb, ['public']);
    await a.api('POST', '/api/workspaces/create', { name: 'big', select: true });
    await a.api('POST', '/api/workspaces/big/config', { source_config: warehouse, target_config: warehouse });

    const session = () =>
      load('GET /api/auth/session (B)', {
        url: `${server!.url}/api/auth/session`,
        headers: { authorization: `Bearer ${b.token}` },
        connections: 8,
        durationSeconds: seconds,
      });
    const alone = await session();
    const restingRss = rssMb(server.child.pid!);

    const answers = new Map<string, number>();
    let stop = false;
    let peakRss = rssMb(server.child.pid!);
    const sampler = setInterval(() => (peakRss = Math.max(peakRss, rssMb(server!.child.pid!))), 100);
    const heavyLoop = async () => {
      while (!stop) {
        const res = await fetch(`${server!.url}/api/analytics/execute`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${a.token}` },
          body: JSON.stringify({ sql: OVERSIZED_SQL }),
        });
        const body = (await res.json()) as { reason?: string; code?: string };
        const key = `${res.status} ${body.reason ?? body.code ?? ''}`.trim();
        answers.set(key, (answers.get(key) ?? 0) + 1);
      }
    };
    const loops = Array.from({ length: HEAVY_CLIENTS }, heavyLoop);
    const loaded = await session();
    stop = true;
    await Promise.all(loops);
    clearInterval(sampler);

    console.log(formatResult({ ...alone, label: 'B alone' }));
    console.log(formatResult({ ...loaded, label: `B beside ${HEAVY_CLIENTS} oversized queries of A` }));
    const p99Ratio = loaded.p99Ms / Math.max(alone.p99Ms, 1);
    console.log(
      `p50 ratio ${(loaded.p50Ms / Math.max(alone.p50Ms, 1)).toFixed(2)}, p99 ratio ${p99Ratio.toFixed(2)} (target: p99 ratio <= 2)`,
    );
    console.log(`A's answers: ${[...answers].map(([k, n]) => `${n}× ${k}`).join(', ')}`);
    console.log(
      `server RSS ${Math.round(restingRss)} MB before A's queries, peak ${Math.round(peakRss)} MB during them`,
    );
    if ([...answers.keys()].some((k) => k !== '413 RESULT_TOO_LARGE')) ok = false;
    if (p99Ratio > 2) ok = false;
  } finally {
    if (server) await stopServer(server.child);
    await withClient(base, async (c) => {
      for (const db of [controlDb, warehouseDb])
        await c.query(`drop database if exists "${db}" with (force)`);
    });
    rmSync(dataDir, { recursive: true, force: true });
  }
  return ok;
}

runIfMain(import.meta.url, main);
