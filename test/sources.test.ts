import { mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  call,
  createTenant,
  createWorkspace,
  login,
  unique,
  type Tenant,
  type TestUser,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';
import { SUPERADMIN_PASSWORD, SUPERADMIN_USERNAME, TEST_SECRET_KEY } from './helpers/constants.ts';
import { demoSchemaSql, demoSourceStatements } from '../seeds/demo-source/generate.ts';
import { loadEnv } from '../src/env.ts';
import { openDatabase } from '../src/db/orm.ts';
import { createLogger } from '../src/logger.ts';
import { startServer, type RunningServer } from '../src/server.ts';
import { connectionConfigSchema } from '../src/warehouse/config.ts';
import * as sources from '../src/modules/sources/sources.service.ts';
import type { EntityManager } from '@mikro-orm/postgresql';

/*
 * The sources routes over a real PostgreSQL source: a database of its own on 127.0.0.1:5432 holding
 * the demo shop data set, created here and dropped at the end (both test modes).
 */
const source = scratchDatabase('src');

const sourceConfig = (overrides: Record<string, unknown> = {}) =>
  pgConfig(source.name, {
    password: 'not-needed-with-trust',
    schemas: ['shop'],
    tables: ['customers', 'shop.orders'],
    ctes: [
      {
        name: 'big_spenders',
        // Ending in a comment, as an editor leaves it.
        sql: 'select customer_id, sum(total_amount) as spent from shop.orders group by customer_id having sum(total_amount) > 500 -- the top',
        description: 'Customers above 500 in total',
      },
      { name: 'broken', sql: 'select * from shop.no_such_table' },
      { name: 'finished', sql: 'select 1 as one;' },
    ],
    ...overrides,
  });

let server: TestServer;
let tenant: Tenant;
let viewer: TestUser;

async function select(token: string, name: string) {
  const res = await call(server, 'POST', '/api/workspaces/select', { token, body: { workspace_name: name } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
}

beforeAll(async () => {
  await source.create();
  await withClient(source.url, async (client) => {
    for (const statement of [demoSchemaSql(), ...demoSourceStatements(), 'analyze'])
      await client.query(statement);
  });
  server = await startTestServer({ WAREHOUSE_STATEMENT_TIMEOUT_MS: '1000', WAREHOUSE_ROW_CAP: '200' });
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, { name: 'shop', source_config: sourceConfig() });
  viewer = await tenant.addUser(['viewer']);
  await select(viewer.token, 'shop');
});

afterAll(async () => {
  await server?.close();
  await source.drop();
});

describe('GET /api/sources/unified-schema', () => {
  it('lists CTEs first, then every table with columns, keys and estimated rows', async () => {
    const res = await call(server, 'GET', '/api/sources/unified-schema', { token: viewer.token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({
      workspace_name: 'shop',
      schema_type: 'source',
      database: source.name,
      schemas: ['shop'],
      missing_schemas: [],
      flatten: false,
      table_count: 9,
    });
    const names = res.body.tables.map((t: { qualified_name: string }) => t.qualified_name);
    expect(names.slice(0, 3)).toEqual(['big_spenders', 'broken', 'finished']);
    expect(names.slice(3).sort()).toEqual(
      ['crm_contacts', 'customers', 'order_items', 'orders', 'products', 'web_events'].map(
        (n) => `shop.${n}`,
      ),
    );
    const [spenders, broken, finished] = res.body.tables;
    expect(spenders).toMatchObject({
      kind: 'cte',
      schema: null,
      description: 'Customers above 500 in total',
    });
    expect(spenders.columns.map((c: { name: string; type: string }) => [c.name, c.type])).toEqual([
      ['customer_id', 'integer'],
      ['spent', 'numeric'],
    ]);
    expect(broken.error).toMatch(/no_such_table/);
    // A final semicolon and a final comment are the CTE's own, not the query's it is read in.
    expect(finished.columns.map((c: { name: string }) => c.name)).toEqual(['one']);
    const orders = res.body.tables.find((t: { name: string }) => t.name === 'orders');
    expect(orders).toMatchObject({ kind: 'table', primary_key: ['order_id'], estimated_rows: 3500 });
    expect(orders.columns.find((c: { name: string }) => c.name === 'customer_id')).toMatchObject({
      type: 'integer',
      nullable: true,
      is_primary_key: false,
      references: { schema: 'shop', table: 'customers', column: 'customer_id' },
    });
  });

  it('flattens to one row per column, CTE columns first', async () => {
    const res = await call(server, 'GET', '/api/sources/unified-schema', {
      token: tenant.admin.token,
      query: { flatten: true },
    });
    expect(res.status).toBe(200);
    expect(res.body.tables).toBeUndefined();
    expect(res.body.columns.length).toBe(res.body.column_count);
    expect(res.body.columns[0]).toMatchObject({
      table: 'big_spenders',
      table_kind: 'cte',
      column: 'customer_id',
    });
    expect(res.body.columns).toContainEqual(
      expect.objectContaining({
        table: 'shop.customers',
        column: 'email',
        type: 'text',
        is_primary_key: false,
      }),
    );
    const off = await call(server, 'GET', '/api/sources/unified-schema', {
      token: tenant.admin.token,
      query: { flatten: false },
    });
    expect(off.body.flatten).toBe(false);
  });

  it('refuses an unknown schema_type and an anonymous caller', async () => {
    const bad = await call(server, 'GET', '/api/sources/unified-schema', {
      token: viewer.token,
      query: { schema_type: 'sideways' },
    });
    expect(bad.status).toBe(400);
    expect((await call(server, 'GET', '/api/sources/unified-schema')).status).toBe(401);
  });
});

describe('GET /api/sources/source-schema', () => {
  it('is restricted to the selected tables', async () => {
    const res = await call(server, 'GET', '/api/sources/source-schema', { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body.selected_tables).toEqual(['customers', 'shop.orders']);
    expect(res.body.tables.map((t: { name: string }) => t.name).sort()).toEqual(['customers', 'orders']);
    const customers = res.body.tables.find((t: { name: string }) => t.name === 'customers');
    expect(customers.description).toMatch(/Web shop accounts/);
    expect(customers.columns[0]).toMatchObject({
      name: 'customer_id',
      is_primary_key: true,
      nullable: false,
    });
    expect((await call(server, 'GET', '/api/sources/source-schema')).status).toBe(401);
  });

  it('names the configured schemas the database does not have (names are case-sensitive)', async () => {
    // A misspelt schema gave an empty listing and nothing else.
    const misspelt = await createTenant(server);
    await createWorkspace(server, misspelt.admin.token, {
      name: 'misspelt',
      select: true,
      source_config: pgConfig(source.name, { schemas: ['Shop', 'shop', 'nope'] }),
    });
    const res = await call(server, 'GET', '/api/sources/source-schema', { token: misspelt.admin.token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ schemas: ['shop'], missing_schemas: ['Shop', 'nope'] });
  });
});

describe('GET /api/sources/sample-values/{table_name}/{column_name}', () => {
  it('returns distinct values, most frequent first, bounded by limit', async () => {
    const res = await call(server, 'GET', '/api/sources/sample-values/customers/country', {
      token: viewer.token,
      query: { limit: 5 },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ table_name: 'customers', column_name: 'country', limit: 5 });
    expect(res.body.values).toHaveLength(5);
    const counts = res.body.values.map((v: { count: number }) => v.count);
    expect(counts).toEqual([...counts].sort((a, b) => b - a));
    const qualified = await call(server, 'GET', '/api/sources/sample-values/shop.orders/status', {
      token: viewer.token,
    });
    expect(qualified.body.values.map((v: { value: string }) => v.value)).toEqual(
      expect.arrayContaining(['completed', 'Completed', 'COMPLETE', 'cancelled']),
    );
  });

  it('samples a CTE of the source config', async () => {
    const res = await call(server, 'GET', '/api/sources/sample-values/big_spenders/customer_id', {
      token: viewer.token,
      query: { limit: 3 },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.values).toHaveLength(3);
  });

  it('answers 400 above 1000, 404 for unknown tables and columns', async () => {
    const over = await call(server, 'GET', '/api/sources/sample-values/customers/country', {
      token: viewer.token,
      query: { limit: 1001 },
    });
    expect(over.status).toBe(400);
    const max = await call(server, 'GET', '/api/sources/sample-values/customers/email', {
      token: viewer.token,
      query: { limit: 1000 },
    });
    expect(max.status).toBe(200);
    expect(max.body.values).toHaveLength(1000);
    expect(
      (await call(server, 'GET', '/api/sources/sample-values/customers/nope', { token: viewer.token }))
        .status,
    ).toBe(404);
    expect(
      (await call(server, 'GET', '/api/sources/sample-values/no_table/email', { token: viewer.token }))
        .status,
    ).toBe(404);
    expect((await call(server, 'GET', '/api/sources/sample-values/customers/email')).status).toBe(401);
  });
});

describe('POST /api/sources/execute-query', () => {
  it('runs a read-only query with typed columns and the row cap', async () => {
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: {
        sql: 'select customer_id, lower(email) as email, signup_date from shop.customers order by 1',
        limit: 10,
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.columns).toEqual([
      { name: 'customer_id', type: 'integer' },
      { name: 'email', type: 'text' },
      { name: 'signup_date', type: 'date' },
    ]);
    expect(res.body).toMatchObject({ row_count: 10, truncated: true, limit: 10 });
    expect(res.body.rows[0]).toMatchObject({
      customer_id: 1,
      signup_date: expect.stringMatching(/^\d{4}-\d{2}-\d{2}$/),
    });
    const capped = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: 'select * from shop.orders' },
    });
    expect(capped.body).toMatchObject({ row_count: 200, truncated: true, limit: 200 });
  });

  it('refuses a mutating statement with 400 naming it, and changes nothing', async () => {
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: 'delete from shop.order_items' },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/only read-only statements are allowed; got DeleteStmt/);
    const sneaky = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: 'select 1; update shop.orders set status = $$x$$' },
    });
    expect(sneaky.status).toBe(400);
    const count = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: {
        sql: `select (select count(*) from shop.order_items)::int as items,
                           (select count(*) from shop.orders where status = 'x')::int as x`,
      },
    });
    expect(count.body.rows[0].items).toBeGreaterThan(7000);
    expect(count.body.rows[0].x).toBe(0);
  });

  it('answers values JSON cannot carry in the text PostgreSQL prints for them', async () => {
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: {
        sql: `select 'NaN'::float8 as nan, '-Infinity'::float4 as low, 1.5::float8 as plain, null::float8 as missing,
          array['Infinity'::float8, 2] as floats, '\\xdeadbeef'::bytea as raw, array['\\x00ff'::bytea] as raws`,
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    // NaN and infinities were null (as SQL NULL is), bytea a serialized Buffer.
    expect(res.body.rows).toEqual([
      {
        nan: 'NaN',
        low: '-Infinity',
        plain: 1.5,
        missing: null,
        floats: ['Infinity', 2],
        raw: '\\xdeadbeef',
        raws: ['\\x00ff'],
      },
    ]);
  });

  it('answers 400 for a syntax error, a limit above the cap and a bad body', async () => {
    const syntax = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: 'selec 1' },
    });
    expect(syntax.status).toBe(400);
    expect(syntax.body.message).toMatch(/syntax error.*position 1|position 1.*syntax error/);
    // Positions count in the text sent, not in the statement dimas wraps it in.
    for (const [sql, position] of [
      ['select * from nope', 15],
      ['  -- the lot\nselect * from nope', 28],
      ['select 1 as é, * from nope', 23],
    ] as const) {
      const missing = await call(server, 'POST', '/api/sources/execute-query', {
        token: tenant.admin.token,
        body: { sql },
      });
      expect(missing.status).toBe(400);
      expect(missing.body.message).toMatch(new RegExp(`"nope" does not exist \\(position ${position}\\)$`));
    }
    const limit = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: 'select 1', limit: 201 },
    });
    expect(limit.status).toBe(400);
    const body = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: {},
    });
    expect(body.status).toBe(400);
  });

  it('cuts a slow query off at the statement timeout with a clear 422', async () => {
    const started = Date.now();
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: 'select count(*) from generate_series(1, 100000) a, generate_series(1, 100000) b' },
    });
    expect(res.status).toBe(422);
    expect(res.body.message).toMatch(/statement timeout/);
    expect(Date.now() - started).toBeLessThan(5000);
  });

  it('needs sql.execute: a viewer gets 403, no token 401', async () => {
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: viewer.token,
      body: { sql: 'select 1' },
    });
    expect(res.status).toBe(403);
    expect(res.body.message).toMatch(/sql.execute/);
    expect(
      (await call(server, 'POST', '/api/sources/execute-query', { body: { sql: 'select 1' } })).status,
    ).toBe(401);
  });
});

describe('workspace state and tenancy', () => {
  it('reads only the caller’s own workspace: another tenant never sees this source', async () => {
    const other = await createTenant(server);
    // No workspace selected yet.
    const none = await call(server, 'GET', '/api/sources/source-schema', { token: other.admin.token });
    expect(none.status).toBe(409);
    // Same workspace name, another organization: its own (empty) workspace, not ours.
    await createWorkspace(server, other.admin.token, { name: 'shop' });
    const res = await call(server, 'GET', '/api/sources/unified-schema', { token: other.admin.token });
    expect(res.status).toBe(409);
    expect(res.body.message).toMatch(/no source database configured/);
    const sample = await call(server, 'GET', '/api/sources/sample-values/customers/email', {
      token: other.admin.token,
    });
    expect(sample.status).toBe(409);
  });

  it('answers 422 with the driver’s reason for an unreachable or refused source', async () => {
    const token = tenant.admin.token;
    await createWorkspace(server, token, {
      name: unique('refused'),
      source_config: sourceConfig({ port: 1 }),
    });
    const refused = await call(server, 'GET', '/api/sources/unified-schema', { token });
    expect(refused.status).toBe(422);
    expect(refused.body.message).toMatch(/connection refused/);

    await createWorkspace(server, token, {
      name: unique('badrole'),
      source_config: sourceConfig({ user: 'no_such_role', password: 'wrong' }),
    });
    const role = await call(server, 'GET', '/api/sources/sample-values/customers/email', { token });
    expect(role.status).toBe(422);
    expect(role.body.message).toMatch(/no_such_role/);
    const query = await call(server, 'POST', '/api/sources/execute-query', {
      token,
      body: { sql: 'select 1' },
    });
    expect(query.status).toBe(422);
    await select(token, 'shop');
  });

  it.runIf(!!inject('databaseUrl'))(
    'refuses a source that points at the control-plane database',
    async () => {
      const url = new URL(inject('databaseUrl'));
      const token = tenant.admin.token;
      await createWorkspace(server, token, {
        name: unique('sneaky'),
        source_config: sourceConfig({
          host: 'localhost',
          port: Number(url.port || 5432),
          database: url.pathname.slice(1),
          schemas: ['public'],
          tables: undefined,
        }),
      });
      const res = await call(server, 'POST', '/api/sources/execute-query', {
        token,
        body: { sql: 'select username from users' },
      });
      expect(res.status).toBe(422);
      expect(res.body.message).toMatch(/own database/);
      await select(token, 'shop');
    },
  );
});

describe('connection checks the workspaces routes will call', () => {
  async function scopeOf(token: string) {
    const em = server.deps.orm.em.fork() as EntityManager;
    const principal = (await server.deps.authenticator.authenticate({ em }, token))!;
    return { em, deps: server.deps, principal };
  }

  it('checks, tests and lists catalogs without saving, with 422 reasons', async () => {
    const scope = await scopeOf(tenant.admin.token);
    const check = await sources.databaseCheck(scope, 'shop');
    expect(check.source).toMatchObject({ configured: true, reachable: true, error: null });
    expect(check.target).toMatchObject({ configured: false, reachable: false });
    const sent = connectionConfigSchema.parse(sourceConfig());
    expect(await sources.databaseTest(scope, 'shop', sent)).toMatchObject({
      success: true,
      database: source.name,
    });
    const catalogs = await sources.databaseCatalogs(scope, 'shop', sent);
    expect(catalogs.databases).toContain(source.name);
    expect(catalogs.schemas).toContain('shop');
    await expect(sources.databaseTest(scope, 'shop', { ...sent, port: 1 })).rejects.toMatchObject({
      code: 'UNPROCESSABLE_CONTENT',
      message: expect.stringMatching(/connection refused/),
    });
    await expect(sources.databaseTest(scope, 'shop')).rejects.toMatchObject({ code: 'CONFLICT' });
    expect(await sources.testStoredPassword(scope)).toMatchObject({ success: true, password_set: true });
    const other = await createTenant(server);
    await expect(sources.databaseCheck(await scopeOf(other.admin.token), 'shop')).rejects.toMatchObject({
      code: 'NOT_FOUND',
    });
  });
});

describe('the demo warehouse of the embedded mode', () => {
  let demo: RunningServer;

  beforeAll(async () => {
    const dataDir = mkdtempSync(join(inject('scratchDir'), 'demo-'));
    const env = loadEnv({
      PORT: '0',
      DIMAS_DATA_DIR: dataDir,
      DIMAS_SECRET_KEY: TEST_SECRET_KEY,
      SUPERADMIN_USERNAME,
      SUPERADMIN_PASSWORD,
      SEED_DEMO: 'true',
      LOG_LEVEL: 'silent',
    });
    // Embedded control plane whatever the test mode: that is where the demo lives.
    const template = inject('embeddedTemplate');
    const db = await openDatabase(template ? { loadDataDir: new Blob([readFileSync(template)]) } : {});
    demo = await startServer(env, { db, logger: createLogger({ level: 'silent' }) });
  }, 180_000);

  afterAll(async () => demo?.close());

  it('serves the demo workspace’s source schema and sample values out of the box', async () => {
    const line = demo.seedReport.lines.find((l) => l.startsWith('demo admin'))!;
    const { password } = JSON.parse(line.slice(line.indexOf('{')));
    const token = await login(demo, 'admin', 'demo.local', password);
    const schema = await call(demo, 'GET', '/api/sources/source-schema', { token });
    expect(schema.status, JSON.stringify(schema.body)).toBe(200);
    expect(schema.body.workspace_name).toBe('demo');
    expect(schema.body.tables.map((t: { name: string }) => t.name).sort()).toEqual([
      'crm_contacts',
      'customers',
      'order_items',
      'orders',
      'products',
      'web_events',
    ]);
    const customers = schema.body.tables.find((t: { name: string }) => t.name === 'customers');
    expect(customers.estimated_rows).toBeGreaterThan(1000);
    const emails = await call(demo, 'GET', '/api/sources/sample-values/customers/email', {
      token,
      query: { limit: 50 },
    });
    expect(emails.status).toBe(200);
    expect(emails.body.values).toHaveLength(50);
    // The mess is there: the same address in several cases.
    const all = await call(demo, 'POST', '/api/sources/execute-query', {
      token,
      body: {
        sql: 'select count(*)::int as n from shop.customers group by lower(email) having count(*) > 1',
      },
    });
    expect(all.body.row_count).toBeGreaterThan(5);
    const target = await call(demo, 'GET', '/api/sources/unified-schema', {
      token,
      query: { schema_type: 'target' },
    });
    expect(target.status).toBe(200);
    expect(target.body).toMatchObject({ schemas: ['analytics'], table_count: 0 });
    // The seeded workspace's documents are objects (they were stored as the JSON string "{}").
    const config = await call(demo, 'GET', '/api/workspaces/demo/config', { token });
    expect(config.status, JSON.stringify(config.body)).toBe(200);
    expect(config.body.settings).toEqual({});
    const workflow = await call(demo, 'GET', '/api/workspaces/demo/workflow/state', { token });
    expect(workflow.status, JSON.stringify(workflow.body)).toBe(200);
    expect(workflow.body.tasks.connect_source.completed).toBe(false);
  });
});
