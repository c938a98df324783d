import { createHash } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EntityManager } from '@mikro-orm/postgresql';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  bindCall,
  createTenant,
  createWorkspace,
  materializeMapping,
  unique,
  until,
  type Tenant,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { loadEnv } from '../src/env.ts';
import { Alert } from '../src/modules/alerts/alerts.entity.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';

/*
 * job_runs' retention (JOB_RUNS_RETENTION_DAYS, 30 here): the sweep deletes finished runs older than
 * that, in every organization, except the runs still read: active ones, the newest finished run of each
 * singleton key, a run an area names as its last run, an export's latest delivery (a webhook rerun
 * resumes after it), a mapping's failed runs since its last success (the next run drops the staging
 * tables they left). Runs are aged with SQL; the sweep is the one the queue's hourly schedule runs.
 */
const warehouse = scratchDatabase('job_ret');
const CUSTOMERS = 95;
const BATCH = 10;

let server: TestServer;
let tenant: Tenant;
let other: Tenant;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/api',
);
const em = () => server.deps.orm.em.fork() as EntityManager;

interface RunSetup {
  organizationId: string;
  kind: string;
  key?: string | null;
  status?: 'queued' | 'running' | 'succeeded' | 'failed' | 'cancelled';
  /** Created this many days ago (and finished a minute later unless active). */
  ageDays: number;
  workspaceId?: string | null;
  progress?: Record<string, unknown>;
}

/** A run row as the queue leaves it, created `ageDays` ago. */
async function insertRun(run: RunSetup, on = server): Promise<string> {
  const status = run.status ?? 'succeeded';
  const active = status === 'queued' || status === 'running';
  const [row] = await (on.deps.orm.em.fork() as EntityManager).execute(
    `insert into job_runs (id, organization_id, workspace_id, kind, status, singleton_key, payload, progress,
        retry_count, started_at, finished_at, created_at, updated_at)
     values (gen_random_uuid(), ?, ?, ?, ?, ?, '{}', ?, 0,
        ${status === 'queued' ? 'null' : 'now() - make_interval(days => ?)'},
        ${active ? 'null' : `now() - make_interval(days => ?) + interval '1 minute'`},
        now() - make_interval(days => ?), ${status === 'running' ? 'now()' : `now() - make_interval(days => ?)`})
     returning id`,
    [
      run.organizationId,
      run.workspaceId ?? null,
      run.kind,
      status,
      run.key ?? null,
      JSON.stringify(run.progress ?? {}),
      ...(status === 'queued' ? [] : [run.ageDays]),
      ...(active ? [] : [run.ageDays]),
      run.ageDays,
      ...(status === 'running' ? [] : [run.ageDays]),
    ],
  );
  return String(row.id);
}

/** Moves a run back in time by `days` (created, started, finished). */
async function age(runId: string, days: number) {
  await em().execute(
    `update job_runs set created_at = created_at - make_interval(days => ?),
        started_at = started_at - make_interval(days => ?), finished_at = finished_at - make_interval(days => ?)
      where id = ?`,
    [days, days, days, runId],
  );
}

/** Which of `ids` are still in job_runs. */
async function remaining(ids: string[], on = server): Promise<string[]> {
  const rows = await (on.deps.orm.em.fork() as EntityManager).execute(
    `select id from job_runs where id in (${ids.map(() => '?').join(', ')})`,
    ids,
  );
  const left = new Set(rows.map((r) => String(r.id)));
  return ids.filter((id) => left.has(id));
}

beforeAll(async () => {
  await warehouse.create();
  server = await startTestServer({ JOB_RUNS_RETENTION_DAYS: '30' });
  tenant = await createTenant(server);
  other = await createTenant(server);
});
afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('job_runs retention', () => {
  it('is 90 days unless JOB_RUNS_RETENTION_DAYS says otherwise', () => {
    expect(loadEnv({}).JOB_RUNS_RETENTION_DAYS).toBe(90);
    expect(server.deps.env.JOB_RUNS_RETENTION_DAYS).toBe(30);
    expect(() => loadEnv({ JOB_RUNS_RETENTION_DAYS: '-1' })).toThrow(/JOB_RUNS_RETENTION_DAYS/);
  });

  it('deletes finished runs older than the period in every organization; keeps active ones and the newest of each key', async () => {
    const kind = unique('ret-');
    await server.deps.jobs.register(kind, async () => ({ done: true }));
    // A run through the queue, aged afterwards, is swept like the rows written here.
    const { run: real } = await server.deps.jobs.enqueue(
      kind,
      {},
      {
        organizationId: tenant.organization.id,
        singletonKey: 'a',
      },
    );
    await until(
      'the run',
      () => server.deps.jobs.getRun(real.id, tenant.organization.id),
      (r) => r?.status === 'succeeded',
    );
    await age(real.id, 70);
    const mine = { organizationId: tenant.organization.id, kind };
    const theirs = { organizationId: other.organization.id, kind };
    const expired = [
      real,
      await insertRun({ ...mine, key: 'a', status: 'failed', ageDays: 60 }),
      await insertRun({ ...mine, key: 'a', status: 'cancelled', ageDays: 50 }),
      await insertRun({ ...mine, key: null, ageDays: 45 }),
      await insertRun({ ...mine, key: null, ageDays: 44 }),
      await insertRun({ ...theirs, key: 'a', status: 'failed', ageDays: 55 }),
    ].map((r) => (typeof r === 'string' ? r : r.id));
    const kept = {
      // The newest finished run of key a, in each organization: the other's is older than this
      // one's newest, yet the newest of its own key.
      newestOfMine: await insertRun({ ...mine, key: 'a', ageDays: 40 }),
      newestOfTheirs: await insertRun({ ...theirs, key: 'a', ageDays: 45 }),
      recent: await insertRun({ ...mine, key: 'b', ageDays: 29 }),
      newerThanRecent: await insertRun({ ...mine, key: 'b', ageDays: 1 }),
      queued: await insertRun({ ...mine, key: 'q', status: 'queued', ageDays: 80 }),
      running: await insertRun({ ...theirs, key: 'r', status: 'running', ageDays: 80 }),
    };
    // A kind this process does not run may be needed by code it does not have: it stays.
    const unknownKind = [
      await insertRun({ ...mine, kind: unique('gone-'), key: 'a', ageDays: 80 }),
      await insertRun({ ...mine, kind: unique('gone-'), key: null, ageDays: 81 }),
    ];

    const deleted = await server.deps.jobs.deleteExpiredRuns();
    expect(deleted).toBeGreaterThanOrEqual(expired.length);
    expect(await remaining(expired)).toEqual([]);
    expect(await remaining(Object.values(kept))).toEqual(Object.values(kept));
    expect(await remaining(unknownKind)).toEqual(unknownKind);
    // What a route reads of the key is still there: its latest run.
    const [latest] = await server.deps.jobs.listRuns(tenant.organization.id, { kind, status: 'succeeded' });
    expect(latest.id).toBe(kept.newerThanRecent);
    expect(await server.deps.jobs.getRun(real.id, tenant.organization.id)).toBeNull();
  });

  it("keeps a run an area names as its last run: an alert's, however old", async () => {
    const name = await createWorkspace(server, tenant.admin.token);
    const workspace = await em().findOneOrFail(Workspace, { name, organization: tenant.organization.id });
    const monitoring = {
      organizationId: tenant.organization.id,
      kind: 'monitoring-run',
      key: workspace.id,
      workspaceId: workspace.id,
    };
    const sawIt = await insertRun({ ...monitoring, ageDays: 60 });
    const between = await insertRun({ ...monitoring, ageDays: 50 });
    const newest = await insertRun({ ...monitoring, ageDays: 40 });
    const fork = em();
    const seen = new Date(Date.now() - 60 * 86_400_000);
    fork.create(Alert, {
      organization: tenant.organization.id,
      workspace: workspace.id,
      checkKey: unique('check-'),
      kind: 'test',
      checkName: 'not_null',
      tableName: 'customers',
      columnName: 'email',
      severity: 'error',
      status: 'active',
      measured: 3,
      threshold: 0,
      message: 'email is null in 3 rows',
      firstSeenAt: seen,
      lastSeenAt: seen,
      lastRunId: sawIt,
    });
    await fork.flush();

    await server.deps.jobs.deleteExpiredRuns();
    expect(await remaining([sawIt, between, newest])).toEqual([sawIt, newest]);
    const alerts = await api('GET', '/alerts/active', { query: { workspace: name } });
    expect(alerts.status, JSON.stringify(alerts.body)).toBe(200);
    expect(JSON.stringify(alerts.body)).toContain(sawIt);
  });

  it('keeps with 0 every run', async () => {
    const keeping = await startTestServer({ JOB_RUNS_RETENTION_DAYS: '0' });
    try {
      const t = await createTenant(keeping);
      // Past this file's 30 days, within the default 90 of the other servers on a shared database.
      const runs = [
        await insertRun(
          { organizationId: t.organization.id, kind: 'source-load', key: 'x', ageDays: 45 },
          keeping,
        ),
        await insertRun(
          { organizationId: t.organization.id, kind: 'source-load', key: 'x', ageDays: 40 },
          keeping,
        ),
      ];
      expect(await keeping.deps.jobs.deleteExpiredRuns()).toBe(0);
      expect(await remaining(runs, keeping)).toEqual(runs);
    } finally {
      await keeping.close();
    }
  });
});

describe("an export's latest delivery", () => {
  const audiences = bindCall(
    () => server,
    () => tenant.admin.token,
    '/api/api/audiences',
  );
  let audienceId: string;

  beforeAll(async () => {
    await warehouse.sql(`create schema crm`);
    await warehouse.sql(`create table crm.customers (customer_id integer primary key, email text)`);
    await warehouse.sql(`insert into crm.customers
       select i, 'user' || i || '@example.com' from generate_series(1, ${CUSTOMERS}) i`);
    await createWorkspace(server, tenant.admin.token, {
      name: unique('job_ret'),
      target_config: pgConfig(warehouse.name, { schemas: ['crm'] }),
      target_schema: {
        name: 'crm',
        version: '1.0.0',
        tables: [
          {
            name: 'customers',
            primary_key: ['customer_id'],
            columns: [
              { name: 'customer_id', type: 'integer', nullable: false },
              { name: 'email', type: 'text' },
            ],
          },
        ],
      },
    });
    const created = await audiences('POST', '', {
      body: {
        name: 'everyone',
        target_table: 'customers',
        definition: { type: 'rules', rules: { all: [] } },
        attribute_columns: ['email'],
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    audienceId = created.body.id;
    const run = await audiences('POST', `/${audienceId}/materialize`);
    expect(run.status, JSON.stringify(run.body)).toBe(200);
    const done = await until(
      'materialize',
      async () => (await audiences('GET', `/${audienceId}`)).body.materialization,
      (m) => m.run_id === run.body.run_id && ['succeeded', 'failed'].includes(m.status),
      90_000,
    );
    expect(done.status, done.error).toBe('succeeded');
  }, 180_000);

  const lastRun = (exportId: string, runId: string) =>
    until(
      `export ${exportId} run ${runId}`,
      async () =>
        (await audiences('GET', `/${audienceId}/exports`)).body.exports.find((e: any) => e.id === exportId),
      (e) =>
        e?.last_run?.run_id === runId && ['succeeded', 'failed', 'cancelled'].includes(e.last_run.status),
      90_000,
    );

  it('stays past the period behind later runs that delivered nothing: a webhook rerun resumes after it', async () => {
    let refuse: number | null = 4;
    const keys: { key: string; status: number }[] = [];
    const hook: Server = createServer((req, res) => {
      let body = '';
      req.on('data', (chunk) => (body += chunk));
      req.on('end', () => {
        const batch = JSON.parse(body).batch_index;
        const status = batch === refuse ? 422 : 200;
        keys.push({ key: String(req.headers['idempotency-key']), status });
        res.writeHead(status).end();
      });
    });
    hook.listen(0, '127.0.0.1');
    await new Promise((resolve) => hook.once('listening', resolve));
    try {
      const url = `http://127.0.0.1:${(hook.address() as AddressInfo).port}/in`;
      const created = await audiences('POST', '/exports', {
        body: {
          audience_id: audienceId,
          destination: { type: 'webhook', url, batch_size: BATCH, max_retries: 0 },
          field_mapping: [
            { source: 'customer_id', destination: 'id' },
            { source: 'email', destination: 'email' },
          ],
        },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const exportId = created.body.export.id as string;
      const delivered = (await lastRun(exportId, created.body.run.run_id)).last_run;
      expect(delivered.status).toBe('failed');
      expect(delivered.progress).toMatchObject({ batches_sent: 4 });
      const deliveryId = delivered.progress.delivery_id as string;
      const exportRun = {
        organizationId: tenant.organization.id,
        kind: 'audience-export',
        key: exportId,
      };
      // Before it, an older delivery; after it, runs that failed before delivering (a refused
      // materialization), the latest of which the export now names as its last run.
      const olderDelivery = await insertRun({
        ...exportRun,
        status: 'failed',
        ageDays: 70,
        progress: { delivery_id: 'older', batches_sent: 2, rows_exported: 20, source_table: 'gone' },
      });
      await age(delivered.run_id, 60);
      const failedBefore = await insertRun({ ...exportRun, status: 'failed', ageDays: 50 });
      const latest = await insertRun({ ...exportRun, status: 'failed', ageDays: 40 });
      await em().execute(`update audience_exports set last_run_id = ? where id = ?`, [latest, exportId]);

      await server.deps.jobs.deleteExpiredRuns();
      expect(await remaining([olderDelivery, delivered.run_id, failedBefore, latest])).toEqual([
        delivered.run_id,
        latest,
      ]);

      refuse = null;
      const before = keys.length;
      const rerun = await audiences('PUT', `/exports/${exportId}`, { body: { run: true } });
      expect(rerun.status, JSON.stringify(rerun.body)).toBe(200);
      const second = (await lastRun(exportId, rerun.body.run.run_id)).last_run;
      expect(second.status, second.error).toBe('succeeded');
      expect(second.progress).toMatchObject({
        delivery_id: deliveryId,
        resumed_from_batch: 4,
        resumed_from_run_id: delivered.run_id,
      });
      // Only the batches the receiver had not acknowledged.
      expect(keys.slice(before).map((k) => k.key)).toEqual(
        Array.from(
          { length: Math.ceil(CUSTOMERS / BATCH) - 4 },
          (_, i) => `${exportId}:${deliveryId}:${i + 4}`,
        ),
      );
    } finally {
      await new Promise((resolve) => hook.close(resolve));
    }
  }, 180_000);
});

describe("a mapping's runs that may have left a staging table", () => {
  const mappingsApi = bindCall(
    () => server,
    () => tenant.admin.token,
    '/api/mappings',
  );
  let workspaceId: string;

  beforeAll(async () => {
    await warehouse.sql(`create schema shop; create schema dw;
      create table shop.customers (id integer primary key, email text);
      insert into shop.customers values (1, 'ann@x.com'), (2, 'bob@x.com');`);
    const name = unique('job_ret_map');
    await createWorkspace(server, tenant.admin.token, {
      name,
      source_config: pgConfig(warehouse.name, { schemas: ['shop'] }),
      target_config: pgConfig(warehouse.name, { schemas: ['dw'] }),
      target_schema: {
        name: 'dw',
        tables: [
          {
            name: 'customers',
            primary_key: ['customer_id'],
            columns: [
              { name: 'customer_id', type: 'integer', nullable: false },
              { name: 'email', type: 'text' },
            ],
          },
        ],
      },
    });
    workspaceId = (await em().findOneOrFail(Workspace, { name, organization: tenant.organization.id })).id;
    for (const [source_field, target_field] of [
      ['shop.customers.id', 'customer_id'],
      ['shop.customers.email', 'email'],
    ]) {
      const res = await mappingsApi('POST', '/customers/connection', {
        body: { connection: { source_field, target_field, status: 'confirmed' } },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
    }
    const commit = await mappingsApi('POST', '/customers/commit-transformation', {
      body: { message: 'customers' },
    });
    expect(commit.status, JSON.stringify(commit.body)).toBe(200);
  }, 120_000);

  it('stay until a later run of the table succeeded: its next materialization still drops what they left', async () => {
    const { run: succeeded } = await materializeMapping(server, tenant.admin.token, 'customers');
    expect(succeeded.status, succeeded.error).toBe('succeeded');
    const mapping = {
      organizationId: tenant.organization.id,
      kind: 'mapping-materialize',
      key: `${workspaceId}:customers`,
      workspaceId,
    };
    // A failure before that success (whose run dropped what it left), then one after it, whose worker
    // died loading: its staging table is still in the target schema. Then a run cancelled while queued.
    const failedBefore = await insertRun({ ...mapping, status: 'failed', ageDays: 80 });
    await age(succeeded.run_id, 70);
    const failedSince = await insertRun({ ...mapping, status: 'failed', ageDays: 60 });
    const cancelled = await insertRun({ ...mapping, status: 'cancelled', ageDays: 50 });
    const leftover = `customers__stg_${createHash('sha256').update(failedSince).digest('hex').slice(0, 8)}`;
    await warehouse.sql(`create table dw."${leftover}" (like dw.customers including all)`);

    await server.deps.jobs.deleteExpiredRuns();
    // The success stays too: the mapping names it as its last run.
    expect(await remaining([failedBefore, succeeded.run_id, failedSince, cancelled])).toEqual([
      succeeded.run_id,
      failedSince,
      cancelled,
    ]);
    const { run: next } = await materializeMapping(server, tenant.admin.token, 'customers');
    expect(next.status, next.error).toBe('succeeded');
    expect(next.result).toMatchObject({ removed_leftovers: [leftover] });
  }, 120_000);
});
