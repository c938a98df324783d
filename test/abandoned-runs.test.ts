import { randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { dirname } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { AudienceExport } from '../src/modules/audiences/audiences.entity.ts';
import { MATERIALIZE_KIND } from '../src/modules/audiences/audience-materialize.job.ts';
import { MATERIALIZE_MAPPING_KIND } from '../src/modules/mappings/mappings.service.ts';
import { EXPORT_KIND, exportFilePath } from '../src/modules/audiences/audience-export.job.ts';
import { HYPOTHESIS_TEST_KIND } from '../src/modules/analytics/analytics.jobs.ts';

/*
 * A run whose worker died (killed, or cut off for longer than JOB_HEARTBEAT_TIMEOUT_SECONDS) is ended
 * failed by the queue's sweep on its last attempt, or when pg-boss will not hand it out again. Its
 * handler never wrote the outcome, so what mirrors the run (an audience's materialization status, an
 * export's last run status, a hypothesis' status) records the failure instead of showing the run as
 * running forever, and the run's progress says what its destination holds from it, as its handler
 * would have recorded had it failed. The dead worker is a run row left running with an old
 * heartbeat; the server sweeps every second.
 */
const warehouse = scratchDatabase('abandoned');
let server: TestServer;
let tenant: Tenant;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/api/audiences',
);
const analytics = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/analytics',
);

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema crm;
    create table crm.customers (customer_id integer primary key, email text, plan text);
    insert into crm.customers
      select i, 'c' || i || '@example.com', case when i % 2 = 0 then 'basic' else 'pro' end
        from generate_series(1, 20) i;`);
  server = await startTestServer({ JOB_HEARTBEAT_TIMEOUT_SECONDS: '2' });
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: unique('abandoned'),
    target_config: pgConfig(warehouse.name, { schemas: ['crm'] }),
    target_schema: {
      name: 'crm',
      tables: [
        {
          name: 'customers',
          primary_key: ['customer_id'],
          columns: [
            { name: 'customer_id', type: 'integer', nullable: false },
            { name: 'email', type: 'text' },
            { name: 'plan', type: 'text' },
          ],
        },
      ],
    },
  });
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

/**
 * A run of `kind` left running by a worker whose last beat is an hour old, and the row that shows
 * it running (`shownBy`: its table, status column and id), as its handler left them; the run's id.
 * `run` gives its id, the progress its worker last recorded and its singleton key.
 */
async function runWithDeadWorker(
  kind: string,
  payload: Record<string, unknown>,
  attempt: number,
  shownBy: { table: string; status: string; id: string } | null,
  run: { id?: string; progress?: Record<string, unknown>; singletonKey?: string } = {},
) {
  const em = server.deps.orm.em.fork();
  const rows = await em.execute<{ id: string }[]>(
    `insert into job_runs (id, organization_id, kind, status, singleton_key, payload, progress, retry_count,
       started_at, created_at, updated_at)
     values (?, ?, ?, 'running', ?, ?, ?, ?, now(), now(), now() - interval '1 hour')
     returning id`,
    [
      run.id ?? randomUUID(),
      tenant.organization.id,
      kind,
      run.singletonKey ?? null,
      JSON.stringify(payload),
      JSON.stringify(run.progress ?? {}),
      attempt,
    ],
  );
  if (shownBy)
    await em.execute(
      `update ${shownBy.table} set ${shownBy.status} = 'running', last_run_id = ? where id = ?`,
      [rows[0].id, shownBy.id],
    );
  return rows[0].id;
}

const runOf = (id: string) => server.deps.jobs.getRun(id, tenant.organization.id);

/** A new audience of every customer; its id. */
async function newAudience(name: string) {
  const created = await api('POST', '', {
    body: { name, target_table: 'customers', definition: { type: 'rules', rules: { all: [] } } },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  return created.body.id as string;
}

/** Materializes the audience through the API; the audience once its run succeeded. */
async function materialized(audienceId: string) {
  const run = await api('POST', `/${audienceId}/materialize`);
  expect(run.status, JSON.stringify(run.body)).toBe(200);
  return until(
    `materialization ${run.body.run_id}`,
    async () => (await api('GET', `/${audienceId}`)).body,
    (a) => a.materialization.run_id === run.body.run_id && a.materialization.status === 'succeeded',
  );
}

const exportOf = async (audienceId: string, exportId: string) =>
  (await api('GET', `/${audienceId}/exports`)).body.exports.find((e: any) => e.id === exportId);

/** A new export of the audience, not run yet; its id. */
async function newExport(audienceId: string, destination: Record<string, unknown>) {
  const created = await api('POST', '/exports', {
    body: { audience_id: audienceId, destination, run_now: false },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  return created.body.export.id as string;
}

/** Runs the export through the API; the export (as listed) once the run ended. */
async function exportRan(audienceId: string, exportId: string) {
  const started = await api('PUT', `/exports/${exportId}`, { body: { run: true } });
  expect(started.status, JSON.stringify(started.body)).toBe(200);
  const runId = started.body.run.run_id;
  return until(
    `export run ${runId}`,
    () => exportOf(audienceId, exportId),
    (e) => e?.last_run?.run_id === runId && ['succeeded', 'failed', 'cancelled'].includes(e.last_run.status),
  );
}

/**
 * A run of the export whose worker died on its last attempt (exports retry twice), having recorded
 * `progress`; the export (as listed) once the queue ended the run.
 */
async function deadExportRun(
  audienceId: string,
  exportId: string,
  progress: Record<string, unknown>,
  id = randomUUID(),
) {
  const runId = await runWithDeadWorker(
    EXPORT_KIND,
    { export_id: exportId },
    2,
    { table: 'audience_exports', status: 'last_run_status', id: exportId },
    { id, progress, singletonKey: exportId },
  );
  return until(
    'the queue to end the run',
    () => exportOf(audienceId, exportId),
    (e) => e.last_run?.run_id === runId && e.last_run.status !== 'running',
  );
}

async function download(exportId: string) {
  const res = await fetch(`${server.url}/api/api/audiences/exports/${exportId}/download`, {
    headers: { authorization: `Bearer ${tenant.admin.token}` },
  });
  return { status: res.status, lines: (await res.text()).split('\n').filter(Boolean).length };
}

describe('a run whose worker died', () => {
  it("fails the audience's materialization instead of leaving it running", async () => {
    const audienceId = await newAudience('dead worker');
    // Its last attempt (materializations retry once) was running when its worker died.
    const runId = await runWithDeadWorker(MATERIALIZE_KIND, { audience_id: audienceId }, 1, {
      table: 'audiences',
      status: 'materialization_status',
      id: audienceId,
    });
    const audience = await until(
      'the materialization to end',
      async () => (await api('GET', `/${audienceId}`)).body,
      (a) => a.materialization.status !== 'running',
    );
    expect(audience.materialization).toMatchObject({ status: 'failed', run_id: runId });
    expect(audience.materialization.error).toMatch(/stopped responding/);
    expect(await runOf(runId)).toMatchObject({ status: 'failed' });
    // A new materialization runs as usual.
    expect((await materialized(audienceId)).materialization.row_count).toBe(20);
  });

  it("says a mapping's materialization wrote no row, unless it had reached the swap", async () => {
    const payload = { workspace_id: randomUUID(), commit_id: randomUUID() };
    const progress = { mode: 'streamed_copy', rows_written: 4000 };
    // Their last attempts (materializations of a mapping retry once).
    const copying = await runWithDeadWorker(MATERIALIZE_MAPPING_KIND, payload, 1, null, {
      progress: { ...progress, phase: 'copying' },
    });
    const swapping = await runWithDeadWorker(MATERIALIZE_MAPPING_KIND, payload, 1, null, {
      progress: { ...progress, phase: 'swapping' },
    });
    const ended = (id: string) =>
      until(
        'the queue to end the run',
        () => runOf(id),
        (r) => r?.status === 'failed',
      );
    // Its loaded rows rolled back with their transaction; the target holds none of them (its empty
    // staging table stays until the table's next materialization: materialize-leftovers.test.ts).
    expect(await ended(copying)).toMatchObject({
      progress: { mode: 'streamed_copy', phase: 'rolled_back', rows_written: 0 },
      error: expect.stringMatching(/stopped responding/),
    });
    // The swap may have committed: what the target holds from it is not known, so its count stays.
    expect((await ended(swapping))?.progress).toEqual({ ...progress, phase: 'swapping' });
  });

  it("fails the export's last run when pg-boss will not hand the run out again", async () => {
    const audienceId = await newAudience('dead export');
    await materialized(audienceId);
    const exp = await api('POST', '/exports', {
      body: { audience_id: audienceId, destination: { type: 'csv' }, run_now: false },
    });
    expect(exp.status, JSON.stringify(exp.body)).toBe(200);
    const exportId = exp.body.export.id;
    // A first attempt, but no pg-boss job behind it: nothing would ever retry it.
    const runId = await runWithDeadWorker(EXPORT_KIND, { export_id: exportId }, 0, {
      table: 'audience_exports',
      status: 'last_run_status',
      id: exportId,
    });
    const recorded = await until(
      'the export to record the failure',
      () =>
        server.deps.orm.em
          .fork()
          .findOne(AudienceExport, { id: exportId }, { fields: ['lastRunStatus', 'lastError'] }),
      (e) => e?.lastRunStatus !== 'running',
    );
    expect(recorded).toMatchObject({
      lastRunStatus: 'failed',
      lastError: expect.stringMatching(/stopped responding/),
    });
    expect(await runOf(runId)).toMatchObject({ status: 'failed' });
    const listed = await api('GET', `/${audienceId}/exports`);
    expect(listed.body.exports.find((e: any) => e.id === exportId).last_run).toMatchObject({
      run_id: runId,
      status: 'failed',
    });
  });

  it('says a CSV or PostgreSQL export run left none of the rows it had counted; the export keeps its figure and file', async () => {
    const audienceId = await newAudience('dead csv and table');
    await materialized(audienceId);
    const csv = await newExport(audienceId, { type: 'csv' });
    const table = await newExport(audienceId, {
      ...pgConfig(warehouse.name),
      schema: 'out',
      table: 'members',
      mode: 'append',
    });
    for (const exportId of [csv, table]) {
      const good = await exportRan(audienceId, exportId);
      expect(good.last_run.status, good.last_run.error).toBe('succeeded');
      expect(good.rows_exported).toBe(20);
      // Its worker had written and reported 12 of the 20 rows when it died.
      const runId = randomUUID();
      const partial = `${exportFilePath(server.deps, tenant.organization.id, exportId)}.${runId}.part`;
      if (exportId === csv) {
        mkdirSync(dirname(partial), { recursive: true });
        writeFileSync(partial, 'id\n1\n2\n');
      }
      const dead = await deadExportRun(
        audienceId,
        exportId,
        { ...good.last_run.progress, rows_exported: 12, percent: 60 },
        runId,
      );
      expect(dead.last_run).toMatchObject({
        run_id: runId,
        status: 'failed',
        error: expect.stringMatching(/stopped responding/),
        // A partial file never moved into place; a transaction that died with its connection.
        progress: { ...good.last_run.progress, rows_exported: 0, percent: 0 },
      });
      expect(dead.rows_exported).toBe(20);
      expect(existsSync(partial)).toBe(false);
    }
    expect(await download(csv)).toEqual({ status: 200, lines: 21 });
    expect((await exportOf(audienceId, csv)).file).toMatchObject({ size: expect.any(Number) });
    expect((await runOf((await exportOf(audienceId, table)).last_run.run_id))?.progress).toMatchObject({
      rows_exported: 0,
    });
  });

  it('says a webhook run left the batches its receiver acknowledged: the export shows them, the next run sends the rest', async () => {
    const received: number[] = [];
    const hook: Server = createServer((req, res) => {
      let body = '';
      req.on('data', (chunk) => (body += chunk));
      req.on('end', () => {
        received.push(JSON.parse(body).batch_index);
        res.writeHead(200).end('ok');
      });
    });
    await new Promise<void>((resolve) => hook.listen(0, '127.0.0.1', resolve));
    try {
      const audienceId = await newAudience('dead webhook');
      await materialized(audienceId);
      const exportId = await newExport(audienceId, {
        type: 'webhook',
        url: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/in`,
        batch_size: 2,
        max_retries: 0,
      });
      const good = await exportRan(audienceId, exportId);
      expect(good.last_run.status, good.last_run.error).toBe('succeeded');
      expect(good.last_run.progress).toMatchObject({ rows_exported: 20, batches_sent: 10 });

      // A rerun of the same delivery whose worker died once the receiver had acknowledged 3 batches.
      const acknowledged = {
        ...good.last_run.progress,
        rows_exported: 6,
        batches_sent: 3,
        percent: 30,
        resumed_from_batch: 0,
        restarted_because: null,
      };
      const dead = await deadExportRun(audienceId, exportId, acknowledged);
      expect(dead.last_run).toMatchObject({ status: 'failed', progress: acknowledged });
      expect(dead.rows_exported).toBe(6);

      received.length = 0;
      const rest = await exportRan(audienceId, exportId);
      expect(rest.last_run.status, rest.last_run.error).toBe('succeeded');
      expect(rest.last_run.progress).toMatchObject({
        rows_exported: 20,
        batches_sent: 10,
        resumed_from_batch: 3,
        resumed_from_run_id: dead.last_run.run_id,
      });
      expect(received).toEqual([3, 4, 5, 6, 7, 8, 9]);
      expect(rest.rows_exported).toBe(20);
    } finally {
      await new Promise((resolve) => hook.close(resolve));
    }
  });

  it("fails the hypothesis' test, which then neither shows as running nor blocks an insight as running", async () => {
    const created = await analytics('POST', '/hypotheses', {
      body: {
        statement: 'Pro customers have higher ids',
        table: 'customers',
        metric: { expression: 'customer_id' },
        segment: { column: 'plan', groups: ['pro', 'basic'] },
        test: 'welch_t',
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const hypothesisId = created.body.id;
    // Tests are not retried: the first attempt is the last.
    const runId = await runWithDeadWorker(HYPOTHESIS_TEST_KIND, { hypothesis_id: hypothesisId }, 0, {
      table: 'hypotheses',
      status: 'status',
      id: hypothesisId,
    });
    const hypothesis = await until(
      'the test to record the failure',
      async () => (await analytics('GET', `/hypotheses/${hypothesisId}`)).body,
      (h) => h.status !== 'running',
    );
    expect(hypothesis).toMatchObject({ status: 'failed', last_run_id: runId });
    expect(hypothesis.error).toMatch(/stopped responding/);
    const insight = await analytics('POST', '/insights', { body: { hypothesis_id: hypothesisId } });
    expect(insight.status).toBe(409);
    expect(insight.body.message).toMatch(/failed; an insight needs a successful test/);
    // A new test runs as usual.
    const started = await analytics('POST', '/hypotheses/test', { body: { hypothesis_id: hypothesisId } });
    expect(started.status, JSON.stringify(started.body)).toBe(200);
    const tested = await until(
      'the new test',
      async () => (await analytics('GET', `/status/${hypothesisId}`)).body,
      (s) => s.status === 'tested' || s.status === 'failed',
    );
    expect(tested).toMatchObject({ status: 'tested', error: null });
    expect(tested.run.id).not.toBe(runId);
  });
});
