/**
 * Materialization through the API against the same INSERT … SELECT run directly with pg.
 *
 *   npx tsx bench/materialize.ts
 *
 * BENCH_DATABASE_URL (else TEST_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres)
 * names a server on which scratch databases are created and dropped afterwards: the control plane,
 * a warehouse holding the source table and the target schema, and a second warehouse for the
 * cross-database path. BENCH_ROWS (default 1,000,000) sizes the source table; the mapping has ten
 * expressions. The server runs as a child process (`node --import tsx src/main.ts`), so its peak
 * RSS is its own, sampled from /proc while each run is under way.
 *
 * Printed: the API's time (enqueue → run succeeded, polled over HTTP) over the direct statement's
 * time (target ≤ 1.25×, best of two each), and the server's RSS before and at peak during the
 * same-database and the cross-database (streamed copy) runs (target: flat, < 300 MB).
 */
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { EntityManager } from '@mikro-orm/postgresql';
import { openDatabase } from '../src/db/orm.ts';
import { createOrganizationRecord, createUser } from '../src/modules/auth/auth.service.ts';
import type { Scope } from '../src/deps.ts';
import { rssMb, startServer, urlFor, withClient } from './harness.ts';

const TARGET_RATIO = 1.25;
const RSS_LIMIT_MB = 300;
const PASSWORD = 'bench-password-long-enough';

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
  const base =
    process.env.BENCH_DATABASE_URL ??
    process.env.TEST_DATABASE_URL ??
    'postgresql://postgres@127.0.0.1:5432/postgres';
  const rows = Number(process.env.BENCH_ROWS ?? 1_000_000);
  const tag = `${process.pid}_${Date.now()}`;
  const [controlDb, warehouseDb, otherDb] = ['cp', 'wh', 'wh2'].map((k) => `dimas_bench_${k}_${tag}`);
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-'));
  let server: { child: ChildProcess; url: string } | undefined;
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
      DATABASE_URL: controlUrl,
      PORT: '0',
      HOST: '127.0.0.1',
      DIMAS_DATA_DIR: dataDir,
      DIMAS_SECRET_KEY: '1f'.repeat(32),
      SUPERADMIN_PASSWORD: 'bench-superadmin-password',
      SEED_DEMO: 'false',
      LOG_LEVEL: 'warn',
      WAREHOUSE_STATEMENT_TIMEOUT_MS: '600000',
    });
    const pid = server.child.pid!;
    const startedMb = rssMb(pid);

    // A tenant with an admin, straight into the control plane the server migrated.
    const db = await openDatabase({ databaseUrl: controlUrl });
    const em = db.orm.em.fork() as EntityManager;
    const org = await createOrganizationRecord(em, { name: 'Bench', domain: `bench-${tag}.test` });
    await createUser({ em } as Scope, {
      organizationId: org.id,
      isSuperAdmin: false,
      username: 'bench',
      password: PASSWORD,
      roles: ['admin'],
      must_change_password: false,
    });
    await db.close();

    const api = async (method: string, path: string, body?: unknown) => {
      const res = await fetch(new URL(path, server!.url), {
        method,
        headers: {
          'content-type': 'application/json',
          ...(token ? { authorization: `Bearer ${token}` } : {}),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const json = (await res.json()) as Record<string, any>;
      if (res.status !== 200)
        throw new Error(`${method} ${path} answered ${res.status}: ${JSON.stringify(json)}`);
      return json;
    };
    let token = '';
    token = (
      await api('POST', '/api/auth/login', {
        username: 'bench',
        domain: `bench-${tag}.test`,
        password: PASSWORD,
      })
    ).token;
    const config = (database: string, schemas: string[]) => ({
      type: 'postgres',
      host: new URL(base).hostname,
      port: Number(new URL(base).port || 5432),
      database,
      user: decodeURIComponent(new URL(base).username) || 'postgres',
      password: decodeURIComponent(new URL(base).password) || 'unused',
      schemas,
    });
    const columns = [
      { name: 'id', type: 'bigint', nullable: false },
      ...Object.entries(EXPRESSIONS).map(([name, [type]]) => ({ name, type })),
    ];
    await api('POST', '/api/workspaces/create', { name: 'bench', select: true });
    await api('POST', '/api/workspaces/bench/config', {
      source_config: config(warehouseDb, ['src']),
      target_config: config(warehouseDb, ['mart']),
      target_schema: { name: 'bench', tables: [{ name: 'events_clean', primary_key: ['id'], columns }] },
    });
    await api('POST', '/api/mappings/events_clean/tables', {
      source_table: 'src.events',
      relationship: 'primary',
    });
    await api('POST', '/api/mappings/events_clean/connection', {
      connection: { source_field: 'events.id', target_field: 'id' },
    });
    for (const [target_field, [, expression]] of Object.entries(EXPRESSIONS))
      await api('POST', '/api/mappings/events_clean/transformation', {
        transformation: { target_field, expression },
      });
    const committed = await api('POST', '/api/mappings/events_clean/commit-transformation', {
      message: 'bench',
    });

    async function viaApi(): Promise<{ ms: number; result: Record<string, unknown> }> {
      const started = performance.now();
      const { run_id } = await api('POST', '/api/mappings/events_clean/materialize', {});
      for (;;) {
        const mapping = await api('GET', '/api/mappings/events_clean');
        const run = mapping.materialization.last_run;
        if (run?.run_id === run_id && run.status === 'succeeded')
          return { ms: performance.now() - started, result: run.result };
        if (run?.run_id === run_id && ['failed', 'cancelled'].includes(run.status))
          throw new Error(`run ${run.status}: ${run.error}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }

    // The baseline: the committed SQL as one INSERT … SELECT into an identical table, with pg.
    const names = columns.map((c) => `"${c.name}"`).join(', ');
    async function direct(): Promise<number> {
      return withClient(urlFor(base, warehouseDb), async (c) => {
        await c.query(`drop table if exists mart.events_direct`);
        await c.query(`create table mart.events_direct (like mart.events_clean including all)`);
        const started = performance.now();
        await c.query(`insert into mart.events_direct (${names})\n${committed.sql}`);
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

    await api('POST', '/api/workspaces/bench/config', { target_config: config(otherDb, ['mart']) });
    const cross = await watchRss(pid, viaApi);
    if (cross.result.result.mode !== 'streamed_copy' || cross.result.result.rows_written !== rows)
      throw new Error(`unexpected run result ${JSON.stringify(cross.result.result)}`);

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
      `server RSS: started ${startedMb.toFixed(0)} MB, idle after a run ${idleMb.toFixed(0)} MB, peak same-database ${samePeak.toFixed(0)} MB, peak cross-database ${cross.peakMb.toFixed(0)} MB (target < ${RSS_LIMIT_MB} MB) ${Math.max(samePeak, cross.peakMb) < RSS_LIMIT_MB ? 'OK' : 'OVER TARGET'}`,
    );
  } finally {
    if (server) {
      server.child.kill('SIGTERM');
      await new Promise((r) => server!.child.once('exit', r));
    }
    rmSync(dataDir, { recursive: true, force: true });
    await withClient(base, async (c) => {
      for (const db of [controlDb, warehouseDb, otherDb])
        await c.query(`drop database if exists "${db}" with (force)`);
    });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().then(
    () => process.exit(0),
    (error) => {
      console.error(error);
      process.exit(1);
    },
  );
}
