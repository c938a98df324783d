/**
 * Four extract–loads of a MariaDB table into PostgreSQL at once (the runs of a kind a server on
 * PostgreSQL works on by default, JOB_CONCURRENCY), against one load alone, through the API.
 *
 *   node bench/mysql-load.ts
 *
 * BENCH_DATABASE_URL (else TEST_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres)
 * names the PostgreSQL server (scratch databases: the control plane and the warehouse); MariaDB is
 * root@127.0.0.1:3306 (a scratch database too). BENCH_MYSQL_ROWS (default 1,000,000) rows of 12
 * columns, four of them text of 20 to 300 characters (about 300 bytes a row).
 *
 * Four organizations each have a workspace loading the same source table into a raw schema of its own
 * (raw_schema in the source config) of the one warehouse. The server runs as a child process, so the
 * RSS sampled from /proc is its own. Printed: one load's time and peak RSS, then the four's (each load
 * enqueue → succeeded, and the whole), and the rows each raw copy holds (target: every row, peak
 * RSS < 300 MB).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import mysql from 'mysql2/promise';
import {
  benchDatabaseUrl,
  createAdmin,
  type JsonApi,
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

const RSS_LIMIT_MB = 300;
const MARIADB = { host: '127.0.0.1', port: 3306, user: 'root' };
const LOADS = 4;

const COLUMNS = `id int unsigned not null primary key, email varchar(120), first_name varchar(40),
  last_name varchar(40), street varchar(200), city varchar(60), country char(2), amount decimal(12,2),
  score tinyint unsigned, active tinyint(1), created datetime, note text`;

/** Queues a full load of the signed-in admin's selected workspace and polls it until it ends. */
async function load(api: JsonApi): Promise<number> {
  const started = performance.now();
  const { source_load } = await api('POST', '/api/schemas/workspace/sync', { load_source: { mode: 'full' } });
  for (;;) {
    const status = (await api('GET', '/api/schemas/workspace/sync/status')).source_load;
    if (status?.run_id === source_load.run_id && status.status === 'succeeded')
      return performance.now() - started;
    if (status?.run_id === source_load.run_id && ['failed', 'cancelled'].includes(status.status))
      throw new Error(`load ${status.status}: ${status.error}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Peak RSS of `pid` while `work` runs, sampled every 20 ms. */
async function peakDuring<T>(pid: number, work: () => Promise<T>): Promise<{ result: T; peakMb: number }> {
  let peakMb = rssMb(pid);
  const sampler = setInterval(() => (peakMb = Math.max(peakMb, rssMb(pid))), 20);
  try {
    return { result: await work(), peakMb };
  } finally {
    clearInterval(sampler);
  }
}

export default async function mysqlLoadBench(): Promise<boolean> {
  const rows = Number(process.env.BENCH_MYSQL_ROWS ?? 1_000_000);
  const base = benchDatabaseUrl();
  const suffix = Date.now().toString(36);
  const cp = `dimas_bench_mlcp_${suffix}`;
  const wh = `dimas_bench_mlwh_${suffix}`;
  const my = `dimas_bench_ml_${suffix}`;
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-ml-'));
  const root = await mysql.createConnection(MARIADB);
  let server: Awaited<ReturnType<typeof startServer>> | undefined;
  try {
    await withClient(base, async (c) => {
      await c.query(`create database "${cp}"`);
      await c.query(`create database "${wh}"`);
    });
    await root.query(`create database \`${my}\``);
    await root.query(`create table \`${my}\`.customers (${COLUMNS})`);
    const fillStarted = performance.now();
    await root.query(
      `set statement max_recursive_iterations = ${rows + 1} for
       insert into \`${my}\`.customers
       with recursive g(n) as (select 1 union all select n + 1 from g where n < ${rows})
       select n, concat('user', n, '@example.com'), concat('First', n % 97), concat('Last', n % 89),
              concat(n % 9999, ' ', repeat('Long Street Name ', 1 + n % 8)), concat('City', n % 500),
              elt(n % 4 + 1, 'DE', 'FR', 'US', 'GB'), (n % 10000) / 100, n % 101, n % 2,
              timestampadd(second, n, '2024-01-01'), repeat('a note about this customer ', 1 + n % 11) from g`,
    );
    const [[size]] = (await root.query(
      `select round(avg(length(email) + length(first_name) + length(last_name) + length(street) + length(city)
                + length(note)) + 30) as avg_row_bytes from \`${my}\`.customers`,
    )) as unknown as [{ avg_row_bytes: number }[]];
    console.log(
      `MariaDB ${my}.customers: ${rows} rows × 12 columns (about ${size.avg_row_bytes} bytes a row) in ${((performance.now() - fillStarted) / 1000).toFixed(1)} s`,
    );

    server = await startServer({ ...serverEnv(urlFor(base, cp), dataDir), LOG_LEVEL: 'error' });
    const apis: JsonApi[] = [];
    for (let i = 1; i <= LOADS; i++) {
      const admin = {
        domain: `ml${i}-${suffix}.test`,
        username: 'admin',
        password: 'timing-password-long-enough',
      };
      await createAdmin(urlFor(base, cp), admin);
      const { api } = await signIn(server.url, admin);
      await api('POST', '/api/workspaces/create', {
        name: 'bench',
        select: true,
        source_config: { type: 'mysql', ...MARIADB, database: my, raw_schema: `raw_bench_${i}` },
        target_config: postgresConfig(base, wh, [`mart_${i}`]),
      });
      await api('POST', '/api/schemas/workspace', {
        schema: {
          name: 'bench',
          version: '1',
          tables: [
            { name: 't', primary_key: ['id'], columns: [{ name: 'id', type: 'bigint', nullable: false }] },
          ],
        },
      });
      apis.push(api);
    }
    const pid = server.child.pid!;
    const rssBefore = rssMb(pid);

    const one = await peakDuring(pid, () => load(apis[0]));
    console.log(
      `one load: ${(one.result / 1000).toFixed(2)} s (${Math.round(rows / (one.result / 1000))} rows/s), ` +
        `server RSS ${rssBefore.toFixed(0)} MB before, peak ${one.peakMb.toFixed(0)} MB`,
    );

    const rssBeforeFour = rssMb(pid);
    const started = performance.now();
    const four = await peakDuring(pid, () => Promise.all(apis.map((api) => load(api))));
    const fourMs = performance.now() - started;
    const loaded = await withClient(urlFor(base, wh), async (c) => {
      const counts: number[] = [];
      for (let i = 1; i <= LOADS; i++)
        counts.push((await c.query(`select count(*)::int as n from raw_bench_${i}.customers`)).rows[0].n);
      return counts;
    });
    const complete = loaded.every((n) => n === rows);
    const ok = complete && one.peakMb < RSS_LIMIT_MB && four.peakMb < RSS_LIMIT_MB;
    console.log(
      `four loads at once: ${(fourMs / 1000).toFixed(2)} s in all (each ${four.result.map((ms) => (ms / 1000).toFixed(1)).join(', ')} s; ` +
        `four loads one after another would take about ${((4 * one.result) / 1000).toFixed(1)} s); ` +
        `rows in each raw copy: ${loaded.join(', ')}${complete ? '' : ` (expected ${rows})`}`,
    );
    console.log(
      `server RSS: ${rssBeforeFour.toFixed(0)} MB before the four, peak ${four.peakMb.toFixed(0)} MB ` +
        `(target < ${RSS_LIMIT_MB} MB): ${ok ? 'ok' : 'OVER'}`,
    );
    return ok;
  } finally {
    if (server) await stopServer(server.child);
    rmSync(dataDir, { recursive: true, force: true });
    await root.query(`drop database if exists \`${my}\``).catch(() => {});
    await root.end();
    await withClient(base, async (c) => {
      await c.query(`drop database if exists "${cp}" with (force)`);
      await c.query(`drop database if exists "${wh}" with (force)`);
    }).catch(() => {});
  }
}

runIfMain(import.meta.url, mysqlLoadBench);
