import { parse as parseYaml } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  bindCall,
  call,
  createTenant,
  createWorkspace,
  unique,
  type Tenant,
  type TestUser,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

/*
 * The transformation project: generated from committed mappings, its status, model SQL, drift and
 * model tests on sampled source rows of a real PostgreSQL database; guards and other tenants too.
 */
const warehouse = scratchDatabase('pipe');

const config = (schemas: string[]) => pgConfig(warehouse.name, { schemas });

const schema = (tierTests: Record<string, unknown>) => ({
  name: 'crm',
  tables: [
    {
      name: 'contacts',
      description: 'People we can reach',
      primary_key: ['id'],
      columns: [
        { name: 'id', type: 'integer', nullable: false },
        { name: 'email', type: 'text', description: 'Lower-case e-mail', tests: { unique: true } },
        { name: 'tier', type: 'text', tests: tierTests },
        { name: 'segment_id', type: 'integer', tests: { relationships: { to: 'segments', field: 'id' } } },
      ],
    },
    // What segment_id refers to: a relationships test names a table of the target schema (it is
    // written as ref('segments')); mart.segments is created by hand below and never mapped.
    { name: 'segments', primary_key: ['id'], columns: [{ name: 'id', type: 'integer', nullable: false }] },
  ],
});

let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let viewer: TestUser;
let nobody: TestUser;
let token: string;
const workspace = unique('pipes');

const api = bindCall(
  () => server,
  () => token,
);

async function saveSchema(tierTests: Record<string, unknown>) {
  const res = await api('POST', `/api/workspaces/${workspace}/config`, {
    body: { target_schema: schema(tierTests) },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
}

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema app; create schema mart;
     create table app.users (id integer primary key, email text, plan text, segment integer);
     insert into app.users values (1, 'A@x.io', 'gold', 1), (2, 'a@X.io', 'silver', 2), (3, 'c@x.io', 'tin', 9), (4, null, null, null);
     create table mart.segments (id integer primary key);
     insert into mart.segments values (1), (2);`);
  server = await startTestServer();
  tenant = await createTenant(server);
  token = tenant.admin.token;
  await createWorkspace(server, token, {
    name: workspace,
    source_config: config(['app']),
    target_config: config(['mart']),
  });
  await saveSchema({ accepted_values: ['GOLD', 'SILVER'] });
  viewer = await tenant.addUser(['viewer']);
  nobody = await tenant.addUserWithoutPermissions();
  for (const user of [viewer, nobody])
    await call(server, 'POST', '/api/workspaces/select', {
      token: user.token,
      body: { workspace_name: workspace },
    });
  other = await createTenant(server);
  await createWorkspace(server, other.admin.token, { name: unique('other') });

  const steps: [string, unknown][] = [
    ['tables', { source_table: 'users', relationship: 'primary' }],
    ['connection', { connection: { source_field: 'users.id', target_field: 'id' } }],
    ['connection', { connection: { source_field: 'users.segment', target_field: 'segment_id' } }],
    ['transformation', { transformation: { target_field: 'email', expression: 'lower(users.email)' } }],
    ['transformation', { transformation: { target_field: 'tier', expression: 'upper(users.plan)' } }],
    ['commit-transformation', { message: 'contacts from users' }],
  ];
  for (const [route, body] of steps) {
    const step = await api('POST', `/api/mappings/contacts/${route}`, { body });
    expect(step.status, `${route}: ${JSON.stringify(step.body)}`).toBe(200);
  }
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

const ROUTES: [string, string, 'read' | 'run'][] = [
  ['POST', '/api/pipelines/generate-project', 'run'],
  ['GET', '/api/pipelines/status', 'read'],
  ['GET', '/api/pipelines/model/contacts', 'read'],
  ['GET', '/api/pipelines/drift-status', 'read'],
  ['POST', '/api/pipelines/test-model', 'run'],
  ['DELETE', '/api/pipelines/project', 'run'],
];

describe('guards', () => {
  it.each(ROUTES)('%s %s: 401 without a token, 403 without the permission', async (method, path, guard) => {
    const body = method === 'POST' ? {} : undefined;
    expect((await call(server, method, path, { body })).status).toBe(401);
    const refused = await api(method, path, { body, token: guard === 'read' ? nobody.token : viewer.token });
    expect(refused.status, JSON.stringify(refused.body)).toBe(403);
  });
});

describe('the transformation project', () => {
  it('has nothing before generation', async () => {
    expect((await api('GET', '/api/pipelines/status')).body).toMatchObject({
      generated: false,
      in_sync: null,
      files: [],
    });
    expect((await api('GET', '/api/pipelines/drift-status')).body).toMatchObject({ generated: false });
    expect((await api('GET', '/api/pipelines/model/contacts')).status).toBe(404);
    expect((await api('DELETE', '/api/pipelines/project')).status).toBe(404);
    expect(
      (await api('POST', '/api/pipelines/test-model', { body: { table_name: 'contacts' } })).status,
    ).toBe(404);
  });

  it('generates the project from the committed mappings', async () => {
    expect(
      (await api('POST', '/api/pipelines/generate-project', { body: { table_names: 'contacts' } })).status,
    ).toBe(400);
    const res = await api('POST', '/api/pipelines/generate-project', { body: {} });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.files.map((f: { path: string }) => f.path)).toEqual([
      'dbt_project.yml',
      'models/schema.yml',
      'models/sources.yml',
      'macros/generate_schema_name.sql',
      'models/contacts.sql',
    ]);
    expect(res.body.models).toEqual([{ table_name: 'contacts', committed_version: 5 }]);

    const status = await api('GET', '/api/pipelines/status');
    expect(status.body).toMatchObject({
      generated: true,
      in_sync: true,
      generated_by: tenant.admin.username,
    });
    const model = await api('GET', '/api/pipelines/model/contacts');
    expect(model.status).toBe(200);
    expect(model.body.sql).toContain(`FROM {{ source('app', 'users') }}`);
    expect(model.body.sql).toContain('CAST((lower(users.email)) AS text) AS "email"');
    expect((await api('GET', '/api/pipelines/model/nope')).status).toBe(404);
    expect((await api('GET', '/api/pipelines/drift-status')).body).toMatchObject({
      generated: true,
      in_sync: true,
      changes: [],
    });

    const diff = await api('GET', `/api/workspaces/${workspace}/git-diff`);
    const paths = diff.body.files.map((f: { path: string }) => f.path);
    expect(paths).toContain('transformation/models/contacts.sql');
    expect(paths).toContain('transformation/models/schema.yml');
  });

  it('runs the model on source rows and reports each test with its failing rows', async () => {
    const res = await api('POST', '/api/pipelines/test-model', {
      body: { table_name: 'contacts', sample_size: 50 },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ rows_tested: 4 });
    const byName = Object.fromEntries(res.body.tests.map((t: { name: string }) => [t.name, t]));
    expect(byName.unique_contacts_id).toMatchObject({ status: 'pass', failures: 0 });
    expect(byName.not_null_contacts_id).toMatchObject({ status: 'pass' });
    // One value (a@x.io) repeats, held by two rows: dbt's unique test returns values.
    expect(byName.unique_contacts_email).toMatchObject({ status: 'fail', failures: 1 });
    expect(byName.unique_contacts_email.failing_rows.map((r: { email: string }) => r.email)).toEqual([
      'a@x.io',
      'a@x.io',
    ]);
    expect(byName.accepted_values_contacts_tier).toMatchObject({ status: 'fail', failures: 1 });
    expect(byName.accepted_values_contacts_tier.failing_rows).toEqual([
      { id: 3, email: 'c@x.io', tier: 'TIN', segment_id: 9 },
    ]);
    expect(byName.relationships_contacts_segment_id).toMatchObject({
      status: 'fail',
      failures: 1,
      failing_rows: [{ segment_id: '9' }],
    });
    expect(res.body).toMatchObject({ passed: 2, failed: 3, errors: 0 });
    const sample = await api('POST', '/api/pipelines/test-model', {
      body: { table_name: 'contacts', sample_size: 1 },
    });
    expect(sample.body.rows_tested).toBe(1);
    expect(
      (await api('POST', '/api/pipelines/test-model', { body: { table_name: 'contacts', sample_size: 0 } }))
        .status,
    ).toBe(400);
    expect((await api('POST', '/api/pipelines/test-model', { body: { table_name: 'nope' } })).status).toBe(
      404,
    );
  });

  it("compares a relationship in the referenced column's type: the integer 1 is the numeric 1.0", async () => {
    // Created by other tooling as numeric: as text, '1.0' is not '1' and every row would fail.
    await warehouse.sql(`alter table mart.segments alter column id type numeric(10,1)`);
    try {
      const res = await api('POST', '/api/pipelines/test-model', {
        body: { table_name: 'contacts', sample_size: 50 },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      const test = res.body.tests.find(
        (t: { name: string }) => t.name === 'relationships_contacts_segment_id',
      );
      expect(test).toMatchObject({ status: 'fail', failures: 1, failing_rows: [{ segment_id: '9' }] });
      // A referenced column that is not there is that test's error, not a 500.
      await warehouse.sql(`alter table mart.segments rename column id to segment_key`);
      const gone = await api('POST', '/api/pipelines/test-model', {
        body: { table_name: 'contacts', sample_size: 50 },
      });
      expect(gone.status, JSON.stringify(gone.body)).toBe(200);
      expect(
        gone.body.tests.find((t: { name: string }) => t.name === 'relationships_contacts_segment_id'),
      ).toMatchObject({
        status: 'error',
        message: 'mart.segments.id does not exist in the target warehouse',
      });
    } finally {
      await warehouse.sql(`alter table mart.segments rename column segment_key to id`).catch(() => {});
      await warehouse.sql(`alter table mart.segments alter column id type integer`);
    }
  });

  it('tells which tables drifted and why', async () => {
    let res = await api('POST', '/api/mappings/contacts/transformation', {
      body: { transformation: { target_field: 'tier', expression: `upper(coalesce(users.plan, 'none'))` } },
    });
    expect(res.status).toBe(200);
    let drift = await api('GET', '/api/pipelines/drift-status');
    // An uncommitted edit is reported but does not make the project out of date.
    expect(drift.body).toMatchObject({
      in_sync: true,
      changes: [{ table_name: 'contacts', reasons: ['uncommitted_changes'] }],
    });
    res = await api('POST', '/api/mappings/contacts/commit-transformation', {
      body: { message: 'tier default' },
    });
    expect(res.status).toBe(200);
    await saveSchema({ accepted_values: ['GOLD', 'SILVER', 'TIN', 'NONE'] });
    drift = await api('GET', '/api/pipelines/drift-status');
    expect(drift.body.in_sync).toBe(false);
    expect(drift.body.project_fingerprint).not.toBe(drift.body.current_fingerprint);
    expect(drift.body.changes).toEqual([
      {
        table_name: 'contacts',
        reasons: ['mapping_committed', 'schema_changed'],
        project_version: 5,
        committed_version: 6,
      },
    ]);
    expect((await api('GET', '/api/pipelines/status')).body.in_sync).toBe(false);
    await api('POST', '/api/pipelines/generate-project', { body: {} });
    expect((await api('GET', '/api/pipelines/drift-status')).body).toMatchObject({
      in_sync: true,
      changes: [],
    });
    const tests = await api('POST', '/api/pipelines/test-model', { body: { table_name: 'contacts' } });
    const tier = tests.body.tests.find((t: { name: string }) => t.name === 'accepted_values_contacts_tier');
    expect(tier).toMatchObject({ status: 'pass' });
    const schemaYml = (await api('GET', `/api/workspaces/${workspace}/git-diff`)).body.diff as string;
    expect(schemaYml).toContain('transformation/models/schema.yml');
    expect(parseYaml).toBeTypeOf('function');
  });

  it('answers another organization as if nothing existed', async () => {
    const as = other.admin.token;
    expect((await api('GET', '/api/pipelines/status', { token: as })).body.generated).toBe(false);
    expect((await api('GET', '/api/pipelines/model/contacts', { token: as })).status).toBe(404);
    expect(
      (await api('POST', '/api/pipelines/test-model', { token: as, body: { table_name: 'contacts' } }))
        .status,
    ).toBe(404);
    expect((await api('DELETE', '/api/pipelines/project', { token: as })).status).toBe(404);
    const generated = await api('POST', '/api/pipelines/generate-project', { token: as, body: {} });
    expect(generated.status).toBe(409);
    expect(generated.body.reason).toBe('NOTHING_COMMITTED');
  });

  it('deletes the project', async () => {
    const res = await api('DELETE', '/api/pipelines/project');
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ success: true, deleted_files: 5 });
    expect((await api('GET', '/api/pipelines/status')).body.generated).toBe(false);
  });
});

describe('a composite primary key', () => {
  it('is tested as a combination: a key column may repeat, a repeated pair fails', async () => {
    await warehouse.sql(`create table app.memberships (user_id integer, segment_id integer);
      insert into app.memberships values (1, 1), (1, 2), (2, 1), (2, 1);`);
    const withMemberships = schema({});
    withMemberships.tables.push({
      name: 'memberships',
      description: 'Who is in which segment',
      primary_key: ['user_id', 'segment_id'],
      columns: [
        { name: 'user_id', type: 'integer', nullable: false },
        { name: 'segment_id', type: 'integer', nullable: false },
      ],
    });
    let res = await api('POST', `/api/workspaces/${workspace}/config`, {
      body: { target_schema: withMemberships },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const steps: [string, unknown][] = [
      ['tables', { source_table: 'memberships', relationship: 'primary' }],
      ['connection', { connection: { source_field: 'memberships.user_id', target_field: 'user_id' } }],
      ['connection', { connection: { source_field: 'memberships.segment_id', target_field: 'segment_id' } }],
      ['commit-transformation', { message: 'memberships' }],
    ];
    for (const [route, body] of steps) {
      res = await api('POST', `/api/mappings/memberships/${route}`, { body });
      expect(res.status, `${route}: ${JSON.stringify(res.body)}`).toBe(200);
    }
    res = await api('POST', '/api/pipelines/generate-project', { body: {} });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.files.map((f: { path: string }) => f.path)).toContain(
      'tests/memberships_primary_key.sql',
    );
    res = await api('POST', '/api/pipelines/test-model', { body: { table_name: 'memberships' } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const byName = Object.fromEntries(res.body.tests.map((t: { name: string }) => [t.name, t]));
    // Each key column repeats (user 1 twice, segment 1 three times): no per-column unique test.
    expect(byName.unique_memberships_user_id).toBeUndefined();
    expect(byName.not_null_memberships_user_id).toMatchObject({ status: 'pass' });
    expect(byName.memberships_primary_key).toMatchObject({
      test: 'singular',
      status: 'fail',
      failures: 1,
      failing_rows: [{ user_id: 2, segment_id: 1, duplicates: '2' }],
    });
    // The contacts model's own tests do not run the memberships key test.
    res = await api('POST', '/api/pipelines/test-model', { body: { table_name: 'contacts' } });
    expect(res.body.tests.map((t: { name: string }) => t.name)).not.toContain('memberships_primary_key');
  });
});
