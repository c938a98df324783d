/**
 * Data-quality metrics and identity resolution on a real PostgreSQL server.
 *
 *   node bench/metrics.ts
 *
 * BENCH_DATABASE_URL (else TEST_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres)
 * names a server on which a scratch database is created and dropped afterwards. BENCH_ROWS
 * (default 1,000,000) sizes the 20-column table; BENCH_IDENTIFIERS (default 1,000,000) the graph.
 *
 * The baseline is the single aggregate statement a person would write by hand for the same
 * measures, run in the same process on the same table; the printed ratio is ours / hand-written.
 */
import pg from 'pg';
import { to as copyTo } from 'pg-copy-streams';
import { computeTableMetrics, type ColumnInput, type MetricsOptions } from '../src/quality/metrics.ts';
import { resolveIdentities } from '../src/quality/identity-graph.ts';
import { benchDatabaseUrl, median, runIfMain, urlFor } from './harness.ts';

const TYPES = ['integer', 'bigint', 'double precision', 'numeric', 'text', 'date', 'timestamptz', 'boolean'];
const TARGET_RATIO = 1.3;

function columnsOf(count: number): ColumnInput[] {
  return Array.from({ length: count }, (_, i) => ({ name: `c${i}`, type: TYPES[i % TYPES.length] }));
}

function generator(c: ColumnInput, i: number): string {
  // Every column gets some nulls and a different cardinality, so no aggregate is trivially cheap.
  const nulls = `case when g % ${i + 7} = 0 then null else `;
  const value = {
    integer: `(g % ${1000 * (i + 1)})::int`,
    bigint: `(g * ${i + 3})::bigint`,
    'double precision': `(g % ${997 + i}) / 7.0::float8`,
    numeric: `((g % ${5000 + i}) / 100.0)::numeric(12,2)`,
    text: `'val_' || (g % ${100 + i * 50})`,
    date: `date '2020-01-01' + (g % ${365 * (i + 1)})`,
    timestamptz: `timestamptz '2024-01-01T00:00:00Z' + (g % ${86400 + i}) * interval '1 second'`,
    boolean: `(g % ${i + 2}) = 0`,
  }[c.type];
  return `${nulls}${value} end`;
}

/** What a person writes by hand: one select list, the same measures, no generated SQL. */
function handWritten(columns: ColumnInput[], exactDistinct: boolean): string {
  const parts = ['count(*)'];
  for (const c of columns) {
    parts.push(`count(${c.name})`);
    if (exactDistinct) parts.push(`count(distinct ${c.name})`);
    if (!['text', 'boolean'].includes(c.type)) parts.push(`min(${c.name})`, `max(${c.name})`);
  }
  parts.push(`max(c6)`);
  return `select ${parts.join(', ')} from bench.wide`;
}

async function time(work: () => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await work();
  return performance.now() - started;
}

async function compare(
  client: pg.Client,
  label: string,
  columns: ColumnInput[],
  options: MetricsOptions,
  exactDistinct: boolean,
  runs: number,
) {
  const table = { schema: 'bench', name: 'wide' };
  const ours = () => computeTableMetrics(client, table, columns, { ...options, timestampColumn: 'c6' });
  const hand = () => client.query(handWritten(columns, exactDistinct));
  await ours();
  await hand();
  const oursMs: number[] = [];
  const handMs: number[] = [];
  // Interleaved, in alternating order, so cache warmth and background noise hit both sides alike.
  for (let i = 0; i < runs; i++) {
    if (i % 2 === 0) {
      oursMs.push(await time(ours));
      handMs.push(await time(hand));
    } else {
      handMs.push(await time(hand));
      oursMs.push(await time(ours));
    }
  }
  const ratio = median(oursMs) / median(handMs);
  const sample = await ours();
  console.log(
    `${label}: ours ${median(oursMs).toFixed(0)} ms, hand-written ${median(handMs).toFixed(0)} ms, ` +
      `ratio ${ratio.toFixed(2)}x (target <= ${TARGET_RATIO}x) ${ratio <= TARGET_RATIO ? 'OK' : 'OVER'}; ` +
      `distinct via ${[...new Set(sample.columns.map((c) => c.distinct_method))].join('/')}`,
  );
  return ratio;
}

async function identityBench(client: pg.Client, identifiers: number) {
  // Blocks of 8 rows chained by alternating shared e-mails (rows 2k,2k+1) and phones (2k+1,2k+2),
  // plus a per-row customer id: 4 e-mails + 5 phones + 8 ids = 17 identifiers per block, diameter ~9.
  const blocks = Math.ceil(identifiers / 17);
  await client.query(`create table bench.ident_src as
    select g as id, 'E' || (g / 8) || '_' || ((g % 8) / 2) || '@Example.com ' as email,
      '+1 (555) ' || lpad((g / 8)::text, 7, '0') || '-' || ((g % 8 + 1) / 2) as phone, 'C' || g as customer_id
    from generate_series(0, ${blocks * 8 - 1}) g`);
  await client.query('analyze bench.ident_src');
  const runner = { query: client.query.bind(client), copyOut: (sql: string) => client.query(copyTo(sql)) };
  const result = await resolveIdentities(runner, {
    schema: 'bench_identity',
    sources: [
      {
        table: { schema: 'bench', name: 'ident_src' },
        keyColumn: 'id',
        identifiers: [
          { column: 'email', type: 'email' },
          { column: 'phone', type: 'phone' },
          { column: 'customer_id', type: 'customer_id' },
        ],
      },
    ],
  });
  const ok = result.clusters === blocks && result.largest_cluster === 17;
  console.log(
    `identity resolution: ${result.identifiers} identifiers, ${result.edges} edges -> ${result.clusters} clusters ` +
      `(largest ${result.largest_cluster}) in ${result.duration_ms} ms ` +
      `${ok ? 'OK' : `UNEXPECTED (expected ${blocks} clusters of 17)`}`,
  );
  return { ...result, ok };
}

export async function runMetricsBench() {
  const serverUrl = benchDatabaseUrl();
  const rows = Number(process.env.BENCH_ROWS ?? 1_000_000);
  const identifiers = Number(process.env.BENCH_IDENTIFIERS ?? 1_000_000);
  const name = `dimas_bench_metrics_${process.pid}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`create database "${name}"`);
  const client = new pg.Client({ connectionString: urlFor(serverUrl, name) });
  try {
    await client.connect();
    const columns = columnsOf(20);
    await client.query('create schema bench');
    await client.query(`create table bench.wide (${columns.map((c) => `${c.name} ${c.type}`).join(', ')})`);
    const load = await time(() =>
      client.query(
        `insert into bench.wide select ${columns.map(generator).join(', ')} from generate_series(1, ${rows}) g`,
      ),
    );
    await client.query('vacuum analyze bench.wide');
    console.log(`table bench.wide: ${rows} rows x ${columns.length} columns loaded in ${load.toFixed(0)} ms`);
    const estimated = Number(
      (await client.query(`select reltuples from pg_class where oid = 'bench.wide'::regclass`)).rows[0]
        .reltuples,
    );
    // Below the default threshold (small BENCH_ROWS) the approximate path is forced, so both paths are measured.
    const approximate = await compare(
      client,
      'metrics, approximate distinct',
      columns,
      { estimatedRows: estimated, exactDistinctMaxRows: Math.min(200_000, estimated - 1) },
      false,
      5,
    );
    const exact = await compare(
      client,
      'metrics, exact distinct',
      columns,
      { estimatedRows: estimated, exactDistinctMaxRows: Number.MAX_SAFE_INTEGER },
      true,
      3,
    );
    const identity = await identityBench(client, identifiers);
    return { approximate, exact, identity };
  } finally {
    await client.end().catch(() => undefined);
    await admin.query(`drop database if exists "${name}" with (force)`);
    await admin.end();
  }
}

runIfMain(import.meta.url, async () => {
  const r = await runMetricsBench();
  return r.approximate <= TARGET_RATIO && r.exact <= TARGET_RATIO && r.identity.ok;
});
