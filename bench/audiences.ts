/**
 * Audiences: the dashboard's SQL statement count as audiences grow, a large CSV export, and webhook
 * exports at once.
 *
 *   node bench/audiences.ts
 *
 * BENCH_DATABASE_URL (else TEST_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres)
 * names a server on which two scratch databases are created and dropped afterwards: the control plane
 * of the dimas server (in process for the dashboard, whose statements are counted on its connection),
 * and the target warehouse holding the customer table.
 * BENCH_EXPORT_ROWS (default 1,000,000) sizes the table; BENCH_AUDIENCES (default 1,000) the dashboard.
 *
 * 1. Dashboard: audiences (each with exports, metrics and conversions) are inserted straight into
 *    the control plane at 10 and at BENCH_AUDIENCES; GET /dashboard is called over HTTP and every
 *    control-plane statement issued during the call is counted. It must not grow with the audiences.
 * 2. Export: the in-process server stops and the server starts again as a child process, the way
 *    `npm start` runs it (bench/harness.ts startServer), so that its RSS is its own. An audience of
 *    every customer is materialized (a job), then exported to CSV (a job) over HTTP. Throughput and
 *    the server's peak RSS during the export, sampled from /proc, are printed (target < 300 MB: the
 *    export streams from a cursor with constant memory). Then four exports of it at once (the runs of a
 *    kind a server on PostgreSQL works on by default): their time and the peak RSS.
 * 3. Webhooks: four exports of the same audience at once to a webhook receiver in a child process of
 *    its own (bench/harness.ts startWebhookReceiver: its memory is not counted, and it checks that each
 *    row arrives once), at the largest batch_size a user may set (10,000 rows a request, each held
 *    while it is sent): time, requests and the server's peak RSS (target < 300 MB).
 */
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import type { EntityManager } from '@mikro-orm/postgresql';
import { loadEnv } from '../src/env.ts';
import { openDatabase } from '../src/db/orm.ts';
import { createLogger } from '../src/logger.ts';
import { startServer, type RunningServer } from '../src/server.ts';
import {
  addAdmin,
  benchDatabaseUrl,
  median,
  postgresConfig,
  rssMb,
  runIfMain,
  serverEnv,
  signIn,
  startServer as startChildServer,
  startWebhookReceiver,
  stopServer,
  urlFor,
  type WebhookTally,
} from './harness.ts';

const RSS_TARGET_MB = 300;
const PASSWORD = 'timing-password-audiences';
/** The largest batch_size a webhook destination accepts (audiences.schemas.ts). */
const WEBHOOK_BATCH = 10_000;

async function until<T>(
  read: () => Promise<T>,
  done: (v: T) => boolean,
  timeoutMs = 30 * 60_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() > deadline) throw new Error(`timed out: ${JSON.stringify(value)}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

/** Every statement the control plane's MikroORM connection runs while `work` runs. */
async function countStatements(server: RunningServer, work: () => Promise<unknown>) {
  const connection = server.deps.orm.em.getConnection() as unknown as {
    executeQuery: (query: string, ...rest: unknown[]) => Promise<unknown>;
  };
  const original = connection.executeQuery;
  const statements: string[] = [];
  connection.executeQuery = function (query: string, ...rest: unknown[]) {
    statements.push(query.replace(/\s+/g, ' '));
    return original.call(this, query, ...rest);
  };
  try {
    await work();
  } finally {
    connection.executeQuery = original;
  }
  return statements;
}

/** n more audiences in the control plane, each with 2 exports, 30 metrics rows and 10 conversions. */
async function seedAudiences(
  cp: pg.Client,
  organizationId: string,
  workspaceId: string,
  warehouseDb: string,
  n: number,
) {
  await cp.query(
    `insert into audiences (id, organization_id, workspace_id, name, description, target_database, target_schema,
       target_table, definition_type, rules, identifier_columns, attribute_columns, definition_version,
       materialization_status, materialized_version, row_count, materialized_at, created_at, updated_at)
     select gen_random_uuid(), $1, $2, 'bench ' || g || ' ' || gen_random_uuid(), '', $3, 'crm', 'customers', 'rules',
            '{"all":[]}', '["customer_id"]', '[]', 1 + g % 2, 'succeeded', 1, g * 10, now() - g * interval '1 minute',
            now(), now()
       from generate_series(1, $4::int) g`,
    [organizationId, workspaceId, warehouseDb, n],
  );
  const fresh = `select id from audiences where workspace_id = $1 and not exists
                   (select 1 from audience_exports e where e.audience_id = audiences.id)`;
  await cp.query(
    `insert into audience_exports (id, organization_id, workspace_id, audience_id, name, destination_type,
       destination_config, field_mapping, schedule, status, created_at, updated_at)
     select gen_random_uuid(), $2, $1, a.id, 'csv ' || k, 'csv', '{"type":"csv"}', '[]', 'manual',
            case when k = 1 then 'active' else 'paused' end, now(), now()
       from (${fresh}) a, generate_series(1, 2) k`,
    [workspaceId, organizationId],
  );
  await cp.query(
    `insert into audience_performance_metrics (id, organization_id, workspace_id, audience_id, ad_platform,
       campaign_id, date, impressions, clicks, spend, conversions, revenue, currency, created_at, updated_at)
     select gen_random_uuid(), $2, $1, a.id, (array['google','meta','tiktok'])[1 + d % 3], 'c' || (d % 5),
            date '2026-01-01' + d, 1000 + d, 10 + d, 5.5 * d, d % 4, 20 * d, 'USD', now(), now()
       from audiences a, generate_series(0, 29) d
      where a.workspace_id = $1
        and not exists (select 1 from audience_performance_metrics m where m.audience_id = a.id)`,
    [workspaceId, organizationId],
  );
  await cp.query(
    `insert into audience_conversions (id, organization_id, workspace_id, audience_id, customer_id, event, value,
       currency, occurred_at, external_id, created_at)
     select gen_random_uuid(), $2, $1, a.id, 'c' || k, 'purchase', k, 'USD', now(), gen_random_uuid()::text, now()
       from audiences a, generate_series(1, 10) k
      where a.workspace_id = $1
        and not exists (select 1 from audience_conversions c where c.audience_id = a.id)`,
    [workspaceId, organizationId],
  );
  await cp.query(
    'analyze audiences; analyze audience_exports; analyze audience_performance_metrics; analyze audience_conversions',
  );
}

export async function runAudiencesBench() {
  const serverUrl = benchDatabaseUrl();
  const exportRows = Number(process.env.BENCH_EXPORT_ROWS ?? 1_000_000);
  const audienceCount = Number(process.env.BENCH_AUDIENCES ?? 1000);
  const controlDb = `dimas_bench_aud_cp_${process.pid}`;
  const warehouseDb = `dimas_bench_aud_wh_${process.pid}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`create database "${controlDb}"`);
  await admin.query(`create database "${warehouseDb}"`);
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-aud-'));
  const warehouse = new pg.Client({ connectionString: urlFor(serverUrl, warehouseDb) });
  const cp = new pg.Client({ connectionString: urlFor(serverUrl, controlDb) });
  let server: RunningServer | undefined;
  let child: Awaited<ReturnType<typeof startChildServer>> | undefined;
  try {
    await warehouse.connect();
    await warehouse.query('create schema crm');
    await warehouse.query(
      `create table crm.customers (customer_id integer primary key, email text, country text, age integer,
         lifetime_value numeric(12,2), signup_date date)`,
    );
    const loadStarted = performance.now();
    await warehouse.query(
      `insert into crm.customers select g, 'user' || g || '@example.com', (array['US','DE','FR','GB'])[1 + g % 4],
         18 + g % 60, (g % 5000) / 3.0, date '2020-01-01' + g % 1500 from generate_series(1, $1::int) g`,
      [exportRows],
    );
    await warehouse.query('analyze crm.customers');
    console.log(
      `warehouse crm.customers: ${exportRows} rows loaded in ${(performance.now() - loadStarted).toFixed(0)} ms`,
    );

    const environment = {
      ...serverEnv(urlFor(serverUrl, controlDb), dataDir),
      LOG_LEVEL: 'silent',
      AUTH_CACHE_TTL_MS: '0',
    };
    const env = loadEnv(environment);
    const db = await openDatabase({ databaseUrl: env.DATABASE_URL });
    server = await startServer(env, { db, seed: false, logger: createLogger({ level: 'silent' }) });
    const tenantAdmin = { domain: `bench-${process.pid}.test`, username: 'bench', password: PASSWORD };
    const org = await addAdmin(server.deps.orm.em.fork() as EntityManager, tenantAdmin);
    const { api } = await signIn(server.url, tenantAdmin);
    const workspace = await api('POST', '/api/workspaces/create', {
      name: 'bench',
      select: true,
      target_config: postgresConfig(serverUrl, warehouseDb, ['crm']),
    });
    await api('POST', '/api/workspaces/bench/config', {
      target_schema: {
        name: 'crm',
        tables: [
          {
            name: 'customers',
            primary_key: ['customer_id'],
            columns: [
              { name: 'customer_id', type: 'integer' },
              { name: 'email', type: 'text' },
              { name: 'country', type: 'text' },
              { name: 'age', type: 'integer' },
              { name: 'lifetime_value', type: 'numeric' },
              { name: 'signup_date', type: 'date' },
            ],
          },
        ],
      },
    });
    const workspaceId = workspace.id ?? workspace.workspace?.id;

    // ---- 1. dashboard ----
    await cp.connect();
    const wsId =
      workspaceId ??
      (await cp.query(`select id from workspaces where organization_id = $1 and name = 'bench'`, [org.id]))
        .rows[0].id;
    const dashboardAt = async (n: number) => {
      const existing = Number(
        (await cp.query('select count(*) from audiences where workspace_id = $1', [wsId])).rows[0].count,
      );
      if (n > existing) await seedAudiences(cp, org.id, wsId, warehouseDb, n - existing);
      await api('GET', '/api/api/audiences/dashboard');
      let answered = 0;
      const statements = await countStatements(server!, async () => {
        answered = (await api('GET', '/api/api/audiences/dashboard')).audiences.length;
      });
      const times: number[] = [];
      for (let i = 0; i < 5; i++) {
        const started = performance.now();
        await api('GET', '/api/api/audiences/dashboard');
        times.push(performance.now() - started);
      }
      const audienceStatements = statements.filter((s) => /audience/.test(s)).length;
      if (process.env.BENCH_VERBOSE) for (const s of statements) console.log(`  ${s.slice(0, 160)}`);
      console.log(
        `dashboard, ${String(answered).padStart(5)} audiences: ${statements.length} control-plane statements ` +
          `(${audienceStatements} reading audience tables), median ${median(times).toFixed(1)} ms`,
      );
      return { answered, statements: statements.length, audienceStatements, ms: median(times) };
    };
    const small = await dashboardAt(10);
    const large = await dashboardAt(audienceCount);
    const constant = small.statements === large.statements && large.audienceStatements === 1;
    console.log(`dashboard statements constant in the number of audiences: ${constant ? 'yes' : 'NO'}`);

    // ---- 2. export ----
    await server.close();
    server = undefined;
    child = await startChildServer(environment);
    const { api: exportApi } = await signIn(child.url, tenantAdmin);
    const audience = await exportApi('POST', '/api/api/audiences', {
      name: 'everyone',
      target_table: 'customers',
      definition: { type: 'rules', rules: { all: [] } },
      attribute_columns: ['email', 'country', 'age', 'lifetime_value', 'signup_date'],
    });
    const materializeStarted = performance.now();
    const run = await exportApi('POST', `/api/api/audiences/${audience.id}/materialize`);
    const done = await until(
      () => exportApi('GET', `/api/api/audiences/${audience.id}`),
      (a) =>
        a.materialization.run_id === run.run_id && ['succeeded', 'failed'].includes(a.materialization.status),
    );
    if (done.materialization.status !== 'succeeded')
      throw new Error(`materialize failed: ${done.materialization.error}`);
    console.log(
      `materialize: ${done.materialization.row_count} rows in ${(performance.now() - materializeStarted).toFixed(0)} ms (job duration ${done.materialization.duration_ms} ms)`,
    );

    const pid = child.child.pid!;
    const baseline = rssMb(pid);
    let peakMb = baseline;
    const sampler = setInterval(() => (peakMb = Math.max(peakMb, rssMb(pid))), 20);
    const exportStarted = performance.now();
    const created = await exportApi('POST', '/api/api/audiences/exports', {
      audience_id: audience.id,
      destination: { type: 'csv' },
    });
    const finished = await until(
      async () =>
        (await exportApi('GET', `/api/api/audiences/${audience.id}/exports`)).exports.find(
          (e: any) => e.id === created.export.id,
        ),
      (e) => e.last_run?.run_id === created.run.run_id && ['succeeded', 'failed'].includes(e.last_run.status),
    );
    const exportMs = performance.now() - exportStarted;
    clearInterval(sampler);
    const jobMs =
      new Date(finished.last_run.finished_at).getTime() - new Date(finished.last_run.started_at).getTime();
    console.log(
      `export job ran ${jobMs} ms of the ${exportMs.toFixed(0)} ms from request to observed completion`,
    );
    if (finished.last_run.status !== 'succeeded')
      throw new Error(`export failed: ${finished.last_run.error}`);
    const file = join(dataDir, 'audience-exports', org.id, `${created.export.id}.csv`);
    const bytes = statSync(file).size;
    const lines = readFileSync(file, 'utf8').split('\n').length - 2;
    console.log(
      `CSV export: ${finished.rows_exported} rows (${lines} data lines), ${(bytes / 2 ** 20).toFixed(1)} MB in ${(exportMs / 1000).toFixed(2)} s ` +
        `= ${Math.round(finished.rows_exported / (exportMs / 1000))} rows/s, ${(bytes / 2 ** 20 / (exportMs / 1000)).toFixed(1)} MB/s`,
    );
    console.log(
      `server RSS: ${baseline.toFixed(0)} MB before, peak ${peakMb.toFixed(0)} MB during the export ` +
        `(target < ${RSS_TARGET_MB} MB): ${peakMb < RSS_TARGET_MB ? 'ok' : 'OVER'}`,
    );

    // ---- 2, continued: four exports at once, as many runs of a kind as a server on PostgreSQL runs by
    // default (JOB_CONCURRENCY), each streaming its rows through this process ----
    const fourAtOnce = async (destination: Record<string, unknown>) => {
      const startMb = rssMb(pid);
      let peak = startMb;
      const sampler = setInterval(() => (peak = Math.max(peak, rssMb(pid))), 20);
      const started = performance.now();
      const runs = await Promise.all(
        [1, 2, 3, 4].map(async () => {
          const exp = await exportApi('POST', '/api/api/audiences/exports', {
            audience_id: audience.id,
            destination,
          });
          return until(
            async () =>
              (await exportApi('GET', `/api/api/audiences/${audience.id}/exports`)).exports.find(
                (e: any) => e.id === exp.export.id,
              ),
            (e) =>
              e.last_run?.run_id === exp.run.run_id && ['succeeded', 'failed'].includes(e.last_run.status),
          );
        }),
      );
      clearInterval(sampler);
      const failed = runs.find((e) => e.last_run.status !== 'succeeded');
      if (failed) console.log(`  an export failed: ${failed.last_run.error}`);
      return { ms: performance.now() - started, startMb, peakMb: peak, runs };
    };
    const csv = await fourAtOnce({ type: 'csv' });
    const parallelOk = csv.runs.every(
      (e) => e.last_run.status === 'succeeded' && e.rows_exported === exportRows,
    );
    console.log(
      `four CSV exports at once: ${(csv.ms / 1000).toFixed(2)} s, server RSS peak ${csv.peakMb.toFixed(0)} MB ` +
        `(target < ${RSS_TARGET_MB} MB): ${parallelOk && csv.peakMb < RSS_TARGET_MB ? 'ok' : 'OVER'}`,
    );

    // ---- 3. four webhook exports at once, at the largest batch a user may set: a batch is held
    // while it is sent, so a batch's size times four is what the server holds at least ----
    const receiver = await startWebhookReceiver();
    let webhook: Awaited<ReturnType<typeof fourAtOnce>>;
    let received: WebhookTally;
    try {
      webhook = await fourAtOnce({
        type: 'webhook',
        url: receiver.url,
        batch_size: WEBHOOK_BATCH,
        timeout_ms: 120_000,
      });
      received = await receiver.tally();
    } finally {
      await receiver.stop();
    }
    const everyRowOnce = webhook.runs.every(
      (e) =>
        e.last_run.status === 'succeeded' &&
        e.rows_exported === exportRows &&
        received.exports[e.id]?.rows === exportRows &&
        received.exports[e.id]?.repeated === 0,
    );
    const webhookOk = everyRowOnce && webhook.peakMb < RSS_TARGET_MB;
    console.log(
      `four webhook exports at once (batch_size ${WEBHOOK_BATCH}): ${(webhook.ms / 1000).toFixed(2)} s, ` +
        `${received.requests} requests of up to ${(received.maxBodyBytes / 2 ** 20).toFixed(1)} MB, every row once: ` +
        `${everyRowOnce ? 'yes' : 'NO'}; server RSS ${webhook.startMb.toFixed(0)} MB at the start, peak ${webhook.peakMb.toFixed(0)} MB ` +
        `(target < ${RSS_TARGET_MB} MB): ${webhookOk ? 'ok' : 'OVER'}`,
    );
    return {
      dashboard: { small, large, constant },
      export: {
        rows: finished.rows_exported,
        ms: exportMs,
        peakMb,
        ok: peakMb < RSS_TARGET_MB && lines === exportRows,
      },
      parallelExports: {
        ms: csv.ms,
        peakMb: csv.peakMb,
        ok: parallelOk && csv.peakMb < RSS_TARGET_MB,
      },
      parallelWebhooks: { ms: webhook.ms, peakMb: webhook.peakMb, ok: webhookOk },
    };
  } finally {
    await server?.close().catch(() => undefined);
    if (child) await stopServer(child.child);
    await warehouse.end().catch(() => undefined);
    await cp.end().catch(() => undefined);
    await admin.query(`drop database if exists "${controlDb}" with (force)`);
    await admin.query(`drop database if exists "${warehouseDb}" with (force)`);
    await admin.end();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

runIfMain(import.meta.url, async () => {
  const r = await runAudiencesBench();
  return r.dashboard.constant && r.export.ok && r.parallelExports.ok && r.parallelWebhooks.ok;
});
