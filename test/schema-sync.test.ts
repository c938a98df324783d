import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, unique, type Tenant, type TestUser } from './helpers/api.ts';
import { pgConfig, ADMIN_URL, runSql, scratchDatabase } from './helpers/scratch-db.ts';

/*
 * Schema sync, sync status and DDL against a real PostgreSQL warehouse (a scratch database on the
 * test server, created here and dropped at the end), and the workspace database routes.
 */
const warehouse = scratchDatabase('sync');
const ddlTarget = scratchDatabase('ddl');
const grantRole = unique('dimas_role_').toLowerCase();

const columnsOf = (table: string) =>
  warehouse.sql<{ column_name: string; data_type: string; is_nullable: string }>(
    `select column_name, data_type, is_nullable from information_schema.columns
      where table_schema = 'analytics' and table_name = $1 order by ordinal_position`,
    [table],
  );

const targetConfig = (overrides: Record<string, unknown> = {}) =>
  pgConfig(warehouse.name, { password: 'trust-auth-ignores-it', schemas: ['analytics'], ...overrides });

// A mixed-case table and a reserved word as a column: only quoted identifiers survive both.
const schemaDoc = () => ({
  name: 'sync-test',
  version: '1.0.0',
  tables: [
    {
      name: 'customers',
      description: "Everyone who bought; it's the key table",
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'bigint', nullable: false, description: 'Key' },
        { name: 'email', type: 'text', nullable: true, description: 'E-mail', pii: true },
        { name: 'lifetime_value', type: 'numeric', nullable: true },
      ],
    },
    {
      name: 'WebEvents',
      primary_key: ['event_id'],
      columns: [
        { name: 'event_id', type: 'uuid', nullable: false },
        { name: 'order', type: 'integer', nullable: true, description: 'Reserved word as a name' },
        { name: 'occurred_at', type: 'timestamptz', nullable: false },
        { name: 'payload', type: 'json', nullable: true },
      ],
    },
  ],
});

let server: TestServer;
let a: Tenant;
let b: Tenant;
let viewer: TestUser;
let editor: TestUser;
const workspace = unique('sync');

async function saveSchema(token: string, schema: unknown) {
  const res = await call(server, 'POST', '/api/schemas/workspace', { token, body: { schema } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

const status = (token = viewer.token) => call(server, 'GET', '/api/schemas/workspace/sync/status', { token });
const sync = (body: Record<string, unknown> = {}, token = editor.token) =>
  call(server, 'POST', '/api/schemas/workspace/sync', { token, body });

beforeAll(async () => {
  await warehouse.create();
  await ddlTarget.create();
  await runSql(ADMIN_URL, `create role "${grantRole}"`);
  server = await startTestServer();
  a = await createTenant(server);
  b = await createTenant(server);
  viewer = await a.addUser(['viewer']);
  editor = await a.addUser(['editor']);
  await createWorkspace(server, a.admin.token, {
    name: workspace,
    target_config: targetConfig(),
    source_config: targetConfig({ schemas: ['public'] }),
  });
  for (const user of [viewer, editor]) {
    const selected = await call(server, 'POST', '/api/workspaces/select', {
      token: user.token,
      body: { workspace_name: workspace },
    });
    expect(selected.status).toBe(200);
  }
  await saveSchema(a.admin.token, schemaDoc());
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
  await ddlTarget.drop();
  await runSql(ADMIN_URL, `drop role if exists "${grantRole}"`);
});

describe('GET /api/schemas/workspace/ddl', () => {
  it('generates quoted DDL with grants that runs on a real database, twice', async () => {
    const res = await call(server, 'GET', '/api/schemas/workspace/ddl', {
      token: viewer.token,
      query: { grant_user: grantRole },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({
      workspace_name: workspace,
      target_schema: 'analytics',
      grant_user: grantRole,
      table_count: 2,
    });
    expect(res.body.ddl).toContain('create table if not exists "analytics"."WebEvents"');
    expect(res.body.ddl).toContain('"order" integer');
    expect(res.body.ddl).toContain(`to "${grantRole}"`);
    expect(res.body.statements.length).toBeGreaterThan(4);
    // The script is idempotent: run it twice on an empty database.
    await ddlTarget.sql(res.body.ddl);
    await ddlTarget.sql(res.body.ddl);
    const tables = await ddlTarget.sql(
      `select table_name from information_schema.tables where table_schema = 'analytics' order by 1`,
    );
    expect(tables.map((r) => r.table_name)).toEqual(['WebEvents', 'customers']);
    const grants = await ddlTarget.sql(
      `select count(*)::int as n from information_schema.role_table_grants where grantee = $1 and privilege_type = 'INSERT'`,
      [grantRole],
    );
    expect(grants[0].n).toBe(2);
    const comment = await ddlTarget.sql(`select obj_description('analytics.customers'::regclass) as c`);
    expect(comment[0].c).toBe("Everyone who bought; it's the key table");
  });

  it('answers 401, 400 for a bad grant_user and 404 without a schema', async () => {
    expect((await call(server, 'GET', '/api/schemas/workspace/ddl')).status).toBe(401);
    const bad = await call(server, 'GET', '/api/schemas/workspace/ddl', {
      token: viewer.token,
      query: { grant_user: 'x'.repeat(64) },
    });
    expect(bad.status).toBe(400);
    await call(server, 'POST', '/api/workspaces/create', { token: b.admin.token, body: { name: 'empty' } });
    const none = await call(server, 'GET', '/api/schemas/workspace/ddl', { token: b.admin.token });
    expect(none.status).toBe(404);
  });
});

describe('schema sync', () => {
  it('is pending before the first sync, and a dry run changes nothing', async () => {
    const before = await status();
    expect(before.status, JSON.stringify(before.body)).toBe(200);
    expect(before.body).toMatchObject({
      status: 'pending',
      target_schema: 'analytics',
      last_synced_at: null,
      schema_changed_since_sync: null,
    });
    expect(before.body.differences.missing_tables.sort()).toEqual(['WebEvents', 'customers']);
    expect(before.body.tables.map((t: { status: string }) => t.status)).toEqual(['pending', 'pending']);
    expect(before.body.pending_statements.join('\n')).toContain('create table if not exists');
    const dry = await sync({ dry_run: true });
    expect(dry.status, JSON.stringify(dry.body)).toBe(200);
    expect(dry.body).toMatchObject({ applied: false, dry_run: true, status: 'pending', synced_at: null });
    expect(await columnsOf('customers')).toEqual([]);
  });

  it('needs pipeline.run and a valid body', async () => {
    expect((await call(server, 'POST', '/api/schemas/workspace/sync', { body: {} })).status).toBe(401);
    expect((await sync({}, viewer.token)).status).toBe(403);
    const bad = await sync({ allow_destructive: 'yes' });
    expect(bad.status).toBe(400);
    expect(await columnsOf('customers')).toEqual([]);
  });

  it('creates the tables, then reports in_sync', async () => {
    const res = await sync();
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ applied: true, status: 'in_sync', skipped: [], stale_connections: [] });
    expect(res.body.after.in_sync).toBe(true);
    expect(await columnsOf('customers')).toEqual([
      { column_name: 'customer_id', data_type: 'bigint', is_nullable: 'NO' },
      { column_name: 'email', data_type: 'text', is_nullable: 'YES' },
      { column_name: 'lifetime_value', data_type: 'numeric', is_nullable: 'YES' },
    ]);
    expect((await columnsOf('WebEvents')).map((c) => c.column_name)).toEqual([
      'event_id',
      'order',
      'occurred_at',
      'payload',
    ]);
    const after = await status();
    expect(after.body).toMatchObject({
      status: 'in_sync',
      schema_changed_since_sync: false,
      pending_statements: [],
    });
    expect(after.body.last_synced_at).toMatch(/^\d{4}-\d\d-\d\dT/);
    const metrics = await call(server, 'GET', '/api/workspaces/metrics', { token: viewer.token });
    expect(metrics.body.schema_sync_status).toBe('in_sync');
  });

  it('a column added to schema.json is pending until the next sync', async () => {
    const added = await call(server, 'POST', '/api/schemas/workspace/tables/customers/columns', {
      token: editor.token,
      body: { column: { name: 'signed_up_at', type: 'timestamptz', nullable: true } },
    });
    expect(added.status, JSON.stringify(added.body)).toBe(200);
    const pending = await status();
    expect(pending.body).toMatchObject({ status: 'pending', schema_changed_since_sync: true });
    expect(pending.body.differences.missing_columns).toEqual([
      { table: 'customers', column: 'signed_up_at', type: 'timestamptz' },
    ]);
    expect(
      pending.body.tables.find((t: { table_name: string }) => t.table_name === 'customers'),
    ).toMatchObject({
      status: 'pending',
      missing_columns: ['signed_up_at'],
    });
    const metrics = await call(server, 'GET', '/api/workspaces/metrics', { token: viewer.token });
    expect(metrics.body.schema_sync_status).toBe('out_of_sync');
    const res = await sync();
    expect(res.status).toBe(200);
    expect(res.body.statements.join('\n')).toContain(
      'alter table "analytics"."customers" add column "signed_up_at" timestamptz',
    );
    expect((await status()).body.status).toBe('in_sync');
  });

  it('a column added in the warehouse outside dimas shows as drifted', async () => {
    await warehouse.sql('alter table analytics.customers add column legacy_code text');
    const drifted = await status();
    expect(drifted.body.status).toBe('drifted');
    expect(drifted.body.differences.extra_columns).toEqual([
      { table: 'customers', column: 'legacy_code', type: 'text' },
    ]);
    expect(drifted.body.destructive_changes).toEqual([
      'column customers.legacy_code is kept (not in schema.json)',
    ]);
    await warehouse.sql('alter table analytics.customers drop column legacy_code');
  });

  it('refuses destructive changes without allow_destructive, keeping the data', async () => {
    await warehouse.sql(
      `insert into analytics.customers (customer_id, email, lifetime_value) values (1, 'a@example.com', 12.5)`,
    );
    const next = schemaDoc();
    next.tables[0].columns = next.tables[0].columns.filter((c) => c.name !== 'lifetime_value');
    next.tables[0].columns.push({ name: 'signed_up_at', type: 'text', nullable: true } as never);
    await saveSchema(a.admin.token, next);
    expect((await status()).body.status).toBe('drifted');

    const kept = await sync();
    expect(kept.status, JSON.stringify(kept.body)).toBe(200);
    expect(kept.body.applied).toBe(true);
    expect(kept.body.status).toBe('drifted');
    expect(kept.body.skipped).toEqual([
      'type of customers.signed_up_at stays timestamp with time zone (schema.json says text)',
      'column customers.lifetime_value is kept (not in schema.json)',
    ]);
    expect(kept.body.statements.join('\n')).not.toMatch(/drop column|alter column .* type/);
    const row = await warehouse.sql('select lifetime_value from analytics.customers');
    expect(row).toEqual([{ lifetime_value: '12.5' }]);
    expect(
      (await call(server, 'GET', '/api/workspaces/metrics', { token: viewer.token })).body.schema_sync_status,
    ).toBe('out_of_sync');

    const destructive = await sync({ allow_destructive: true });
    expect(destructive.status, JSON.stringify(destructive.body)).toBe(200);
    expect(destructive.body).toMatchObject({ applied: true, status: 'in_sync', skipped: [] });
    expect((await columnsOf('customers')).map((c) => [c.column_name, c.data_type])).toEqual([
      ['customer_id', 'bigint'],
      ['email', 'text'],
      ['signed_up_at', 'text'],
    ]);
    expect((await status()).body.status).toBe('in_sync');
  });

  it('runs in one transaction: a change the data refuses leaves everything as it was (409)', async () => {
    await warehouse.sql(`insert into analytics.customers (customer_id) values (2)`);
    const next = schemaDoc();
    next.tables[0].columns = [
      { name: 'customer_id', type: 'bigint', nullable: false, description: 'Key' },
      { name: 'email', type: 'text', nullable: false, description: 'now required' },
      { name: 'signed_up_at', type: 'text', nullable: true, description: '' },
    ];
    next.tables.push({
      name: 'segments',
      primary_key: ['segment_id'],
      columns: [{ name: 'segment_id', type: 'integer', nullable: false }],
    } as never);
    await saveSchema(a.admin.token, next);
    const res = await sync();
    expect(res.status, JSON.stringify(res.body)).toBe(409);
    expect(res.body.message).toMatch(/rolled back/);
    expect(await columnsOf('segments')).toEqual([]);
    expect((await status()).body.status).toBe('pending');
    // Back to the synced schema for the tests below.
    await saveSchema(a.admin.token, { ...schemaDoc(), tables: [schemaDoc().tables[1]] });
  });

  it('reports error without a target warehouse, 409 on sync; unreachable → error and 422', async () => {
    const ws = unique('nowh');
    await call(server, 'POST', '/api/workspaces/create', {
      token: editor.token,
      body: { name: ws, template_name: 'identity' },
    });
    const none = await status(editor.token);
    expect(none.status).toBe(200);
    expect(none.body).toMatchObject({ status: 'error', differences: null });
    expect(none.body.message).toMatch(/no target warehouse/);
    expect((await sync()).status).toBe(409);

    await call(server, 'POST', `/api/workspaces/${ws}/config`, {
      token: editor.token,
      body: { target_config: targetConfig({ port: 1 }) },
    });
    const down = await status(editor.token);
    expect(down.body.status).toBe('error');
    expect(down.body.message).toMatch(/connection refused/);
    const failed = await sync();
    expect(failed.status).toBe(422);
    expect(failed.body.message).toMatch(/connection refused/);
    await call(server, 'POST', '/api/workspaces/select', {
      token: editor.token,
      body: { workspace_name: workspace },
    });
  });

  it('another tenant cannot reach the workspace', async () => {
    const res = await call(server, 'POST', '/api/workspaces/select', {
      token: b.admin.token,
      body: { workspace_name: workspace },
    });
    expect(res.status).toBe(404);
    const theirs = await status(b.admin.token);
    expect(theirs.body.workspace_name).toBe('empty');
    expect(theirs.body.status).toBe('error');
  });
});

describe('workspace database routes', () => {
  const base = `/api/workspaces`;

  it('GET {workspace}/database/check reports both sides', async () => {
    const res = await call(server, 'GET', `${base}/${workspace}/database/check`, { token: viewer.token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({
      workspace_name: workspace,
      source: { configured: true, reachable: true, error: null },
      target: { configured: true, reachable: true, error: null },
    });
    expect(res.body.target.server_version).toMatch(/\d+/);
    expect((await call(server, 'GET', `${base}/${workspace}/database/check`)).status).toBe(401);
    expect(
      (await call(server, 'GET', `${base}/${workspace}/database/check`, { token: b.admin.token })).status,
    ).toBe(404);
    expect((await call(server, 'GET', `${base}/nope/database/check`, { token: viewer.token })).status).toBe(
      404,
    );
  });

  it('POST {workspace}/database/test tests the stored target or a sent config, without saving', async () => {
    const stored = await call(server, 'POST', `${base}/${workspace}/database/test`, {
      token: editor.token,
      body: {},
    });
    expect(stored.status, JSON.stringify(stored.body)).toBe(200);
    expect(stored.body).toMatchObject({ success: true, database: warehouse.name, user: 'postgres' });
    const sent = await call(server, 'POST', `${base}/${workspace}/database/test`, {
      token: editor.token,
      body: { config: targetConfig({ database: ddlTarget.name }) },
    });
    expect(sent.status).toBe(200);
    expect(sent.body.database).toBe(ddlTarget.name);
    const badPort = await call(server, 'POST', `${base}/${workspace}/database/test`, {
      token: editor.token,
      body: { config: targetConfig({ port: 1 }) },
    });
    expect(badPort.status).toBe(422);
    expect(badPort.body.message).toMatch(/connection refused/);
    const badRole = await call(server, 'POST', `${base}/${workspace}/database/test`, {
      token: editor.token,
      body: { config: targetConfig({ user: 'no_such_role_dimas' }) },
    });
    expect(badRole.status).toBe(422);
    expect(badRole.body.message).toMatch(/no_such_role_dimas/);
    // Nothing was saved: the stored target still points at the warehouse database.
    const config = await call(server, 'GET', `${base}/${workspace}/config`, { token: viewer.token });
    expect(config.body.target_config).toMatchObject({
      database: warehouse.name,
      port: targetConfig().port,
      password_set: true,
    });
    expect(
      (await call(server, 'POST', `${base}/${workspace}/database/test`, { token: viewer.token, body: {} }))
        .status,
    ).toBe(403);
    expect(
      (
        await call(server, 'POST', `${base}/${workspace}/database/test`, {
          token: editor.token,
          body: { config: { type: 'postgres', host: '127.0.0.1', port: 'x' } },
        })
      ).status,
    ).toBe(400);
    expect(
      (await call(server, 'POST', `${base}/${workspace}/database/test`, { token: b.admin.token, body: {} }))
        .status,
    ).toBe(404);
  });

  it('POST {workspace}/database/catalogs lists databases and schemas', async () => {
    const res = await call(server, 'POST', `${base}/${workspace}/database/catalogs`, {
      token: editor.token,
      body: {},
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.databases).toEqual(expect.arrayContaining([warehouse.name, ddlTarget.name]));
    expect(res.body.schemas).toContain('analytics');
    const unreachable = await call(server, 'POST', `${base}/${workspace}/database/catalogs`, {
      token: editor.token,
      body: { config: targetConfig({ host: 'no-such-host.invalid' }) },
    });
    expect(unreachable.status).toBe(422);
    expect(unreachable.body.message).toMatch(/unknown host|could not be resolved/);
    expect(
      (
        await call(server, 'POST', `${base}/${workspace}/database/catalogs`, {
          token: viewer.token,
          body: {},
        })
      ).status,
    ).toBe(403);
    expect((await call(server, 'POST', `${base}/${workspace}/database/catalogs`, { body: {} })).status).toBe(
      401,
    );
    expect(
      (
        await call(server, 'POST', `${base}/${workspace}/database/catalogs`, {
          token: b.admin.token,
          body: {},
        })
      ).status,
    ).toBe(404);
  });

  it('POST test-stored-password checks the stored source password', async () => {
    const res = await call(server, 'POST', `${base}/test-stored-password`, { token: viewer.token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ success: true, workspace_name: workspace, password_set: true });
    expect((await call(server, 'POST', `${base}/test-stored-password`)).status).toBe(401);
    // A source the stored credentials no longer open: 422 with the reason.
    const ws = unique('badsrc');
    await call(server, 'POST', '/api/workspaces/create', {
      token: editor.token,
      body: { name: ws, source_config: targetConfig({ user: 'no_such_role_dimas' }) },
    });
    const bad = await call(server, 'POST', `${base}/test-stored-password`, { token: editor.token });
    expect(bad.status).toBe(422);
    expect(bad.body.message).toMatch(/no_such_role_dimas/);
    // Another tenant's current workspace has no source: 409, never this tenant's source.
    const other = await call(server, 'POST', `${base}/test-stored-password`, { token: b.admin.token });
    expect(other.status).toBe(409);
    await call(server, 'POST', '/api/workspaces/select', {
      token: editor.token,
      body: { workspace_name: workspace },
    });
  });
});
