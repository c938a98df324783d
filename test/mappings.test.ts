import type { EntityManager } from '@mikro-orm/postgresql';
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
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';
import { writeSuggestions } from '../src/modules/mappings/mappings.service.ts';

/*
 * The mappings routes one by one: success, no token (401), missing permission (403), bad input
 * (400 naming what is wrong) and another organization (404), over a real PostgreSQL source database.
 */
const warehouse = scratchDatabase('map');

const config = (schemas: string[]) => pgConfig(warehouse.name, { schemas });

const schema = {
  name: 'people',
  tables: [
    {
      name: 'people',
      primary_key: ['id'],
      columns: [
        { name: 'id', type: 'integer', nullable: false },
        { name: 'email', type: 'text' },
        { name: 'name', type: 'text' },
        { name: 'spent', type: 'numeric' },
      ],
    },
    {
      name: 'accounts',
      columns: [
        { name: 'id', type: 'integer' },
        { name: 'EMAIL', type: 'text' },
        { name: 'name', type: 'text' },
        { name: 'extra', type: 'text' },
      ],
    },
  ],
};

let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let viewer: TestUser;
let nobody: TestUser;
let token: string;
const workspace = unique('maps');

/** The message and every issue of an error answer (several problems arrive as issues). */
const problems = (body: { message?: string; issues?: { message: string }[] }) =>
  [body.message, ...(body.issues ?? []).map((i) => i.message)].join('\n');

const api = bindCall(
  () => server,
  () => token,
);

const setUpWorkspace = (t: Tenant, name: string, tables = schema.tables) =>
  createWorkspace(server, t.admin.token, {
    name,
    source_config: config(['shop']),
    target_config: config(['mart']),
    target_schema: { ...schema, tables },
  });

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema shop; create schema mart;
     create table shop.customers (id integer primary key, email text, name text, age integer);
     create table shop.orders (id integer primary key, customer_id integer, total numeric(10,2));
     create table shop.odd (customer_ref text, label text);
     insert into shop.customers values (1, 'A@X.IO', 'ann', 30), (2, 'b@x.io', 'bob', null), (3, null, 'cy', 41);
     insert into shop.orders values (10, 1, 5.50), (11, 1, 4.50), (12, 3, 20);`);
  server = await startTestServer();
  tenant = await createTenant(server);
  token = tenant.admin.token;
  await setUpWorkspace(tenant, workspace);
  viewer = await tenant.addUser(['viewer']);
  nobody = await tenant.addUserWithoutPermissions();
  for (const user of [viewer, nobody])
    await call(server, 'POST', '/api/workspaces/select', {
      token: user.token,
      body: { workspace_name: workspace },
    });
  other = await createTenant(server);
  await setUpWorkspace(other, unique('elsewhere'), [{ ...schema.tables[1], name: 'other_people' }]);
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

const ROUTES: [string, string, 'read' | 'write' | 'run'][] = [
  ['GET', '/api/mappings', 'read'],
  ['GET', '/api/mappings/people', 'read'],
  ['GET', '/api/mappings/people/transform-code', 'read'],
  ['POST', '/api/mappings/batch/transform-code', 'write'],
  ['GET', '/api/mappings/people/field-transform/email', 'read'],
  ['GET', '/api/mappings/people/tables', 'read'],
  ['POST', '/api/mappings/people/tables', 'write'],
  ['POST', '/api/mappings/people/tables/validate', 'write'],
  ['DELETE', '/api/mappings/people/tables/shop.orders', 'write'],
  ['GET', '/api/mappings/people/wildcard/effective', 'read'],
  ['POST', '/api/mappings/people/generate-code', 'write'],
  ['POST', '/api/mappings/people/connection', 'write'],
  ['DELETE', '/api/mappings/people/connection', 'write'],
  ['POST', '/api/mappings/people/transformation', 'write'],
  ['DELETE', '/api/mappings/people/transformation/name', 'write'],
  ['POST', '/api/mappings/resolve-ambiguity', 'write'],
  ['POST', '/api/mappings/people/preview-transformation', 'write'],
  ['POST', '/api/mappings/people/transformation-diff', 'write'],
  ['POST', '/api/mappings/people/commit-transformation', 'write'],
  ['POST', '/api/mappings/people/materialize', 'run'],
  ['DELETE', '/api/mappings/clear-all', 'write'],
];

describe('guards', () => {
  it.each(ROUTES)('%s %s: 401 without a token, 403 without the permission', async (method, path, guard) => {
    const body = method === 'POST' ? {} : undefined;
    const anonymous = await call(server, method, path, { body });
    expect(anonymous.status).toBe(401);
    const refused = await api(method, path, { body, token: guard === 'read' ? nobody.token : viewer.token });
    expect(refused.status, JSON.stringify(refused.body)).toBe(403);
    expect(refused.body.code).toBe('FORBIDDEN');
  });
});

describe('mapping writes and reads', () => {
  it('lists nothing at first and shows an empty mapping of a schema table', async () => {
    const list = await api('GET', '/api/mappings', { query: { include_workspace: 'true' } });
    expect(list.status).toBe(200);
    expect(list.body).toMatchObject({
      workspace_name: workspace,
      mappings: [],
      workspace: { schema_name: 'people', unmapped_tables: ['people', 'accounts'] },
    });
    expect(
      (await api('GET', '/api/mappings', { query: { include_workspace: 'false' } })).body.workspace,
    ).toBeUndefined();
    const empty = await api('GET', '/api/mappings/people');
    expect(empty.body).toMatchObject({
      table_name: 'people',
      version: 0,
      tables: {},
      committed_version: null,
    });
    expect((await api('GET', '/api/mappings/nope')).status).toBe(404);
  });

  it('adds tables, refusing unknown tables, bad ON expressions and missing columns', async () => {
    let res = await api('POST', '/api/mappings/people/tables', {
      body: { source_table: 'customers', relationship: 'primary' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.primary_table).toBe('shop.customers');

    res = await api('POST', '/api/mappings/people/tables', {
      body: { source_table: 'nowhere', relationship: 'primary' },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/nowhere does not exist/);

    res = await api('POST', '/api/mappings/people/tables', {
      body: { source_table: 'orders', relationship: 'join', join_on: 'customers.id = = orders.customer_id' },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/syntax error.*position \d+/);

    res = await api('POST', '/api/mappings/people/tables', {
      body: { source_table: 'orders', relationship: 'join', join_on: 'customers.id = orders.buyer' },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/shop\.orders has no column buyer/);

    res = await api('POST', '/api/mappings/people/tables', {
      body: { source_table: 'orders', relationship: 'join' },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/needs join_on/);

    res = await api('POST', '/api/mappings/people/tables', { body: { relationship: 'sideways' } });
    expect(res.status).toBe(400);

    res = await api('POST', '/api/mappings/people/tables', {
      body: {
        source_table: 'orders',
        relationship: 'join',
        join_type: 'left',
        join_on: 'customers.id = orders.customer_id',
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.tables.map((t: { source_table: string }) => t.source_table)).toEqual([
      'shop.customers',
      'shop.orders',
    ]);
    expect((await api('GET', '/api/mappings/people/tables')).body).toEqual(res.body);
  });

  it('validates relationships and reports every problem', async () => {
    // Customer 1 has two orders: the join gives it two rows, measured on the source.
    expect((await api('POST', '/api/mappings/people/tables/validate')).body).toMatchObject({
      valid: false,
      problems: [
        {
          path: ['tables', 'shop.orders', 'fan_out'],
          message: expect.stringContaining('1 of 3 primary rows match more than one row (up to 2)'),
        },
      ],
      fan_out: [{ source_table: 'shop.orders', primary_rows: 3, joined_rows: 4, multiplied_rows: 1 }],
    });
    let res = await api('POST', '/api/mappings/people/tables', {
      body: { source_table: 'shop.odd', relationship: 'join', join_on: 'customers.id = odd.customer_ref' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    // A second primary on top of the type mismatch: both are reported.
    res = await api('POST', '/api/mappings/people/tables', {
      body: { source_table: 'shop.odd', relationship: 'primary' },
    });
    expect(res.status).toBe(200);
    res = await api('POST', '/api/mappings/people/tables', {
      body: {
        source_table: 'shop.orders',
        relationship: 'join',
        join_on: 'customers.id = orders.customer_id::text',
      },
    });
    const validation = await api('POST', '/api/mappings/people/tables/validate');
    expect(validation.status).toBe(200);
    expect(validation.body.valid).toBe(false);
    const messages = validation.body.problems.map((p: { message: string }) => p.message).join('\n');
    expect(messages).toMatch(/2 primary tables/);
    res = await api('POST', '/api/mappings/people/tables', {
      body: { source_table: 'shop.odd', relationship: 'join', join_on: 'customers.id = odd.customer_ref' },
    });
    const second = await api('POST', '/api/mappings/people/tables/validate');
    expect(second.body.problems.map((p: { message: string }) => p.message).join('\n')).toMatch(
      /customers\.id \(integer\) and odd\.customer_ref \(text\) are not comparable/,
    );
    res = await api('DELETE', '/api/mappings/people/tables/odd');
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect((await api('DELETE', '/api/mappings/people/tables/odd')).status).toBe(404);
    res = await api('POST', '/api/mappings/people/tables', {
      body: {
        source_table: 'orders',
        relationship: 'join',
        join_on: 'customers.id = orders.customer_id',
        accept_fan_out: true,
      },
    });
    expect((await api('POST', '/api/mappings/people/tables/validate')).body).toMatchObject({
      valid: true,
      fan_out: [{ source_table: 'shop.orders', joined_rows: 4, accepted: true }],
    });
    // Set again without accept_fan_out: the refusal is back (the default is not accepted).
    res = await api('POST', '/api/mappings/people/tables', {
      body: { source_table: 'orders', relationship: 'join', join_on: 'customers.id = orders.customer_id' },
    });
    expect((await api('POST', '/api/mappings/people/tables/validate')).body.valid).toBe(false);
  });

  it('creates, updates and deletes connections, naming unknown fields', async () => {
    let res = await api('POST', '/api/mappings/people/connection', {
      body: {
        connection: {
          source_field: 'customers.email',
          target_field: 'email',
          status: 'suggested',
          confidence: 0.6,
        },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    res = await api('POST', '/api/mappings/people/connection', {
      body: { connection: { source_field: 'shop.customers.email', target_field: 'email' } },
    });
    expect(res.body.connections).toEqual([
      { source_field: 'shop.customers.email', target_field: 'email', status: 'confirmed', confidence: null },
    ]);
    res = await api('POST', '/api/mappings/people/connection', {
      body: { connection: { source_field: 'customers.email', target_field: 'mail' } },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/no column mail/);
    res = await api('POST', '/api/mappings/people/connection', {
      body: { connection: { source_field: 'customers.mail', target_field: 'email' } },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/shop\.customers has no column mail/);
    res = await api('POST', '/api/mappings/people/connection', {
      body: { connection: { source_field: 'odd.label', target_field: 'name' } },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/not part of the mapping/);
    expect(
      (await api('POST', '/api/mappings/people/connection', { body: { source_field: 'x.y' } })).status,
    ).toBe(400);
    expect(
      (
        await api('POST', '/api/mappings/nope/connection', {
          body: { connection: { source_field: 'customers.id', target_field: 'id' } },
        })
      ).status,
    ).toBe(404);

    res = await api('POST', '/api/mappings/people/connection', {
      body: { connection: { source_field: 'customers.name', target_field: 'name' } },
    });
    expect(res.status).toBe(200);
    res = await api('DELETE', '/api/mappings/people/connection', {
      query: { source_field: 'customers.name', target_field: 'name' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.connections.map((c: { target_field: string }) => c.target_field)).toEqual(['email']);
    res = await api('DELETE', '/api/mappings/people/connection', {
      query: { source_field: 'customers.name', target_field: 'name' },
    });
    expect(res.status).toBe(404);
    expect(
      (await api('DELETE', '/api/mappings/people/connection', { query: { source_field: 'bad' } })).status,
    ).toBe(400);
  });

  it('sets and deletes transformations, with the parser message for bad SQL', async () => {
    let res = await api('POST', '/api/mappings/people/transformation', {
      body: {
        transformation: {
          target_field: 'name',
          expression: 'initcap(customers.name)',
          description: 'capitalized',
        },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.transformations.name).toEqual({
      expression: 'initcap(customers.name)',
      description: 'capitalized',
    });
    res = await api('POST', '/api/mappings/people/transformation', {
      body: { transformation: { target_field: 'spent', expression: 'sum(orders.total' } },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/Transformation for spent: expression syntax error.*position \d+/);
    res = await api('POST', '/api/mappings/people/transformation', {
      body: { transformation: { target_field: 'spent', expression: 'payments.amount * 2' } },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(
      /payments\.amount names table payments, which is not a table of this mapping/,
    );
    res = await api('POST', '/api/mappings/people/transformation', {
      body: { transformation: { target_field: 'spent', expression: 'orders.amount' } },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/shop\.orders has no column amount/);
    res = await api('POST', '/api/mappings/people/transformation', {
      body: { transformation: { target_field: 'spent', expression: '1; drop table shop.customers' } },
    });
    expect(res.status).toBe(400);
    res = await api('POST', '/api/mappings/people/transformation', {
      body: { transformation: { target_field: 'cost', expression: '1' } },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/no column cost/);
    res = await api('POST', '/api/mappings/people/transformation', {
      body: { transformation: { target_field: 'spent', expression: 'coalesce(orders.total, 0)' } },
    });
    expect(res.status).toBe(200);
    expect((await api('DELETE', '/api/mappings/people/transformation/spent')).status).toBe(200);
    expect((await api('DELETE', '/api/mappings/people/transformation/spent')).status).toBe(404);
  });

  it('generates SQL, names unmapped NOT NULL fields, shows one field and batches', async () => {
    let res = await api('GET', '/api/mappings/people/transform-code');
    expect(res.status).toBe(400);
    expect(problems(res.body)).toMatch(/Unmapped NOT NULL fields of people: id/);
    res = await api('POST', '/api/mappings/people/connection', {
      body: { connection: { source_field: 'customers.id', target_field: 'id' } },
    });
    expect(res.status).toBe(200);
    res = await api('GET', '/api/mappings/people/transform-code');
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.sql).toContain('LEFT JOIN "shop"."orders" ON (customers.id = orders.customer_id)');
    expect(res.body.columns.map((c: { source: string }) => c.source)).toEqual([
      'column',
      'column',
      'expression',
      'null',
    ]);
    expect(res.body).toMatchObject({ committed_sql: null, matches_committed: false });

    res = await api('GET', '/api/mappings/people/field-transform/name');
    expect(res.body).toMatchObject({ source: 'expression', sql: 'CAST((initcap(customers.name)) AS text)' });
    res = await api('GET', '/api/mappings/people/field-transform/email');
    expect(res.body).toMatchObject({ source: 'column', source_field: 'shop.customers.email' });
    expect((await api('GET', '/api/mappings/people/field-transform/nope')).status).toBe(404);

    res = await api('POST', '/api/mappings/batch/transform-code', {
      body: { table_names: ['people', 'accounts'] },
    });
    expect(res.status).toBe(200);
    expect(res.body.results.map((r: { table_name: string; ok: boolean }) => [r.table_name, r.ok])).toEqual([
      ['accounts', false],
      ['people', true],
    ]);
    expect(
      (await api('POST', '/api/mappings/batch/transform-code', { body: { table_names: 'people' } })).status,
    ).toBe(400);
  });

  it('maps a table by name from a wildcard, explicit connections winning', async () => {
    let res = await api('POST', '/api/mappings/accounts/connection', {
      body: { connection: { source_field: 'customers.*', target_field: '*' } },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    res = await api('POST', '/api/mappings/accounts/connection', {
      body: { connection: { source_field: 'customers.email', target_field: 'name' } },
    });
    expect(
      (
        await api('POST', '/api/mappings/accounts/connection', {
          body: { connection: { source_field: 'customers.*', target_field: 'name' } },
        })
      ).status,
    ).toBe(400);
    res = await api('GET', '/api/mappings/accounts/wildcard/effective');
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ wildcard_tables: ['shop.customers'] });
    expect(res.body.fields).toEqual([
      {
        target_field: 'id',
        source_field: 'shop.customers.id',
        expression: null,
        origin: 'wildcard',
        status: 'confirmed',
      },
      {
        target_field: 'EMAIL',
        source_field: 'shop.customers.email',
        expression: null,
        origin: 'wildcard',
        status: 'confirmed',
      },
      {
        target_field: 'name',
        source_field: 'shop.customers.email',
        expression: null,
        origin: 'connection',
        status: 'confirmed',
      },
      { target_field: 'extra', source_field: null, expression: null, origin: 'unmapped', status: null },
    ]);
    const sql = await api('GET', '/api/mappings/accounts/transform-code');
    expect(sql.body.sql).toContain('CAST("shop"."customers"."email" AS text) AS "EMAIL"');
    expect((await api('GET', '/api/mappings/people/wildcard/effective')).body.wildcard_tables).toEqual([]);
  });

  it('generates Python code', async () => {
    const res = await api('POST', '/api/mappings/people/generate-code');
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ language: 'python', filename: 'people.py' });
    expect(res.body.code).toContain("if __name__ == '__main__':");
    expect((await api('POST', '/api/mappings/nope/generate-code')).status).toBe(404);
  });

  it('resolves an ambiguity into a confirmed connection', async () => {
    const em = server.deps.orm.em.fork() as EntityManager;
    const ws = await em.findOneOrFail(Workspace, { organization: tenant.organization.id, name: workspace });
    await writeSuggestions({ em, deps: server.deps }, ws, 'people', {
      connections: [{ source_field: 'shop.customers.age', target_field: 'spent', confidence: 0.4 }],
      ambiguities: [
        {
          target_field: 'spent',
          candidates: [
            { source_field: 'shop.customers.age', confidence: 0.4 },
            { source_field: 'shop.orders.total', confidence: 0.45 },
          ],
        },
      ],
    });
    await em.flush();
    let res = await api('GET', '/api/mappings/people');
    expect(res.body.ambiguities).toHaveLength(1);
    res = await api('POST', '/api/mappings/resolve-ambiguity', {
      body: {
        resolve_input: { table_name: 'people', target_field: 'spent', source_field: 'customers.name' },
      },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/not a candidate/);
    res = await api('POST', '/api/mappings/resolve-ambiguity', {
      body: { resolve_input: { table_name: 'people', target_field: 'spent', source_field: 'orders.total' } },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.ambiguities).toEqual([]);
    expect(res.body.connections.filter((c: { target_field: string }) => c.target_field === 'spent')).toEqual([
      { source_field: 'shop.orders.total', target_field: 'spent', status: 'confirmed', confidence: 0.45 },
    ]);
    res = await api('POST', '/api/mappings/resolve-ambiguity', {
      body: { resolve_input: { table_name: 'people', target_field: 'spent', source_field: null } },
    });
    expect(res.status).toBe(404);
    expect(
      (await api('POST', '/api/mappings/resolve-ambiguity', { body: { table_name: 'people' } })).status,
    ).toBe(400);
  });

  it('previews, diffs, commits and materializes', async () => {
    let res = await api('POST', '/api/mappings/people/preview-transformation', {
      body: { target_field: 'name', limit: 5 },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    // A name is personal: with mask_pii_in_samples on (the default) the preview shows its shape only.
    expect(res.body.masked_columns).toContain('name');
    expect(res.body.rows.map((r: { name: string }) => r.name).sort()).toEqual(['Aa', 'Aaa', 'Aaa', 'Aaa']);
    expect(
      (await api('POST', '/api/mappings/people/preview-transformation', { body: { limit: 0 } })).status,
    ).toBe(400);
    expect(
      (await api('POST', '/api/mappings/people/preview-transformation', { body: { expression: '1' } }))
        .status,
    ).toBe(400);

    res = await api('POST', '/api/mappings/people/materialize');
    expect(res.status).toBe(409);
    expect(res.body.reason).toBe('NOT_COMMITTED');

    res = await api('POST', '/api/mappings/people/transformation-diff', { body: { limit: 10 } });
    expect(res.status).toBe(200);
    expect(res.body.data_diff).toMatchObject({ rows_after: 4, added_rows: 4 });
    expect(
      (await api('POST', '/api/mappings/people/transformation-diff', { body: { limit: 'all' } })).status,
    ).toBe(400);

    expect((await api('POST', '/api/mappings/people/commit-transformation', { body: {} })).status).toBe(400);
    // One row per order is what this mapping wants: the fan-out is refused until accepted.
    res = await api('POST', '/api/mappings/people/commit-transformation', { body: { message: 'people v1' } });
    expect(res.status).toBe(422);
    expect(res.body.message).toMatch(/the joined result has 4 rows instead of 3/);
    res = await api('POST', '/api/mappings/people/tables', {
      body: {
        source_table: 'orders',
        relationship: 'join',
        join_on: 'customers.id = orders.customer_id',
        accept_fan_out: true,
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    res = await api('POST', '/api/mappings/people/commit-transformation', { body: { message: 'people v1' } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const list = await api('GET', '/api/mappings');
    expect(list.body.mappings.find((m: { table_name: string }) => m.table_name === 'people')).toMatchObject({
      committed_version: res.body.version,
      has_uncommitted_changes: false,
    });

    res = await api('POST', '/api/mappings/people/materialize');
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ status: 'queued', table_name: 'people', created: true });
    const again = await api('POST', '/api/mappings/people/materialize');
    if (again.body.run_id === res.body.run_id) expect(again.body.created).toBe(false);
    expect((await api('POST', '/api/mappings/nope/materialize')).status).toBe(404);
  });

  it('answers another organization with 404 for this workspace’s tables', async () => {
    const as = other.admin.token;
    expect((await api('GET', '/api/mappings', { token: as })).body.mappings).toEqual([]);
    for (const [method, path, body, query] of [
      ['GET', '/api/mappings/people', undefined, undefined],
      ['GET', '/api/mappings/people/transform-code', undefined, undefined],
      ['GET', '/api/mappings/people/field-transform/email', undefined, undefined],
      ['GET', '/api/mappings/people/tables', undefined, undefined],
      [
        'POST',
        '/api/mappings/people/tables',
        { source_table: 'customers', relationship: 'primary' },
        undefined,
      ],
      ['POST', '/api/mappings/people/tables/validate', {}, undefined],
      ['DELETE', '/api/mappings/people/tables/shop.customers', undefined, undefined],
      ['GET', '/api/mappings/people/wildcard/effective', undefined, undefined],
      ['POST', '/api/mappings/people/generate-code', {}, undefined],
      [
        'POST',
        '/api/mappings/people/connection',
        { connection: { source_field: 'customers.id', target_field: 'id' } },
        undefined,
      ],
      [
        'DELETE',
        '/api/mappings/people/connection',
        undefined,
        { source_field: 'customers.id', target_field: 'id' },
      ],
      [
        'POST',
        '/api/mappings/people/transformation',
        { transformation: { target_field: 'name', expression: '1' } },
        undefined,
      ],
      ['DELETE', '/api/mappings/people/transformation/name', undefined, undefined],
      [
        'POST',
        '/api/mappings/resolve-ambiguity',
        { resolve_input: { table_name: 'people', target_field: 'spent', source_field: null } },
        undefined,
      ],
      ['POST', '/api/mappings/people/preview-transformation', {}, undefined],
      ['POST', '/api/mappings/people/transformation-diff', {}, undefined],
      ['POST', '/api/mappings/people/commit-transformation', { message: 'x' }, undefined],
      ['POST', '/api/mappings/people/materialize', {}, undefined],
    ] as const) {
      const res = await api(method, path, {
        token: as,
        body,
        query: query as Record<string, string> | undefined,
      });
      expect(res.status, `${method} ${path}: ${JSON.stringify(res.body)}`).toBe(404);
    }
    const batch = await api('POST', '/api/mappings/batch/transform-code', {
      token: as,
      body: { table_names: ['people'] },
    });
    expect(batch.body.results).toEqual([expect.objectContaining({ table_name: 'people', ok: false })]);
  });

  it('clears everything only with the workspace name typed again', async () => {
    let res = await api('DELETE', '/api/mappings/clear-all');
    expect(res.status).toBe(400);
    expect(res.body.message).toContain(`confirm_workspace_name=${workspace}`);
    res = await api('DELETE', '/api/mappings/clear-all', { query: { confirm_workspace_name: 'wrong' } });
    expect(res.status).toBe(400);
    // Another organization's clear-all never reaches this workspace.
    res = await api('DELETE', '/api/mappings/clear-all', {
      token: other.admin.token,
      query: { confirm_workspace_name: workspace },
    });
    expect(res.status).toBe(400);
    res = await api('DELETE', '/api/mappings/clear-all', { query: { confirm_workspace_name: workspace } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ success: true, deleted_mappings: 2, deleted_commits: 1 });
    expect((await api('GET', '/api/mappings')).body.mappings).toEqual([]);
  });
});
