import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { ADMIN_URL, pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';
import { enqueueMonitoringRun } from '../src/modules/monitoring/monitoring.jobs.ts';

/*
 * Settings-like fields that were accepted and then read by nothing (or read only sometimes), seen
 * through the API now that they either act or are refused; and fields that were read but whose
 * effect no test observed. The rule: a field a route accepts either changes what a user sees, or is
 * refused.
 */
const warehouse = scratchDatabase('sread');
const role = unique('dimas_sread_').toLowerCase();

const connection = (schemas: string[], overrides: Record<string, unknown> = {}) =>
  pgConfig(warehouse.name, { schemas, ...overrides });

const crm = {
  name: 'crm',
  tables: [
    {
      name: 'contacts',
      primary_key: ['id'],
      columns: [
        { name: 'id', type: 'integer', nullable: false },
        { name: 'email', type: 'text' },
      ],
    },
  ],
};

let server: TestServer;
let tenant: Tenant;
const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema app; create schema mart;
    create table app.people (id integer primary key, email text);`);
  await withClient(ADMIN_URL, (c) => c.query(`create role "${role}"`));
  server = await startTestServer();
  tenant = await createTenant(server);
});
afterAll(async () => {
  await server?.close();
  await warehouse.drop();
  await withClient(ADMIN_URL, (c) => c.query(`drop role if exists "${role}"`));
});

const issuesOf = (body: { issues?: { path: (string | number)[]; message: string }[] }) =>
  (body.issues ?? []).map((i) => `${i.path.join('.')}: ${i.message}`).join('\n');

describe('reverse-ETL connections are databases that monitoring measures, nothing more', () => {
  let name: string;
  beforeAll(async () => {
    name = await createWorkspace(server, tenant.admin.token, {
      name: unique('retl'),
      source_config: connection(['app']),
      target_config: connection(['mart']),
      target_schema: crm,
    });
  });
  const database = () => ({ name: 'copy-db', ...pgConfig(warehouse.name), schema: 'mart' });

  it('refuses webhook and csv destinations, which nothing sent rows to', async () => {
    for (const destination of [
      { name: 'hook', type: 'webhook', url: 'https://hooks.example.com/x', secret: 'tok' },
      { name: 'export', type: 'csv', delimiter: ';' },
    ]) {
      for (const [method, path, body] of [
        [
          'PUT',
          '/api/workspaces/admin-settings',
          { workspace_name: name, reverse_etl_connections: [destination] },
        ],
        ['PUT', '/api/workspaces/admin-settings', { reverse_etl_connections: [destination] }],
        ['POST', `/api/workspaces/${name}/config`, { settings: { reverse_etl_connections: [destination] } }],
      ] as const) {
        const res = await api(method, path, { body });
        expect(res.status, JSON.stringify(res.body)).toBe(400);
        expect(issuesOf(res.body)).toMatch(/must be postgres/);
      }
    }
    const settings = await api('GET', '/api/workspaces/admin-settings', { query: { workspace_name: name } });
    expect(settings.body.settings.reverse_etl_connections).toBeUndefined();
  });

  it('assigns a table without a write mode: the assignment names the table monitoring measures', async () => {
    const saved = await api('PUT', '/api/workspaces/admin-settings', {
      body: { workspace_name: name, reverse_etl_connections: [database()] },
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    const withMode = await api('PUT', '/api/schemas/workspace/tables/contacts/connection', {
      body: { connection_name: 'copy-db', mode: 'replace' },
    });
    expect(withMode.status, JSON.stringify(withMode.body)).toBe(400);
    expect(issuesOf(withMode.body)).toMatch(/"mode" is not a field/);
    const assigned = await api('PUT', '/api/schemas/workspace/tables/contacts/connection', {
      body: { connection_name: 'copy-db', destination_table: 'people' },
    });
    expect(assigned.status, JSON.stringify(assigned.body)).toBe(200);
    expect(assigned.body).toMatchObject({ assigned: true, destination_table: 'people' });
    expect(assigned.body).not.toHaveProperty('mode');
    const listed = await api('GET', '/api/schemas/workspace/connections');
    expect(listed.body.assignments).toEqual([expect.not.objectContaining({ mode: expect.anything() })]);
  });
});

describe('the workspace config route reads every field it takes', () => {
  it('schema_template alone assigns that library template to a workspace without a schema', async () => {
    const name = await createWorkspace(server, tenant.admin.token, { name: unique('tpl') });
    const saved = await api('POST', `/api/workspaces/${name}/config`, {
      body: { schema_template: 'customer-360' },
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    expect(saved.body.schema_template).toBe('customer-360');
    expect(saved.body.target_schema?.tables.length).toBeGreaterThan(0);
    const template = await api('GET', '/api/schemas/templates/customer-360');
    expect(saved.body.target_schema).toEqual(template.body.schema);
    const detail = await api('GET', `/api/workspaces/${name}`);
    expect(detail.body).toMatchObject({
      schema_assigned: true,
      schema_template: 'customer-360',
      schema_customized: false,
    });

    // Sent with the schema it already has, the template name is kept as given (it was dropped).
    const relabelled = await api('POST', `/api/workspaces/${name}/config`, {
      body: { target_schema: saved.body.target_schema, schema_template: 'ecommerce-orders' },
    });
    expect(relabelled.status, JSON.stringify(relabelled.body)).toBe(200);
    expect(relabelled.body.schema_template).toBe('ecommerce-orders');
    expect(relabelled.body.target_schema).toEqual(template.body.schema);

    // A template beside a removed schema contradicts itself.
    const contradiction = await api('POST', `/api/workspaces/${name}/config`, {
      body: { target_schema: null, schema_template: 'customer-360' },
    });
    expect(contradiction.status).toBe(400);
    expect(contradiction.body.message).toMatch(/schema_template customer-360 with target_schema null/);
    expect((await api('GET', `/api/workspaces/${name}/config`)).body.schema_template).toBe(
      'ecommerce-orders',
    );
  });

  it('settings: workspace_name is refused (the route names the workspace), and a null auto_confirm_threshold survives a round trip', async () => {
    const name = await createWorkspace(server, tenant.admin.token, { name: unique('cfgset') });
    const misplaced = await api('POST', `/api/workspaces/${name}/config`, {
      body: { settings: { workspace_name: 'another', sample_size: 200 } },
    });
    expect(misplaced.status, JSON.stringify(misplaced.body)).toBe(400);
    expect(JSON.stringify(misplaced.body.issues)).toContain('workspace_name');
    expect((await api('GET', `/api/workspaces/${name}/config`)).body.settings).toEqual({});

    // The organization confirms at 0.9; this workspace never does (null is a value of its own).
    const global = await api('PUT', '/api/workspaces/admin-settings', {
      body: { auto_confirm_threshold: 0.9 },
    });
    expect(global.status, JSON.stringify(global.body)).toBe(200);
    try {
      const own = await api('PUT', '/api/workspaces/admin-settings', {
        body: { workspace_name: name, auto_confirm_threshold: null },
      });
      expect(own.body.effective.auto_confirm_threshold).toBeNull();
      const read = await api('GET', `/api/workspaces/${name}/config`);
      expect(read.body.settings).toEqual({ auto_confirm_threshold: null });
      const again = await api('POST', `/api/workspaces/${name}/config`, { body: read.body });
      expect(again.status, JSON.stringify(again.body)).toBe(200);
      expect(again.body.settings).toEqual({ auto_confirm_threshold: null });
      const effective = await api('GET', '/api/workspaces/admin-settings', {
        query: { workspace_name: name },
      });
      expect(effective.body.effective.auto_confirm_threshold).toBeNull();
    } finally {
      await api('PUT', '/api/workspaces/admin-settings', { body: { auto_confirm_threshold: null } });
    }
  });
});

describe('connection configs take only the fields their engine reads', () => {
  it('refuses raw_schema and cursor_columns on postgres, ctes on mysql, wherever a config is sent', async () => {
    const name = unique('eng');
    const refused = [
      [
        'POST',
        '/api/workspaces/create',
        { name, source_config: connection(['app'], { raw_schema: 'raw_x' }) },
        'source_config.raw_schema',
      ],
      [
        'POST',
        '/api/workspaces/create',
        { name, target_config: connection(['mart'], { cursor_columns: { people: 'id' } }) },
        'target_config.cursor_columns',
      ],
      [
        'POST',
        '/api/workspaces/create',
        {
          name,
          source_config: {
            type: 'mysql',
            host: '127.0.0.1',
            database: 'shop',
            user: 'root',
            ctes: [{ name: 'c', sql: 'select 1' }],
          },
        },
        'source_config.ctes',
      ],
    ] as const;
    for (const [method, path, body, field] of refused) {
      const res = await api(method, path, { body });
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      expect(issuesOf(res.body)).toContain(field);
    }
    expect((await api('GET', `/api/workspaces/${name}`)).status).toBe(404);

    await createWorkspace(server, tenant.admin.token, {
      name,
      source_config: connection(['app']),
      target_config: connection(['mart']),
    });
    for (const [method, path, body, field] of [
      [
        'POST',
        '/api/workspaces/source-config',
        { source_config: connection(['app'], { cursor_columns: { people: 'id' } }) },
        'cursor_columns',
      ],
      [
        'POST',
        `/api/workspaces/${name}/config`,
        { target_config: connection(['mart'], { raw_schema: 'raw_x' }) },
        'raw_schema',
      ],
      [
        'POST',
        `/api/workspaces/${name}/database/test`,
        { config: connection(['mart'], { raw_schema: 'raw_x' }) },
        'raw_schema',
      ],
    ] as const) {
      const res = await api(method, path, { body });
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      expect(issuesOf(res.body)).toContain(field);
    }
    const config = await api('GET', `/api/workspaces/${name}/config`);
    expect(config.body.source_config).not.toHaveProperty('cursor_columns');
    expect(config.body.target_config).not.toHaveProperty('raw_schema');

    // The engine that reads them takes them.
    const mysql = await api('POST', `/api/workspaces/${name}/config`, {
      body: {
        source_config: {
          type: 'mysql',
          host: '127.0.0.1',
          database: 'shop',
          user: 'root',
          raw_schema: 'raw_shop_copy',
          cursor_columns: { orders: 'updated_at' },
        },
      },
    });
    expect(mysql.status, JSON.stringify(mysql.body)).toBe(200);
    expect(mysql.body.source_config).toMatchObject({
      raw_schema: 'raw_shop_copy',
      cursor_columns: { orders: 'updated_at' },
    });
  });
});

describe('settings that were read, now observed', () => {
  let name: string;
  beforeAll(async () => {
    name = await createWorkspace(server, tenant.admin.token, {
      name: unique('obs'),
      source_config: connection(['app']),
      target_config: connection(['mart']),
      target_schema: crm,
    });
  });

  it('ssl: the connection asks for TLS (this server has none), without it connects', async () => {
    const plain = await api('POST', `/api/workspaces/${name}/database/test`, {
      body: { config: connection(['mart'], { ssl: false }) },
    });
    expect(plain.status, JSON.stringify(plain.body)).toBe(200);
    const tls = await api('POST', `/api/workspaces/${name}/database/test`, {
      body: { config: connection(['mart'], { ssl: true }) },
    });
    expect(tls.status, JSON.stringify(tls.body)).toBe(422);
    expect(tls.body.message).toMatch(/ssl|tls|certificate/i);
  });

  it('sync grant_user: the role is granted DML on the synced tables, and only when named', async () => {
    const grants = async () =>
      (
        await warehouse.sql<{ privilege_type: string }>(
          `select privilege_type from information_schema.role_table_grants
            where grantee = $1 and table_schema = 'mart' and table_name = 'contacts' order by 1`,
          [role],
        )
      ).map((r) => r.privilege_type);
    const plain = await api('POST', '/api/schemas/workspace/sync', { body: {} });
    expect(plain.status, JSON.stringify(plain.body)).toBe(200);
    expect(await grants()).toEqual([]);
    const granted = await api('POST', '/api/schemas/workspace/sync', { body: { grant_user: role } });
    expect(granted.status, JSON.stringify(granted.body)).toBe(200);
    expect(await grants()).toEqual(expect.arrayContaining(['DELETE', 'INSERT', 'SELECT', 'UPDATE']));
  });

  it('schema_type source: a table monitoring config of a source table is checked on the source', async () => {
    const saved = await api('PUT', '/api/api/schema/config/tables/app.people/monitoring', {
      body: { schema_type: 'source', config: { volume: { min_rows: 1, severity: 'critical' } } },
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    const workspaceId = (await api('GET', `/api/workspaces/${name}`)).body.id;
    const queued = await enqueueMonitoringRun(server.deps, {
      organizationId: tenant.organization.id,
      workspaceId,
      reason: 'on_demand',
    });
    const run = await until(
      `monitoring run ${queued.run_id}`,
      () => server.deps.jobs.getRun(queued.run_id, tenant.organization.id),
      (r) => !!r && ['succeeded', 'failed', 'cancelled'].includes(r.status),
    );
    expect(run!.status, JSON.stringify(run)).toBe('succeeded');
    const alerts = await api('GET', '/api/api/alerts/active', { query: { workspace: name } });
    expect(alerts.body.alerts).toEqual([
      expect.objectContaining({ table_name: 'app.people', kind: 'monitor', severity: 'critical' }),
    ]);
  });
});
