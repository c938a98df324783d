/**
 * Materialization through the API against the same INSERT … SELECT run directly with pg.
 *
 *   node bench/materialize.ts
 *
 * BENCH_DATABASE_URL (else TEST_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres)
 * names a server on which scratch databases are created and dropped afterwards: the control plane,
 * a warehouse holding the source table and the target schema, and a second warehouse for the
 * cross-database path. BENCH_ROWS (default 1,000,000) sizes the source table; the mapping has ten
 * expressions. The server runs as a child process (`node src/main.ts`), so its peak
 * RSS is its own, sampled from /proc while each run is under way.
 *
 * Printed: the API's time (enqueue → run succeeded, polled over HTTP) over the direct statement's
 * time (target ≤ 1.25×, best of two each), and the server's RSS before and at peak during the
 * same-database and the cross-database (streamed copy) runs, and with four streamed copies at once
 * (JOB_CONCURRENCY's default on PostgreSQL) (target: flat, < 300 MB).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  benchDatabaseUrl,
  createAdmin,
  mapTable,
  type MappedColumn,
  materialize,
  postgresConfig,
  rssMb,
  runIfMain,
  serverEnv,
  setUpMapping,
  signIn,
  startServer,
  stopServer,
  urlFor,
  withClient,
} from './harness.ts';

const TARGET_RATIO = 1.25;
const RSS_LIMIT_MB = 300;
const PASSWORD = 'timing-password-long-enough';
const TABLE = 'events_clean';

const EXPRESSIONS: Record<string, [string, string]> = {
  email: ['text', 'lower(trim(events.email))'],
  phone: ['text', `regexp_replace(events.phone, '[^0-9]', '', 'g')`],
  full_name: ['text', `initcap(events.first_name || ' ' || events.last_name)`],
  amount: ['numeric', 'round(events.amount::numeric, 2)'],
  created_at: ['timestamptz', 'events.created::timestamptz'],
  country: ['text', `upper(coalesce(nullif(trim(events.country), ''), 'XX'))`],
  is_active: ['boolean', `events.flag = 't'`],
  score_band: [
    'text',
    `CASE WHEN events.score >= 80 THEN 'high' WHEN events.score >= 50 THEN 'mid' ELSE 'low' END`,
  ],
  email_domain: ['text', `split_part(lower(events.email), '@', 2)`],
  created_date: ['date', 'CAST(events.created AS date)'],
};

/**
 * Samples the process's RSS every 50 ms while `work` runs; returns its result, the peak, and the
 * peak of each fifth of the run (flat memory shows as equal fifths, growth as a rising series).
 */
async function watchRss<T>(
  pid: number,
  work: () => Promise<T>,
): Promise<{ result: T; peakMb: number; fifthsMb: number[] }> {
  const samples: { at: number; mb: number }[] = [];
  const sample = () => samples.push({ at: performance.now(), mb: rssMb(pid) });
  sample();
  const timer = setInterval(sample, 50);
  try {
    const result = await work();
    sample();
    const start = samples[0].at;
    const span = samples.at(-1)!.at - start || 1;
    const fifthsMb = [0, 1, 2, 3, 4].map((k) =>
      Math.max(
        0,
        ...samples.filter((x) => Math.min(4, Math.floor(((x.at - start) / span) * 5)) === k).map((x) => x.mb),
      ),
    );
    return { result, peakMb: Math.max(...samples.map((x) => x.mb)), fifthsMb };
  } finally {
    clearInterval(timer);
  }
}

export default async function main() {
  const base = benchDatabaseUrl();
  const rows = Number(process.env.BENCH_ROWS ?? 1_000_000);
  const tag = `${process.pid}_${Date.now()}`;
  const [controlDb, warehouseDb, otherDb] = ['cp', 'wh', 'wh2'].map((k) => `dimas_bench_${k}_${tag}`);
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-'));
  let server: Awaited<ReturnType<typeof startServer>> | undefined;
  await withClient(base, async (c) => {
    for (const db of [controlDb, warehouseDb, otherDb]) await c.query(`create database "${db}"`);
  });
  try {
    console.log(`source: ${rows.toLocaleString('en')} rows, ${Object.keys(EXPRESSIONS).length} expressions`);
    const generated = performance.now();
    await withClient(urlFor(base, warehouseDb), async (c) => {
      await c.query(`create schema src; create schema mart;
        create table src.events (id bigint primary key, email text, phone text, first_name text, last_name text,
          amount text, created text, country text, flag text, score integer);
        insert into src.events
        select g, '  User' || g || '@Example.COM ', '(555) ' || lpad((g % 10000000)::text, 7, '0'),
               'first' || (g % 1000), 'last' || (g % 5000), ((g % 100000) / 100.0)::text,
               (timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute')::text,
               case when g % 7 = 0 then '' else 'de' end, case when g % 3 = 0 then 't' else 'f' end, (g % 100)::int
          from generate_series(1, ${rows}) g;
        analyze src.events;`);
    });
    console.log(`generated in ${((performance.now() - generated) / 1000).toFixed(1)} s`);

    const controlUrl = urlFor(base, controlDb);
    server = await startServer({
      ...serverEnv(controlUrl, dataDir),
      WAREHOUSE_STATEMENT_TIMEOUT_MS: '600000',
    });
    const pid = server.child.pid!;
    const startedMb = rssMb(pid);

    const admin = { domain: `bench-${tag}.test`, username: 'bench', password: PASSWORD };
    await createAdmin(controlUrl, admin);
    const { api } = await signIn(server.url, admin);
    const columns: MappedColumn[] = [
      { name: 'id', type: 'bigint', nullable: false, sourceField: 'events.id' },
      ...Object.entries(EXPRESSIONS).map(([name, [type, expression]]) => ({ name, type, expression })),
    ];
    const committedSql = await setUpMapping(api, {
      workspace: 'bench',
      sourceConfig: postgresConfig(base, warehouseDb, ['src']),
      targetConfig: postgresConfig(base, warehouseDb, ['mart']),
      table: TABLE,
      primaryKey: ['id'],
      sourceTable: 'src.events',
      columns,
    });

    async function viaApi(): Promise<{ ms: number; result: Record<string, unknown> }> {
      const started = performance.now();
      const { result } = await materialize(api, TABLE);
      return { ms: performance.now() - started, result };
    }

    // The baseline: the committed SQL as one INSERT … SELECT into an identical table, with pg.
    const names = columns.map((c) => `"${c.name}"`).join(', ');
    async function direct(): Promise<number> {
      return withClient(urlFor(base, warehouseDb), async (c) => {
        await c.query(`drop table if exists mart.events_direct`);
        await c.query(`create table mart.events_direct (like mart.events_clean including all)`);
        const started = performance.now();
        await c.query(`insert into mart.events_direct (${names})\n${committedSql}`);
        return performance.now() - started;
      });
    }

    // The target table exists after the first run (it creates it); then both sides alternate.
    await viaApi();
    const idleMb = rssMb(pid);
    const directMs: number[] = [];
    const apiMs: number[] = [];
    let samePeak = 0;
    for (let round = 0; round < 2; round++) {
      directMs.push(await direct());
      const { result, peakMb } = await watchRss(pid, viaApi);
      apiMs.push(result.ms);
      samePeak = Math.max(samePeak, peakMb);
      if (result.result.mode !== 'insert_select' || result.result.rows_written !== rows)
        throw new Error(`unexpected run result ${JSON.stringify(result.result)}`);
    }
    const ratio = Math.min(...apiMs) / Math.min(...directMs);
    const count = await withClient(urlFor(base, warehouseDb), async (c) =>
      Number((await c.query('select count(*) as n from mart.events_clean')).rows[0].n),
    );
    if (count !== rows) throw new Error(`the target holds ${count} rows, expected ${rows}`);

    await api('POST', '/api/workspaces/bench/config', {
      target_config: postgresConfig(base, otherDb, ['mart']),
    });
    const cross = await watchRss(pid, viaApi);
    if (cross.result.result.mode !== 'streamed_copy' || cross.result.result.rows_written !== rows)
      throw new Error(`unexpected run result ${JSON.stringify(cross.result.result)}`);

    // As many streamed copies at once as a server on PostgreSQL runs by default (JOB_CONCURRENCY):
    // the server's memory with every worker of the kind busy, each copying its batches.
    const copies = [2, 3, 4].map((n) => `${TABLE}_${n}`);
    await api('POST', '/api/workspaces/bench/config', {
      target_schema: {
        name: 'bench',
        tables: [TABLE, ...copies].map((name) => ({
          name,
          primary_key: ['id'],
          columns: columns.map(({ name: column, type, nullable }) => ({ name: column, type, nullable })),
        })),
      },
    });
    for (const table of copies) await mapTable(api, table, 'src.events', columns);
    const parallel = await watchRss(pid, async () => {
      const started = performance.now();
      const results = await Promise.all([TABLE, ...copies].map((table) => materialize(api, table)));
      return { ms: performance.now() - started, results };
    });
    for (const { result } of parallel.result.results)
      if (result.mode !== 'streamed_copy' || result.rows_written !== rows)
        throw new Error(`unexpected run result ${JSON.stringify(result)}`);

    const fmt = (ms: number) => `${(ms / 1000).toFixed(2)} s`;
    console.log(`direct INSERT … SELECT (pg)      ${directMs.map(fmt).join(', ')}`);
    console.log(`API materialize, same database   ${apiMs.map(fmt).join(', ')}`);
    console.log(
      `ratio API / direct: ${ratio.toFixed(3)}× (target ≤ ${TARGET_RATIO}×) ${ratio <= TARGET_RATIO ? 'OK' : 'OVER TARGET'}`,
    );
    console.log(
      `API materialize, across databases (streamed copy): ${fmt(cross.result.ms)} (${(cross.result.ms / Math.min(...directMs)).toFixed(2)}× the direct statement)`,
    );
    console.log(
      `server RSS by fifths of the cross-database run: ${cross.fifthsMb.map((m) => m.toFixed(0)).join(', ')} MB`,
    );
    console.log(
      `${1 + copies.length} streamed copies at once: ${fmt(parallel.result.ms)}; server RSS by fifths ${parallel.fifthsMb.map((m) => m.toFixed(0)).join(', ')} MB`,
    );
    const peak = Math.max(samePeak, cross.peakMb, parallel.peakMb);
    console.log(
      `server RSS: started ${startedMb.toFixed(0)} MB, idle after a run ${idleMb.toFixed(0)} MB, peak same-database ${samePeak.toFixed(0)} MB, peak cross-database ${cross.peakMb.toFixed(0)} MB, peak of ${1 + copies.length} at once ${parallel.peakMb.toFixed(0)} MB (target < ${RSS_LIMIT_MB} MB) ${peak < RSS_LIMIT_MB ? 'OK' : 'OVER TARGET'}`,
    );
  } finally {
    if (server) await stopServer(server.child);
    rmSync(dataDir, { recursive: true, force: true });
    await withClient(base, async (c) => {
      for (const db of [controlDb, warehouseDb, otherDb])
        await c.query(`drop database if exists "${db}" with (force)`);
    });
  }
}

runIfMain(import.meta.url, main);
