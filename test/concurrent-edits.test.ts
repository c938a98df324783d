import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

/*
 * A team edits one workspace at once: requests that change the same document (the target schema, a
 * mapping, the settings, the workflow state) at the same moment must all take effect, where each
 * used to write back the document it had read and erase the others' changes.
 */
const warehouse = scratchDatabase('concurrent');
const COLUMNS = Array.from({ length: 12 }, (_, i) => `c${i}`);

let server: TestServer;
let tenant: Tenant;
const workspace = unique('together');

const api = (method: string, path: string, body?: unknown) =>
  call(server, method, path, { token: tenant.admin.token, body });

/** The target schema's table as GET /api/schemas/workspace shows it. */
async function wideTable(): Promise<{ columns: { name: string; tests?: object }[] }> {
  const { body } = await api('GET', '/api/schemas/workspace');
  return body.schema.tables.find((t: { name: string }) => t.name === 'wide');
}

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema shop;
    create table shop.wide (${COLUMNS.map((c) => `${c} text`).join(', ')}, id int primary key);`);
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: workspace,
    select: true,
    source_config: pgConfig(warehouse.name, { schemas: ['shop'] }),
    target_config: pgConfig(warehouse.name, { schemas: ['mart'] }),
    target_schema: {
      name: 'wide',
      version: '1',
      tables: [
        {
          name: 'wide',
          primary_key: ['id'],
          columns: [{ name: 'id', type: 'integer' }, ...COLUMNS.map((name) => ({ name, type: 'text' }))],
        },
      ],
    },
  });
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('concurrent edits of one document all take effect', () => {
  it('column tests saved at once on twelve columns of one target schema', async () => {
    const saved = await Promise.all(
      COLUMNS.map((c) =>
        api('PUT', `/api/api/schema/config/columns/wide/${c}/test`, { config: { not_null: true } }),
      ),
    );
    expect(saved.map((r) => r.status)).toEqual(COLUMNS.map(() => 200));
    const table = await wideTable();
    const tested = table.columns
      .filter((c: { tests?: unknown }) => c.tests)
      .map((c: { name: string }) => c.name);
    expect(tested.sort()).toEqual([...COLUMNS].sort());
  });

  it('connections added at once to twelve fields of one mapping', async () => {
    const added = await Promise.all(
      COLUMNS.map((c) =>
        api('POST', '/api/mappings/wide/connection', {
          connection: { source_field: `wide.${c}`, target_field: c },
        }),
      ),
    );
    expect(added.map((r) => r.status)).toEqual(COLUMNS.map(() => 200));
    const mapping = (await api('GET', '/api/mappings/wide')).body;
    const connected = mapping.connections.map((c: { target_field: string }) => c.target_field);
    expect(connected.sort()).toEqual([...COLUMNS].sort());
    // Each edit counted once: twelve edits of a new mapping make version 12.
    expect(mapping.version).toBe(COLUMNS.length);
  });

  it('column tests saved while a schema sync runs, and the defaults the sync proposes', async () => {
    const [synced, ...saved] = await Promise.all([
      api('POST', '/api/schemas/workspace/sync', {}),
      ...COLUMNS.slice(0, 6).map((c) =>
        api('PUT', `/api/api/schema/config/columns/wide/${c}/test`, {
          config: { accepted_values: ['x', 'y'] },
        }),
      ),
    ]);
    expect(synced.status, JSON.stringify(synced.body)).toBe(200);
    expect(synced.body.applied).toBe(true);
    expect(saved.map((r) => r.status)).toEqual(saved.map(() => 200));
    const table = await wideTable();
    const columns = new Map(table.columns.map((c: { name: string; tests?: object }) => [c.name, c.tests]));
    for (const c of COLUMNS.slice(0, 6))
      expect(columns.get(c)).toMatchObject({ accepted_values: ['x', 'y'] });
    // The sync's default test on the primary key landed beside them.
    expect(columns.get('id')).toMatchObject({ unique: true, not_null: true });
  });

  it('the first monitoring config of a table and of a column, saved by several people at once', async () => {
    const tableConfigs = [3600, 7200, 10800, 14400].map((max_age_seconds) => ({
      freshness: { max_age_seconds },
    }));
    const tables = await Promise.all(
      tableConfigs.map((config) => api('PUT', '/api/api/schema/config/tables/wide/monitoring', { config })),
    );
    expect(tables.map((r) => r.status)).toEqual(tableConfigs.map(() => 200));
    const columnConfigs = [0.1, 0.2, 0.3, 0.4].map((max) => ({ null_rate: { max } }));
    const columns = await Promise.all(
      columnConfigs.map((config) =>
        api('PUT', '/api/api/schema/config/columns/wide/c1/monitoring', { config }),
      ),
    );
    expect(columns.map((r) => r.status)).toEqual(columnConfigs.map(() => 200));
    // One of them is stored, whole.
    const table = await call(server, 'GET', '/api/api/schema/config/tables/wide/monitoring', {
      token: tenant.admin.token,
      query: { schema_type: 'target' },
    });
    expect(tableConfigs.map((c) => c.freshness.max_age_seconds)).toContain(
      table.body.config.freshness.max_age_seconds,
    );
  });

  it('admin settings merged at once, and workflow tasks marked at once', async () => {
    const settings = [
      { discovery_confidence_threshold: 0.61 },
      { ambiguity_margin: 0.07 },
      { sample_size: 321 },
      { query_row_limit: 77 },
    ];
    const merged = await Promise.all(
      settings.map((s) => api('PUT', '/api/workspaces/admin-settings', { workspace_name: workspace, ...s })),
    );
    expect(merged.map((r) => r.status)).toEqual(settings.map(() => 200));
    const stored = (
      await call(server, 'GET', '/api/workspaces/admin-settings', {
        token: tenant.admin.token,
        query: { workspace_name: workspace },
      })
    ).body;
    for (const s of settings) expect(stored.settings).toMatchObject(s);

    const tasks = ['connect_source', 'configure_target', 'assign_schema'];
    const marked = await Promise.all(
      tasks.map((task) =>
        api('POST', `/api/workspaces/${workspace}/workflow/complete`, { task_data: { task } }),
      ),
    );
    expect(marked.map((r) => r.status)).toEqual(tasks.map(() => 200));
    const state = (await api('GET', `/api/workspaces/${workspace}/workflow/state`)).body;
    for (const task of tasks) expect(state.tasks[task].completed).toBe(true);
  });

  it("an organization's first admin and global settings, saved by several people at once", async () => {
    const fresh = await createTenant(server);
    const as = (method: string, path: string, body?: unknown) =>
      call(server, method, path, { token: fresh.admin.token, body });
    const settings = [
      { discovery_confidence_threshold: 0.62 },
      { ambiguity_margin: 0.08 },
      { sample_size: 123 },
    ];
    const contexts = ['hotels', 'shoes', 'books'];
    const saved = await Promise.all([
      ...settings.map((s) => as('PUT', '/api/workspaces/admin-settings', s)),
      ...contexts.map((business_context) =>
        as('PUT', '/api/workspaces/global-settings', { business_context }),
      ),
    ]);
    expect(saved.map((r) => [r.status, r.body.code])).toEqual(saved.map(() => [200, undefined]));
    const stored = (await as('GET', '/api/workspaces/admin-settings')).body;
    for (const s of settings) expect(stored.settings).toMatchObject(s);
    const global = (await as('GET', '/api/workspaces/global-settings')).body;
    expect(contexts).toContain(global.settings.business_context);
  });
});
