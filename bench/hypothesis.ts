/**
 * Hypothesis-test benchmark: a Welch t-test on BENCH_ROWS (default 10,000,000) warehouse rows through
 * the server (POST /api/analytics/hypotheses, then POST /api/analytics/hypotheses/test, a job followed
 * over GET /api/analytics/status/{id}?wait_ms=… until it is done), against the bare aggregate SQL the
 * test needs, run directly with pg in the same run. Prints the ratio of medians (target ≤ 1.2×) and the server's
 * RSS before, at peak during and after the measured tests, which must stay flat (peak − before
 * < 50 MB): only one row per group leaves the warehouse.
 *
 *   node bench/hypothesis.ts
 *   BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres BENCH_ROWS=1000000 node bench/hypothesis.ts
 *
 * BENCH_DATABASE_URL (else TEST_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres)
 * names a server on which two scratch databases are created (the control plane and the warehouse)
 * and dropped at the end. The server runs as a child process (`node src/main.ts`), so
 * its RSS is its own, sampled from /proc. BENCH_ITERATIONS (default 5) sets the measured rounds.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import {
  benchDatabaseUrl,
  createAdmin,
  median,
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

const TARGET_RATIO = 1.2;
const RSS_GROWTH_LIMIT_MB = 50;
const PASSWORD = 'timing-password-long-enough';
const STATUS_WAIT_MS = 20_000;

export interface HypothesisBenchResult {
  rows: number;
  iterations: number;
  api_ms: number;
  bare_ms: number;
  ratio: number;
  target_ratio: number;
  server_rss_before_mb: number;
  server_rss_peak_mb: number;
  server_rss_after_mb: number;
  server_rss_growth_mb: number;
  rss_growth_limit_mb: number;
  ok: boolean;
}

const round1 = (x: number) => Math.round(x * 10) / 10;

export async function runHypothesisBench(
  options: { serverUrl?: string; rows?: number; iterations?: number; log?: (line: string) => void } = {},
): Promise<HypothesisBenchResult> {
  const base = options.serverUrl ?? benchDatabaseUrl();
  const rowCount = options.rows ?? Number(process.env.BENCH_ROWS ?? 10_000_000);
  const iterations = options.iterations ?? Number(process.env.BENCH_ITERATIONS ?? 5);
  const log = options.log ?? ((line: string) => console.log(line));

  const tag = `${process.pid}_${Date.now()}`;
  const controlDb = `dimas_bench_hcp_${tag}`;
  const warehouseDb = `dimas_bench_hypothesis_${tag}`;
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-'));
  let server: Awaited<ReturnType<typeof startServer>> | undefined;
  await withClient(base, async (c) => {
    for (const db of [controlDb, warehouseDb]) await c.query(`create database "${db}"`);
  });
  // One connection for the bare SQL: every bare run uses the same backend.
  const pool = new pg.Pool({ connectionString: urlFor(base, warehouseDb), max: 1 });
  pool.on('connect', (client) => client.on('error', () => {}));
  pool.on('error', () => {});

  try {
    let started = performance.now();
    // Unlogged: the bench measures reads, and skipping WAL halves the load time.
    await pool.query(
      `CREATE UNLOGGED TABLE events AS
       SELECT i AS id, (i % 2 = 0) AS treated,
              random() * 100 + CASE WHEN i % 2 = 0 THEN 0.05 ELSE 0 END AS value
       FROM generate_series(1, $1::int) AS i`,
      [rowCount],
    );
    await pool.query('ANALYZE events');
    log(
      `loaded ${rowCount.toLocaleString('en')} rows in ${((performance.now() - started) / 1000).toFixed(1)} s`,
    );

    const controlUrl = urlFor(base, controlDb);
    server = await startServer({
      ...serverEnv(controlUrl, dataDir),
      WAREHOUSE_STATEMENT_TIMEOUT_MS: '600000',
    });
    const pid = server.child.pid!;

    const admin = { domain: `bench-${tag}.test`, username: 'bench', password: PASSWORD };
    await createAdmin(controlUrl, admin);
    const { api } = await signIn(server.url, admin);
    await api('POST', '/api/workspaces/create', {
      name: 'bench',
      select: true,
      target_config: postgresConfig(base, warehouseDb, ['public']),
    });
    const hypothesis = await api('POST', '/api/analytics/hypotheses', {
      statement: 'Treated events have a higher value',
      table: 'events',
      metric: { expression: 'value' },
      segment: { condition: 'treated' },
      test: 'welch_t',
      alpha: 0.05,
    });
    const hypothesisId = hypothesis.id as string;

    /**
     * Starts the test through the route and follows status/{id} until the run is over, long polling
     * (wait_ms): the server answers when the run ends. Polling instead at a rate that notices the end
     * within a few percent (every 10 ms) slowed the test itself by about a fifth on a 2-core machine:
     * each status request costs CPU in the server and the control-plane database.
     */
    async function viaApi(): Promise<Record<string, any>> {
      const run = await api('POST', '/api/analytics/hypotheses/test', { hypothesis_id: hypothesisId });
      for (;;) {
        const status = await api('GET', `/api/analytics/status/${hypothesisId}?wait_ms=${STATUS_WAIT_MS}`);
        if (
          status.run?.id === run.run_id &&
          ['succeeded', 'failed', 'cancelled'].includes(status.run.status)
        ) {
          if (status.run.status !== 'succeeded')
            throw new Error(`the test ${status.run.status}: ${JSON.stringify(status)}`);
          return status;
        }
      }
    }

    const bareSql = 'SELECT treated, count(value), avg(value), var_samp(value) FROM events GROUP BY treated';
    const bare = () => pool.query(bareSql);

    // Warm the cache (and the server's SQL parser, loaded once) before measuring.
    for (let i = 0; i < 2; i++) {
      await viaApi();
      await bare();
    }
    // Node 24's V8 optimizes libpg-query's WASM parser in background threads once it is hot: a
    // one-time spike in the server that lasts about a second. Let it finish, so it neither competes
    // for CPU with the measured runs nor passes for per-test memory.
    await new Promise((resolve) => setTimeout(resolve, 3000));

    const rssBefore = rssMb(pid);
    let rssPeak = rssBefore;
    const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, rssMb(pid))), 10);
    const apiTimes: number[] = [];
    const bareTimes: number[] = [];
    // The run's own duration as the server records it (started → finished), without queueing and polling.
    const jobTimes: number[] = [];
    let status: Record<string, any> | undefined;
    try {
      for (let i = 0; i < iterations; i++) {
        // Alternating order, so neither side always runs on a cache the other has just warmed.
        for (const side of i % 2 ? ['bare', 'api'] : ['api', 'bare']) {
          started = performance.now();
          if (side === 'api') {
            status = await viaApi();
            apiTimes.push(performance.now() - started);
            if (typeof status.run.duration_ms === 'number') jobTimes.push(status.run.duration_ms);
          } else {
            await bare();
            bareTimes.push(performance.now() - started);
          }
        }
      }
    } finally {
      clearInterval(sampler);
    }
    rssPeak = Math.max(rssPeak, rssMb(pid));
    await new Promise((resolve) => setTimeout(resolve, 500));
    const rssAfter = rssMb(pid);

    const ratio = median(apiTimes) / median(bareTimes);
    const growth = rssPeak - rssBefore;
    const summary: HypothesisBenchResult = {
      rows: rowCount,
      iterations,
      api_ms: round1(median(apiTimes)),
      bare_ms: round1(median(bareTimes)),
      ratio: Math.round(ratio * 1000) / 1000,
      target_ratio: TARGET_RATIO,
      server_rss_before_mb: round1(rssBefore),
      server_rss_peak_mb: round1(rssPeak),
      server_rss_after_mb: round1(rssAfter),
      server_rss_growth_mb: round1(growth),
      rss_growth_limit_mb: RSS_GROWTH_LIMIT_MB,
      ok: ratio <= TARGET_RATIO && growth < RSS_GROWTH_LIMIT_MB,
    };
    const n = status!.result.sample_sizes.total as number;
    if (n !== rowCount) throw new Error(`the test counted ${n} rows, expected ${rowCount}`);
    log(
      `welch t-test via the API: t = ${Number(status!.result.statistic).toFixed(4)}, ` +
        `p = ${Number(status!.p_value).toExponential(3)}, n = ${n.toLocaleString('en')}`,
    );
    const fmt = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(', ');
    log(`API test, enqueue → succeeded (ms): ${fmt(apiTimes)}; median ${summary.api_ms} ms`);
    if (jobTimes.length)
      log(
        `  of which the job run itself, started → finished (ms): ${fmt(jobTimes)}; median ${median(jobTimes)} ms`,
      );
    log(`bare aggregate SQL with pg (ms):     ${fmt(bareTimes)}; median ${summary.bare_ms} ms`);
    log(
      `ratio API / bare: ${summary.ratio.toFixed(3)}× (target ≤ ${TARGET_RATIO}×) ` +
        (ratio <= TARGET_RATIO ? 'OK' : 'OVER TARGET'),
    );
    // Each round runs both sides back to back: their ratio within a round is not moved by load that
    // other processes put on the machine for a few seconds, which the ratio of medians can be.
    const paired = median(apiTimes.map((t, i) => t / bareTimes[i]));
    log(`  median of the rounds' own API / bare ratios: ${paired.toFixed(3)}×`);
    log(
      `server RSS: before ${summary.server_rss_before_mb} MB, peak during ${summary.server_rss_peak_mb} MB, ` +
        `after ${summary.server_rss_after_mb} MB; peak − before ${summary.server_rss_growth_mb} MB ` +
        `(target < ${RSS_GROWTH_LIMIT_MB} MB) ${growth < RSS_GROWTH_LIMIT_MB ? 'OK' : 'OVER TARGET'}`,
    );
    return summary;
  } finally {
    await pool.end();
    if (server) await stopServer(server.child);
    rmSync(dataDir, { recursive: true, force: true });
    await withClient(base, async (c) => {
      for (const db of [controlDb, warehouseDb])
        await c.query(`drop database if exists "${db}" with (force)`);
    });
  }
}

runIfMain(import.meta.url, async () => {
  const summary = await runHypothesisBench();
  console.log(JSON.stringify(summary));
  return summary.ok;
});
