/**
 * Hypothesis-test benchmark: a Welch t-test on BENCH_ROWS (default 10,000,000) warehouse rows through
 * the statistics engine, against the bare aggregate SQL the test needs, in the same run and on the same
 * connection. Prints the ratio of medians (target ≤ 1.2×) and Node's peak RSS, which must not grow with
 * the row count: only one row per group leaves the warehouse.
 *
 *   npx tsx bench/hypothesis.ts
 *   BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres BENCH_ROWS=1000000 npx tsx bench/hypothesis.ts
 *
 * It creates a scratch database on that server and drops it at the end.
 */
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import type { StatsQuery } from '../src/stats/sql.ts';
import { runWelch } from '../src/stats/welch.ts';

export interface HypothesisBenchResult {
  rows: number;
  iterations: number;
  engine_ms: number;
  bare_ms: number;
  ratio: number;
  target_ratio: number;
  rss_start_mb: number;
  peak_rss_mb: number;
  rss_growth_mb: number;
  process_max_rss_mb: number;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const mb = (bytes: number) => Math.round((bytes / 1024 / 1024) * 10) / 10;

export async function runHypothesisBench(
  options: { serverUrl?: string; rows?: number; iterations?: number; log?: (line: string) => void } = {},
): Promise<HypothesisBenchResult> {
  const serverUrl =
    options.serverUrl ??
    process.env.BENCH_DATABASE_URL ??
    process.env.TEST_DATABASE_URL ??
    'postgresql://postgres@127.0.0.1:5432/postgres';
  const rowCount = options.rows ?? Number(process.env.BENCH_ROWS ?? 10_000_000);
  const iterations = options.iterations ?? Number(process.env.BENCH_ITERATIONS ?? 5);
  const log = options.log ?? ((line: string) => console.log(line));

  const name = `dimas_bench_hypothesis_${process.pid}_${Date.now()}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`create database "${name}"`);
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  // One connection: both sides run on the same backend, one after the other.
  const pool = new pg.Pool({ connectionString: url.toString(), max: 1 });
  pool.on('connect', (client) => client.on('error', () => {}));
  pool.on('error', () => {});
  const query: StatsQuery = async (sql, params) => (await pool.query(sql, params)).rows;

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

    const input = {
      source: { schema: 'public', table: 'events' },
      metric: { sql: 'value' },
      segment: { condition: 'treated' },
    };
    const bareSql = 'SELECT treated, count(value), avg(value), var_samp(value) FROM events GROUP BY treated';
    const engine = () => runWelch(query, input);
    const bare = () => pool.query(bareSql);

    // Warm the cache (and the SQL parser the engine loads once) before measuring.
    for (let i = 0; i < 2; i++) {
      await engine();
      await bare();
    }
    // Node 24's V8 optimizes libpg-query's WASM parser (which checks the expressions) in background
    // threads once it is hot: a one-time spike of several hundred MB that lasts about a second. Let it
    // finish, so it neither competes for CPU with the measured queries nor passes for per-query memory.
    await new Promise((resolve) => setTimeout(resolve, 3000));
    const rssBefore = process.memoryUsage.rss();
    let rssPeak = rssBefore;
    const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, process.memoryUsage.rss())), 10);
    const engineTimes: number[] = [];
    const bareTimes: number[] = [];
    let result;
    for (let i = 0; i < iterations; i++) {
      // Alternating order, so neither side always runs on a cache the other has just warmed.
      for (const side of i % 2 ? ['bare', 'engine'] : ['engine', 'bare']) {
        started = performance.now();
        if (side === 'engine') {
          result = await engine();
          engineTimes.push(performance.now() - started);
        } else {
          await bare();
          bareTimes.push(performance.now() - started);
        }
      }
    }
    clearInterval(sampler);
    const rssAfter = process.memoryUsage.rss();
    const summary: HypothesisBenchResult = {
      rows: rowCount,
      iterations,
      engine_ms: Math.round(median(engineTimes) * 10) / 10,
      bare_ms: Math.round(median(bareTimes) * 10) / 10,
      ratio: Math.round((median(engineTimes) / median(bareTimes)) * 1000) / 1000,
      target_ratio: 1.2,
      rss_start_mb: mb(rssBefore),
      peak_rss_mb: mb(Math.max(rssPeak, rssAfter)),
      rss_growth_mb: mb(rssAfter - rssBefore),
      // resourceUsage().maxRSS is in kilobytes; it includes the parser's warm-up spike.
      process_max_rss_mb: mb(process.resourceUsage().maxRSS * 1024),
    };
    log(
      `welch t-test: t = ${result!.statistic.toFixed(4)}, p = ${result!.p_value.toExponential(3)}, ` +
        `n = ${result!.sample_sizes.total.toLocaleString('en')}`,
    );
    log(`engine (median of ${iterations}): ${summary.engine_ms} ms`);
    log(`bare aggregate SQL (median of ${iterations}): ${summary.bare_ms} ms`);
    log(
      `ratio engine / bare: ${summary.ratio.toFixed(3)}x (target <= ${summary.target_ratio}x) ` +
        (summary.ratio <= summary.target_ratio ? 'OK' : 'OVER TARGET'),
    );
    log(
      `node RSS while measuring: ${summary.rss_start_mb} MB at start, peak ${summary.peak_rss_mb} MB, ` +
        `growth ${summary.rss_growth_mb} MB; process max RSS ${summary.process_max_rss_mb} MB ` +
        `(includes the one-time parser warm-up)`,
    );
    return summary;
  } finally {
    await pool.end();
    await admin.query(`drop database if exists "${name}" with (force)`);
    await admin.end();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  runHypothesisBench().then(
    (summary) => {
      console.log(JSON.stringify(summary));
      process.exitCode = summary.ratio <= summary.target_ratio ? 0 : 1;
    },
    (error) => {
      console.error(error);
      process.exitCode = 1;
    },
  );
}
