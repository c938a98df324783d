import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  bindCall,
  createTenant,
  createWorkspace,
  unique,
  type Tenant,
  type TestUser,
} from './helpers/api.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';

/*
 * A column test that does not apply to its column's type is refused wherever a target schema is
 * written, not only by PUT …/test: the workspace config, a schema.json upload, an added column, a
 * schema copied from another workspace. Each answers 400 with every problem at once (where it is in
 * the request, and why) and stores nothing; what applies is stored. A schema stored before the rule
 * still saves, and a write that adds no problem to it is not refused. No warehouse is needed: the
 * rule reads the schema's types only.
 */

interface Column {
  name: string;
  type: string;
  nullable?: boolean;
  tests?: Record<string, unknown>;
}

const baseSchema = () => ({
  name: 'shop',
  version: '1.0.0',
  tables: [
    {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false },
        { name: 'tier', type: 'text' },
        { name: 'signup', type: 'date' },
        { name: 'active', type: 'boolean' },
      ] as Column[],
    },
    {
      name: 'orders',
      primary_key: ['order_id'],
      columns: [
        { name: 'order_id', type: 'integer', nullable: false },
        {
          name: 'customer_id',
          type: 'integer',
          tests: { relationships: { to: 'customers', field: 'customer_id' } },
        },
        { name: 'total', type: 'numeric', tests: { range: { min: 0 } } },
      ] as Column[],
    },
  ],
});
type Schema = ReturnType<typeof baseSchema>;

const columnOf = (schema: Schema, table: string, column: string) =>
  schema.tables.find((t) => t.name === table)!.columns.find((c) => c.name === column)!;

/** The base schema with the given tests (by `table.column`) set. */
function withTests(tests: Record<string, Record<string, unknown>>, schema = baseSchema()): Schema {
  for (const [at, config] of Object.entries(tests)) {
    const [table, column] = at.split('.');
    columnOf(schema, table, column).tests = config;
  }
  return schema;
}

/** Three tests of three kinds, none of which fits its column. */
const misfits = () =>
  withTests({
    'customers.signup': { accepted_values: ['someday'] },
    'customers.tier': { range: { min: 1, max: '10' } },
    'customers.active': { not_null: true, regex: '^t' },
  });
const MISFIT_ISSUES = (at: (string | number)[]) => [
  {
    path: [...at, 'tables', 0, 'columns', 1, 'tests', 'range'],
    message:
      "range does not apply to column customers.tier of type text: 1 is a number, and text compares character by character ('10' < '9')",
  },
  {
    path: [...at, 'tables', 0, 'columns', 2, 'tests', 'accepted_values', 0],
    message:
      'accepted_values does not apply to column customers.signup of type date: "someday" is not an ISO date or timestamp',
  },
  {
    path: [...at, 'tables', 0, 'columns', 3, 'tests', 'regex'],
    message:
      'regex does not apply to column customers.active of type boolean: a regular expression matches text',
  },
];
/** The same kinds of test, in the columns' types. */
const fits = () =>
  withTests({
    'customers.signup': { accepted_values: ['2024-01-01'], range: { min: '2020-01-01' } },
    'customers.tier': { range: { min: 'a', max: 'z' }, regex: '^[a-z]+$' },
    'customers.active': { not_null: true, accepted_values: [true] },
  });

let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let viewer: TestUser;
let workspace: string;
let legacy: string;
let othersWorkspace: string;
const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

/** A schema.json as stored before the rule: written into the database, as no route writes it now. */
async function storeAsBefore(name: string, schema: Schema) {
  const em = server.deps.orm.em.fork();
  const { id } = await em.findOneOrFail(Workspace, { name, organization: tenant.organization.id });
  await em.execute(`update workspaces set target_schema = ?::jsonb where id = ?`, [
    JSON.stringify(schema),
    id,
  ]);
}

const config = (name = workspace) => api('GET', `/api/workspaces/${name}/config`);
const schemaJson = () => api('GET', '/api/schemas/workspace');

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
  other = await createTenant(server);
  viewer = await tenant.addUser(['viewer']);
  legacy = await createWorkspace(server, tenant.admin.token, { name: unique('old'), select: false });
  await storeAsBefore(legacy, withTests({ 'customers.signup': { accepted_values: ['someday'] } }));
  othersWorkspace = await createWorkspace(server, other.admin.token, { target_schema: baseSchema() });
  workspace = await createWorkspace(server, tenant.admin.token, { target_schema: baseSchema() });
  const selected = await api('POST', '/api/workspaces/select', {
    token: viewer.token,
    body: { workspace_name: workspace },
  });
  expect(selected.status).toBe(200);
}, 120_000);

afterAll(async () => {
  await server?.close();
});

describe('POST /api/workspaces/{name}/config', () => {
  it('refuses every test that does not apply at once, with where and why, and stores nothing of the request', async () => {
    const before = await config();
    expect(before.body.target_schema.tables[1].columns[1].tests).toEqual({
      relationships: { to: 'customers', field: 'customer_id' },
    });
    const res = await api('POST', `/api/workspaces/${workspace}/config`, {
      body: { description: 'renamed with the schema', target_schema: misfits() },
    });
    expect(res.status).toBe(400);
    expect(res.body.code).toBe('BAD_REQUEST');
    expect(res.body.issues).toEqual(MISFIT_ISSUES(['target_schema']));
    expect(res.body.message).toBe(
      MISFIT_ISSUES([])
        .map((i) => i.message)
        .join('; '),
    );
    // The description of the same request was not stored either.
    expect((await config()).body).toEqual(before.body);
  });

  it('refuses a change of type that leaves another column’s test without its sense', async () => {
    const before = await config();
    const retyped = baseSchema();
    columnOf(retyped, 'customers', 'customer_id').type = 'text';
    const res = await api('POST', `/api/workspaces/${workspace}/config`, {
      body: { target_schema: retyped },
    });
    expect(res.status).toBe(400);
    expect(res.body.issues).toEqual([
      {
        path: ['target_schema', 'tables', 1, 'columns', 1, 'tests', 'relationships', 'field'],
        message:
          'relationships does not apply to column orders.customer_id of type integer: customers.customer_id is text, and integer values cannot be compared with text ones',
      },
    ]);
    // A test naming a table the schema does not have (dbt renders it as ref('segments')).
    const dangling = withTests({ 'orders.order_id': { relationships: { to: 'segments', field: 'id' } } });
    const refused = await api('POST', `/api/workspaces/${workspace}/config`, {
      body: { target_schema: dangling },
    });
    expect(refused.status).toBe(400);
    expect(refused.body.message).toBe('relationships.to: segments is not a table of the target schema');
    expect((await config()).body).toEqual(before.body);
  });

  it('stores the tests that apply, and GET …/test finds no problem in them', async () => {
    const res = await api('POST', `/api/workspaces/${workspace}/config`, { body: { target_schema: fits() } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect((await config()).body.target_schema).toEqual(res.body.target_schema);
    const signup = await api('GET', '/api/api/schema/config/columns/customers/signup/test');
    expect(signup.body).toMatchObject({
      configured: true,
      config: { accepted_values: ['2024-01-01'], range: { min: '2020-01-01' } },
      problems: [],
    });
  });

  it('answers a caller it refuses as before: 401 without credentials, 403 to a viewer, 404 to another organization', async () => {
    const before = await config();
    const body = { target_schema: misfits() };
    const path = `/api/workspaces/${workspace}/config`;
    expect((await api('POST', path, { body, token: null })).status).toBe(401);
    expect((await api('POST', path, { body, token: viewer.token })).status).toBe(403);
    const foreign = await api('POST', path, { body, token: other.admin.token });
    expect(foreign.status).toBe(404);
    expect(foreign.body.issues).toBeUndefined();
    expect((await config()).body).toEqual(before.body);
  });
});

describe('POST /api/schemas/workspace (schema.json upload)', () => {
  it('refuses what does not apply at its place in the request and stores nothing; stores what applies', async () => {
    const before = await schemaJson();
    const res = await api('POST', '/api/schemas/workspace', { body: { schema: misfits() } });
    expect(res.status).toBe(400);
    expect(res.body.issues).toEqual(MISFIT_ISSUES(['schema']));
    expect((await schemaJson()).body).toEqual(before.body);

    for (const token of [null, viewer.token]) {
      const refused = await api('POST', '/api/schemas/workspace', { body: { schema: misfits() }, token });
      expect(refused.status).toBe(token ? 403 : 401);
    }
    expect((await schemaJson()).body).toEqual(before.body);

    const next = fits();
    columnOf(next, 'orders', 'total').tests = { range: { min: '0', max: 1e6 } };
    const saved = await api('POST', '/api/schemas/workspace', { body: { schema: next } });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    expect(columnOf(saved.body.schema, 'orders', 'total').tests).toEqual({ range: { min: '0', max: 1e6 } });
  });
});

describe('POST /api/schemas/workspace/tables/{table}/columns', () => {
  const path = '/api/schemas/workspace/tables/orders/columns';

  it('refuses a new column whose tests do not apply to its type, and adds one whose tests do', async () => {
    const before = await schemaJson();
    const res = await api('POST', path, {
      body: { column: { name: 'placed', type: 'timestamptz', tests: { range: { min: 0 }, regex: '^2' } } },
    });
    expect(res.status).toBe(400);
    expect(res.body.issues).toEqual([
      {
        path: ['column', 'tests', 'range', 'min'],
        message:
          'range does not apply to column orders.placed of type timestamptz: min 0 is not an ISO date or timestamp',
      },
      {
        path: ['column', 'tests', 'regex'],
        message:
          'regex does not apply to column orders.placed of type timestamptz: a regular expression matches text',
      },
    ]);
    expect((await schemaJson()).body).toEqual(before.body);
    const column = { name: 'placed', type: 'timestamptz', tests: { range: { min: '2020-01-01T00:00:00Z' } } };
    expect((await api('POST', path, { body: { column }, token: null })).status).toBe(401);
    expect((await api('POST', path, { body: { column }, token: viewer.token })).status).toBe(403);
    expect((await schemaJson()).body).toEqual(before.body);

    const added = await api('POST', path, { body: { column } });
    expect(added.status, JSON.stringify(added.body)).toBe(200);
    expect(columnOf(added.body.schema, 'orders', 'placed').tests).toEqual(column.tests);
  });
});

describe('a schema copied from another workspace', () => {
  it('is refused when it brings a test that does not apply; another organization’s workspace is not found', async () => {
    const before = await schemaJson();
    const res = await api('POST', '/api/workspaces/target-schema/assign', {
      body: { from_workspace: legacy },
    });
    expect(res.status).toBe(400);
    expect(res.body.issues).toEqual([
      {
        path: ['from_workspace'],
        message:
          'accepted_values does not apply to column customers.signup of type date: "someday" is not an ISO date or timestamp',
      },
    ]);
    const foreign = await api('POST', '/api/workspaces/target-schema/assign', {
      body: { from_workspace: othersWorkspace },
    });
    expect(foreign.status).toBe(404);
    expect(
      (
        await api('POST', '/api/workspaces/target-schema/assign', {
          body: { from_workspace: legacy },
          token: null,
        })
      ).status,
    ).toBe(401);
    expect((await schemaJson()).body).toEqual(before.body);
  });

  it('is copied when its tests apply; so are library templates', async () => {
    const source = await createWorkspace(server, tenant.admin.token, {
      select: false,
      target_schema: fits(),
    });
    const copied = await api('POST', '/api/workspaces/target-schema/assign', {
      body: { from_workspace: source },
    });
    expect(copied.status, JSON.stringify(copied.body)).toBe(200);
    expect((await schemaJson()).body.schema).toEqual((await config(source)).body.target_schema);

    const templates = (await api('GET', '/api/schemas/templates')).body.templates;
    expect(templates.length).toBeGreaterThan(0);
    for (const { name } of templates) {
      const assigned = await api('POST', `/api/schemas/templates/${name}/assign`);
      expect(assigned.status, `${name}: ${JSON.stringify(assigned.body)}`).toBe(200);
      const created = await api('POST', '/api/workspaces/create', {
        body: { name: unique('tpl'), template_name: name, select: false },
      });
      expect(created.status, `${name}: ${JSON.stringify(created.body)}`).toBe(200);
    }
  });
});

describe('a schema stored before the rule', () => {
  it('saves again with its old test; the same problem new at another column is refused', async () => {
    const stored = (await config(legacy)).body;
    expect(columnOf(stored.target_schema, 'customers', 'signup').tests).toEqual({
      accepted_values: ['someday'],
    });
    // Sent back as GET gave it, with an edit elsewhere that applies: the old test is no new problem.
    const edited = structuredClone(stored.target_schema) as Schema;
    columnOf(edited, 'customers', 'tier').tests = { accepted_values: ['gold'] };
    const saved = await api('POST', `/api/workspaces/${legacy}/config`, {
      body: { description: 'kept', target_schema: edited },
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    expect((await config(legacy)).body).toMatchObject({ description: 'kept', target_schema: edited });

    // The same problem written into another column is new there.
    columnOf(edited, 'customers', 'tier').tests = undefined;
    columnOf(edited, 'customers', 'active').tests = { accepted_values: ['someday'] };
    const refused = await api('POST', `/api/workspaces/${legacy}/config`, {
      body: { target_schema: edited },
    });
    expect(refused.status).toBe(400);
    expect(refused.body.issues).toEqual([
      {
        path: ['target_schema', 'tables', 0, 'columns', 3, 'tests', 'accepted_values', 0],
        message:
          'accepted_values does not apply to column customers.active of type boolean: "someday" is not true or false',
      },
    ]);
    expect((await config(legacy)).body.target_schema).toEqual(saved.body.target_schema);
  });
});
