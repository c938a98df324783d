/**
 * Extract–load of a MariaDB table into PostgreSQL through the API, against the same copy done by the
 * database clients in the same run: `mariadb --batch --quick … | psql -c '\copy … from stdin'`.
 *
 *   node bench/extract-load.ts
 *
 * BENCH_DATABASE_URL (else TEST_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres)
 * names the PostgreSQL server (scratch databases: the control plane and the warehouse); MariaDB is
 * root@127.0.0.1:3306 (a scratch database too). BENCH_ROWS (default 1,000,000) rows × 10 columns.
 * The server runs as a child process, so the RSS sampled from /proc during the load is its own.
 *
 * Printed: the API's time (enqueue → run succeeded) over the clients' pipe (target ≤ 1.5×, best of
 * two each) and the server's RSS before and at peak (target: flat, < 300 MB).
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import mysql from 'mysql2/promise';
import {
  benchDatabaseUrl,
  createAdmin,
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

const TARGET_RATIO = 1.5;
const RSS_LIMIT_MB = 300;
const MARIADB = { host: '127.0.0.1', port: 3306, user: 'root' };

const COLUMNS = `id int unsigned not null primary key, email varchar(120), first_name varchar(40), last_name varchar(40),
  amount decimal(12,2), score tinyint unsigned, active tinyint(1), country char(2), created datetime, note text`;

function sh(command: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', ['-o', 'pipefail', '-c', command], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`${command}: ${code} ${err}`))));
  });
}

async function timed<T>(work: () => Promise<T>): Promise<[number, T]> {
  const started = performance.now();
  const result = await work();
  return [performance.now() - started, result];
}

export default async function extractLoadBench(): Promise<boolean> {
  const rows = Number(process.env.BENCH_ROWS ?? 1_000_000);
  const base = benchDatabaseUrl();
  const suffix = Date.now().toString(36);
  const cp = `dimas_bench_elcp_${suffix}`;
  const wh = `dimas_bench_elwh_${suffix}`;
  const my = `dimas_bench_el_${suffix}`;
  const admin = { domain: `el${suffix}.test`, username: 'admin', password: 'timing-password-long-enough' };
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-el-'));
  const root = await mysql.createConnection(MARIADB);
  let server: Awaited<ReturnType<typeof startServer>> | undefined;
  try {
    await withClient(base, async (c) => {
      await c.query(`create database "${cp}"`);
      await c.query(`create database "${wh}"`);
    });
    await root.query(`create database \`${my}\``);
    await root.query(`create table \`${my}\`.events (${COLUMNS})`);
    console.log(`filling ${rows} rows × 10 columns in MariaDB…`);
    await root.query(
      `set statement max_recursive_iterations = ${rows + 1} for
       insert into \`${my}\`.events
       with recursive g(n) as (select 1 union all select n + 1 from g where n < ${rows})
       select n, concat('user', n, '@example.com'), concat('First', n % 97), concat('Last', n % 89),
              (n % 10000) / 100, n % 101, n % 2, elt(n % 4 + 1, 'DE', 'FR', 'US', 'GB'),
              timestampadd(second, n, '2024-01-01'), repeat('note ', n % 7) from g`,
    );

    // The clients' copy: the same rows, converted to the same PostgreSQL types by psql's \copy.
    const whUrl = urlFor(base, wh);
    await withClient(whUrl, (c) =>
      c.query(`create table baseline (id bigint primary key, email varchar(120), first_name varchar(40),
        last_name varchar(40), amount numeric(12,2), score smallint, active smallint, country varchar(2),
        created timestamp, note text)`),
    );
    const pipe = `mariadb -h127.0.0.1 -uroot --batch --quick --skip-column-names ${my} -e 'select * from events' | psql -q '${whUrl}' -c '\\copy baseline from stdin'`;
    const clientTimes: number[] = [];
    for (let i = 0; i < 2; i++) {
      await withClient(whUrl, (c) => c.query('truncate baseline'));
      clientTimes.push((await timed(() => sh(pipe)))[0]);
    }

    server = await startServer({ ...serverEnv(urlFor(base, cp), dataDir), LOG_LEVEL: 'error' });
    await createAdmin(urlFor(base, cp), admin);
    const { api } = await signIn(server.url, admin);
    await api('POST', '/api/workspaces/create', {
      name: 'bench',
      select: true,
      source_config: { type: 'mysql', ...MARIADB, database: my },
      target_config: postgresConfig(base, wh, ['mart']),
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
    const pid = server.child.pid!;
    const rssBefore = rssMb(pid);
    let peak = rssBefore;
    const apiTimes: number[] = [];
    for (let i = 0; i < 2; i++) {
      const sampler = setInterval(() => (peak = Math.max(peak, rssMb(pid))), 50);
      const [ms] = await timed(async () => {
        const { source_load } = await api('POST', '/api/schemas/workspace/sync', {
          load_source: { mode: 'full' },
        });
        for (;;) {
          const status = (await api('GET', '/api/schemas/workspace/sync/status')).source_load;
          if (status?.run_id === source_load.run_id && status.status === 'succeeded') return;
          if (status?.run_id === source_load.run_id && ['failed', 'cancelled'].includes(status.status))
            throw new Error(`load ${status.status}: ${status.error}`);
          await new Promise((r) => setTimeout(r, 50));
        }
      });
      clearInterval(sampler);
      apiTimes.push(ms);
    }
    const loaded = await withClient(
      whUrl,
      async (c) => (await c.query(`select count(*)::int as n from "raw_${my}".events`)).rows[0].n,
    );
    const bestApi = Math.min(...apiTimes);
    const bestClients = Math.min(...clientTimes);
    const ratio = bestApi / bestClients;
    console.log(`rows loaded: ${loaded} of ${rows}`);
    console.log(
      `clients (mariadb --batch --quick | psql \\copy): ${clientTimes.map((t) => (t / 1000).toFixed(2)).join(' s, ')} s`,
    );
    console.log(
      `dimas load job (API, enqueue → succeeded):        ${apiTimes.map((t) => (t / 1000).toFixed(2)).join(' s, ')} s`,
    );
    console.log(`ratio (best of each): ${ratio.toFixed(2)} (target ≤ ${TARGET_RATIO})`);
    console.log(
      `server RSS: ${rssBefore.toFixed(0)} MB before, ${peak.toFixed(0)} MB at peak (target < ${RSS_LIMIT_MB} MB)`,
    );
    return loaded === rows && ratio <= TARGET_RATIO && peak < RSS_LIMIT_MB;
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

runIfMain(import.meta.url, extractLoadBench);
