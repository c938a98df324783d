/**
 * Discovery benchmark: a source of BENCH_TABLES (default 500) tables × 20 columns, discovered through
 * the real REST event stream against the customer-360 template, compared in the same run with the bare
 * work discovery cannot avoid: the introspection queries and one profiling statement per table on a
 * plain connection. The difference is what discovery adds (matching, run bookkeeping, mapping writes,
 * events). Prints both medians, the ratio, and the peak RSS of the process (server included).
 *
 *   node bench/discovery.ts
 *   BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres BENCH_TABLES=200 node bench/discovery.ts
 *
 * It creates two scratch databases (control plane, source) on that server and drops them at the end.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { EntityManager } from '@mikro-orm/postgresql';
import { createParser } from 'eventsource-parser';
import pg from 'pg';
import { loadEnv } from '../src/env.ts';
import { openDatabase } from '../src/db/orm.ts';
import { createLogger } from '../src/logger.ts';
import { startServer } from '../src/server.ts';
import { introspectCatalog } from '../src/warehouse/introspect.ts';
import { profileTable } from '../src/llm/profile.ts';
import type { DiscoveryEvent } from '../src/modules/discovery/discovery.schemas.ts';
import {
  addAdmin,
  benchDatabaseUrl,
  median,
  postgresConfig,
  runIfMain,
  serverEnv,
  signIn,
  urlFor,
} from './harness.ts';

export interface DiscoveryBenchResult {
  tables: number;
  columns_per_table: number;
  rows_per_table: number;
  iterations: number;
  discovery_ms: number;
  /** From the request to the end of profiling (introspection, profiles, events). */
  profiling_phase_ms: number;
  bare_ms: number;
  ratio: number;
  fields_suggested: number;
  peak_rss_mb: number;
  process_max_rss_mb: number;
}

const mb = (bytes: number) => Math.round((bytes / 1024 / 1024) * 10) / 10;

/** Twenty columns drawn from what real exports hold, so the matcher has real work (and real ties). */
const COLUMN_POOL: [string, string, string][] = [
  ['email', 'text', `'user' || g || '@example.com'`],
  ['first_name', 'text', `'name' || g`],
  ['last_name', 'text', `'family' || g`],
  ['phone', 'text', `'+1 415 555 ' || lpad((g % 10000)::text, 4, '0')`],
  ['city', 'text', `(array['Paris','Berlin','Austin','Lima'])[1 + g % 4]`],
  ['country', 'text', `(array['FR','DE','US','PE'])[1 + g % 4]`],
  ['postal_code', 'text', `lpad((g * 7 % 99999)::text, 5, '0')`],
  ['created_at', 'timestamptz', `now() - g * interval '1 hour'`],
  ['updated_at', 'timestamptz', `now() - g * interval '1 minute'`],
  ['status', 'text', `(array['active','churned','trial'])[1 + g % 3]`],
  ['amount', 'numeric(12,2)', `g * 1.25`],
  ['currency', 'text', `(array['USD','EUR'])[1 + g % 2]`],
  ['customer_id', 'integer', `1 + g % 97`],
  ['birth_date', 'date', `date '1970-01-01' + g`],
  ['gender', 'text', `(array['f','m','x'])[1 + g % 3]`],
  ['notes', 'text', `md5(g::text)`],
  ['is_subscribed', 'boolean', `g % 2 = 0`],
  ['website', 'text', `'https://example.com/' || g`],
  ['external_ref', 'uuid', `md5(g::text)::uuid`],
  ['score', 'integer', `g % 100`],
  ['company_name', 'text', `'Company ' || (g % 50)`],
  ['address_line1', 'text', `g || ' Main Street'`],
  ['state', 'text', `(array['CA','TX','NY'])[1 + g % 3]`],
  ['loyalty_tier', 'text', `(array['gold','silver'])[1 + g % 2]`],
];

function sourceDdl(tables: number, rows: number): string {
  const out: string[] = ['create schema src;'];
  for (let t = 0; t < tables; t++) {
    // A different slice of the pool per table, 19 columns besides the key.
    const cols = Array.from({ length: 19 }, (_, i) => COLUMN_POOL[(t + i * 5) % COLUMN_POOL.length]);
    const unique = [...new Map(cols.map((c) => [c[0], c])).values()];
    while (unique.length < 19) unique.push([`attr_${unique.length}`, 'text', `'v' || (g % 13)`]);
    const name = `t${String(t).padStart(3, '0')}`;
    out.push(
      `create table src.${name} (id integer primary key, ${unique.map(([n, type]) => `${n} ${type}`).join(', ')});`,
      `insert into src.${name} select g, ${unique.map(([, , expr]) => expr).join(', ')} from generate_series(1, ${rows}) g;`,
    );
  }
  out.push('analyze;');
  return out.join('\n');
}

/** The events, each with the time it arrived (ms since the request). */
async function readStream(url: string, token: string): Promise<(DiscoveryEvent & { at: number })[]> {
  const t0 = performance.now();
  const res = await fetch(`${url}/api/workspaces/discover`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: '{}',
  });
  if (!res.headers.get('content-type')?.startsWith('text/event-stream'))
    throw new Error(`discover answered ${res.status}: ${await res.text()}`);
  const events: (DiscoveryEvent & { at: number })[] = [];
  const parser = createParser({
    onEvent: (m) => events.push({ ...JSON.parse(m.data), at: performance.now() - t0 }),
  });
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parser.feed(value);
  }
  return events;
}

export async function runDiscoveryBench(
  options: {
    serverUrl?: string;
    tables?: number;
    rows?: number;
    iterations?: number;
    log?: (line: string) => void;
  } = {},
): Promise<DiscoveryBenchResult> {
  const serverUrl = options.serverUrl ?? benchDatabaseUrl();
  const tables = options.tables ?? Number(process.env.BENCH_TABLES ?? 500);
  const rows = options.rows ?? Number(process.env.BENCH_ROWS ?? 200);
  const iterations = options.iterations ?? Number(process.env.BENCH_ITERATIONS ?? 3);
  const log = options.log ?? ((line: string) => console.log(line));

  const tag = `${process.pid}_${Date.now()}`;
  const controlName = `dimas_bench_disc_ctl_${tag}`;
  const sourceName = `dimas_bench_disc_src_${tag}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`create database "${controlName}"`);
  await admin.query(`create database "${sourceName}"`);
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-discovery-'));
  const source = new pg.Client({ connectionString: urlFor(serverUrl, sourceName) });
  let running: Awaited<ReturnType<typeof startServer>> | undefined;
  try {
    let t0 = performance.now();
    await source.connect();
    await source.query(sourceDdl(tables, rows));
    log(`source: ${tables} tables × 20 columns × ${rows} rows in ${Math.round(performance.now() - t0)} ms`);

    const env = loadEnv({ ...serverEnv(urlFor(serverUrl, controlName), dataDir), LOG_LEVEL: 'silent' });
    const db = await openDatabase({ databaseUrl: env.DATABASE_URL });
    running = await startServer(env, { db, seed: false, logger: createLogger({ level: 'silent' }) });
    const tenantAdmin = { domain: `bench${tag}.test`, username: 'bench', password: 'timing-password-123' };
    await addAdmin(running.deps.orm.em.fork() as EntityManager, tenantAdmin);
    const { api, token } = await signIn(running.url, tenantAdmin);
    const template = JSON.parse(
      readFileSync(new URL('../seeds/schemas/customer-360.json', import.meta.url), 'utf8'),
    );
    await api('POST', '/api/workspaces/create', { name: 'bench', select: true });
    await api('POST', '/api/workspaces/bench/config', {
      source_config: postgresConfig(serverUrl, sourceName, ['src']),
      target_schema: template,
    });

    // The bare work: the catalog queries and one profiling statement per table, on one plain connection.
    const run = async (sql: string, params: unknown[]) => (await source.query(sql, params)).rows;
    const bare = async () => {
      const introspected = await introspectCatalog(
        async <R>(sql: string, params: unknown[]) => (await source.query(sql, params)).rows as R[],
        { schemas: ['src'] },
      );
      for (const t of introspected.tables)
        await profileTable(
          run,
          t.schema,
          t.name,
          t.columns.map((c) => ({ name: c.name, type: c.type })),
          { rowLimit: 1000 },
        );
      return introspected.tables.length;
    };

    let peakRss = process.memoryUsage().rss;
    const sampler = setInterval(() => (peakRss = Math.max(peakRss, process.memoryUsage().rss)), 20);
    const discoveryMs: number[] = [];
    const profilingMs: number[] = [];
    const bareMs: number[] = [];
    let suggested = 0;
    // Warm both paths (connections, parser, template cache) before measuring.
    await bare();
    await readStream(running.url, token);
    for (let i = 0; i < iterations; i++) {
      t0 = performance.now();
      const events = await readStream(running.url, token);
      discoveryMs.push(performance.now() - t0);
      const last = events.at(-1);
      if (last?.type !== 'completed') throw new Error(`discovery ended with ${JSON.stringify(last)}`);
      if (last.summary.tables !== tables) throw new Error(`discovery saw ${last.summary.tables} tables`);
      suggested = last.summary.fields_suggested;
      profilingMs.push(events.find((e) => e.type === 'progress' && e.step === 'profiled')!.at);
      t0 = performance.now();
      const seen = await bare();
      bareMs.push(performance.now() - t0);
      if (seen !== tables) throw new Error(`bare introspection saw ${seen} tables`);
    }
    clearInterval(sampler);

    const result: DiscoveryBenchResult = {
      tables,
      columns_per_table: 20,
      rows_per_table: rows,
      iterations,
      discovery_ms: Math.round(median(discoveryMs)),
      profiling_phase_ms: Math.round(median(profilingMs)),
      bare_ms: Math.round(median(bareMs)),
      ratio: Math.round((median(discoveryMs) / median(bareMs)) * 100) / 100,
      fields_suggested: suggested,
      peak_rss_mb: mb(peakRss),
      process_max_rss_mb: Math.round((process.resourceUsage().maxRSS / 1024) * 10) / 10,
    };
    log(
      `discovery (REST stream, ${tables} tables, customer-360): median ${result.discovery_ms} ms over ${iterations} runs`,
    );
    log(
      `  of which introspection + profiling: ${result.profiling_phase_ms} ms; matching + writing: ${result.discovery_ms - result.profiling_phase_ms} ms`,
    );
    log(`bare introspection + profiling queries:              median ${result.bare_ms} ms`);
    log(`ratio discovery / bare: ${result.ratio}×  (${suggested} fields suggested)`);
    log(`peak RSS ${result.peak_rss_mb} MB (process max ${result.process_max_rss_mb} MB, server included)`);
    return result;
  } finally {
    await source.end().catch(() => {});
    await running?.close();
    await admin.query(`drop database if exists "${controlName}" with (force)`);
    await admin.query(`drop database if exists "${sourceName}" with (force)`);
    await admin.end();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

runIfMain(import.meta.url, async () => {
  await runDiscoveryBench();
});
