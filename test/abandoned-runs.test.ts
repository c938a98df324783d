import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { AudienceExport } from '../src/modules/audiences/audiences.entity.ts';
import { MATERIALIZE_KIND } from '../src/modules/audiences/audience-materialize.job.ts';
import { EXPORT_KIND } from '../src/modules/audiences/audience-export.job.ts';
import { HYPOTHESIS_TEST_KIND } from '../src/modules/analytics/analytics.jobs.ts';

/*
 * A run whose worker died (killed, or cut off for longer than JOB_HEARTBEAT_TIMEOUT_SECONDS) is ended
 * failed by the queue's sweep on its last attempt, or when pg-boss will not hand it out again. Its
 * handler never wrote the outcome, so what mirrors the run (an audience's materialization status, an
 * export's last run status, a hypothesis' status) records the failure instead of showing the run as
 * running forever. The
 * dead worker is a run row left running with an old heartbeat; the server sweeps every second.
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
 * A run of `kind` left running by a worker that stopped beating an hour ago, and the row that shows
 * it running (`shownBy`: its table, status column and id), as its handler left them; the run's id.
 */
async function runWithDeadWorker(
  kind: string,
  payload: Record<string, unknown>,
  attempt: number,
  shownBy: { table: string; status: string; id: string },
) {
  const em = server.deps.orm.em.fork();
  const rows = await em.execute<{ id: string }[]>(
    `insert into job_runs (id, organization_id, kind, status, payload, progress, retry_count, started_at,
       created_at, updated_at)
     values (gen_random_uuid(), ?, ?, 'running', ?, '{}', ?, now() - interval '1 hour',
       now() - interval '1 hour', now() - interval '1 hour')
     returning id`,
    [tenant.organization.id, kind, JSON.stringify(payload), attempt],
  );
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
