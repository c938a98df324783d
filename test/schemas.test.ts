import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, unique, type Tenant, type TestUser } from './helpers/api.ts';
import { registerWorkspaceExtension } from '../src/modules/workspaces/workspace-extensions.ts';
import type { TargetSchema } from '../src/modules/schemas/schemas.schemas.ts';

let server: TestServer;
let a: Tenant;
let b: Tenant;
let viewer: TestUser;
let workspace: string;

const TEMPLATES = ['customer-360', 'ecommerce-orders', 'identity', 'marketing-events'];

const validSchema = () => ({
  name: 'crm',
  version: '2.0.0',
  tables: [
    {
      name: 'contacts',
      description: 'People',
      primary_key: ['contact_id'],
      columns: [
        { name: 'contact_id', type: 'text', nullable: false, description: 'Key', pii: false },
        { name: 'email', type: 'text', nullable: true, description: 'E-mail', pii: true },
        { name: 'signed_up_at', type: 'timestamptz', nullable: true, description: 'When', pii: false },
      ],
    },
  ],
});

beforeAll(async () => {
  server = await startTestServer();
  a = await createTenant(server);
  b = await createTenant(server);
  viewer = await a.addUser(['viewer']);
  workspace = unique('sch');
  await createWorkspace(server, a.admin.token, { name: workspace });
  await call(server, 'POST', '/api/workspaces/select', {
    token: viewer.token,
    body: { workspace_name: workspace },
  });
});
afterAll(async () => server?.close());

describe('library templates', () => {
  it('lists the four templates', async () => {
    const res = await call(server, 'GET', '/api/schemas/templates', { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body.templates.map((t: { name: string }) => t.name)).toEqual(TEMPLATES);
    for (const t of res.body.templates) {
      expect(t.table_count).toBeGreaterThanOrEqual(2);
      expect(t.description.length).toBeGreaterThan(10);
    }
    expect((await call(server, 'GET', '/api/schemas/templates')).status).toBe(401);
  });

  it('serves each template with descriptions on every table and column, portable types only', async () => {
    for (const name of TEMPLATES) {
      const res = await call(server, 'GET', `/api/schemas/templates/${name}`, { token: viewer.token });
      expect(res.status).toBe(200);
      expect(res.body.schema.name).toBe(name);
      for (const table of res.body.schema.tables) {
        expect(table.description, table.name).not.toBe('');
        expect(table.primary_key.length).toBeGreaterThan(0);
        for (const column of table.columns) {
          expect(column.description, `${table.name}.${column.name}`).not.toBe('');
          expect([
            'text',
            'integer',
            'bigint',
            'numeric',
            'boolean',
            'date',
            'timestamp',
            'timestamptz',
            'json',
            'uuid',
          ]).toContain(column.type);
        }
      }
    }
    const c360 = await call(server, 'GET', '/api/schemas/templates/customer-360', { token: viewer.token });
    const customers = c360.body.schema.tables.find((t: { name: string }) => t.name === 'customers');
    const columns = customers.columns.map((c: { name: string }) => c.name);
    for (const c of [
      'customer_id',
      'email',
      'phone',
      'first_name',
      'last_name',
      'postal_code',
      'country_code',
      'date_of_birth',
      'lifetime_value',
    ])
      expect(columns).toContain(c);
  });

  it('answers 404 for an unknown template and 401 without a token', async () => {
    expect((await call(server, 'GET', '/api/schemas/templates/nope', { token: viewer.token })).status).toBe(
      404,
    );
    expect((await call(server, 'GET', '/api/schemas/templates/identity')).status).toBe(401);
  });
});

describe('workspace schema.json', () => {
  it('has none at first: 404', async () => {
    const res = await call(server, 'GET', '/api/schemas/workspace', { token: viewer.token });
    expect(res.status).toBe(404);
    expect((await call(server, 'DELETE', '/api/schemas/workspace', { token: a.admin.token })).status).toBe(
      404,
    );
  });

  it('assigns a template as it is', async () => {
    const res = await call(server, 'POST', '/api/schemas/templates/marketing-events/assign', {
      token: a.admin.token,
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      workspace_name: workspace,
      exists: true,
      template_name: 'marketing-events',
      customized: false,
      stale_connections: [],
    });
    expect(res.body.schema.tables.map((t: { name: string }) => t.name)).toEqual([
      'events',
      'campaigns',
      'ad_performance',
    ]);
    const read = await call(server, 'GET', '/api/schemas/workspace', { token: viewer.token });
    expect(read.body.schema).toEqual(res.body.schema);
  });

  it('copies a library schema into an editable own schema', async () => {
    const res = await call(server, 'POST', '/api/schemas/workspace/copy-from-library/customer-360', {
      token: a.admin.token,
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ template_name: 'customer-360', customized: true });
    expect(
      (await call(server, 'POST', '/api/schemas/workspace/copy-from-library/nope', { token: a.admin.token }))
        .status,
    ).toBe(404);
  });

  it('refuses template writes by readers, anonymous callers, and callers with no workspace', async () => {
    expect(
      (await call(server, 'POST', '/api/schemas/templates/identity/assign', { token: viewer.token })).status,
    ).toBe(403);
    expect((await call(server, 'POST', '/api/schemas/templates/identity/assign')).status).toBe(401);
    expect(
      (
        await call(server, 'POST', '/api/schemas/workspace/copy-from-library/identity', {
          token: viewer.token,
        })
      ).status,
    ).toBe(403);
    const fresh = await a.addUser(['editor']);
    const res = await call(server, 'POST', '/api/schemas/templates/identity/assign', { token: fresh.token });
    expect(res.status).toBe(409);
    expect(res.body.message).toContain('select');
  });

  it('saves a valid schema', async () => {
    const res = await call(server, 'POST', '/api/schemas/workspace', {
      token: a.admin.token,
      body: { schema: validSchema() },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ customized: true, stale_connections: [] });
    expect(res.body.schema).toEqual(validSchema());
  });

  it('refuses an invalid schema with 400 listing every problem', async () => {
    const schema = validSchema();
    schema.tables[0].columns.push({
      name: 'email',
      type: 'text',
      nullable: true,
      description: '',
      pii: true,
    });
    schema.tables[0].columns.push({
      name: 'age',
      type: 'varchar',
      nullable: true,
      description: '',
      pii: false,
    });
    schema.tables[0].primary_key = ['contact_id', 'missing_id'];
    schema.tables.push({ ...schema.tables[0], name: 'Contacts' });
    const res = await call(server, 'POST', '/api/schemas/workspace', {
      token: a.admin.token,
      body: { schema },
    });
    expect(res.status).toBe(400);
    const messages = res.body.issues.map((i: { message: string }) => i.message).join('\n');
    expect(messages).toContain('Duplicate column contacts.email');
    expect(messages).toContain('unknown type varchar');
    expect(messages).toContain('missing column missing_id');
    expect(messages).toContain('Duplicate table name Contacts');
    // Both tables carry the same three problems, plus the duplicate table name.
    expect(res.body.issues.length).toBe(7);
    const unchanged = await call(server, 'GET', '/api/schemas/workspace', { token: viewer.token });
    expect(unchanged.body.schema).toEqual(validSchema());
  });

  it('refuses bad bodies and readers', async () => {
    expect(
      (await call(server, 'POST', '/api/schemas/workspace', { token: a.admin.token, body: {} })).status,
    ).toBe(400);
    expect(
      (
        await call(server, 'POST', '/api/schemas/workspace', {
          token: a.admin.token,
          body: { schema: { name: 'x' } },
        })
      ).status,
    ).toBe(400);
    expect(
      (
        await call(server, 'POST', '/api/schemas/workspace', {
          token: viewer.token,
          body: { schema: validSchema() },
        })
      ).status,
    ).toBe(403);
    expect(
      (await call(server, 'POST', '/api/schemas/workspace', { body: { schema: validSchema() } })).status,
    ).toBe(401);
    expect((await call(server, 'GET', '/api/schemas/workspace')).status).toBe(401);
  });

  it('adds a column to an existing table', async () => {
    const column = { name: 'loyalty_points', type: 'integer', description: 'Points balance' };
    const res = await call(server, 'POST', '/api/schemas/workspace/tables/contacts/columns', {
      token: a.admin.token,
      body: { column },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.schema.tables[0].columns.at(-1)).toEqual({ ...column, nullable: true, pii: false });
    const dup = await call(server, 'POST', '/api/schemas/workspace/tables/contacts/columns', {
      token: a.admin.token,
      body: { column },
    });
    expect(dup.status).toBe(409);
    const missing = await call(server, 'POST', '/api/schemas/workspace/tables/nope/columns', {
      token: a.admin.token,
      body: { column: { ...column, name: 'x' } },
    });
    expect(missing.status).toBe(404);
    const badType = await call(server, 'POST', '/api/schemas/workspace/tables/contacts/columns', {
      token: a.admin.token,
      body: { column: { name: 'y', type: 'money' } },
    });
    expect(badType.status).toBe(400);
    expect(badType.body.issues[0].message).toContain('unknown type money');
    expect(
      (
        await call(server, 'POST', '/api/schemas/workspace/tables/contacts/columns', {
          token: a.admin.token,
          body: {},
        })
      ).status,
    ).toBe(400);
    expect(
      (
        await call(server, 'POST', '/api/schemas/workspace/tables/contacts/columns', {
          token: viewer.token,
          body: { column: { name: 'z', type: 'text' } },
        })
      ).status,
    ).toBe(403);
  });

  it('lists all schemas: the library and this organization’s workspaces only', async () => {
    const other = unique('other');
    await call(server, 'POST', '/api/workspaces/create', {
      token: b.admin.token,
      body: { name: other, template_name: 'identity' },
    });
    const res = await call(server, 'GET', '/api/schemas', { token: viewer.token });
    expect(res.status).toBe(200);
    const library = res.body.schemas.filter((s: { source: string }) => s.source === 'library');
    expect(library.map((s: { name: string }) => s.name)).toEqual(TEMPLATES);
    const own = res.body.schemas.filter((s: { source: string }) => s.source === 'workspace');
    expect(own.map((s: { workspace_name: string }) => s.workspace_name)).toEqual([workspace]);
    expect((await call(server, 'GET', '/api/schemas')).status).toBe(401);
  });

  it('deletes the workspace schema', async () => {
    expect((await call(server, 'DELETE', '/api/schemas/workspace', { token: viewer.token })).status).toBe(
      403,
    );
    expect((await call(server, 'DELETE', '/api/schemas/workspace')).status).toBe(401);
    const res = await call(server, 'DELETE', '/api/schemas/workspace', { token: a.admin.token });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ exists: false, schema: null, template_name: null });
    expect((await call(server, 'GET', '/api/schemas/workspace', { token: viewer.token })).status).toBe(404);
    expect(
      (
        await call(server, 'POST', '/api/schemas/workspace/tables/contacts/columns', {
          token: a.admin.token,
          body: { column: { name: 'q', type: 'text' } },
        })
      ).status,
    ).toBe(404);
  });
});

describe('extensions (how mappings take part)', () => {
  it('reports connections to vanished fields on save, and feeds metrics, status and files', async () => {
    const name = unique('ext');
    await call(server, 'POST', '/api/workspaces/create', {
      token: a.admin.token,
      body: { name, source_config: { type: 'postgres', host: 'h', database: 'd', user: 'u' } },
    });
    // A stand-in for the mappings area: one confirmed connection to contacts.email in this workspace.
    const connections = [
      { target_table: 'contacts', target_field: 'email', source_field: 'crm_people.mail' },
    ];
    registerWorkspaceExtension({
      name: 'test-mappings',
      async files(_scope, ws) {
        return ws.name === name
          ? [{ path: 'mappings/contacts.json', content: JSON.stringify(connections) }]
          : [];
      },
      async facts(_scope, ws) {
        return ws.name === name
          ? { mapped_tables: 1, mapped_fields: 1, confirmed_connections: 1, schema_sync_status: 'in_sync' }
          : {};
      },
      async reconcileSchema(_scope, ws, schema: TargetSchema | null) {
        if (ws.name !== name) return [];
        return connections
          .filter(
            (c) =>
              !schema?.tables
                .find((t) => t.name === c.target_table)
                ?.columns.some((col) => col.name === c.target_field),
          )
          .map((c) => ({ ...c, reason: 'The target field no longer exists' }));
      },
    });
    const token = a.admin.token;
    const kept = await call(server, 'POST', '/api/schemas/workspace', {
      token,
      body: { schema: validSchema() },
    });
    expect(kept.body.stale_connections).toEqual([]);
    const schema = validSchema();
    schema.tables[0].columns = schema.tables[0].columns.filter((c) => c.name !== 'email');
    const saved = await call(server, 'POST', '/api/schemas/workspace', { token, body: { schema } });
    expect(saved.status).toBe(200);
    expect(saved.body.stale_connections).toEqual([
      {
        target_table: 'contacts',
        target_field: 'email',
        source_field: 'crm_people.mail',
        reason: 'The target field no longer exists',
      },
    ]);
    const metrics = await call(server, 'GET', '/api/workspaces/metrics', { token });
    expect(metrics.body).toMatchObject({ mapped_fields: 1, schema_fields: 2, mapping_coverage: 0.5 });
    const status = await call(server, 'GET', '/api/workspaces/workflow-status', { token });
    const discover = status.body.tasks.find((t: { task: string }) => t.task === 'discover');
    expect(discover).toMatchObject({ completed: true, status: 'completed' });
    const review = status.body.tasks.find((t: { task: string }) => t.task === 'review_mappings');
    expect(review.completed).toBe(true);
    const diff = await call(server, 'GET', `/api/workspaces/${name}/git-diff`, { token });
    expect(diff.body.files.map((f: { path: string }) => f.path)).toContain('mappings/contacts.json');
  });
});
