import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

/*
 * Settings-like fields that were accepted and then read by nothing (or read only sometimes), seen
 * through the API now that they either act or are refused; and fields that were read but whose
 * effect no test observed. The rule: a field a route accepts either changes what a user sees, or is
 * refused.
 */
const warehouse = scratchDatabase('sread');

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
  server = await startTestServer();
  tenant = await createTenant(server);
});
afterAll(async () => {
  await server?.close();
  await warehouse.drop();
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
