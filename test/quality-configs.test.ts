import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, unique, type Tenant, type TestUser } from './helpers/api.ts';
import { pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';
import { generateDbtProject } from '../src/transform/dbt.ts';
import { runColumnTests } from '../src/quality/rules.ts';

/*
 * Column test, column monitoring and table monitoring configs, their summary, and reverse-ETL
 * connections. The target warehouse and the source are a real PostgreSQL scratch database on
 * 127.0.0.1:5432 (created here, dropped at the end).
 */
const warehouse = scratchDatabase('qc');

const connection = (schemas: string[], overrides: Record<string, unknown> = {}) =>
  pgConfig(warehouse.name, { schemas, ...overrides });

const schemaDoc = () => ({
  name: 'shop-target',
  version: '1.0.0',
  tables: [
    {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false },
        { name: 'email', type: 'text' },
        { name: 'tier', type: 'text' },
        { name: 'lifetime_value', type: 'numeric' },
        { name: 'is_active', type: 'boolean' },
        { name: 'created_at', type: 'timestamptz' },
      ],
    },
    {
      name: 'orders',
      primary_key: ['order_id'],
      columns: [
        { name: 'order_id', type: 'integer', nullable: false },
        { name: 'customer_id', type: 'integer' },
        { name: 'amount', type: 'numeric' },
        { name: 'ordered_at', type: 'timestamptz' },
      ],
    },
  ],
});

let server: TestServer;
let a: Tenant;
let b: Tenant;
let viewer: TestUser;
let editor: TestUser;
const workspace = unique('qc');
const cfg = '/api/api/schema/config';
const testPath = (table: string, column: string) => `${cfg}/columns/${table}/${column}/test`;
const colMonPath = (table: string, column: string) => `${cfg}/columns/${table}/${column}/monitoring`;
const tableMonPath = (table: string) => `${cfg}/tables/${table}/monitoring`;

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema shop;
     create table shop.contacts (id int primary key, email text, updated_at timestamptz, score int);
     insert into shop.contacts values (1, 'a@x.io', now(), 3), (2, null, now(), 5);`);
  server = await startTestServer();
  a = await createTenant(server);
  b = await createTenant(server);
  viewer = await a.addUser(['viewer']);
  editor = await a.addUser(['editor']);
  for (const [tenant, name] of [
    [a, workspace],
    [b, 'other'],
  ] as const) {
    await createWorkspace(server, tenant.admin.token, {
      name,
      target_config: connection(['mart']),
      source_config: connection(['shop']),
    });
    const saved = await call(server, 'POST', '/api/schemas/workspace', {
      token: tenant.admin.token,
      body: { schema: schemaDoc() },
    });
    expect(saved.status).toBe(200);
  }
  for (const user of [viewer, editor])
    await call(server, 'POST', '/api/workspaces/select', {
      token: user.token,
      body: { workspace_name: workspace },
    });
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('column test configs', () => {
  it('stores tests on the schema.json column, where GET and the workspace schema show them', async () => {
    const empty = await call(server, 'GET', testPath('customers', 'email'), { token: viewer.token });
    expect(empty.status).toBe(200);
    expect(empty.body).toMatchObject({ configured: false, config: null, table_name: 'customers' });

    const put = await call(server, 'PUT', testPath('customers', 'email'), {
      token: editor.token,
      body: { config: { not_null: true, unique: true, regex: '^[^@]+@[^@]+$' } },
    });
    expect(put.status, JSON.stringify(put.body)).toBe(200);
    expect(put.body).toMatchObject({
      workspace_name: workspace,
      schema_type: 'target',
      column_name: 'email',
      configured: true,
      config: { not_null: true, unique: true, regex: '^[^@]+@[^@]+$', severity: 'error' },
    });
    for (const [table, column, config] of [
      ['customers', 'tier', { accepted_values: ['gold', 'silver', 'basic'], severity: 'warning' }],
      ['customers', 'lifetime_value', { range: { min: 0, max: 1_000_000 } }],
      ['orders', 'customer_id', { relationships: { to: 'customers', field: 'customer_id' } }],
    ] as const) {
      const res = await call(server, 'PUT', testPath(table, column), {
        token: editor.token,
        body: { config },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
    }
    const got = await call(server, 'GET', testPath('customers', 'tier'), { token: viewer.token });
    expect(got.body.config).toEqual({ accepted_values: ['gold', 'silver', 'basic'], severity: 'warning' });
    const schema = await call(server, 'GET', '/api/schemas/workspace', { token: viewer.token });
    const email = schema.body.schema.tables[0].columns.find((c: { name: string }) => c.name === 'email');
    expect(email.tests).toMatchObject({ not_null: true, unique: true });
  });

  it('feeds the dbt project and the quality runner as stored', async () => {
    const schema = (await call(server, 'GET', '/api/schemas/workspace', { token: viewer.token })).body.schema;
    const customers = schema.tables.find((t: { name: string }) => t.name === 'customers');
    const files = await generateDbtProject({
      projectName: 'qc',
      models: [
        {
          mapping: {
            table_name: 'customers',
            tables: { contacts: { relationship: 'primary' } },
            connections: [
              {
                source_field: 'contacts.id',
                target_field: 'customer_id',
                status: 'confirmed',
                confidence: 1,
              },
              { source_field: 'contacts.email', target_field: 'email', status: 'confirmed', confidence: 1 },
            ],
          },
          target: customers,
        },
      ],
      defaultSourceSchema: 'shop',
    });
    const model = parseYaml(files.find((f) => f.path === 'models/schema.yml')!.content).models[0];
    const tests = (name: string) => model.columns.find((c: { name: string }) => c.name === name)?.data_tests;
    expect(tests('email')).toEqual(['unique', 'not_null']);
    expect(tests('tier')).toEqual([{ accepted_values: { values: ['gold', 'silver', 'basic'] } }]);

    // The summary's configs run unchanged through the quality runner on a real table.
    await warehouse.sql(`create schema mart;
       create table mart.customers (customer_id int, email text, tier text, lifetime_value numeric);
       insert into mart.customers values (1, 'a@x.io', 'gold', 10), (2, 'bad-email', 'GOLD', -5), (3, null, 'basic', 2);`);
    const summary = await call(server, 'GET', `${cfg}/summary`, { token: viewer.token });
    const onCustomers = summary.body.column_tests
      .filter((t: { table_name: string }) => t.table_name === 'customers')
      .map((t: { column_name: string; config: unknown }) => ({ column: t.column_name, config: t.config }));
    const results = await withClient(warehouse.url, (client) =>
      runColumnTests(client, { schema: 'mart', name: 'customers' }, onCustomers),
    );
    const failing = Object.fromEntries(results.map((r) => [`${r.column}.${r.check}`, r.measured]));
    expect(failing).toEqual({
      'email.not_null': 1,
      'email.unique': 0,
      'email.regex': 1,
      'tier.accepted_values': 1,
      'lifetime_value.range': 1,
    });
  });

  it('answers 400 for bad configs', async () => {
    const put = (table: string, column: string, config: unknown) =>
      call(server, 'PUT', testPath(table, column), { token: editor.token, body: { config } });
    for (const [table, column, config, pattern] of [
      ['customers', 'email', { not_nul: true }, /not_nul|Unrecognized/],
      ['customers', 'email', {}, /at least one test/],
      ['customers', 'email', { regex: '(unclosed' }, /regex/],
      ['orders', 'customer_id', { relationships: { to: 'nope', field: 'id' } }, /not a table/],
      ['orders', 'customer_id', { relationships: { to: 'customers', field: 'nope' } }, /no column nope/],
      ['customers', 'lifetime_value', { range: { min: 'abc' } }, /abc\\" is not a number/],
      ['customers', 'lifetime_value', { range: { min: 5, max: 1 } }, /min is greater/],
      ['customers', 'is_active', { range: { min: 0 } }, /does not apply/],
      ['customers', 'created_at', { range: { min: 'yesterday' } }, /ISO date/],
      ['customers', 'customer_id', { accepted_values: ['x'] }, /x\\" is not a number/],
    ] as const) {
      const res = await put(table, column, config);
      expect(res.status, `${JSON.stringify(config)} → ${JSON.stringify(res.body)}`).toBe(400);
      expect(JSON.stringify(res.body)).toMatch(pattern);
    }
    expect(
      (await call(server, 'PUT', testPath('customers', 'email'), { token: editor.token, body: {} })).status,
    ).toBe(400);
  });

  it('answers 404 for unknown tables and columns, 401 and 403', async () => {
    for (const [method, path] of [
      ['GET', testPath('customers', 'nope')],
      ['GET', testPath('nope', 'email')],
      ['PUT', testPath('customers', 'nope')],
      ['DELETE', testPath('nope', 'email')],
    ] as const) {
      const res = await call(server, method, path, {
        token: editor.token,
        body: method === 'PUT' ? { config: { not_null: true } } : undefined,
      });
      expect(res.status, `${method} ${path}`).toBe(404);
    }
    expect((await call(server, 'GET', testPath('customers', 'email'))).status).toBe(401);
    const asViewer = await call(server, 'PUT', testPath('customers', 'email'), {
      token: viewer.token,
      body: { config: { unique: true } },
    });
    expect(asViewer.status).toBe(403);
    expect(
      (await call(server, 'DELETE', testPath('customers', 'email'), { token: viewer.token })).status,
    ).toBe(403);
  });

  it('is isolated per tenant: the other organization sees none of these configs', async () => {
    const theirs = await call(server, 'GET', testPath('customers', 'email'), { token: b.admin.token });
    expect(theirs.status).toBe(200);
    expect(theirs.body).toMatchObject({ workspace_name: 'other', configured: false });
    const select = await call(server, 'POST', '/api/workspaces/select', {
      token: b.admin.token,
      body: { workspace_name: workspace },
    });
    expect(select.status).toBe(404);
    const summary = await call(server, 'GET', `${cfg}/summary`, { token: b.admin.token });
    expect(summary.body.totals).toMatchObject({ column_tests: 0, column_monitoring: 0, table_monitoring: 0 });
  });

  it('a hand-written schema.json with malformed tests is refused on save', async () => {
    const doc = schemaDoc();
    (doc.tables[0].columns[1] as Record<string, unknown>).tests = { unique: 'yes' };
    const res = await call(server, 'POST', '/api/schemas/workspace', {
      token: editor.token,
      body: { schema: doc },
    });
    expect(res.status).toBe(400);
    expect(JSON.stringify(res.body)).toMatch(/Column tests of customers.email/);
  });

  it('DELETE removes the tests from the column; a second DELETE is 404', async () => {
    const res = await call(server, 'DELETE', testPath('customers', 'lifetime_value'), {
      token: editor.token,
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ configured: false, config: null });
    expect(
      (await call(server, 'DELETE', testPath('customers', 'lifetime_value'), { token: editor.token })).status,
    ).toBe(404);
    const schema = await call(server, 'GET', '/api/schemas/workspace', { token: viewer.token });
    const column = schema.body.schema.tables[0].columns.find(
      (c: { name: string }) => c.name === 'lifetime_value',
    );
    expect(column.tests).toBeUndefined();
  });
});

describe('monitoring configs', () => {
  it('column monitoring: PUT, GET, DELETE on the target schema', async () => {
    const config = {
      null_rate: { max: 0.05, severity: 'critical' },
      distinct: { min: 10 },
      severity: 'warning',
    };
    const put = await call(server, 'PUT', colMonPath('customers', 'email'), {
      token: editor.token,
      body: { config },
    });
    expect(put.status, JSON.stringify(put.body)).toBe(200);
    expect(put.body).toMatchObject({ configured: true, schema_type: 'target', config });
    expect(put.body.updated_at).toMatch(/^\d{4}-/);
    const replaced = await call(server, 'PUT', colMonPath('customers', 'email'), {
      token: editor.token,
      body: { config: { null_rate: { max: 0.1 } } },
    });
    expect(replaced.body.config).toEqual({ null_rate: { max: 0.1 }, severity: 'warning' });
    const got = await call(server, 'GET', colMonPath('customers', 'email'), { token: viewer.token });
    expect(got.body).toMatchObject({ configured: true, config: { null_rate: { max: 0.1 } } });
    const range = await call(server, 'PUT', colMonPath('orders', 'ordered_at'), {
      token: editor.token,
      body: { config: { range: { min: '2020-01-01', severity: 'info' } } },
    });
    expect(range.status, JSON.stringify(range.body)).toBe(200);
    const del = await call(server, 'DELETE', colMonPath('orders', 'ordered_at'), { token: editor.token });
    expect(del.status).toBe(200);
    expect(del.body.configured).toBe(false);
    expect(
      (await call(server, 'DELETE', colMonPath('orders', 'ordered_at'), { token: editor.token })).status,
    ).toBe(404);
    expect(
      (await call(server, 'GET', colMonPath('orders', 'ordered_at'), { token: viewer.token })).body
        .configured,
    ).toBe(false);
  });

  it('table monitoring: freshness and volume thresholds with severity', async () => {
    const config = {
      freshness: { max_age_seconds: 86_400, column: 'ordered_at', severity: 'error' },
      volume: { min_rows: 1, max_change_ratio: 0.5 },
    };
    const put = await call(server, 'PUT', tableMonPath('orders'), { token: editor.token, body: { config } });
    expect(put.status, JSON.stringify(put.body)).toBe(200);
    expect(put.body).toMatchObject({
      configured: true,
      table_name: 'orders',
      config: { ...config, severity: 'warning' },
    });
    const got = await call(server, 'GET', tableMonPath('orders'), {
      token: viewer.token,
      query: { schema_type: 'target' },
    });
    expect(got.body.config).toEqual(put.body.config);
    const put2 = await call(server, 'PUT', tableMonPath('customers'), {
      token: editor.token,
      body: { config: { volume: { max_rows: 1_000_000 } } },
    });
    expect(put2.status).toBe(200);
  });

  it('answers 400, 401, 403 and 404 as it should', async () => {
    const bad = [
      [colMonPath('customers', 'email'), { null_rate: { max: 2 } }, /null_rate|max/],
      [colMonPath('customers', 'email'), {}, /at least one threshold/],
      [colMonPath('customers', 'email'), { distinct: { min: 5, max: 1 } }, /greater/],
      [
        colMonPath('customers', 'email'),
        { null_rate: { max: 0.1, severity: 'fatal' } },
        /severity|fatal|Invalid/,
      ],
      [tableMonPath('orders'), { freshness: { max_age_seconds: 60, column: 'amount' } }, /not a date/],
      [tableMonPath('orders'), { freshness: { max_age_seconds: 60, column: 'nope' } }, /no column nope/],
      [tableMonPath('orders'), { volume: { min_rows: 10, max_rows: 1 } }, /greater/],
      [tableMonPath('orders'), { freshness: { max_age_seconds: -1 } }, /max_age_seconds|small|positive|>0/i],
    ] as const;
    for (const [path, config, pattern] of bad) {
      const res = await call(server, 'PUT', path, { token: editor.token, body: { config } });
      expect(res.status, `${path} ${JSON.stringify(config)} → ${JSON.stringify(res.body)}`).toBe(400);
      expect(JSON.stringify(res.body)).toMatch(pattern);
    }
    const badType = await call(server, 'GET', tableMonPath('orders'), {
      token: viewer.token,
      query: { schema_type: 'lake' },
    });
    expect(badType.status).toBe(400);
    for (const path of [colMonPath('customers', 'nope'), colMonPath('nope', 'email'), tableMonPath('nope')]) {
      const config = path.includes('/tables/') ? { volume: { min_rows: 1 } } : { null_rate: { max: 0.1 } };
      expect((await call(server, 'GET', path, { token: viewer.token })).status, path).toBe(404);
      expect((await call(server, 'PUT', path, { token: editor.token, body: { config } })).status, path).toBe(
        404,
      );
      expect((await call(server, 'DELETE', path, { token: editor.token })).status, path).toBe(404);
    }
    expect((await call(server, 'GET', tableMonPath('orders'))).status).toBe(401);
    expect(
      (
        await call(server, 'PUT', tableMonPath('orders'), {
          token: viewer.token,
          body: { config: { volume: { min_rows: 1 } } },
        })
      ).status,
    ).toBe(403);
    expect((await call(server, 'DELETE', tableMonPath('orders'), { token: viewer.token })).status).toBe(403);
    const theirs = await call(server, 'GET', tableMonPath('orders'), { token: b.admin.token });
    expect(theirs.body).toMatchObject({ workspace_name: 'other', configured: false });
  });

  it('schema_type=source validates against the source database', async () => {
    const put = await call(server, 'PUT', tableMonPath('contacts'), {
      token: editor.token,
      body: { schema_type: 'source', config: { freshness: { max_age_seconds: 3600, column: 'updated_at' } } },
    });
    expect(put.status, JSON.stringify(put.body)).toBe(200);
    expect(put.body).toMatchObject({ schema_type: 'source', table_name: 'shop.contacts', configured: true });
    const col = await call(server, 'PUT', colMonPath('shop.contacts', 'score'), {
      token: editor.token,
      body: { schema_type: 'source', config: { range: { min: 0, max: 10 } } },
    });
    expect(col.status, JSON.stringify(col.body)).toBe(200);
    const got = await call(server, 'GET', colMonPath('contacts', 'score'), {
      token: viewer.token,
      query: { schema_type: 'source' },
    });
    expect(got.body).toMatchObject({
      configured: true,
      table_name: 'shop.contacts',
      config: { range: { min: 0, max: 10 } },
    });
    // schema_type may come in the query of a PUT as well.
    const byQuery = await call(server, 'PUT', colMonPath('contacts', 'score'), {
      token: editor.token,
      query: { schema_type: 'source' },
      body: { config: { range: { min: 1, max: 9 } } },
    });
    expect(byQuery.status, JSON.stringify(byQuery.body)).toBe(200);
    expect(byQuery.body).toMatchObject({ schema_type: 'source', table_name: 'shop.contacts' });
    // The target side of the same names is separate.
    expect((await call(server, 'GET', tableMonPath('contacts'), { token: viewer.token })).status).toBe(404);
    const missing = await call(server, 'GET', colMonPath('contacts', 'nope'), {
      token: viewer.token,
      query: { schema_type: 'source' },
    });
    expect(missing.status).toBe(404);
    const missingTable = await call(server, 'GET', tableMonPath('ghosts'), {
      token: viewer.token,
      query: { schema_type: 'source' },
    });
    expect(missingTable.status).toBe(404);
  });

  it('summary counts everything and flags configs whose column left schema.json', async () => {
    const next = schemaDoc();
    next.tables[0].columns = next.tables[0].columns.filter((c) => c.name !== 'email');
    // Keep the stored tests of the columns that stay.
    const current = (await call(server, 'GET', '/api/schemas/workspace', { token: viewer.token })).body
      .schema;
    next.tables = current.tables.map((t: { name: string; columns: { name: string }[] }) =>
      t.name === 'customers' ? { ...t, columns: t.columns.filter((c) => c.name !== 'email') } : t,
    );
    const saved = await call(server, 'POST', '/api/schemas/workspace', {
      token: editor.token,
      body: { schema: next },
    });
    expect(saved.status).toBe(200);
    const res = await call(server, 'GET', `${cfg}/summary`, { token: viewer.token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.totals).toEqual({
      column_tests: 2,
      column_monitoring: 2,
      table_monitoring: 3,
      tables_covered: 3,
      orphaned: 1,
    });
    expect(res.body.tests_by_kind).toMatchObject({ accepted_values: 1, relationships: 1, not_null: 0 });
    const orphan = res.body.column_monitoring.find((c: { column_name: string }) => c.column_name === 'email');
    expect(orphan).toMatchObject({ schema_type: 'target', table_name: 'customers', orphaned: true });
    expect((await call(server, 'GET', `${cfg}/summary`)).status).toBe(401);
  });
});

describe('reverse-ETL connections', () => {
  const destinations = () => [
    {
      name: 'crm-db',
      ...pgConfig(warehouse.name, { password: 's3cret-pw' }),
      schema: 'crm',
    },
    { name: 'backup-db', ...pgConfig(warehouse.name, { password: 'tok-123' }), schema: 'backup' },
    { name: 'export-db', ...pgConfig(warehouse.name), schema: 'export' },
  ];

  it('defines destinations in the workspace settings with secrets sealed and never returned', async () => {
    const res = await call(server, 'PUT', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: { workspace_name: workspace, reverse_etl_connections: destinations() },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const text = JSON.stringify(res.body);
    expect(text).not.toContain('s3cret-pw');
    expect(text).not.toContain('tok-123');
    expect(res.body.settings.reverse_etl_connections[0]).toMatchObject({
      name: 'crm-db',
      password_set: true,
    });
    expect(res.body.settings.reverse_etl_connections[1]).toMatchObject({
      name: 'backup-db',
      password_set: true,
    });
    const [row] = await server.deps.orm.em
      .fork()
      .getConnection()
      .execute(`select settings from workspaces where name = ? and organization_id = ?`, [
        workspace,
        a.organization.id,
      ]);
    const stored = row.settings.reverse_etl_connections;
    expect(stored[0].password).toMatch(/^v1/);
    expect(server.deps.secrets.decrypt(stored[0].password)).toBe('s3cret-pw');
    expect(server.deps.secrets.decrypt(stored[1].password)).toBe('tok-123');
    const config = await call(server, 'GET', `/api/workspaces/${workspace}/config`, { token: viewer.token });
    expect(JSON.stringify(config.body)).not.toMatch(/s3cret-pw|tok-123|"password"|"secret"/);
    const diff = await call(server, 'GET', `/api/workspaces/${workspace}/git-diff`, { token: viewer.token });
    expect(diff.status).toBe(200);
    expect(JSON.stringify(diff.body)).toContain('password_set');
    expect(JSON.stringify(diff.body)).not.toMatch(
      new RegExp(stored[0].password.slice(0, 20).replace(/[+/]/g, '.')),
    );

    // Sent back as read (masked), the stored secrets stay; a changed host drops the password.
    const masked = res.body.settings.reverse_etl_connections;
    await call(server, 'PUT', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: { workspace_name: workspace, reverse_etl_connections: masked },
    });
    const moved = [{ ...masked[0], host: 'elsewhere.example.com' }, masked[1], masked[2]];
    const after = await call(server, 'PUT', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: { workspace_name: workspace, reverse_etl_connections: moved },
    });
    expect(after.body.settings.reverse_etl_connections[0].password_set).toBe(false);
    expect(after.body.settings.reverse_etl_connections[1].password_set).toBe(true);
    await call(server, 'PUT', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: { workspace_name: workspace, reverse_etl_connections: destinations() },
    });
    const invalid = await call(server, 'PUT', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: {
        workspace_name: workspace,
        reverse_etl_connections: [{ ...destinations()[2], name: 'x', port: 0 }],
      },
    });
    expect(invalid.status).toBe(400);
    const dup = await call(server, 'PUT', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: { workspace_name: workspace, reverse_etl_connections: [destinations()[2], destinations()[2]] },
    });
    expect(dup.status).toBe(400);
  });

  it('lists the connections and assigns or removes one per table', async () => {
    const list = await call(server, 'GET', '/api/schemas/workspace/connections', { token: viewer.token });
    expect(list.status, JSON.stringify(list.body)).toBe(200);
    expect(list.body.defined_in).toBe('workspace');
    expect(list.body.connections.map((c: { name: string }) => c.name)).toEqual([
      'crm-db',
      'backup-db',
      'export-db',
    ]);
    expect(JSON.stringify(list.body)).not.toMatch(/s3cret-pw|tok-123/);
    expect(list.body.connections[0]).toMatchObject({
      type: 'postgres',
      password_set: true,
      assigned_tables: [],
    });

    const assign = await call(server, 'PUT', '/api/schemas/workspace/tables/customers/connection', {
      token: editor.token,
      body: { connection_name: 'crm-db', destination_table: 'crm_customers' },
    });
    expect(assign.status, JSON.stringify(assign.body)).toBe(200);
    expect(assign.body).toMatchObject({
      assigned: true,
      table_name: 'customers',
      destination_table: 'crm_customers',
      connection: { name: 'crm-db', password_set: true },
    });
    expect(JSON.stringify(assign.body)).not.toContain('s3cret-pw');
    await call(server, 'PUT', '/api/schemas/workspace/tables/orders/connection', {
      token: editor.token,
      body: { connection_name: 'export-db' },
    });
    const listed = await call(server, 'GET', '/api/schemas/workspace/connections', { token: viewer.token });
    expect(listed.body.connections[0].assigned_tables).toEqual(['customers']);
    expect(listed.body.assignments).toEqual([
      expect.objectContaining({ table_name: 'customers', connection_name: 'crm-db' }),
      expect.objectContaining({ table_name: 'orders', connection_name: 'export-db' }),
    ]);

    const removed = await call(server, 'PUT', '/api/schemas/workspace/tables/orders/connection', {
      token: editor.token,
      body: { connection_name: null },
    });
    expect(removed.status).toBe(200);
    expect(removed.body).toMatchObject({ assigned: false, connection: null });
    const final = await call(server, 'GET', '/api/schemas/workspace/connections', { token: viewer.token });
    expect(final.body.assignments.map((x: { table_name: string }) => x.table_name)).toEqual(['customers']);
  });

  it('answers 400, 401, 403 and 404, and another tenant sees nothing', async () => {
    const put = (table: string, body: unknown, token = editor.token) =>
      call(server, 'PUT', `/api/schemas/workspace/tables/${table}/connection`, { token, body });
    expect((await put('customers', { connection_name: 'nope' })).status).toBe(404);
    expect((await put('nope', { connection_name: 'crm-db' })).status).toBe(404);
    expect((await put('customers', { connection_name: 'crm-db', mode: 'upsert' })).status).toBe(400);
    expect((await put('customers', {})).status).toBe(400);
    expect((await put('customers', { connection_name: 'crm-db' }, viewer.token)).status).toBe(403);
    expect((await call(server, 'GET', '/api/schemas/workspace/connections')).status).toBe(401);
    const theirs = await call(server, 'GET', '/api/schemas/workspace/connections', { token: b.admin.token });
    expect(theirs.body).toMatchObject({ workspace_name: 'other', connections: [], assignments: [] });
    expect((await put('customers', { connection_name: 'crm-db' }, b.admin.token)).status).toBe(404);
  });
});
