import type { EntityManager } from '@mikro-orm/postgresql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, call, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';
import { TableMapping } from '../src/modules/mappings/mappings.entity.ts';
import { MetricSnapshot } from '../src/modules/monitoring/monitoring.entity.ts';
import {
  applyDefaultMonitors,
  proposeDefaultMonitors,
} from '../src/modules/monitoring/default-monitors.service.ts';
import { systemScope } from '../src/modules/monitoring/monitoring-run.service.ts';
import { SchemaConfig } from '../src/modules/schemas/schemas.entity.ts';

/*
 * Monitoring routes over HTTP against a real PostgreSQL warehouse: a scratch database on
 * 127.0.0.1:5432 (never the control-plane database), created here and dropped at the end.
 */
const warehouse = scratchDatabase('mon');

const connection = (schema: string) => pgConfig(warehouse.name, { schemas: [schema] });

const targetSchema = {
  name: 'shop',
  version: '1.0.0',
  tables: [
    {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false },
        { name: 'email', type: 'text', pii: true },
        { name: 'phone', type: 'text', pii: true },
        { name: 'score', type: 'numeric' },
        { name: 'signup', type: 'date' },
        { name: 'updated_at', type: 'timestamptz' },
      ],
    },
    {
      name: 'events',
      primary_key: ['event_id'],
      columns: [
        { name: 'event_id', type: 'integer', nullable: false },
        { name: 'customer_id', type: 'integer' },
        { name: 'email', type: 'text', pii: true },
        { name: 'device_id', type: 'text' },
        { name: 'occurred_at', type: 'timestamptz' },
      ],
    },
    {
      name: 'prospects',
      primary_key: ['prospect_no'],
      columns: [
        { name: 'prospect_no', type: 'integer', nullable: false },
        { name: 'email', type: 'text', pii: true },
        { name: 'phone', type: 'text', pii: true },
      ],
    },
    {
      name: 'orders',
      primary_key: ['order_id'],
      columns: [{ name: 'order_id', type: 'integer', nullable: false }],
    },
  ],
};

let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let viewerToken: string;
let workspaceName: string;
let otherWorkspaceName: string;

const em = () => server.deps.orm.em.fork() as EntityManager;

const finished = (runId: string, organizationId: string) =>
  until(
    `run ${runId}`,
    () => server.deps.jobs.getRun(runId, organizationId),
    (r) => !!r && ['succeeded', 'failed', 'cancelled'].includes(r.status),
  );

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema shop;
     create table shop.customers (customer_id integer primary key, email text, phone text, score numeric(6,2),
       signup date, updated_at timestamptz);
     insert into shop.customers values
       (1, ' Ann@X.com ', '+1 (555) 000-1111', 10.50, '2024-01-01', '2024-05-01T10:00:00Z'),
       (2, 'bob@y.com', null, 20.00, '2024-02-01', '2024-05-02T10:00:00Z'),
       (3, 'carl@z.com', '555-000-3333', null, null, '2024-05-03T10:00:00Z'),
       (4, null, null, 5.25, '2023-12-31', null);
     create table shop.events (event_id integer primary key, customer_id integer, email text, device_id text,
       occurred_at timestamptz);
     insert into shop.events values
       (100, null, 'ann@x.com', 'd1', '2024-05-01T11:00:00Z'),
       (101, null, 'dave@w.com', 'd2', '2024-05-01T12:00:00Z'),
       (102, 2, null, 'd3', '2024-05-01T13:00:00Z'),
       (103, null, 'DAVE@w.com', 'd4', '2024-05-01T14:00:00Z');
     create table shop.prospects (prospect_no integer primary key, email text, phone text);
     insert into shop.prospects values (1, 'bob@y.com', '555-000-3333'), (2, 'erin@v.com', null);`);
  server = await startTestServer();
  tenant = await createTenant(server);
  other = await createTenant(server);
  viewerToken = (await tenant.addUser(['viewer'])).token;
  workspaceName = unique('mon');
  otherWorkspaceName = unique('mon');
  await createWorkspace(server, tenant.admin.token, {
    name: workspaceName,
    target_config: connection('shop'),
    source_config: connection('shop'),
    target_schema: targetSchema,
  });
  await createWorkspace(server, other.admin.token, {
    name: otherWorkspaceName,
    target_config: connection('elsewhere'),
    target_schema: targetSchema,
  });
  const select = await call(server, 'POST', '/api/workspaces/select', {
    token: viewerToken,
    body: { workspace_name: workspaceName },
  });
  expect(select.status, JSON.stringify(select.body)).toBe(200);
  // Reverse-ETL connections of the workspace: a database one (measurable) and a webhook (not).
  const m = em();
  const workspace = await m.findOneOrFail(Workspace, {
    name: workspaceName,
    organization: tenant.organization.id,
  });
  workspace.settings = {
    ...workspace.settings,
    reverse_etl_connections: [
      {
        name: 'copy_db',
        ...pgConfig(warehouse.name),
        schema: 'shop',
        ssl: false,
      },
      { name: 'hook', type: 'webhook', url: 'https://example.com/hook', method: 'POST', batch_size: 10 },
    ],
  };
  // customers and events are mapped; prospects is not (the identity graph must leave it out).
  for (const tableName of ['customers', 'events'])
    m.create(TableMapping, {
      organization: tenant.organization.id,
      workspace: workspace.id,
      tableName,
      tables: {},
      connections: [],
      transformations: {},
      ambiguities: [],
    });
  await m.flush();
}, 120_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/monitoring',
);

describe('metrics', () => {
  it('measures the target tables of schema.json with hand-computed values and stores them for trends', async () => {
    const res = await api('GET', '/metrics/workspace');
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const body = res.body;
    expect(body.workspace_name).toBe(workspaceName);
    expect(body.data_source).toBe('target');
    expect(body.database).toBe(warehouse.name);
    expect(body.tables.map((t: any) => t.table)).toEqual(['shop.customers', 'shop.events', 'shop.prospects']);
    expect(body.missing_tables).toEqual(['orders']);
    expect(body.errors).toEqual([]);
    const customers = body.tables[0];
    expect(customers.row_count).toBe(4);
    expect(customers.previous).toBeNull();
    const col = (name: string) => customers.columns.find((c: any) => c.name === name);
    expect(col('customer_id')).toMatchObject({
      null_count: 0,
      null_rate: 0,
      distinct_count: 4,
      distinct_exact: true,
      min: 1,
      max: 4,
    });
    expect(col('email')).toMatchObject({
      null_count: 1,
      null_rate: 0.25,
      distinct_count: 3,
      distinct_exact: true,
    });
    expect(col('phone')).toMatchObject({ null_count: 2, null_rate: 0.5, distinct_count: 2 });
    expect(col('score')).toMatchObject({
      null_count: 1,
      null_rate: 0.25,
      distinct_count: 3,
      min: 5.25,
      max: 20,
    });
    expect(col('signup')).toMatchObject({
      null_count: 1,
      distinct_count: 3,
      min: '2023-12-31',
      max: '2024-02-01',
    });
    expect(customers.freshness.column).toBe('updated_at');
    expect(Date.parse(customers.freshness.max_timestamp)).toBe(Date.parse('2024-05-03T10:00:00Z'));
    expect(customers.freshness.age_seconds).toBeGreaterThan(0);
    const events = body.tables[1];
    expect(events.row_count).toBe(4);
    expect(events.columns.find((c: any) => c.name === 'customer_id')).toMatchObject({
      null_count: 3,
      null_rate: 0.75,
      distinct_count: 1,
    });
    expect(events.freshness.column).toBe('occurred_at');

    const again = await api('GET', '/metrics/workspace', { query: { first_table_only: 'true' } });
    expect(again.status).toBe(200);
    expect(again.body.tables.map((t: any) => t.table)).toEqual(['shop.customers']);
    expect(again.body.tables[0].previous.row_count).toBe(4);
    const snapshots = await em().find(MetricSnapshot, {
      organization: tenant.organization.id,
      tableName: 'shop.customers',
      dataSource: 'target',
    });
    expect(snapshots.length).toBe(2);
    expect(snapshots[0].metrics).toMatchObject({ row_count: 4 });
  });

  it('measures a named data source: source, target or a reverse-ETL connection', async () => {
    for (const name of ['source', 'target', 'copy_db']) {
      const res = await api('GET', `/metrics/datasource/${name}`);
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      expect(res.body.data_source).toBe(name === 'copy_db' ? 'connection:copy_db' : name);
      expect(res.body.tables.map((t: any) => t.table)).toEqual([
        'shop.customers',
        'shop.events',
        'shop.prospects',
      ]);
      expect(res.body.tables[2].row_count).toBe(2);
    }
    expect((await api('GET', '/metrics/datasource/hook')).status).toBe(400);
    expect((await api('GET', '/metrics/datasource/nothing_here')).status).toBe(404);
    expect((await api('GET', `/metrics/datasource/${'x'.repeat(64)}`)).status).toBe(400);
    expect((await api('GET', '/metrics/workspace', { query: { first_table_only: 'perhaps' } })).status).toBe(
      400,
    );
  });

  it('keeps tenants apart and checks credentials', async () => {
    expect((await call(server, 'GET', '/api/monitoring/metrics/workspace')).status).toBe(401);
    expect((await call(server, 'GET', '/api/monitoring/metrics/datasource/source')).status).toBe(401);
    // A viewer may read.
    expect((await api('GET', '/metrics/workspace', { token: viewerToken })).status).toBe(200);
    // The other organization sees its own (empty) target, never this workspace's tables or connections.
    const theirs = await api('GET', '/metrics/workspace', { token: other.admin.token });
    expect(theirs.status).toBe(200);
    expect(theirs.body.tables).toEqual([]);
    expect(theirs.body.missing_tables).toEqual(['customers', 'events', 'prospects', 'orders']);
    expect((await api('GET', '/metrics/datasource/copy_db', { token: other.admin.token })).status).toBe(404);
    expect((await api('GET', '/metrics/datasource/source', { token: other.admin.token })).status).toBe(409);
  });
});

describe('identity graph', () => {
  it('answers never built, then builds the expected clusters from the mapped tables', async () => {
    const before = await api('GET', '/identity-graph/workspace');
    expect(before.status, JSON.stringify(before.body)).toBe(200);
    expect(before.body).toMatchObject({
      built: false,
      schema_created: false,
      schema: 'shop_identity',
      clusters: 0,
    });
    expect(before.body.message).toMatch(/Never built/);

    expect((await api('POST', '/identity-graph/create-schema', { token: viewerToken })).status).toBe(403);
    const created = await api('POST', '/identity-graph/create-schema');
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    expect(created.body).toMatchObject({ created: true, schema: 'shop_identity', database: warehouse.name });
    expect(created.body.build.run_id).toBeTruthy();
    await finished(created.body.build.run_id, tenant.organization.id);

    const again = await api('POST', '/identity-graph/create-schema');
    expect(again.status).toBe(200);
    expect(again.body.created).toBe(false);
    await finished(again.body.build.run_id, tenant.organization.id);

    const stats = await api('GET', '/identity-graph/workspace');
    expect(stats.status, JSON.stringify(stats.body)).toBe(200);
    const s = stats.body;
    expect(s.built).toBe(true);
    expect(s.last_build.status).toBe('succeeded');
    // prospects is not mapped, but it is a source table with e-mail and phone columns: proposed as an
    // identity source, it adds erin and links bob (its row 1) to carl's phone.
    expect(s.identifiers_by_type).toEqual({ customer_id: 4, email: 5, phone: 2, device_id: 4 });
    expect(s.identifiers).toBe(15);
    expect(s.clusters).toBe(5);
    expect(s.singletons).toBe(2);
    expect(s.largest_cluster.size).toBe(6);
    expect(s.cluster_size_distribution).toMatchObject({ '1': 2, '3-5': 2, '6-10': 1 });
    expect(s.recent_runs.length).toBe(2);
    const clusters = s.largest_clusters.map((c: any) => c.identifiers);
    expect(clusters[0]).toEqual({
      customer_id: ['2', '3'],
      device_id: ['d3'],
      email: ['bob@y.com', 'carl@z.com'],
      phone: ['5550003333'],
    });
    expect(clusters).toContainEqual({
      customer_id: ['1'],
      device_id: ['d1'],
      email: ['ann@x.com'],
      phone: ['15550001111'],
    });
    expect(clusters).toContainEqual({ device_id: ['d2', 'd4'], email: ['dave@w.com'] });
    expect(s.last_build.result.sources.map((x: any) => x.table)).toEqual([
      'shop.customers',
      'shop.events',
      'shop.prospects',
    ]);
    expect(s.last_build.result.sources_origin).toBe('proposed');

    expect(
      (await api('GET', '/identity-graph/workspace', { query: { database: warehouse.name } })).status,
    ).toBe(200);
    expect((await api('GET', '/identity-graph/workspace', { query: { database: 'elsewhere' } })).status).toBe(
      404,
    );
    expect(
      (await api('GET', '/identity-graph/workspace', { query: { database: 'x'.repeat(64) } })).status,
    ).toBe(400);
  });

  it('raises an identity health alert for a cluster over the size limit', async () => {
    const m = em();
    const workspace = await m.findOneOrFail(Workspace, {
      name: workspaceName,
      organization: tenant.organization.id,
    });
    workspace.settings = { ...workspace.settings, identity_resolution: { max_cluster_size: 3 } };
    await m.flush();
    const res = await api('POST', '/identity-graph/create-schema');
    expect(res.status).toBe(200);
    const run = await finished(res.body.build.run_id, tenant.organization.id);
    expect(run!.status, JSON.stringify(run)).toBe('succeeded');
    const alerts = await call(server, 'GET', '/api/api/alerts/active', {
      token: tenant.admin.token,
      query: { workspace: workspaceName },
    });
    expect(alerts.status).toBe(200);
    const identity = alerts.body.alerts.filter((a: any) => a.kind === 'identity');
    expect(identity.map((a: any) => a.check).sort()).toEqual([
      'cluster_size_limit',
      'records_without_profile',
    ]);
    // ann (4 identifiers) and bob + carl (6) are over the limit.
    expect(identity.find((a: any) => a.check === 'cluster_size_limit')).toMatchObject({
      measured: 2,
      threshold: 3,
      table_name: 'shop_identity.identity_clusters',
    });
    // Their identifiers stay unmerged and flagged, so their records are in no unified profile: ann's
    // customer 1 and event 100; customers 2 and 3, event 102 and prospect 1 of bob and carl.
    const stats = await api('GET', '/identity-graph/workspace');
    expect(stats.body.unified_profiles).toMatchObject({
      records_without_profile: 6,
      records_without_profile_by_source: { 'shop.customers': 3, 'shop.events': 2, 'shop.prospects': 1 },
    });
    expect(identity.find((a: any) => a.check === 'records_without_profile')).toMatchObject({
      measured: 6,
      threshold: 0,
      table_name: 'shop_identity.unified_profiles',
    });
    expect(stats.body.largest_cluster.size).toBe(3);
  });

  it('keeps tenants apart and checks credentials', async () => {
    expect((await call(server, 'GET', '/api/monitoring/identity-graph/workspace')).status).toBe(401);
    expect((await call(server, 'POST', '/api/monitoring/identity-graph/create-schema')).status).toBe(401);
    const theirs = await api('GET', '/identity-graph/workspace', { token: other.admin.token });
    expect(theirs.status).toBe(200);
    expect(theirs.body).toMatchObject({ built: false, schema: 'elsewhere_identity', identifiers: 0 });
    expect(
      (
        await api('GET', '/identity-graph/workspace', {
          token: other.admin.token,
          query: { database: 'nope' },
        })
      ).status,
    ).toBe(404);
  });
});

describe('default monitors', () => {
  it('proposes primary-key tests and freshness once, never re-adding one the user removed', async () => {
    const m = em();
    const workspace = await m.findOneOrFail(Workspace, {
      name: workspaceName,
      organization: tenant.organization.id,
    });
    const scope = systemScope(server.deps, m, tenant.organization.id);
    const proposals = await proposeDefaultMonitors(scope, workspace);
    expect(
      proposals
        .filter((p) => p.state === 'new')
        .map((p) => p.key)
        .sort(),
    ).toEqual([
      'freshness:customers',
      'freshness:events',
      'pk:customers:customer_id',
      'pk:events:event_id',
      'pk:orders:order_id',
      'pk:prospects:prospect_no',
    ]);
    const { added } = await applyDefaultMonitors(scope, workspace);
    expect(added.length).toBe(6);
    const customers = (workspace.targetSchema as any).tables.find((t: any) => t.name === 'customers');
    expect(customers.columns[0].tests).toEqual({ not_null: true, unique: true, severity: 'error' });
    const freshness = await m.findOneOrFail(SchemaConfig, {
      workspace: workspace.id,
      tableName: 'customers',
      kind: 'table_monitoring',
    });
    expect(freshness.config).toMatchObject({ freshness: { column: 'updated_at', max_age_seconds: 172800 } });
    expect((await applyDefaultMonitors(scope, workspace)).added).toEqual([]);
    await m.remove(freshness).flush();
    const after = await proposeDefaultMonitors(scope, workspace);
    expect(after.find((p) => p.key === 'freshness:customers')?.state).toBe('declined');
    expect((await applyDefaultMonitors(scope, workspace)).added).toEqual([]);
  });
});

describe('default monitors on schema sync', () => {
  it('adds them when the sync route creates the tables', async () => {
    const res = await call(server, 'POST', '/api/schemas/workspace/sync', {
      token: other.admin.token,
      body: {},
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.applied).toBe(true);
    const m = em();
    const workspace = await m.findOneOrFail(Workspace, {
      name: otherWorkspaceName,
      organization: other.organization.id,
    });
    const events = (workspace.targetSchema as any).tables.find((t: any) => t.name === 'events');
    expect(events.columns[0].tests).toEqual({ not_null: true, unique: true, severity: 'error' });
    const freshness = await m.find(SchemaConfig, { workspace: workspace.id, kind: 'table_monitoring' });
    expect(freshness.map((f) => f.tableName).sort()).toEqual(['customers', 'events']);
    const proposals = await proposeDefaultMonitors(
      systemScope(server.deps, m, other.organization.id),
      workspace,
    );
    expect(proposals.every((p) => p.state === 'configured')).toBe(true);
  });
});

describe('metrics of floats that are not numbers', () => {
  it("measures a float column holding NaN and infinities: ranges over the numbers, 'Infinity' as text", async () => {
    // One NaN made the maximum NaN (PostgreSQL sorts it above every number), hid the values over a
    // range's bound, and failed the whole workspace's metrics with a 500 (JSON has no NaN).
    await warehouse.sql(`create schema lab;
      create table lab.readings (id integer primary key, val float8, amount numeric);
      insert into lab.readings select g, g, g from generate_series(1, 20) g;
      update lab.readings set val = 'NaN', amount = 'NaN' where id = 3;
      insert into lab.readings values (21, '-Infinity', null);`);
    const lab = await createTenant(server);
    await createWorkspace(server, lab.admin.token, {
      name: unique('lab'),
      select: true,
      target_config: connection('lab'),
      target_schema: {
        name: 'lab',
        version: '1.0.0',
        tables: [
          {
            name: 'readings',
            primary_key: ['id'],
            columns: [
              { name: 'id', type: 'integer', nullable: false },
              { name: 'val', type: 'numeric' },
              { name: 'amount', type: 'numeric' },
            ],
          },
        ],
      },
    });
    const res = await api('GET', '/metrics/workspace', { token: lab.admin.token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const col = (name: string) => res.body.tables[0].columns.find((c: { name: string }) => c.name === name);
    expect(col('val')).toMatchObject({ null_count: 0, min: '-Infinity', max: 20 });
    expect(col('amount')).toMatchObject({ null_count: 1, min: 1, max: 20 });
  });
});
