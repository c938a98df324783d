import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';

/*
 * POST /api/pipelines/test-model counts what dbt's own tests of the generated project return, as the
 * monitoring runner does: unique and accepted_values count values (the rows holding them are told in
 * the message), accepted_values compares in the column's type, relationships counts rows. A test the
 * database refuses is that test's error; the others still run. Such a test (a list of no dates on a
 * date column) is refused when saved; a schema.json stored before may hold one, and still runs.
 */
const warehouse = scratchDatabase('pprobe');
const config = (schemas: string[]) => pgConfig(warehouse.name, { schemas });

const targetSchema = {
  name: 'crm',
  tables: [
    {
      name: 'people',
      primary_key: ['id'],
      columns: [
        { name: 'id', type: 'integer', nullable: false },
        { name: 'email', type: 'text', tests: { unique: true } },
        { name: 'tier', type: 'text', tests: { accepted_values: ['GOLD', 'SILVER'] } },
        { name: 'joined', type: 'date', tests: { accepted_values: ['someday'] } },
        { name: 'score', type: 'numeric', tests: { accepted_values: [1.5, 2] } },
        { name: 'segment_id', type: 'integer', tests: { relationships: { to: 'segments', field: 'id' } } },
      ],
    },
    // segment_id's relationships test names a table of the target schema (dbt's ref('segments')).
    { name: 'segments', primary_key: ['id'], columns: [{ name: 'id', type: 'integer', nullable: false }] },
  ],
};

let server: TestServer;
let tenant: Tenant;
const workspace = unique('pprobe');
const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema app; create schema mart;
     create table app.people (id integer primary key, email text, plan text, score numeric(6,2), joined date, segment integer);
     insert into app.people values
       (1, 'a@x.io', 'gold', 1.50, '2024-01-01', 1),
       (2, 'a@x.io', 'tin', 2.00, '2024-01-02', 9),
       (3, 'a@x.io', 'tin', 3.25, '2024-01-03', 9),
       (4, 'b@x.io', 'silver', 1.50, '2024-01-04', 2),
       (5, 'b@x.io', null, null, null, 8);
     create table mart.segments (id integer primary key);
     insert into mart.segments values (1), (2);`);
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: workspace,
    source_config: config(['app']),
    target_config: config(['mart']),
  });
  const refused = await api('POST', `/api/workspaces/${workspace}/config`, {
    body: { target_schema: targetSchema },
  });
  expect(refused.status).toBe(400);
  expect(refused.body.issues).toEqual([
    {
      path: ['target_schema', 'tables', 0, 'columns', 3, 'tests', 'accepted_values', 0],
      message:
        'accepted_values does not apply to column people.joined of type date: "someday" is not an ISO date or timestamp',
    },
  ]);
  // Stored as a schema.json saved before the rule was: in the database.
  const em = server.deps.orm.em.fork();
  const { id } = await em.findOneOrFail(Workspace, { name: workspace, organization: tenant.organization.id });
  await em.execute(`update workspaces set target_schema = ?::jsonb where id = ?`, [
    JSON.stringify(targetSchema),
    id,
  ]);
  const steps: [string, unknown][] = [
    ['tables', { source_table: 'people', relationship: 'primary' }],
    ['connection', { connection: { source_field: 'people.id', target_field: 'id' } }],
    ['connection', { connection: { source_field: 'people.email', target_field: 'email' } }],
    ['connection', { connection: { source_field: 'people.joined', target_field: 'joined' } }],
    ['connection', { connection: { source_field: 'people.score', target_field: 'score' } }],
    ['connection', { connection: { source_field: 'people.segment', target_field: 'segment_id' } }],
    ['transformation', { transformation: { target_field: 'tier', expression: 'upper(people.plan)' } }],
    ['commit-transformation', { message: 'people' }],
  ];
  for (const [route, body] of steps) {
    const step = await api('POST', `/api/mappings/people/${route}`, { body });
    expect(step.status, `${route}: ${JSON.stringify(step.body)}`).toBe(200);
  }
  const generated = await api('POST', '/api/pipelines/generate-project', { body: {} });
  expect(generated.status, JSON.stringify(generated.body)).toBe(200);
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('test-model counts failures as dbt does', () => {
  it('unique and accepted_values count values, in the column type; relationships count rows; a refused test is an error', async () => {
    const res = await api('POST', '/api/pipelines/test-model', { body: { table_name: 'people' } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.rows_tested).toBe(5);
    const byName = Object.fromEntries(res.body.tests.map((t: { name: string }) => [t.name, t]));

    // a@x.io (3 rows) and b@x.io (2 rows): dbt's unique test returns 2 values.
    expect(byName.unique_people_email).toMatchObject({
      status: 'fail',
      failures: 2,
      message: '2 values of email repeat: unique fails (5 of 5 rows hold them)',
    });
    expect(byName.unique_people_email.failing_rows).toHaveLength(5);

    // TIN, held by 2 rows, is one value outside the list.
    expect(byName.accepted_values_people_tier).toMatchObject({
      status: 'fail',
      failures: 1,
      message: '1 values of tier are not accepted: accepted_values fails (2 of 5 rows hold them)',
    });
    expect(byName.accepted_values_people_tier.failing_rows.map((r: { id: number }) => r.id)).toEqual([2, 3]);

    // numeric(6,2) reads 1.50 and 2.00; compared as numbers they are the accepted 1.5 and 2.
    expect(byName.accepted_values_people_score).toMatchObject({ status: 'fail', failures: 1 });
    expect(byName.accepted_values_people_score.failing_rows.map((r: { id: number }) => r.id)).toEqual([3]);

    // 'someday' is no date: the database refuses the comparison, the other tests still run.
    expect(byName.accepted_values_people_joined).toMatchObject({ status: 'error', failures: 0 });
    expect(byName.accepted_values_people_joined.message).toMatch(/invalid input syntax for type date/);

    // Segments 9 (2 rows) and 8 (1 row) are not in mart.segments: 3 rows, as dbt's join returns.
    expect(byName.relationships_people_segment_id).toMatchObject({
      status: 'fail',
      failures: 3,
      failing_rows: [{ segment_id: '8' }, { segment_id: '9' }],
      message: '3 of 5 rows (2 values of segment_id) have no match in mart.segments.id',
    });

    expect(byName.not_null_people_id).toMatchObject({ status: 'pass', failures: 0 });
    expect(byName.unique_people_id).toMatchObject({ status: 'pass', failures: 0 });
    expect(res.body).toMatchObject({ passed: 2, failed: 4, errors: 1 });
  });
});

describe('generate-project', () => {
  it('concurrent first generations all succeed and leave one project', async () => {
    expect((await api('DELETE', '/api/pipelines/project')).status).toBe(200);
    const answers = await Promise.all(
      Array.from({ length: 4 }, () => api('POST', '/api/pipelines/generate-project', { body: {} })),
    );
    expect(
      answers.map((a) => a.status),
      JSON.stringify(answers.map((a) => a.body)),
    ).toEqual([200, 200, 200, 200]);
    const status = await api('GET', '/api/pipelines/status');
    expect(status.body).toMatchObject({ generated: true, in_sync: true });
    expect(status.body.fingerprint).toBe(answers[0].body.fingerprint);
  });
});

describe('generate-project with table_names', () => {
  it('says why none of the tables asked for can be generated; an empty list is a 400', async () => {
    const none = await api('POST', '/api/pipelines/generate-project', {
      body: { table_names: ['peeple', 'orders'] },
    });
    expect(none.status, JSON.stringify(none.body)).toBe(409);
    expect(none.body).toMatchObject({
      reason: 'NOTHING_COMMITTED',
      message: `None of the tables asked for can be generated in workspace ${workspace}: peeple (no committed transformation), orders (no committed transformation)`,
    });
    const empty = await api('POST', '/api/pipelines/generate-project', { body: { table_names: [] } });
    expect(empty.status, JSON.stringify(empty.body)).toBe(400);
    expect(JSON.stringify(empty.body.issues)).toContain('give at least one table');
    // The project generated before is still there.
    expect((await api('GET', '/api/pipelines/status')).body.generated).toBe(true);
  });
});
