/**
 * Identity resolution at scale, against the simplest fast thing a person would write by hand.
 *
 *   node bench/identity.ts            (BENCH_IDENTIFIERS, default 1,000,000)
 *
 * Data: BENCH_IDENTIFIERS / 4 people spread over three source tables of a scratch database on the
 * server of BENCH_DATABASE_URL (else TEST_DATABASE_URL, else the local server): a CRM export
 * (e-mail, phone), shop customers (customer id, the e-mail in other case and spacing) and support
 * users (a second e-mail, the phone in another format). Each person is one cluster of 4 identifiers.
 *
 * Baseline, in the same run on the same tables: COPY the identifier pairs of every row out, union-find
 * them in this process (identifiers as strings in a Map), COPY the labels back into a table. Ours is
 * the whole build (staging, numbering, edges, degrees, components, the graph's tables with keys).
 * The build is also run once with its components computed in the warehouse only (in-process limit
 * 0), for its time and this process's memory beside it; through a server, once as configured by
 * default and once with IDENTITY_IN_PROCESS_IDENTIFIERS at half the graph (contracted in the
 * warehouse, finished in the server's process, as graphs over the limit are).
 * Then 1% new people are added and the incremental build is timed against the full one, on a graph
 * with planner statistics (as autovacuum leaves it), alone and with the unified profiles built in the
 * same transaction (all of them after the full build, the changed clusters' after the incremental
 * one); they are removed again before the baseline runs. The steps of the fastest full build and of
 * the incremental one are printed as their results report them. Elapsed times and the CPU time of the
 * server process and of this one are printed (the CPU figures move less when other work shares the
 * machine; parallel index build workers of the server are not counted), with the peak RSS of this
 * process during our builds.
 *
 * Last line: `identity: <seconds> s for <n> identifiers; ratio <r> of baseline`.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import pg from 'pg';
import { from as copyFrom, to as copyTo } from 'pg-copy-streams';
import { resolveIdentities, updateIdentities } from '../src/quality/identity-graph.ts';
import { defaultNormalizer, type IdentitySource } from '../src/quality/identity-schema.ts';
import { buildGoldenRecords, type GoldenRecordOptions } from '../src/quality/golden-records.ts';
import type { CopyOutRunner } from '../src/quality/sql.ts';
import { transactionRunner } from '../src/modules/monitoring/monitoring-metrics.ts';
import type { WarehouseTransaction } from '../src/warehouse/warehouse.ts';
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

const TARGET_RATIO = 2;

const SOURCES: IdentitySource[] = [
  {
    table: { schema: 'bench', name: 'crm_contacts' },
    keyColumn: 'id',
    identifiers: [
      { column: 'email', type: 'email' },
      { column: 'phone', type: 'phone' },
    ],
  },
  {
    table: { schema: 'bench', name: 'shop_customers' },
    keyColumn: 'id',
    identifiers: [
      { column: 'customer_id', type: 'customer_id' },
      { column: 'email', type: 'email' },
    ],
  },
  {
    table: { schema: 'bench', name: 'support_users' },
    keyColumn: 'id',
    identifiers: [
      { column: 'work_email', type: 'email' },
      { column: 'phone', type: 'phone' },
    ],
  },
];

/** The profile fields a server proposes for these sources: one per identifier type, most frequent value. */
const PROFILE_FIELDS: GoldenRecordOptions['fields'] = [
  ...new Set(SOURCES.flatMap((s) => s.identifiers.map((id) => id.type))),
].map((type) => ({
  name: type,
  rule: 'most_frequent',
  columns: SOURCES.flatMap((source, i) =>
    source.identifiers
      .filter((id) => id.type === type)
      .map((id) => ({ source: i, column: id.column, normalize: defaultNormalizer(type) })),
  ),
}));

function people(from: number, to: number): string[] {
  const range = `generate_series(${from}, ${to - 1}) p`;
  return [
    `insert into bench.crm_contacts select p, 'Person' || p || '@Example.com', '+1 555 ' || lpad(p::text, 8, '0') from ${range}`,
    `insert into bench.shop_customers select p, 'C' || p, ' person' || p || '@example.com' from ${range}`,
    `insert into bench.support_users select p, 'p' || p || '@work.example', '(1) 555-' || lpad(p::text, 8, '0') from ${range}`,
  ];
}

function runnerOf(client: pg.Client): CopyOutRunner {
  return {
    query: (sql, params) => client.query(sql, params as unknown[]),
    copyOut: (sql) => client.query(copyTo(sql)),
  };
}

/** Graph and profiles in one transaction, as the server's build job runs them; milliseconds of each. */
async function graphAndProfiles(client: pg.Client, incremental: boolean, options: { schema: string }) {
  const runner = transactionRunner({
    query: (sql, params) => client.query(sql, params),
    copyFrom: (sql) => client.query(copyFrom(sql)),
    copyTo: (sql) => client.query(copyTo(sql)),
  } as WarehouseTransaction);
  await client.query('begin');
  const graphOptions = { ...options, sources: SOURCES };
  const graph = incremental
    ? await updateIdentities(runner, graphOptions)
    : await resolveIdentities(runner, graphOptions);
  const started = performance.now();
  const profiles = await buildGoldenRecords(
    runner,
    { ...options, sources: SOURCES, fields: PROFILE_FIELDS },
    graph.mode === 'incremental',
  );
  await client.query('commit');
  return { graph, profiles, profilesMs: performance.now() - started };
}

/**
 * CPU milliseconds used so far by the server process behind `client`, read from /proc when the
 * server runs on this machine (else NaN: only elapsed time is compared).
 */
async function backendCpu(client: pg.Client): Promise<() => number> {
  const { rows } = await client.query('select pg_backend_pid() as pid');
  return () => {
    try {
      const fields = readFileSync(`/proc/${rows[0].pid}/stat`, 'utf8').split(') ')[1].split(' ');
      return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
    } catch {
      return NaN;
    }
  };
}

/** The hand-written version: pairs out, union-find over strings, labels back in. */
async function baseline(client: pg.Client): Promise<number> {
  const started = performance.now();
  const pairs = `
    select 'email:' || lower(btrim(email)), 'phone:' || translate(phone, translate(phone, '0123456789', ''), '') from bench.crm_contacts
    union all select 'customer_id:' || btrim(customer_id), 'email:' || lower(btrim(email)) from bench.shop_customers
    union all select 'email:' || lower(btrim(work_email)), 'phone:' || translate(phone, translate(phone, '0123456789', ''), '') from bench.support_users`;
  const ids = new Map<string, number>();
  let parent = new Int32Array(1 << 20);
  const idOf = (key: string) => {
    let id = ids.get(key);
    if (id === undefined) {
      id = ids.size;
      ids.set(key, id);
      if (id >= parent.length) {
        const grown = new Int32Array(parent.length * 2);
        grown.set(parent);
        parent = grown;
      }
      parent[id] = id;
    }
    return id;
  };
  const find = (x: number) => {
    while (parent[x] !== x) {
      parent[x] = parent[parent[x]];
      x = parent[x];
    }
    return x;
  };
  let rest = '';
  for await (const chunk of client.query(copyTo(`copy (${pairs}) to stdout`))) {
    const lines = (rest + chunk.toString()).split('\n');
    rest = lines.pop()!;
    for (const line of lines) {
      const tab = line.indexOf('\t');
      const a = find(idOf(line.slice(0, tab)));
      const b = find(idOf(line.slice(tab + 1)));
      if (a !== b) parent[Math.max(a, b)] = Math.min(a, b);
    }
  }
  await client.query('drop table if exists bench.baseline_labels');
  await client.query('create table bench.baseline_labels (identifier text, label int)');
  const keys = ids.keys();
  async function* lines() {
    let batch = '';
    let i = 0;
    for (const key of keys) {
      batch += `${key}\t${find(i++)}\n`;
      if (batch.length > 1 << 16) {
        yield batch;
        batch = '';
      }
    }
    if (batch) yield batch;
  }
  await pipeline(Readable.from(lines()), client.query(copyFrom('copy bench.baseline_labels from stdin')));
  return performance.now() - started;
}

/**
 * The build as users run it: POST identity-graph/create-schema on a dimas server started as
 * `npm start` starts it (`env` added), whose workspace targets `database` with the three tables as
 * confirmed identity sources; elapsed time until the job's run is over, and the server's RSS
 * sampled from /proc all along (the job runs in the server's process).
 */
async function throughServer(serverUrl: string, database: string, env: Record<string, string>) {
  const controlDb = `dimas_bench_icp_${process.pid}_${Date.now()}`;
  await withClient(serverUrl, (c) => c.query(`create database "${controlDb}"`));
  let server: Awaited<ReturnType<typeof startServer>> | undefined;
  try {
    const controlUrl = urlFor(serverUrl, controlDb);
    server = await startServer({
      ...serverEnv(controlUrl, mkdtempSync(join(tmpdir(), 'dimas-bench-'))),
      WAREHOUSE_STATEMENT_TIMEOUT_MS: '600000',
      ...env,
    });
    const admin = {
      domain: `bench-${controlDb}.test`,
      username: 'bench',
      password: 'timing-identity-password',
    };
    await createAdmin(controlUrl, admin);
    const { api } = await signIn(server.url, admin);
    await api('POST', '/api/workspaces/create', {
      name: 'bench',
      select: true,
      target_config: postgresConfig(serverUrl, database, ['bench']),
    });
    await api('PUT', '/api/workspaces/admin-settings', {
      workspace_name: 'bench',
      identity_resolution: {
        sources: SOURCES.map((source) => ({
          table: `${source.table.schema}.${source.table.name}`,
          key_column: source.keyColumn,
          identifiers: source.identifiers.map(({ column, type }) => ({ column, type })),
        })),
      },
    });
    const pid = server.child.pid!;
    const rssBefore = rssMb(pid);
    let rssPeak = rssBefore;
    const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, rssMb(pid))), 10);
    const started = performance.now();
    try {
      const created = await api('POST', '/api/monitoring/identity-graph/create-schema');
      for (;;) {
        await new Promise((resolve) => setTimeout(resolve, 250));
        const graph = await api('GET', '/api/monitoring/identity-graph/workspace');
        const build = graph.last_build;
        if (build?.run_id !== created.build.run_id) continue;
        if (build.status === 'succeeded')
          return { ms: performance.now() - started, result: build.result, rssBefore, rssPeak };
        if (['failed', 'cancelled'].includes(build.status))
          throw new Error(`the build ${build.status}: ${build.error}`);
      }
    } finally {
      clearInterval(sampler);
    }
  } finally {
    if (server) await stopServer(server.child);
    await withClient(serverUrl, (c) => c.query(`drop database if exists "${controlDb}" with (force)`));
  }
}

export async function runIdentityBench() {
  const serverUrl = benchDatabaseUrl();
  const identifiers = Number(process.env.BENCH_IDENTIFIERS ?? 1_000_000);
  const persons = Math.ceil(identifiers / 4);
  const name = `dimas_bench_identity_${process.pid}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`create database "${name}"`);
  const client = new pg.Client({ connectionString: urlFor(serverUrl, name) });
  let peakRss = 0;
  const sampler = setInterval(() => (peakRss = Math.max(peakRss, process.memoryUsage().rss)), 50);
  try {
    await client.connect();
    await client.query('create schema bench');
    await client.query('create table bench.crm_contacts (id int primary key, email text, phone text)');
    await client.query(
      'create table bench.shop_customers (id int primary key, customer_id text, email text)',
    );
    await client.query('create table bench.support_users (id int primary key, work_email text, phone text)');
    for (const statement of people(0, persons)) await client.query(statement);
    await client.query('analyze');
    const runner = runnerOf(client);
    const options = { schema: 'bench_identity', sources: SOURCES };
    const serverCpu = await backendCpu(client);
    const cpuOf = async <T>(work: () => Promise<T>) => {
      const [server, own] = [serverCpu(), process.cpuUsage()];
      const value = await work();
      const used = process.cpuUsage(own);
      return { value, server: serverCpu() - server, own: (used.user + used.system) / 1000 };
    };
    // Ours first, so that the peak memory sampled is ours and not the baseline's Map of strings:
    // the build with its components in the warehouse only (limit 0: what this process holds when it
    // holds nothing of the graph) before anything else grows this process, then the default build
    // (warm-up, two measured builds) and the incremental one; the baseline (warm-up, two measured
    // runs) last, on the same rows.
    const rssBefore = process.memoryUsage().rss;
    peakRss = rssBefore;
    const inWarehouse = await resolveIdentities(runner, { ...options, inProcessLimit: 0 });
    const warehousePeak = peakRss;
    const warehouseOk =
      inWarehouse.components_in === 'warehouse' &&
      inWarehouse.clusters === persons &&
      inWarehouse.largest_cluster === 4;
    await resolveIdentities(runner, options);
    const ours: number[] = [];
    const base: number[] = [];
    peakRss = 0;
    const measured = await cpuOf(() => resolveIdentities(runner, options));
    ours.push(measured.value.duration_ms);
    // The last full build also builds the unified profiles, for the incremental build's comparison.
    const fullWithProfiles = await graphAndProfiles(client, false, options);
    const result = fullWithProfiles.graph;
    ours.push(result.duration_ms);
    const peak = peakRss;
    const oursMs = Math.min(...ours);
    const ok = result.clusters === persons && result.largest_cluster === 4;

    const added = Math.ceil(persons / 100);
    for (const statement of people(persons, persons + added)) await client.query(statement);
    // The graph with planner statistics, as autovacuum leaves a warehouse's tables after a full build
    // (this machine runs without it): the incremental build's plans must hold with them too.
    await client.query(
      'analyze bench_identity.identity_nodes, bench_identity.identity_edges, bench_identity.identity_records, bench_identity.identity_clusters, bench_identity.unified_profiles',
    );
    peakRss = 0;
    const incrementalWithProfiles = await graphAndProfiles(client, true, options);
    const incremental = incrementalWithProfiles.graph;
    const incrementalPeak = peakRss;
    const incrementalOk = incremental.clusters === persons + added && incremental.largest_cluster === 4;
    for (const table of ['crm_contacts', 'shop_customers', 'support_users'])
      await client.query(`delete from bench.${table} where id >= $1`, [persons]);
    await client.query('vacuum analyze');

    // Through the server, as users run it: once as configured by default, once with the in-process
    // limit at half the graph, as a graph twice the default limit gets it (contracted in the warehouse,
    // the rest finished in the server's process).
    const halfLimit = String(Math.floor(identifiers / 2));
    const viaServer = await throughServer(serverUrl, name, {});
    const viaServerOverLimit = await throughServer(serverUrl, name, {
      IDENTITY_IN_PROCESS_IDENTIFIERS: halfLimit,
    });

    await baseline(client);
    const baseCpu = await cpuOf(() => baseline(client));
    base.push(baseCpu.value);
    base.push(await baseline(client));
    const baseMs = Math.min(...base);
    console.log(
      `full build: ${result.identifiers} identifiers, ${result.edges} edges -> ${result.clusters} clusters ` +
        `(largest ${result.largest_cluster}) in ${oursMs.toFixed(0)} ms; baseline ${baseMs.toFixed(0)} ms ` +
        `${ok ? 'OK' : `UNEXPECTED (expected ${persons} clusters of 4)`}`,
    );
    console.log(
      `incremental build after 1% new people: ${incremental.duration_ms} ms ` +
        `(${(incremental.duration_ms / oursMs).toFixed(3)} of a full build; target <= 0.1) ` +
        `${incrementalOk ? 'OK' : `UNEXPECTED: ${incremental.clusters} clusters`}`,
    );
    const fullTotal = result.duration_ms + fullWithProfiles.profilesMs;
    const incrementalTotal = incremental.duration_ms + incrementalWithProfiles.profilesMs;
    const profilesOk =
      fullWithProfiles.profiles.profiles === persons &&
      incrementalWithProfiles.profiles.profiles === persons + added &&
      incrementalWithProfiles.profiles.mode === 'incremental';
    console.log(
      `with the unified profiles (${PROFILE_FIELDS.length} fields): full build ${result.duration_ms} + ` +
        `${fullWithProfiles.profilesMs.toFixed(0)} ms; incremental ${incremental.duration_ms} + ` +
        `${incrementalWithProfiles.profilesMs.toFixed(0)} ms, the profiles of the changed clusters only ` +
        `(${(incrementalTotal / fullTotal).toFixed(3)} of a full build with its profiles; target <= 0.1) ` +
        `${profilesOk ? 'OK' : `UNEXPECTED: ${JSON.stringify([fullWithProfiles.profiles, incrementalWithProfiles.profiles])}`}`,
    );
    const cpu = (c: { server: number; own: number }) =>
      `${(c.server / 1000).toFixed(1)} s server + ${(c.own / 1000).toFixed(1)} s this process`;
    // CPU time moves less than elapsed time when other work shares the machine.
    console.log(
      `CPU time: full build ${cpu(measured)}; baseline ${cpu(baseCpu)}; ratio ` +
        `${((measured.server + measured.own) / (baseCpu.server + baseCpu.own)).toFixed(2)} ` +
        `(load average ${loadavg()
          .map((l) => l.toFixed(1))
          .join(' ')})`,
    );
    const steps = (r: { steps: { step: string; ms: number }[] }) =>
      r.steps.map((s) => `${s.step} ${s.ms}`).join(', ');
    const fastest = measured.value.duration_ms <= result.duration_ms ? measured.value : result;
    console.log(`steps (ms): full build ${steps(fastest)}; incremental ${steps(incremental)}`);
    const mb = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(0)} MB`;
    console.log(
      `components in the warehouse: ${inWarehouse.duration_ms} ms, ${inWarehouse.iterations} rounds ` +
        `(${(inWarehouse.duration_ms / oursMs).toFixed(2)} of the build with them in this process) ` +
        `${warehouseOk ? 'OK' : `UNEXPECTED: ${inWarehouse.clusters} clusters`}`,
    );
    console.log(
      `RSS of the resolving process: ${mb(rssBefore)} before any build; peak with the components in ` +
        `the warehouse ${mb(warehousePeak)}, in this process ${mb(peak)} (incremental ${mb(incrementalPeak)}) ` +
        `(target < 300 MB)`,
    );
    const serverLine = (run: Awaited<ReturnType<typeof throughServer>>) =>
      `${(run.ms / 1000).toFixed(1)} s (graph ${(run.result.duration_ms / 1000).toFixed(1)} s with its components in ` +
      `${run.result.components_in}, then ${run.result.profiles} profiles), ` +
      `server RSS ${run.rssBefore.toFixed(0)} MB before, peak ${run.rssPeak.toFixed(0)} MB`;
    console.log(
      `through the server (create-schema, the job, unified profiles): ${serverLine(viaServer)}; ` +
        `with IDENTITY_IN_PROCESS_IDENTIFIERS=${halfLimit}: ${serverLine(viaServerOverLimit)} (target < 300 MB)`,
    );
    const ratio = oursMs / baseMs;
    console.log(
      `identity: ${(oursMs / 1000).toFixed(2)} s for ${result.identifiers} identifiers; ratio ${ratio.toFixed(2)} of baseline`,
    );
    return (
      ok &&
      incrementalOk &&
      warehouseOk &&
      profilesOk &&
      ratio <= TARGET_RATIO &&
      incremental.duration_ms <= oursMs / 10 &&
      incrementalTotal <= fullTotal / 10
    );
  } finally {
    clearInterval(sampler);
    await client.end().catch(() => undefined);
    await admin.query(`drop database if exists "${name}" with (force)`);
    await admin.end();
  }
}

runIfMain(import.meta.url, runIdentityBench);
