/**
 * Audiences: the dashboard's SQL statement count as audiences grow, and a large CSV export.
 *
 *   npx tsx bench/audiences.ts
 *
 * BENCH_DATABASE_URL (else TEST_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres)
 * names a server on which two scratch databases are created and dropped afterwards: the control plane
 * of an in-process dimas server, and the target warehouse holding the customer table.
 * BENCH_EXPORT_ROWS (default 1,000,000) sizes the table; BENCH_AUDIENCES (default 1,000) the dashboard.
 *
 * 1. Dashboard: audiences (each with exports, metrics and conversions) are inserted straight into
 *    the control plane at 10 and at BENCH_AUDIENCES; GET /dashboard is called over HTTP and every
 *    control-plane statement issued during the call is counted. It must not grow with the audiences.
 * 2. Export: an audience of every customer is materialized (a job), then exported to CSV (a job)
 *    over HTTP. Throughput and the process's peak RSS during the export are printed (target < 300 MB:
 *    the export streams from a cursor with constant memory).
 */
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import type { EntityManager } from '@mikro-orm/postgresql';
import { loadEnv } from '../src/env.ts';
import { openDatabase } from '../src/db/orm.ts';
import { createLogger } from '../src/logger.ts';
import { startServer, type RunningServer } from '../src/server.ts';
import { createOrganizationRecord, createUser } from '../src/modules/auth/auth.service.ts';
import { assertReadOnlySql } from '../src/warehouse/sql-guard.ts';

const RSS_TARGET_MB = 300;
const PASSWORD = 'bench-password-audiences';

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

async function http(server: RunningServer, token: string, method: string, path: string, body?: unknown) {
  const res = await fetch(new URL(path, server.url), {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const json = (await res.json()) as any;
  if (res.status !== 200)
    throw new Error(`${method} ${path} answered ${res.status}: ${JSON.stringify(json)}`);
  return json;
}

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
  const serverUrl =
    process.env.BENCH_DATABASE_URL ??
    process.env.TEST_DATABASE_URL ??
    'postgresql://postgres@127.0.0.1:5432/postgres';
  const exportRows = Number(process.env.BENCH_EXPORT_ROWS ?? 1_000_000);
  const audienceCount = Number(process.env.BENCH_AUDIENCES ?? 1000);
  const controlDb = `dimas_bench_aud_cp_${process.pid}`;
  const warehouseDb = `dimas_bench_aud_wh_${process.pid}`;
  const urlOf = (db: string) => {
    const url = new URL(serverUrl);
    url.pathname = `/${db}`;
    return url.toString();
  };
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`create database "${controlDb}"`);
  await admin.query(`create database "${warehouseDb}"`);
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-bench-aud-'));
  const warehouse = new pg.Client({ connectionString: urlOf(warehouseDb) });
  const cp = new pg.Client({ connectionString: urlOf(controlDb) });
  let server: RunningServer | undefined;
  try {
    await warehouse.connect();
    const target = new URL(serverUrl);
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

    const env = loadEnv({
      PORT: '0',
      DATABASE_URL: urlOf(controlDb),
      DIMAS_DATA_DIR: dataDir,
      DIMAS_SECRET_KEY: randomBytes(32).toString('hex'),
      SEED_DEMO: 'false',
      LOG_LEVEL: 'silent',
      AUTH_CACHE_TTL_MS: '0',
    });
    const db = await openDatabase({ databaseUrl: env.DATABASE_URL });
    server = await startServer(env, { db, seed: false, logger: createLogger({ level: 'silent' }) });
    const em = server.deps.orm.em.fork() as EntityManager;
    const org = await createOrganizationRecord(em, { name: 'Bench', domain: `bench-${process.pid}.test` });
    await createUser(
      { em, deps: server.deps },
      {
        organizationId: org.id,
        isSuperAdmin: false,
        username: 'bench',
        password: PASSWORD,
        roles: ['admin'],
        must_change_password: false,
      },
    );
    const login = await fetch(new URL('/api/auth/login', server.url), {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'bench', domain: org.domain, password: PASSWORD }),
    });
    const token = ((await login.json()) as { token: string }).token;
    const workspace = await http(server, token, 'POST', '/api/workspaces/create', {
      name: 'bench',
      select: true,
      target_config: {
        type: 'postgres',
        host: target.hostname,
        port: Number(target.port || 5432),
        database: warehouseDb,
        user: decodeURIComponent(target.username) || 'postgres',
        ...(target.password ? { password: decodeURIComponent(target.password) } : {}),
        schemas: ['crm'],
      },
    });
    await http(server, token, 'POST', '/api/workspaces/bench/config', {
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
      await http(server!, token, 'GET', '/api/api/audiences/dashboard');
      let answered = 0;
      const statements = await countStatements(server!, async () => {
        answered = (await http(server!, token, 'GET', '/api/api/audiences/dashboard')).audiences.length;
      });
      const times: number[] = [];
      for (let i = 0; i < 5; i++) {
        const started = performance.now();
        await http(server!, token, 'GET', '/api/api/audiences/dashboard');
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
    const audience = await http(server, token, 'POST', '/api/api/audiences', {
      name: 'everyone',
      target_table: 'customers',
      definition: { type: 'rules', rules: { all: [] } },
      attribute_columns: ['email', 'country', 'age', 'lifetime_value', 'signup_date'],
    });
    const materializeStarted = performance.now();
    const run = await http(server, token, 'POST', `/api/api/audiences/${audience.id}/materialize`);
    const done = await until(
      () => http(server!, token, 'GET', `/api/api/audiences/${audience.id}`),
      (a) =>
        a.materialization.run_id === run.run_id && ['succeeded', 'failed'].includes(a.materialization.status),
    );
    if (done.materialization.status !== 'succeeded')
      throw new Error(`materialize failed: ${done.materialization.error}`);
    console.log(
      `materialize: ${done.materialization.row_count} rows in ${(performance.now() - materializeStarted).toFixed(0)} ms (job duration ${done.materialization.duration_ms} ms)`,
    );

    // The SQL guard compiles its WASM parser on first use (a one-off of a few hundred MB of compiler
    // memory and seconds); a running server has long done so, so it is warmed before measuring.
    await assertReadOnlySql('select 1');
    global.gc?.();
    const baseline = process.memoryUsage().rss;
    let peak = baseline;
    let atPeak = process.memoryUsage();
    const sampler = setInterval(() => {
      const usage = process.memoryUsage();
      if (usage.rss > peak) [peak, atPeak] = [usage.rss, usage];
    }, 20);
    const exportStarted = performance.now();
    const created = await http(server, token, 'POST', '/api/api/audiences/exports', {
      audience_id: audience.id,
      destination: { type: 'csv' },
    });
    const finished = await until(
      async () =>
        (await http(server!, token, 'GET', `/api/api/audiences/${audience.id}/exports`)).exports.find(
          (e: any) => e.id === created.export.id,
        ),
      (e) => e.last_run?.run_id === created.run.run_id && ['succeeded', 'failed'].includes(e.last_run.status),
    );
    const exportMs = performance.now() - exportStarted;
    clearInterval(sampler);
    const mb = (n: number) => `${(n / 2 ** 20).toFixed(0)} MB`;
    console.log(
      `at the peak: heap used ${mb(atPeak.heapUsed)} of ${mb(atPeak.heapTotal)}, external ${mb(atPeak.external)}, array buffers ${mb(atPeak.arrayBuffers)}`,
    );
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
    const peakMb = peak / 2 ** 20;
    console.log(
      `CSV export: ${finished.rows_exported} rows (${lines} data lines), ${(bytes / 2 ** 20).toFixed(1)} MB in ${(exportMs / 1000).toFixed(2)} s ` +
        `= ${Math.round(finished.rows_exported / (exportMs / 1000))} rows/s, ${(bytes / 2 ** 20 / (exportMs / 1000)).toFixed(1)} MB/s`,
    );
    console.log(
      `server RSS: ${(baseline / 2 ** 20).toFixed(0)} MB before, peak ${peakMb.toFixed(0)} MB during the export ` +
        `(target < ${RSS_TARGET_MB} MB): ${peakMb < RSS_TARGET_MB ? 'ok' : 'OVER'}`,
    );
    return {
      dashboard: { small, large, constant },
      export: {
        rows: finished.rows_exported,
        ms: exportMs,
        peakMb,
        ok: peakMb < RSS_TARGET_MB && lines === exportRows,
      },
    };
  } finally {
    await server?.close().catch(() => undefined);
    await warehouse.end().catch(() => undefined);
    await cp.end().catch(() => undefined);
    await admin.query(`drop database if exists "${controlDb}" with (force)`);
    await admin.query(`drop database if exists "${warehouseDb}" with (force)`);
    await admin.end();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  runAudiencesBench().then(
    (r) => process.exit(r.dashboard.constant && r.export.ok ? 0 : 1),
    (error) => {
      console.error(error);
      process.exit(1);
    },
  );
}
