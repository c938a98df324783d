import type { EntityManager } from '@mikro-orm/postgresql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import type { CallerScope } from '../src/deps.ts';
import { putColumnMonitoring, putColumnTest } from '../src/modules/schemas/quality-configs.service.ts';
import { enqueueMonitoringRun, runDueMonitoring } from '../src/modules/monitoring/monitoring.jobs.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';

/*
 * Monitoring runs and alerts against a real PostgreSQL warehouse (a scratch database on
 * 127.0.0.1:5432, dropped at the end): a null-rate threshold crossed raises one alert however many
 * runs see it, a dismissal (with snooze) hides it, and fixing the data resolves it.
 */
const warehouse = scratchDatabase('alert');

const targetSchema = {
  name: 'crm',
  version: '1.0.0',
  tables: [
    {
      name: 'contacts',
      primary_key: ['id'],
      columns: [
        { name: 'id', type: 'integer', nullable: false },
        { name: 'email', type: 'text', pii: true },
        { name: 'updated_at', type: 'timestamptz' },
      ],
    },
  ],
};

let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let viewerToken: string;
let workspaceName: string;
let workspaceId: string;
let otherWorkspaceName: string;
let scope: CallerScope;

/** One monitoring run on demand, awaited; returns its summary. */
async function monitoringRun(reason: 'on_demand' | 'materialization' = 'on_demand') {
  const queued = await enqueueMonitoringRun(server.deps, {
    organizationId: tenant.organization.id,
    workspaceId,
    reason,
  });
  const run = await until(
    `run ${queued.run_id}`,
    () => server.deps.jobs.getRun(queued.run_id, tenant.organization.id),
    (r) => !!r && ['succeeded', 'failed', 'cancelled'].includes(r.status),
  );
  expect(run!.status, JSON.stringify(run)).toBe('succeeded');
  return run!.result as Record<string, any>;
}

const active = (query: Record<string, any> = {}, token = tenant.admin.token) =>
  call(server, 'GET', '/api/api/alerts/active', { token, query: { workspace: workspaceName, ...query } });
const dismiss = (id: string, body: unknown, token = tenant.admin.token) =>
  call(server, 'POST', `/api/api/alerts/${id}/dismiss`, { token, body });
const setNullEmails = (count: number) =>
  warehouse.sql(
    `update crm.contacts set email = case when id <= $1 then null else 'c' || id || '@x.com' end`,
    [count],
  );

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema crm;
     create table crm.contacts (id integer primary key, email text, updated_at timestamptz default now());
     insert into crm.contacts (id, email) select g, 'c' || g || '@x.com' from generate_series(1, 10) g;`);
  await setNullEmails(1);
  server = await startTestServer();
  tenant = await createTenant(server);
  other = await createTenant(server);
  viewerToken = (await tenant.addUser(['viewer'])).token;
  workspaceName = unique('alr');
  otherWorkspaceName = unique('alr');
  for (const [t, name] of [
    [tenant, workspaceName],
    [other, otherWorkspaceName],
  ] as const) {
    await createWorkspace(server, t.admin.token, {
      name,
      target_config: pgConfig(warehouse.name, { schemas: ['crm'] }),
      target_schema: targetSchema,
    });
  }
  const em = server.deps.orm.em.fork() as EntityManager;
  workspaceId = (
    await em.findOneOrFail(Workspace, { name: workspaceName, organization: tenant.organization.id })
  ).id;
  const principal = await server.deps.authenticator.authenticate({ em }, tenant.admin.token);
  scope = { em, deps: server.deps, principal: principal! };
  // The monitoring configuration under test (through the schemas area's service).
  await putColumnMonitoring(
    scope,
    { table_name: 'contacts', column_name: 'email', schema_type: 'target' },
    { null_rate: { max: 0.2 }, severity: 'warning' },
  );
  await putColumnTest(scope, 'contacts', 'id', { unique: true, not_null: true });
}, 120_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('monitoring runs and alerts', () => {
  let alertId: string;

  it('is scheduled for workspaces with checks, and a passing run raises nothing', async () => {
    const due = await runDueMonitoring(server.deps, { organizationId: tenant.organization.id });
    expect(due.monitoring).toContain(workspaceId);
    // The other organization's workspace has no checks: nothing to run there.
    const otherId = (
      await (server.deps.orm.em.fork() as EntityManager).findOneOrFail(Workspace, {
        name: otherWorkspaceName,
      })
    ).id;
    expect(due.monitoring).not.toContain(otherId);
    await until(
      'scheduled run',
      () => server.deps.jobs.listRuns(tenant.organization.id, { workspaceId, kind: 'monitoring-run' }),
      (runs) => runs.length > 0 && runs.every((r) => ['succeeded', 'failed'].includes(r.status)),
    );
    const summary = await monitoringRun();
    expect(summary.tables_measured).toBe(1);
    expect(summary.failed).toBe(0);
    // table_exists, null_rate, not_null, unique
    expect(summary.checks).toBe(4);
    const res = await active();
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.alerts).toEqual([]);
  });

  it('raises one alert when the null rate crosses its threshold, however many runs see it', async () => {
    await setNullEmails(5);
    const first = await monitoringRun();
    expect(first.alerts).toMatchObject({ raised: 1, updated: 0 });
    const second = await monitoringRun('materialization');
    expect(second.alerts).toMatchObject({ raised: 0, updated: 1 });
    const res = await active();
    expect(res.body.total).toBe(1);
    expect(res.body.counts).toEqual({ info: 0, warning: 1, error: 0, critical: 0 });
    const alert = res.body.alerts[0];
    expect(alert).toMatchObject({
      check_key: 'monitor:crm.contacts:email:null_rate',
      kind: 'monitor',
      check: 'null_rate',
      table_name: 'crm.contacts',
      column_name: 'email',
      severity: 'warning',
      status: 'active',
      measured: 0.5,
      threshold: 0.2,
      occurrences: 2,
      dismissal: null,
    });
    alertId = alert.id;
    expect((await active({ severity: 'warning' })).body.total).toBe(1);
    expect((await active({ severity: 'critical' })).body.total).toBe(0);
  });

  it('refuses bad input, other tenants and missing credentials', async () => {
    expect((await active({ severity: 'loud' })).status).toBe(400);
    expect((await call(server, 'GET', '/api/api/alerts/active', { token: tenant.admin.token })).status).toBe(
      400,
    );
    expect((await active({ workspace: otherWorkspaceName })).status).toBe(404);
    expect((await active({ workspace: 'no-such-workspace' })).status).toBe(404);
    expect((await active({}, other.admin.token)).status).toBe(404);
    expect(
      (await call(server, 'GET', '/api/api/alerts/active', { query: { workspace: workspaceName } })).status,
    ).toBe(401);
    expect((await active({}, viewerToken)).status).toBe(200);

    expect((await dismiss(alertId, {})).status).toBe(400);
    expect((await dismiss(alertId, { reason: '' })).status).toBe(400);
    expect((await dismiss(alertId, { reason: 'x', snooze_minutes: 0 })).status).toBe(400);
    expect((await dismiss(alertId, { reason: 'known' }, viewerToken)).status).toBe(403);
    expect((await dismiss(alertId, { reason: 'known' }, other.admin.token)).status).toBe(404);
    expect((await dismiss('not-a-uuid', { reason: 'known' })).status).toBe(404);
    expect((await dismiss('00000000-0000-4000-8000-000000000000', { reason: 'known' })).status).toBe(404);
    expect(
      (await call(server, 'POST', `/api/api/alerts/${alertId}/dismiss`, { body: { reason: 'x' } })).status,
    ).toBe(401);
    expect((await active()).body.total).toBe(1);
  });

  it('hides a dismissed alert for its snooze period and brings it back afterwards', async () => {
    const res = await dismiss(alertId, { reason: 'Backfill under way', snooze_minutes: 60 });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.status).toBe('dismissed');
    expect(res.body.dismissal).toMatchObject({
      dismissed_by: tenant.admin.username,
      reason: 'Backfill under way',
    });
    expect(Date.parse(res.body.dismissal.snoozed_until) - Date.now()).toBeGreaterThan(59 * 60_000);
    expect((await active()).body.total).toBe(0);

    const during = await monitoringRun();
    expect(during.alerts).toMatchObject({ raised: 0, still_dismissed: 1 });
    expect((await active()).body.total).toBe(0);

    // The snooze ends: the alert shows again at once, and the next failing run makes it active.
    await (server.deps.orm.em.fork() as EntityManager)
      .getConnection()
      .execute(`update alerts set snoozed_until = now() - interval '1 minute' where id = ?`, [alertId]);
    const shown = await active();
    expect(shown.body.alerts.map((a: any) => a.id)).toEqual([alertId]);
    const after = await monitoringRun();
    expect(after.alerts).toMatchObject({ raised: 0, reactivated: 1 });
    const back = await active();
    expect(back.body.alerts).toHaveLength(1);
    expect(back.body.alerts[0]).toMatchObject({ id: alertId, status: 'active', dismissal: null });
  });

  it('keeps a dismissed alert without snooze away until the failure changes', async () => {
    expect((await dismiss(alertId, { reason: 'Accepted for now' })).status).toBe(200);
    await monitoringRun();
    expect((await active()).body.total).toBe(0);
    // The threshold's severity changes: a different failure, so the alert comes back.
    await putColumnMonitoring(
      scope,
      { table_name: 'contacts', column_name: 'email', schema_type: 'target' },
      { null_rate: { max: 0.2, severity: 'error' } },
    );
    const run = await monitoringRun();
    expect(run.alerts).toMatchObject({ raised: 0, reactivated: 1 });
    const res = await active();
    expect(res.body.alerts).toHaveLength(1);
    expect(res.body.alerts[0]).toMatchObject({ id: alertId, severity: 'error', status: 'active' });
  });

  it('resolves the alert once the data is fixed', async () => {
    await setNullEmails(0);
    const run = await monitoringRun();
    expect(run.alerts).toMatchObject({ resolved: 1 });
    expect((await active()).body.total).toBe(0);
    expect((await dismiss(alertId, { reason: 'late' })).status).toBe(409);
    // A new failure after resolution is a new alert.
    await setNullEmails(4);
    const again = await monitoringRun();
    expect(again.alerts).toMatchObject({ raised: 1 });
    const res = await active();
    expect(res.body.alerts).toHaveLength(1);
    expect(res.body.alerts[0].id).not.toBe(alertId);
    expect(res.body.alerts[0].occurrences).toBe(1);
  });

  it('raises column test failures and missing tables as alerts', async () => {
    await warehouse.sql(
      `alter table crm.contacts drop constraint contacts_pkey; insert into crm.contacts (id, email) values (1, 'dup@x.com')`,
    );
    const run = await monitoringRun();
    expect(run.failures.map((f: any) => f.check_key)).toEqual(
      expect.arrayContaining(['test:crm.contacts:id:unique']),
    );
    await warehouse.sql(`alter table crm.contacts rename to contacts_old`);
    const missing = await monitoringRun();
    expect(missing.failures.map((f: any) => f.check_key)).toContain('monitor:crm.contacts::table_exists');
    const res = await active({ severity: 'error' });
    // The missing table is an alert of its own; the table's other alerts stay as they were.
    expect(res.body.alerts.map((a: any) => a.check_key).sort()).toEqual([
      'monitor:crm.contacts::table_exists',
      'monitor:crm.contacts:email:null_rate',
      'test:crm.contacts:id:unique',
    ]);
    await warehouse.sql(`alter table crm.contacts_old rename to contacts`);
  });

  it('runs the other tests of a table when one cannot run, and raises that one as an alert', async () => {
    // A bound the column's type cannot hold: the database refused the table's whole test statement,
    // and every test of the table went silent with no alert. PUT …/test and a schema.json upload
    // refuse such a test now; a schema.json stored before may still hold one.
    const saved = await call(server, 'GET', '/api/schemas/workspace', { token: tenant.admin.token });
    const doc = saved.body.schema;
    doc.tables[0].columns.find((c: { name: string }) => c.name === 'updated_at').tests = {
      range: { min: 0, max: 10 },
    };
    await (server.deps.orm.em.fork() as EntityManager)
      .getConnection()
      .execute(`update workspaces set target_schema = ?::jsonb where id = ?`, [
        JSON.stringify(doc),
        workspaceId,
      ]);
    await putColumnTest(scope, 'contacts', 'email', { accepted_values: ['nobody@x.com'] });
    const run = await monitoringRun();
    const failing = run.failures.map((f: any) => f.check_key);
    expect(failing).toEqual(
      expect.arrayContaining([
        'test:crm.contacts:id:unique',
        'test:crm.contacts:email:accepted_values',
        'test:crm.contacts:updated_at:runs',
      ]),
    );
    const alerts = (await active({ severity: 'error' })).body.alerts;
    expect(alerts.find((a: any) => a.check_key === 'test:crm.contacts:updated_at:runs')).toMatchObject({
      column_name: 'updated_at',
      message: expect.stringMatching(/cannot run/),
    });
  });
});
