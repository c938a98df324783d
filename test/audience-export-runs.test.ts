import { readdirSync, existsSync } from 'node:fs';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { randomUUID } from 'node:crypto';
import { dirname } from 'node:path';
import type { EntityManager } from '@mikro-orm/postgresql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.ts';
import { bindCall, createTenant, createWorkspace, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { EXPORT_KIND, exportFilePath } from '../src/modules/audiences/audience-export.job.ts';
import { AudienceExport } from '../src/modules/audiences/audiences.entity.ts';

/*
 * An export run writes its outcome (status, error, rows exported, file) on the export only while the
 * export names it as its last run. The export's singleton key keeps one run at a time, but it is free
 * again while an older run's handler is still on its way out (a CSV run past its point of no return, a
 * run cancelled while it ran): a newer run can start then, and what the older one writes last must
 * not replace the newer one's outcome.
 *
 * The newer run is a real run of the same export through the queue, enqueued under another singleton
 * key while the older one is held by the webhook receiver (two runs of a kind at once:
 * JOB_CONCURRENCY 2), which is how the two overlap in that window. A CSV run is held by a gate in
 * front of the warehouse, and the newer run is named on the export by a direct update, as the
 * scheduler names the run it enqueues.
 */
const warehouse = scratchDatabase('aud_runs');
const CUSTOMERS = 30;
const BATCH = 10;
const ENDED = ['succeeded', 'failed', 'cancelled'];

type Answer = 'ok' | 'refuse';

/**
 * A webhook receiver that answers each run's batches as `decide` said for that run (200 or 400), and
 * holds the batches of a run it was told nothing about until it is.
 */
async function receiver() {
  const answers = new Map<string, Answer>();
  const held: { runId: string; batch: number; answer: (a: Answer) => void }[] = [];
  const hook: Server = createServer((req, res: ServerResponse) => {
    let body = '';
    req.on('data', (chunk) => (body += chunk));
    req.on('end', () => {
      const { run_id: runId, batch_index: batch } = JSON.parse(body) as {
        run_id: string;
        batch_index: number;
      };
      const answer = (a: Answer) =>
        res.writeHead(a === 'ok' ? 200 : 400, { 'content-type': 'text/plain' }).end(a === 'ok' ? 'ok' : 'no');
      const decided = answers.get(runId);
      if (decided) answer(decided);
      else held.push({ runId, batch, answer });
    });
  });
  hook.listen(0, '127.0.0.1');
  await new Promise((resolve) => hook.once('listening', resolve));
  return {
    url: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/in`,
    /** The batches of `runId` it holds. */
    heldOf: (runId: string) => held.filter((h) => h.runId === runId).map((h) => h.batch),
    decide(runId: string, a: Answer) {
      answers.set(runId, a);
      for (const h of held.filter((x) => x.runId === runId)) {
        held.splice(held.indexOf(h), 1);
        h.answer(a);
      }
    },
    close() {
      for (const h of held.splice(0)) h.answer('refuse');
      hook.closeAllConnections();
      return new Promise((resolve) => hook.close(resolve));
    },
  };
}

let server: TestServer;
let tenant: Tenant;
let audienceId: string;
let hook: Awaited<ReturnType<typeof receiver>>;
let warehouseGate: TcpProxy;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/api/audiences',
);

const exportOf = async (id: string) =>
  (await api('GET', `/${audienceId}/exports`)).body.exports.find((e: any) => e.id === id);

/** The export's row in the control-plane database, as its runs wrote it. */
async function stored(id: string) {
  const row = await (server.deps.orm.em.fork() as EntityManager).findOneOrFail(AudienceExport, { id });
  return {
    last_run_id: row.lastRunId,
    last_run_status: row.lastRunStatus,
    last_error: row.lastError,
    rows_exported: row.rowsExported,
    file_path: row.filePath,
  };
}

/**
 * The run once its handler is over: the queue recorded the attempt's result (a successful run returns
 * one) or its error, after everything the handler wrote on its way out.
 */
const finished = (runId: string) =>
  until(
    `run ${runId}`,
    () => server.deps.jobs.getRun(runId, tenant.organization.id),
    (job) => !!job && ENDED.includes(job.status) && (job.status !== 'succeeded' || job.result !== null),
    90_000,
  ).then((job) => job!);

async function createExport(destination: Record<string, unknown>) {
  const created = await api('POST', '/exports', {
    body: {
      audience_id: audienceId,
      destination,
      field_mapping: [
        { source: 'customer_id', destination: 'id' },
        { source: 'email', destination: 'email' },
      ],
      run_now: false,
    },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  return created.body.export.id as string;
}

// A held batch waits for the test, not for the export's timeout.
const webhookExport = () =>
  createExport({ type: 'webhook', url: hook.url, batch_size: BATCH, max_retries: 0, timeout_ms: 120_000 });

/** Triggers a run of the export as a client does; its id. */
async function trigger(id: string) {
  const res = await api('PUT', `/exports/${id}`, { body: { run: true } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  expect(res.body.run.created).toBe(true);
  return res.body.run.run_id as string;
}

/** A run of the export that holds its batch 0 at the receiver: its id, once the batch is held. */
async function heldRun(id: string) {
  const runId = await trigger(id);
  await until(
    'the run holds its first batch',
    async () => hook.heldOf(runId),
    (b) => b.includes(0),
  );
  return runId;
}

/**
 * A newer run of the export, started while the older run's handler is still at work: the export's
 * own singleton key is held by that run, so it goes under another.
 */
async function newerRun(id: string) {
  const row = await (server.deps.orm.em.fork() as EntityManager).findOneOrFail(AudienceExport, { id });
  const { run } = await server.deps.jobs.enqueue(
    EXPORT_KIND,
    { export_id: id },
    { organizationId: tenant.organization.id, workspaceId: row.workspace.id, singletonKey: `${id}:newer` },
  );
  return run.id;
}

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema crm`);
  await warehouse.sql(`create table crm.customers (customer_id integer primary key, email text)`);
  await warehouse.sql(`insert into crm.customers
     select i, 'user' || i || '@example.com' from generate_series(1, ${CUSTOMERS}) i`);
  const direct = pgConfig(warehouse.name, { schemas: ['crm'] });
  warehouseGate = await startTcpProxy(new URL(`postgresql://${direct.host}:${direct.port}`));
  hook = await receiver();
  server = await startTestServer({ JOB_CONCURRENCY: '2' });
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    target_config: { ...direct, host: '127.0.0.1', port: Number(new URL(warehouseGate.url).port) },
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
  const created = await api('POST', '', {
    body: {
      name: 'everyone',
      target_table: 'customers',
      definition: { type: 'rules', rules: { all: [] } },
      attribute_columns: ['email'],
    },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  audienceId = created.body.id;
  expect((await api('POST', `/${audienceId}/materialize`)).status).toBe(200);
  const done = await until(
    'materialize',
    async () => (await api('GET', `/${audienceId}`)).body,
    (a) => ['succeeded', 'failed'].includes(a.materialization.status),
    90_000,
  );
  expect(done.materialization.status, done.materialization.error).toBe('succeeded');
}, 180_000);

afterAll(async () => {
  warehouseGate?.release();
  await hook?.close();
  await server?.close();
  await warehouseGate?.close();
  await warehouse.drop();
});

describe("an export run writes its outcome on the export only while it is the export's last run", () => {
  it("records the outcome of the export's last run, a success and then a failure", async () => {
    const id = await webhookExport();
    const first = await trigger(id);
    hook.decide(first, 'ok');
    expect((await finished(first)).status).toBe('succeeded');
    const succeeded = await exportOf(id);
    expect(succeeded.last_run).toMatchObject({ run_id: first, status: 'succeeded' });
    expect(succeeded.rows_exported).toBe(CUSTOMERS);
    expect(await stored(id)).toMatchObject({
      last_run_id: first,
      last_run_status: 'succeeded',
      last_error: null,
      rows_exported: CUSTOMERS,
    });

    const second = await trigger(id);
    hook.decide(second, 'refuse');
    expect((await finished(second)).status).toBe('failed');
    const failed = await exportOf(id);
    expect(failed.last_run).toMatchObject({ run_id: second, status: 'failed' });
    expect(failed.last_run.error).toContain('the webhook answered 400');
    // The receiver acknowledged nothing of this run: it still holds the first run's rows.
    expect(failed.rows_exported).toBe(CUSTOMERS);
    const row = await stored(id);
    expect(row).toMatchObject({ last_run_id: second, last_run_status: 'failed', rows_exported: CUSTOMERS });
    expect(row.last_error).toContain('the webhook answered 400');
  }, 120_000);

  it("a run that succeeds after a newer run failed leaves the newer run's failure on the export", async () => {
    const id = await webhookExport();
    const older = await heldRun(id);
    expect((await exportOf(id)).last_run).toMatchObject({ run_id: older, status: 'running' });

    const newer = await newerRun(id);
    hook.decide(newer, 'refuse');
    expect((await finished(newer)).status).toBe('failed');
    expect((await exportOf(id)).last_run).toMatchObject({ run_id: newer, status: 'failed' });

    hook.decide(older, 'ok');
    const job = await finished(older);
    // The older run's own record is its success; the export's is the newer run's failure.
    expect(job.status).toBe('succeeded');
    expect(job.progress).toMatchObject({ rows_exported: CUSTOMERS });
    const view = await exportOf(id);
    expect(view.last_run).toMatchObject({ run_id: newer, status: 'failed' });
    expect(view.last_run.error).toContain('the webhook answered 400');
    expect(view.rows_exported).toBeNull();
    const row = await stored(id);
    expect(row).toMatchObject({ last_run_id: newer, last_run_status: 'failed', rows_exported: null });
    expect(row.last_error).toContain('the webhook answered 400');
  }, 120_000);

  it("a run that fails after a newer run succeeded leaves the newer run's success on the export", async () => {
    const id = await webhookExport();
    const older = await heldRun(id);

    const newer = await newerRun(id);
    hook.decide(newer, 'ok');
    expect((await finished(newer)).status).toBe('succeeded');
    expect((await exportOf(id)).rows_exported).toBe(CUSTOMERS);

    hook.decide(older, 'refuse');
    const job = await finished(older);
    expect(job.status).toBe('failed');
    expect(job.error).toContain('the webhook answered 400');
    const view = await exportOf(id);
    expect(view.last_run).toMatchObject({ run_id: newer, status: 'succeeded', error: null });
    expect(view.rows_exported).toBe(CUSTOMERS);
    expect(await stored(id)).toMatchObject({
      last_run_id: newer,
      last_run_status: 'succeeded',
      last_error: null,
      rows_exported: CUSTOMERS,
    });
  }, 120_000);

  it('a CSV run that completes after the export names a newer run records nothing and moves no file into place', async () => {
    const id = await createExport({ type: 'csv' });
    const dir = dirname(exportFilePath(server.deps, tenant.organization.id, id));
    const filesOf = () => (existsSync(dir) ? readdirSync(dir).filter((f) => f.startsWith(id)) : []);
    warehouseGate.hold();
    let older: string;
    const newer = randomUUID();
    try {
      older = await trigger(id);
      await until(
        'the run starts',
        () => exportOf(id),
        (e) => e.last_run?.run_id === older && e.last_run.status === 'running',
      );
      const em = server.deps.orm.em.fork() as EntityManager;
      await em.nativeUpdate(AudienceExport, { id }, { lastRunId: newer });
    } finally {
      warehouseGate.release();
    }
    const job = await finished(older);
    expect(job.status).toBe('succeeded');
    expect(job.progress).toMatchObject({ rows_exported: CUSTOMERS });
    const view = await exportOf(id);
    expect(view.rows_exported).toBeNull();
    expect(view.file).toBeNull();
    const download = await fetch(`${server.url}/api/api/audiences/exports/${id}/download`, {
      headers: { authorization: `Bearer ${tenant.admin.token}` },
    });
    expect(download.status).toBe(404);
    // Neither the file nor the run's partial file is left.
    expect(filesOf()).toEqual([]);
    // As the start of the run left it: the newer run, once it starts, writes its own.
    expect(await stored(id)).toMatchObject({
      last_run_id: newer,
      last_run_status: 'running',
      last_error: null,
      rows_exported: null,
      file_path: null,
    });

    // The export's last run records its file as before.
    const next = await trigger(id);
    expect((await finished(next)).status).toBe('succeeded');
    const done = await exportOf(id);
    expect(done.last_run).toMatchObject({ run_id: next, status: 'succeeded' });
    expect(done.rows_exported).toBe(CUSTOMERS);
    expect(done.file).not.toBeNull();
    expect(filesOf()).toEqual([`${id}.csv`]);
  }, 120_000);

  it('pausing an export cancels its queued manual run, which never runs', async () => {
    const id = await webhookExport();
    const previous = await trigger(id);
    hook.decide(previous, 'ok');
    expect((await finished(previous)).status).toBe('succeeded');

    // Both workers busy: the next run of the export waits in the queue while the export is paused.
    const busy = [await heldRun(await webhookExport()), await heldRun(await webhookExport())];
    const queued = await trigger(id);
    // The export names the run it queued at once, as the schedule's runs are named.
    expect((await exportOf(id)).last_run).toMatchObject({ run_id: queued, status: 'queued' });
    const paused = await api('PUT', `/exports/${id}`, { body: { status: 'paused' } });
    expect(paused.status, JSON.stringify(paused.body)).toBe(200);
    expect(paused.body.export.last_run).toMatchObject({ run_id: queued, status: 'cancelled' });
    for (const runId of busy) hook.decide(runId, 'ok');
    for (const runId of busy) await finished(runId);
    const job = await finished(queued);
    expect(job).toMatchObject({ status: 'cancelled', started_at: null, result: null });
    expect(hook.heldOf(queued)).toEqual([]);

    const view = await exportOf(id);
    expect(view.status).toBe('paused');
    expect(view.last_run).toMatchObject({ run_id: queued, status: 'cancelled' });
    // What the destination holds is still the previous run's rows.
    expect(view.rows_exported).toBe(CUSTOMERS);
    expect(await stored(id)).toMatchObject({
      last_run_id: queued,
      last_run_status: 'cancelled',
      rows_exported: CUSTOMERS,
    });
  }, 120_000);
});
