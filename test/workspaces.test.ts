import { inflateRawSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EntityManager } from '@mikro-orm/postgresql';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  call as rawCall,
  createTenant,
  unique,
  type CallOptions,
  type Tenant,
  type TestUser,
} from './helpers/api.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';
import { connectionConfig } from '../src/modules/workspaces/workspaces.service.ts';
import { recordWorkspaceCommit } from '../src/modules/workspaces/workspaces-files.service.ts';
import { mappingCache } from '../src/modules/workspaces/workspaces-cache.ts';

const SOURCE_PASSWORD = `src-Secret-${Math.random().toString(36).slice(2)}`;
const TARGET_PASSWORD = `tgt-Secret-${Math.random().toString(36).slice(2)}`;

let server: TestServer;
let a: Tenant;
let b: Tenant;
let viewer: TestUser;
let editor: TestUser;
/** Every response body of this file, to prove that no stored password ever comes back. */
const bodies: string[] = [];

async function call(method: string, path: string, options: CallOptions = {}) {
  const res = await rawCall(server, method, path, options);
  bodies.push(typeof res.body === 'string' ? res.body : JSON.stringify(res.body));
  return res;
}

const source = (password?: string) => ({
  type: 'postgres',
  host: 'db.example.internal',
  port: 5432,
  database: 'shop',
  user: 'reader',
  ...(password ? { password } : {}),
  schemas: ['public'],
});

async function createWorkspace(token: string, name: string, extra: Record<string, unknown> = {}) {
  const res = await call('POST', '/api/workspaces/create', { token, body: { name, ...extra } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

/** Entries of a zip archive, read through its central directory (method 0 stored, 8 deflated). */
function unzip(zip: Buffer): Map<string, string> {
  const entries = new Map<string, string>();
  const end = zip.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  let at = zip.readUInt32LE(end + 16);
  for (let i = 0; i < zip.readUInt16LE(end + 10); i++) {
    const method = zip.readUInt16LE(at + 10);
    const size = zip.readUInt32LE(at + 20);
    const nameLength = zip.readUInt16LE(at + 28);
    const skip = nameLength + zip.readUInt16LE(at + 30) + zip.readUInt16LE(at + 32);
    const name = zip.toString('utf8', at + 46, at + 46 + nameLength);
    const local = zip.readUInt32LE(at + 42);
    const start = local + 30 + zip.readUInt16LE(local + 26) + zip.readUInt16LE(local + 28);
    const data = zip.subarray(start, start + size);
    entries.set(name, (method === 8 ? inflateRawSync(data) : data).toString('utf8'));
    at += 46 + skip;
  }
  return entries;
}

beforeAll(async () => {
  server = await startTestServer();
  a = await createTenant(server);
  b = await createTenant(server);
  viewer = await a.addUser(['viewer']);
  editor = await a.addUser(['editor']);
});
afterAll(async () => server?.close());

describe('create, list, get, update, delete', () => {
  it('creates a workspace and selects it for the caller', async () => {
    const name = unique('ws');
    const ws = await createWorkspace(a.admin.token, name, {
      description: 'first',
      template_name: 'customer-360',
    });
    expect(ws).toMatchObject({
      name,
      description: 'first',
      is_current: true,
      schema_assigned: true,
      schema_template: 'customer-360',
      source_configured: false,
    });
    const current = await call('GET', '/api/workspaces/current', { token: a.admin.token });
    expect(current.status).toBe(200);
    expect(current.body.name).toBe(name);
  });

  it('refuses reserved names, in any case, saying why', async () => {
    for (const name of ['current', 'Metrics', 'schema', 'create', 'select', 'flush-cache']) {
      const res = await call('POST', '/api/workspaces/create', { token: a.admin.token, body: { name } });
      expect(res.status, name).toBe(400);
      expect(res.body.message).toMatch(/reserved/);
    }
  });

  it('refuses unsafe names with 400 and duplicates (case-insensitively) with 409', async () => {
    const bad = await call('POST', '/api/workspaces/create', {
      token: a.admin.token,
      body: { name: '../etc' },
    });
    expect(bad.status).toBe(400);
    expect(bad.body.issues[0].path).toEqual(['name']);
    const name = unique('Dup');
    await createWorkspace(a.admin.token, name);
    const again = await call('POST', '/api/workspaces/create', {
      token: a.admin.token,
      body: { name: name.toLowerCase() },
    });
    expect(again.status).toBe(409);
    expect(again.body.message).toContain('already exists');
    // Another organization may use the same name.
    await createWorkspace(b.admin.token, name);
  });

  it('refuses an unknown template with 400', async () => {
    const res = await call('POST', '/api/workspaces/create', {
      token: a.admin.token,
      body: { name: unique('ws'), template_name: 'nope' },
    });
    expect(res.status).toBe(400);
  });

  it('needs credentials and workspace.write', async () => {
    expect((await call('POST', '/api/workspaces/create', { body: { name: unique('ws') } })).status).toBe(401);
    const res = await call('POST', '/api/workspaces/create', {
      token: viewer.token,
      body: { name: unique('ws') },
    });
    expect(res.status).toBe(403);
    await createWorkspace(editor.token, unique('ed'));
  });

  it('lists the organization’s workspaces with the caller’s current and last used', async () => {
    const name = unique('ls');
    await createWorkspace(a.admin.token, name, { select: false });
    const other = unique('other');
    await createWorkspace(b.admin.token, other);
    const res = await call('GET', '/api/workspaces', { token: a.admin.token });
    expect(res.status).toBe(200);
    const names = res.body.workspaces.map((w: { name: string }) => w.name);
    expect(names).toContain(name);
    expect(names).not.toContain(other);
    const listed = res.body.workspaces.find((w: { name: string }) => w.name === name);
    expect(listed).toMatchObject({ is_current: false, last_used_at: null });
    const current = res.body.workspaces.find((w: { is_current: boolean }) => w.is_current);
    expect(current.name).toBe(res.body.current_workspace);
    expect(current.last_used_at).toEqual(expect.any(String));
    expect((await call('GET', '/api/workspaces')).status).toBe(401);
    expect((await call('GET', '/api/workspaces', { token: viewer.token })).status).toBe(200);
  });

  it('pages the list', async () => {
    const res = await call('GET', '/api/workspaces', {
      token: a.admin.token,
      query: { limit: 1, offset: 1 },
    });
    expect(res.status).toBe(200);
    expect(res.body.workspaces).toHaveLength(1);
    expect(res.body.total).toBeGreaterThan(2);
    expect(
      (await call('GET', '/api/workspaces', { token: a.admin.token, query: { limit: 501 } })).status,
    ).toBe(400);
  });

  it('gets by name; unknown and another tenant’s name answer 404', async () => {
    const name = unique('get');
    await createWorkspace(a.admin.token, name);
    const res = await call('GET', `/api/workspaces/${name}`, { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ name, source_config: null, target_config: null, table_count: 0 });
    expect(Object.keys(res.body.workflow_state)).toContain('connect_source');
    expect((await call('GET', `/api/workspaces/${name}`, { token: b.admin.token })).status).toBe(404);
    expect((await call('GET', `/api/workspaces/${unique('none')}`, { token: a.admin.token })).status).toBe(
      404,
    );
    expect((await call('GET', `/api/workspaces/${name}`)).status).toBe(401);
  });

  it('updates name and description; refuses a reserved new name', async () => {
    const name = unique('up');
    await createWorkspace(a.admin.token, name);
    const renamed = unique('renamed');
    const res = await call('PUT', `/api/workspaces/${name}`, {
      token: a.admin.token,
      body: { name: renamed, description: 'changed' },
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ name: renamed, description: 'changed' });
    expect((await call('GET', `/api/workspaces/${name}`, { token: a.admin.token })).status).toBe(404);
    const reserved = await call('PUT', `/api/workspaces/${renamed}`, {
      token: a.admin.token,
      body: { name: 'workflow-status' },
    });
    expect(reserved.status).toBe(400);
    const badBody = await call('PUT', `/api/workspaces/${renamed}`, {
      token: a.admin.token,
      body: { description: 42 },
    });
    expect(badBody.status).toBe(400);
    expect((await call('PUT', `/api/workspaces/${renamed}`, { token: viewer.token, body: {} })).status).toBe(
      403,
    );
    expect((await call('PUT', `/api/workspaces/${renamed}`, { token: b.admin.token, body: {} })).status).toBe(
      404,
    );
  });

  it('deletes a workspace with everything in it; its selection then answers 409', async () => {
    const name = unique('del');
    await createWorkspace(a.admin.token, name);
    expect((await call('DELETE', `/api/workspaces/${name}`, { token: viewer.token })).status).toBe(403);
    expect((await call('DELETE', `/api/workspaces/${name}`, { token: b.admin.token })).status).toBe(404);
    const res = await call('DELETE', `/api/workspaces/${name}`, { token: a.admin.token });
    expect(res.status).toBe(200);
    expect((await call('GET', `/api/workspaces/${name}`, { token: a.admin.token })).status).toBe(404);
    const current = await call('GET', '/api/workspaces/current', { token: a.admin.token });
    expect(current.status).toBe(409);
    expect(current.body.message).toMatch(/select/i);
  });
});

describe('selection', () => {
  it('answers 409 with a clear message when nothing is selected', async () => {
    const fresh = await a.addUser(['editor']);
    for (const path of [
      'current',
      'source-config',
      'metrics',
      'workflow-status',
      'schema',
      'target-schema/check',
    ]) {
      const res = await call('GET', `/api/workspaces/${path}`, { token: fresh.token });
      expect(res.status, path).toBe(409);
      expect(res.body, path).toMatchObject({ reason: 'NO_WORKSPACE_SELECTED' });
      expect(res.body.message).toContain('No workspace selected');
    }
  });

  it('selects a workspace; the choice holds across logins', async () => {
    const name = unique('sel');
    await createWorkspace(a.admin.token, name, { select: false });
    const user = await a.addUser(['viewer']);
    const res = await call('POST', '/api/workspaces/select', {
      token: user.token,
      body: { workspace_name: name },
    });
    expect(res.status).toBe(200);
    expect(res.body.workspace).toMatchObject({ name, is_current: true });
    const relogin = await rawCall(server, 'POST', '/api/auth/login', {
      body: { username: user.username, domain: a.organization.domain, password: 'correct-horse-battery' },
    });
    const current = await call('GET', '/api/workspaces/current', { token: relogin.body.token });
    expect(current.body.name).toBe(name);
  });

  it('refuses unknown and foreign workspaces with 404, a bad body with 400, no token with 401', async () => {
    const foreign = unique('foreign');
    await createWorkspace(b.admin.token, foreign);
    expect(
      (
        await call('POST', '/api/workspaces/select', {
          token: a.admin.token,
          body: { workspace_name: foreign },
        })
      ).status,
    ).toBe(404);
    expect((await call('POST', '/api/workspaces/select', { token: a.admin.token, body: {} })).status).toBe(
      400,
    );
    expect((await call('POST', '/api/workspaces/select', { body: { workspace_name: foreign } })).status).toBe(
      401,
    );
  });

  it('lets a service account select a workspace', async () => {
    const name = unique('sa');
    await createWorkspace(a.admin.token, name, { select: false });
    const created = await call('POST', '/api/api/service-accounts', {
      token: a.admin.token,
      body: { name: unique('bot'), roles: ['editor'] },
    });
    expect(created.status).toBe(200);
    const key = created.body.api_key;
    expect((await call('GET', '/api/workspaces/current', { token: key })).status).toBe(409);
    expect(
      (await call('POST', '/api/workspaces/select', { token: key, body: { workspace_name: name } })).status,
    ).toBe(200);
    const current = await call('GET', '/api/workspaces/current', { token: key });
    expect(current.body.name).toBe(name);
  });
});

describe('source configuration and secrets', () => {
  let name: string;
  beforeAll(async () => {
    name = unique('src');
    await createWorkspace(a.admin.token, name);
  });

  it('reads an unconfigured source as such', async () => {
    const res = await call('GET', '/api/workspaces/source-config', { token: a.admin.token });
    expect(res.body).toEqual({ workspace_name: name, configured: false, source_config: null, warnings: [] });
  });

  it('validates the shape with 400 naming the wrong field', async () => {
    const res = await call('POST', '/api/workspaces/source-config', {
      token: a.admin.token,
      body: { source_config: { ...source(), port: 'not-a-port' } },
    });
    expect(res.status).toBe(400);
    expect(res.body.issues.some((i: { path: string[] }) => i.path.join('.') === 'source_config.port')).toBe(
      true,
    );
    const missing = await call('POST', '/api/workspaces/source-config', {
      token: a.admin.token,
      body: { source_config: { type: 'postgres' } },
    });
    expect(missing.status).toBe(400);
    expect(missing.body.issues.map((i: { path: string[] }) => i.path.join('.'))).toContain(
      'source_config.host',
    );
  });

  it('stores the password encrypted and never returns it', async () => {
    const res = await call('POST', '/api/workspaces/source-config', {
      token: a.admin.token,
      body: { source_config: source(SOURCE_PASSWORD) },
    });
    expect(res.status).toBe(200);
    expect(res.body.source_config).toMatchObject({ host: 'db.example.internal', password_set: true });
    expect(res.body.source_config.password).toBeUndefined();
    const [row] = await server.deps.orm.em
      .fork()
      .getConnection()
      .execute('select * from workspaces where organization_id = ? and name = ?', [a.organization.id, name]);
    const raw = JSON.stringify(row);
    expect(raw).not.toContain(SOURCE_PASSWORD);
    expect(row.source_config.password).toMatch(/^v1:/);
    // The contract other areas use decrypts it.
    const em = server.deps.orm.em.fork() as EntityManager;
    const ws = await em.findOneOrFail(Workspace, { organization: a.organization.id, name });
    expect(connectionConfig({ em, deps: server.deps }, ws, 'source')?.password).toBe(SOURCE_PASSWORD);
  });

  it('keeps the stored password when the masked config comes back', async () => {
    const read = await call('GET', '/api/workspaces/source-config', { token: a.admin.token });
    const res = await call('POST', '/api/workspaces/source-config', {
      token: a.admin.token,
      body: { source_config: { ...read.body.source_config, database: 'shop2' } },
    });
    expect(res.body.source_config).toMatchObject({ database: 'shop2', password_set: true });
    const em = server.deps.orm.em.fork() as EntityManager;
    const ws = await em.findOneOrFail(Workspace, { organization: a.organization.id, name });
    expect(connectionConfig({ em, deps: server.deps }, ws, 'source')?.password).toBe(SOURCE_PASSWORD);
  });

  it('accepts the longest password allowed', async () => {
    const long = 'p'.repeat(1024);
    const res = await call('POST', '/api/workspaces/source-config', {
      token: a.admin.token,
      body: { source_config: source(long) },
    });
    expect(res.status).toBe(200);
    expect((await call('GET', `/api/workspaces/${name}`, { token: a.admin.token })).status).toBe(200);
    await call('POST', '/api/workspaces/source-config', {
      token: a.admin.token,
      body: { source_config: source(SOURCE_PASSWORD) },
    });
  });

  it('needs workspace.write to change it', async () => {
    await call('POST', '/api/workspaces/select', { token: viewer.token, body: { workspace_name: name } });
    expect((await call('GET', '/api/workspaces/source-config', { token: viewer.token })).status).toBe(200);
    const res = await call('POST', '/api/workspaces/source-config', {
      token: viewer.token,
      body: { source_config: source() },
    });
    expect(res.status).toBe(403);
    expect((await call('GET', '/api/workspaces/source-config')).status).toBe(401);
  });

  it('round-trips the complete configuration, secrets masked and kept', async () => {
    const saved = await call('POST', `/api/workspaces/${name}/config`, {
      token: a.admin.token,
      body: {
        target_config: source(TARGET_PASSWORD),
        settings: { sample_size: 200 },
        success_criteria_prompt: 'Every customer has an e-mail.',
      },
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    expect(saved.body.target_config.password_set).toBe(true);
    const read = await call('GET', `/api/workspaces/${name}/config`, { token: viewer.token });
    expect(read.status).toBe(200);
    expect(read.body).toMatchObject({
      workspace_name: name,
      settings: { sample_size: 200 },
      success_criteria_prompt: 'Every customer has an e-mail.',
      schema_template: null,
    });
    // What GET answered goes back unchanged and nothing is lost.
    const again = await call('POST', `/api/workspaces/${name}/config`, {
      token: a.admin.token,
      body: read.body,
    });
    expect(again.status, JSON.stringify(again.body)).toBe(200);
    const { stale_connections: stale, ...rest } = again.body;
    expect(stale).toEqual([]);
    expect(rest).toEqual(read.body);
    const em = server.deps.orm.em.fork() as EntityManager;
    const ws = await em.findOneOrFail(Workspace, { organization: a.organization.id, name });
    expect(connectionConfig({ em, deps: server.deps }, ws, 'target')?.password).toBe(TARGET_PASSWORD);
    expect(connectionConfig({ em, deps: server.deps }, ws, 'source')?.password).toBe(SOURCE_PASSWORD);
    const [row] = await em
      .getConnection()
      .execute('select target_config::text as t from workspaces where id = ?', [ws.id]);
    expect(row.t).not.toContain(TARGET_PASSWORD);
  });

  it('validates the configuration document', async () => {
    const res = await call('POST', `/api/workspaces/${name}/config`, {
      token: a.admin.token,
      body: {
        settings: { sample_size: -1 },
        target_schema: { name: 'x', tables: [{ name: 't', columns: [{ name: 'a', type: 'varchar(3)' }] }] },
      },
    });
    expect(res.status).toBe(400);
    const settings = await call('POST', `/api/workspaces/${name}/config`, {
      token: a.admin.token,
      body: { settings: { sample_size: -1 } },
    });
    expect(settings.status).toBe(400);
    expect(settings.body.issues[0].path[0]).toBe('settings');
    expect(
      (await call('POST', `/api/workspaces/${name}/config`, { token: viewer.token, body: {} })).status,
    ).toBe(403);
    expect((await call('GET', `/api/workspaces/${name}/config`, { token: b.admin.token })).status).toBe(404);
  });

  it('clears a password when password_set is false', async () => {
    const res = await call('POST', `/api/workspaces/${name}/config`, {
      token: a.admin.token,
      body: { target_config: { ...source(), password_set: false } },
    });
    expect(res.body.target_config.password_set).toBe(false);
  });
});

describe('target schema of the current workspace', () => {
  let name: string;
  beforeAll(async () => {
    name = unique('ts');
    await createWorkspace(a.admin.token, name);
  });

  it('reports no schema, then assigns a template', async () => {
    const check = await call('GET', '/api/workspaces/target-schema/check', { token: a.admin.token });
    expect(check.body).toMatchObject({ workspace_name: name, assigned: false, table_count: 0 });
    expect(
      (await call('GET', '/api/workspaces/target-schema/content', { token: a.admin.token })).status,
    ).toBe(404);
    expect((await call('GET', '/api/workspaces/schema', { token: a.admin.token })).body.schema).toBeNull();
    const assign = await call('POST', '/api/workspaces/target-schema/assign', {
      token: a.admin.token,
      body: { template_name: 'ecommerce-orders' },
    });
    expect(assign.status).toBe(200);
    expect(assign.body).toMatchObject({
      assigned: true,
      template_name: 'ecommerce-orders',
      customized: false,
    });
    const content = await call('GET', '/api/workspaces/target-schema/content', { token: a.admin.token });
    expect(content.body.schema.tables.map((t: { name: string }) => t.name)).toEqual([
      'orders',
      'order_items',
      'products',
    ]);
    const schema = await call('GET', '/api/workspaces/schema', { token: a.admin.token });
    expect(schema.body).toMatchObject({ template_name: 'ecommerce-orders', customized: false });
  });

  it('lists available schemas: the library and the organization’s workspaces', async () => {
    const res = await call('GET', '/api/workspaces/target-schema/available', { token: a.admin.token });
    expect(res.status).toBe(200);
    const library = res.body.schemas.filter((s: { source: string }) => s.source === 'library');
    expect(library.map((s: { name: string }) => s.name).sort()).toEqual([
      'customer-360',
      'ecommerce-orders',
      'identity',
      'marketing-events',
    ]);
    expect(library.find((s: { name: string }) => s.name === 'ecommerce-orders').is_assigned).toBe(true);
    const own = res.body.schemas.find((s: { workspace_name: string }) => s.workspace_name === name);
    expect(own.is_assigned).toBe(true);
  });

  it('copies another workspace’s schema; foreign ones are 404', async () => {
    const from = unique('from');
    await createWorkspace(a.admin.token, from, { template_name: 'identity', select: false });
    const res = await call('POST', '/api/workspaces/target-schema/assign', {
      token: a.admin.token,
      body: { from_workspace: from },
    });
    expect(res.body).toMatchObject({
      assigned: true,
      template_name: 'identity',
      customized: true,
      table_count: 3,
    });
    const foreign = unique('fws');
    await createWorkspace(b.admin.token, foreign, { template_name: 'identity' });
    const refused = await call('POST', '/api/workspaces/target-schema/assign', {
      token: a.admin.token,
      body: { from_workspace: foreign },
    });
    expect(refused.status).toBe(404);
  });

  it('refuses bad input, unknown templates and readers', async () => {
    expect(
      (await call('POST', '/api/workspaces/target-schema/assign', { token: a.admin.token, body: {} })).status,
    ).toBe(400);
    expect(
      (
        await call('POST', '/api/workspaces/target-schema/assign', {
          token: a.admin.token,
          body: { template_name: 'nope' },
        })
      ).status,
    ).toBe(404);
    await call('POST', '/api/workspaces/select', { token: viewer.token, body: { workspace_name: name } });
    expect(
      (
        await call('POST', '/api/workspaces/target-schema/assign', {
          token: viewer.token,
          body: { template_name: 'identity' },
        })
      ).status,
    ).toBe(403);
    for (const path of ['check', 'content', 'available'])
      expect((await call('GET', `/api/workspaces/target-schema/${path}`)).status).toBe(401);
  });
});

describe('workflow', () => {
  let name: string;
  beforeAll(async () => {
    name = unique('wf');
    await createWorkspace(a.admin.token, name);
  });

  it('marks tasks complete and incomplete with their data', async () => {
    const state = await call('GET', `/api/workspaces/${name}/workflow/state`, { token: viewer.token });
    expect(state.body.tasks.connect_source).toEqual({ completed: false, completed_at: null, data: {} });
    const done = await call('POST', `/api/workspaces/${name}/workflow/complete`, {
      token: a.admin.token,
      body: { task_data: { task: 'review_mappings', data: { reviewer: 'ann' } } },
    });
    expect(done.status).toBe(200);
    expect(done.body.tasks.review_mappings).toMatchObject({ completed: true, data: { reviewer: 'ann' } });
    expect(done.body.tasks.review_mappings.completed_at).toEqual(expect.any(String));
    const undone = await call('POST', `/api/workspaces/${name}/workflow/incomplete`, {
      token: a.admin.token,
      body: { task_data: { task: 'review_mappings' } },
    });
    expect(undone.body.tasks.review_mappings).toMatchObject({ completed: false, completed_at: null });
  });

  it('refuses unknown tasks, readers and other tenants', async () => {
    const bad = await call('POST', `/api/workspaces/${name}/workflow/complete`, {
      token: a.admin.token,
      body: { task_data: { task: 'fly_to_the_moon' } },
    });
    expect(bad.status).toBe(400);
    const body = { task_data: { task: 'discover' } };
    expect(
      (await call('POST', `/api/workspaces/${name}/workflow/complete`, { token: viewer.token, body })).status,
    ).toBe(403);
    expect(
      (await call('POST', `/api/workspaces/${name}/workflow/incomplete`, { token: b.admin.token, body }))
        .status,
    ).toBe(404);
    expect(
      (await call('GET', `/api/workspaces/${name}/workflow/state`, { token: b.admin.token })).status,
    ).toBe(404);
    expect((await call('GET', `/api/workspaces/${name}/workflow/state`)).status).toBe(401);
  });

  it('derives the status from the real state, not the flags', async () => {
    await call('POST', `/api/workspaces/${name}/workflow/complete`, {
      token: a.admin.token,
      body: { task_data: { task: 'connect_source' } },
    });
    let res = await call('GET', '/api/workspaces/workflow-status', { token: a.admin.token });
    expect(res.status).toBe(200);
    const task = (t: string) => res.body.tasks.find((x: { task: string }) => x.task === t);
    // Flagged but not configured: not done.
    expect(task('connect_source')).toMatchObject({
      completed: false,
      marked_complete: true,
      status: 'available',
    });
    expect(task('discover')).toMatchObject({
      status: 'blocked',
      blocked_by: ['connect_source', 'assign_schema'],
    });
    expect(res.body.next_task).toBe('connect_source');
    await call('POST', '/api/workspaces/source-config', {
      token: a.admin.token,
      body: { source_config: source() },
    });
    await call('POST', '/api/schemas/templates/customer-360/assign', { token: a.admin.token });
    res = await call('GET', '/api/workspaces/workflow-status', { token: a.admin.token });
    expect(task('connect_source').completed).toBe(true);
    expect(task('assign_schema').completed).toBe(true);
    expect(task('discover')).toMatchObject({ status: 'available', blocked_by: [] });
    expect(res.body.progress).toBeCloseTo(2 / 8);
    expect((await call('GET', '/api/workspaces/workflow-status')).status).toBe(401);
  });

  it('reports metrics from the schema (nothing mapped yet)', async () => {
    const res = await call('GET', '/api/workspaces/metrics', { token: a.admin.token });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      workspace_name: name,
      schema_tables: 3,
      mapped_fields: 0,
      confirmed_connections: 0,
      mapping_coverage: 0,
      schema_sync_status: 'not_synced',
      last_materialized_at: null,
    });
    expect(res.body.schema_fields).toBeGreaterThan(30);
    expect(res.body.unmapped_fields).toBe(res.body.schema_fields);
    expect(res.body.pii_fields).toBeGreaterThan(5);
    expect((await call('GET', '/api/workspaces/metrics')).status).toBe(401);
  });
});

describe('settings', () => {
  let name: string;
  beforeAll(async () => {
    name = unique('set');
    await createWorkspace(a.admin.token, name);
  });

  it('global admin settings: POST replaces, PUT merges, DELETE resets; a workspace inherits them', async () => {
    const initial = await call('GET', '/api/workspaces/admin-settings', { token: viewer.token });
    expect(initial.body).toMatchObject({ scope: 'global', is_default: true, settings: {} });
    expect(initial.body.effective.sample_size).toBe(1000);
    const created = await call('POST', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: { sample_size: 500, query_row_limit: 50 },
    });
    expect(created.body.settings).toEqual({ sample_size: 500, query_row_limit: 50 });
    const replaced = await call('POST', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: { sample_size: 600 },
    });
    expect(replaced.body.settings).toEqual({ sample_size: 600 });
    expect(replaced.body.effective.query_row_limit).toBe(1000);
    const merged = await call('PUT', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: { query_timeout_seconds: 10 },
    });
    expect(merged.body.settings).toEqual({ sample_size: 600, query_timeout_seconds: 10 });
    const ws = await call('PUT', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: { workspace_name: name, sample_size: 42, auto_confirm_threshold: 0.9 },
    });
    expect(ws.body).toMatchObject({ scope: 'workspace', workspace_name: name });
    expect(ws.body.effective).toMatchObject({
      sample_size: 42,
      query_timeout_seconds: 10,
      auto_confirm_threshold: 0.9,
    });
    const nulled = await call('PUT', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      body: { workspace_name: name, sample_size: null },
    });
    expect(nulled.body.effective.sample_size).toBe(600);
    const read = await call('GET', '/api/workspaces/admin-settings', {
      token: viewer.token,
      query: { workspace_name: name },
    });
    expect(read.body.settings).toEqual({ auto_confirm_threshold: 0.9 });
    const reset = await call('DELETE', '/api/workspaces/admin-settings', {
      token: a.admin.token,
      query: { workspace_name: name },
    });
    expect(reset.body).toMatchObject({ is_default: true, settings: {} });
    const global = await call('DELETE', '/api/workspaces/admin-settings', { token: a.admin.token });
    expect(global.body).toMatchObject({ scope: 'global', is_default: true });
  });

  it('refuses unknown keys and bad values with 400, editors with 403, foreign workspaces with 404', async () => {
    expect(
      (await call('PUT', '/api/workspaces/admin-settings', { token: a.admin.token, body: { bogus: 1 } }))
        .status,
    ).toBe(400);
    expect(
      (
        await call('POST', '/api/workspaces/admin-settings', {
          token: a.admin.token,
          body: { sample_size: 'x' },
        })
      ).status,
    ).toBe(400);
    for (const method of ['POST', 'PUT', 'DELETE'])
      expect(
        (
          await call(method, '/api/workspaces/admin-settings', {
            token: editor.token,
            body: method === 'DELETE' ? undefined : {},
          })
        ).status,
      ).toBe(403);
    expect(
      (
        await call('GET', '/api/workspaces/admin-settings', {
          token: b.admin.token,
          query: { workspace_name: name },
        })
      ).status,
    ).toBe(404);
    expect((await call('GET', '/api/workspaces/admin-settings')).status).toBe(401);
  });

  it('global settings: defaults, merge, null resets; per organization', async () => {
    const initial = await call('GET', '/api/workspaces/global-settings', { token: viewer.token });
    expect(initial.body.settings).toEqual({ business_context: '' });
    const updated = await call('PUT', '/api/workspaces/global-settings', {
      token: a.admin.token,
      body: { business_context: 'We sell bikes.' },
    });
    expect(updated.status).toBe(200);
    expect(updated.body.settings).toEqual({ business_context: 'We sell bikes.' });
    // An empty patch changes nothing; null resets to the default.
    const kept = await call('PUT', '/api/workspaces/global-settings', { token: a.admin.token, body: {} });
    expect(kept.body.settings).toEqual({ business_context: 'We sell bikes.' });
    const other = await call('GET', '/api/workspaces/global-settings', { token: b.admin.token });
    expect(other.body.settings.business_context).toBe('');
    const again = await call('PUT', '/api/workspaces/global-settings', {
      token: a.admin.token,
      body: { business_context: null },
    });
    expect(again.body.settings).toEqual({ business_context: '' });
    // Settings without an effect were removed; sending one is a 400 like any unknown key.
    for (const body of [
      { business_context: 42 },
      { currency_code: 'EUR' },
      { data_retention_days: 30 },
      { organization_display_name: 'Bikes & Co' },
    ])
      expect(
        (await call('PUT', '/api/workspaces/global-settings', { token: a.admin.token, body })).status,
      ).toBe(400);
    expect(
      (await call('PUT', '/api/workspaces/global-settings', { token: editor.token, body: {} })).status,
    ).toBe(403);
    expect((await call('GET', '/api/workspaces/global-settings')).status).toBe(401);
  });

  it('user preferences: POST replaces, PUT merges, DELETE resets and keeps the selection', async () => {
    const user = await a.addUser(['viewer']);
    await call('POST', '/api/workspaces/select', { token: user.token, body: { workspace_name: name } });
    const initial = await call('GET', '/api/workspaces/user-preferences', { token: user.token });
    expect(initial.body).toMatchObject({
      preferences: { theme: 'system', page_size: 50 },
      current_workspace: name,
    });
    expect(initial.body.last_used[0].workspace_name).toBe(name);
    const created = await call('POST', '/api/workspaces/user-preferences', {
      token: user.token,
      body: { theme: 'dark', page_size: 100 },
    });
    expect(created.body.preferences).toMatchObject({ theme: 'dark', page_size: 100 });
    const replaced = await call('POST', '/api/workspaces/user-preferences', {
      token: user.token,
      body: { theme: 'light' },
    });
    expect(replaced.body.preferences).toMatchObject({ theme: 'light', page_size: 50 });
    const merged = await call('PUT', '/api/workspaces/user-preferences', {
      token: user.token,
      body: { language: 'de' },
    });
    expect(merged.body.preferences).toMatchObject({ theme: 'light', language: 'de' });
    const reset = await call('DELETE', '/api/workspaces/user-preferences', { token: user.token });
    expect(reset.body.preferences).toMatchObject({ theme: 'system', language: 'en' });
    expect(reset.body.current_workspace).toBe(name);
    expect((await call('GET', '/api/workspaces/current', { token: user.token })).body.name).toBe(name);
    expect(
      (await call('PUT', '/api/workspaces/user-preferences', { token: user.token, body: { theme: 'neon' } }))
        .status,
    ).toBe(400);
    expect(
      (
        await call('POST', '/api/workspaces/user-preferences', {
          token: user.token,
          body: { current_workspace: 'x' },
        })
      ).status,
    ).toBe(400);
    for (const method of ['GET', 'POST', 'PUT', 'DELETE'])
      expect(
        (
          await call(method, '/api/workspaces/user-preferences', {
            body: method === 'POST' || method === 'PUT' ? {} : undefined,
          })
        ).status,
      ).toBe(401);
  });
});

describe('prompts', () => {
  let name: string;
  beforeAll(async () => {
    name = unique('pr');
    await createWorkspace(a.admin.token, name);
  });

  it('system prompt: default, clone, update, delete reverts', async () => {
    const initial = await call('GET', `/api/workspaces/${name}/system-prompt`, { token: viewer.token });
    expect(initial.body).toMatchObject({ is_custom: false });
    expect(initial.body.prompt).toBe(initial.body.default_prompt);
    const cloned = await call('POST', `/api/workspaces/${name}/system-prompt/clone`, {
      token: a.admin.token,
    });
    expect(cloned.body).toMatchObject({ is_custom: true, prompt: initial.body.default_prompt });
    expect(
      (await call('POST', `/api/workspaces/${name}/system-prompt/clone`, { token: a.admin.token })).status,
    ).toBe(409);
    const updated = await call('PUT', `/api/workspaces/${name}/system-prompt`, {
      token: a.admin.token,
      body: { prompt: 'Map only the customers table.' },
    });
    expect(updated.body).toMatchObject({ is_custom: true, prompt: 'Map only the customers table.' });
    const deleted = await call('DELETE', `/api/workspaces/${name}/system-prompt`, { token: a.admin.token });
    expect(deleted.body).toMatchObject({ is_custom: false, prompt: initial.body.default_prompt });
  });

  it('system prompt: refuses bad input, readers and other tenants', async () => {
    expect(
      (
        await call('PUT', `/api/workspaces/${name}/system-prompt`, {
          token: a.admin.token,
          body: { prompt: '' },
        })
      ).status,
    ).toBe(400);
    expect(
      (
        await call('PUT', `/api/workspaces/${name}/system-prompt`, {
          token: viewer.token,
          body: { prompt: 'x' },
        })
      ).status,
    ).toBe(403);
    expect(
      (await call('POST', `/api/workspaces/${name}/system-prompt/clone`, { token: viewer.token })).status,
    ).toBe(403);
    expect(
      (await call('DELETE', `/api/workspaces/${name}/system-prompt`, { token: viewer.token })).status,
    ).toBe(403);
    expect(
      (await call('GET', `/api/workspaces/${name}/system-prompt`, { token: b.admin.token })).status,
    ).toBe(404);
    expect(
      (await call('DELETE', `/api/workspaces/${name}/system-prompt`, { token: b.admin.token })).status,
    ).toBe(404);
    expect((await call('GET', `/api/workspaces/${name}/system-prompt`)).status).toBe(401);
  });

  it('success-criteria prompt file', async () => {
    const initial = await call('GET', `/api/workspaces/${name}/prompt`, { token: viewer.token });
    expect(initial.body).toEqual({ workspace_name: name, content: '', exists: false });
    const put = await call('PUT', `/api/workspaces/${name}/prompt`, {
      token: a.admin.token,
      body: { content: '- 95% of customers have an e-mail' },
    });
    expect(put.body).toMatchObject({ exists: true, content: '- 95% of customers have an e-mail' });
    expect(
      (await call('PUT', `/api/workspaces/${name}/prompt`, { token: a.admin.token, body: {} })).status,
    ).toBe(400);
    expect(
      (await call('PUT', `/api/workspaces/${name}/prompt`, { token: viewer.token, body: { content: 'x' } }))
        .status,
    ).toBe(403);
    expect((await call('GET', `/api/workspaces/${name}/prompt`, { token: b.admin.token })).status).toBe(404);
    expect((await call('GET', `/api/workspaces/${name}/prompt`)).status).toBe(401);
  });
});

describe('files: git-diff and download', () => {
  let name: string;
  beforeAll(async () => {
    name = unique('files');
    await createWorkspace(a.admin.token, name, {
      template_name: 'identity',
      source_config: source(SOURCE_PASSWORD),
    });
    await call('PUT', `/api/workspaces/${name}/prompt`, {
      token: a.admin.token,
      body: { content: 'criteria v1\n' },
    });
  });

  it('diffs against the empty tree before the first commit', async () => {
    const res = await call('GET', `/api/workspaces/${name}/git-diff`, { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body.base_commit).toBeNull();
    expect(res.body.has_changes).toBe(true);
    expect(res.body.files.map((f: { path: string }) => f.path)).toEqual([
      'prompts/success_criteria.md',
      'schema.json',
      'workspace.json',
    ]);
    expect(res.body.files.every((f: { status: string }) => f.status === 'added')).toBe(true);
    expect(res.body.diff).toContain('diff --git a/schema.json b/schema.json');
    expect(res.body.diff).toContain('--- /dev/null');
    expect(res.body.diff).toContain('+++ b/schema.json');
    expect(res.body.diff).toContain('+  "name": "identity"');
    expect(res.body.diff).toContain('"password_set": true');
  });

  it('diffs against the last commit', async () => {
    const em = server.deps.orm.em.fork() as EntityManager;
    const ws = await em.findOneOrFail(Workspace, { organization: a.organization.id, name });
    const principal = {
      id: a.admin.id,
      organizationId: a.organization.id,
      username: a.admin.username,
    } as never;
    await recordWorkspaceCommit({ em, deps: server.deps, principal }, ws, 'initial');
    const clean = await call('GET', `/api/workspaces/${name}/git-diff`, { token: a.admin.token });
    expect(clean.body).toMatchObject({ has_changes: false, files: [], diff: '' });
    expect(clean.body.base_commit.message).toBe('initial');
    await call('PUT', `/api/workspaces/${name}/prompt`, {
      token: a.admin.token,
      body: { content: 'criteria v2\n' },
    });
    const changed = await call('GET', `/api/workspaces/${name}/git-diff`, { token: a.admin.token });
    expect(changed.body.files).toEqual([
      { path: 'prompts/success_criteria.md', status: 'modified', additions: 1, deletions: 1 },
    ]);
    expect(changed.body.diff).toContain('-criteria v1');
    expect(changed.body.diff).toContain('+criteria v2');
  });

  it('refuses other tenants and anonymous callers', async () => {
    expect((await call('GET', `/api/workspaces/${name}/git-diff`, { token: b.admin.token })).status).toBe(
      404,
    );
    expect((await call('GET', `/api/workspaces/${name}/git-diff`)).status).toBe(401);
  });

  it('downloads the files as a zip', async () => {
    const res = await fetch(new URL(`/api/workspaces/${name}/download`, server.url), {
      headers: { authorization: `Bearer ${viewer.token}` },
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/zip');
    expect(res.headers.get('content-disposition')).toContain(`${name}-`);
    const bytes = Buffer.from(await res.arrayBuffer());
    expect(bytes.subarray(0, 4)).toEqual(Buffer.from([0x50, 0x4b, 0x03, 0x04]));
    const entries = unzip(bytes);
    expect([...entries.keys()].sort()).toEqual([
      'prompts/success_criteria.md',
      'schema.json',
      'workspace.json',
    ]);
    expect(JSON.parse(entries.get('schema.json')!).name).toBe('identity');
    expect(entries.get('prompts/success_criteria.md')).toBe('criteria v2\n');
    expect(JSON.parse(entries.get('workspace.json')!).source_config).toMatchObject({ password_set: true });
    for (const content of entries.values()) expect(content).not.toContain(SOURCE_PASSWORD);
    const anonymous = await call('GET', `/api/workspaces/${name}/download`);
    expect(anonymous.status).toBe(401);
    expect(anonymous.body.code).toBe('UNAUTHORIZED');
    expect((await call('GET', `/api/workspaces/${name}/download`, { token: b.admin.token })).status).toBe(
      404,
    );
  });
});

describe('caches and benchmark', () => {
  it('caches the selection; flush-cache makes the next request reload it', async () => {
    const user = await a.addUser(['viewer']);
    const first = unique('c1');
    const second = unique('c2');
    await createWorkspace(a.admin.token, first, { select: false });
    await createWorkspace(a.admin.token, second, { select: false });
    await call('POST', '/api/workspaces/select', { token: user.token, body: { workspace_name: first } });
    expect((await call('GET', '/api/workspaces/current', { token: user.token })).body.name).toBe(first);
    // Another API process changes the selection: this one still answers from its cache…
    await server.deps.orm.em
      .fork()
      .getConnection()
      .execute(
        `update users set preferences = jsonb_set(preferences, '{current_workspace}', to_jsonb((select id::text from workspaces where organization_id = ? and name = ?))) where id = ?`,
        [a.organization.id, second, user.id],
      );
    expect((await call('GET', '/api/workspaces/current', { token: user.token })).body.name).toBe(first);
    // …until the caller flushes it.
    const res = await call('POST', '/api/workspaces/flush-cache', { token: user.token });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ success: true, cleared: 1 });
    expect((await call('GET', '/api/workspaces/current', { token: user.token })).body.name).toBe(second);
    expect((await call('POST', '/api/workspaces/flush-cache')).status).toBe(401);
  });

  it('flushes the mapping cache of the caller’s organization only (workspace.write)', async () => {
    const em = server.deps.orm.em.fork() as EntityManager;
    const inA = { em, organizationId: a.organization.id };
    const inB = { em, organizationId: b.organization.id };
    await mappingCache.set(inA, 'w1:sql', 'select 1');
    await mappingCache.set(inB, 'w2:sql', 'select 2');
    const res = await call('POST', '/api/workspaces/flush-mapping-cache', { token: editor.token });
    expect(res.status).toBe(200);
    expect(res.body.cleared).toBeGreaterThanOrEqual(1);
    expect(await mappingCache.get(inA, 'w1:sql')).toBeUndefined();
    expect(await mappingCache.get(inB, 'w2:sql')).toBe('select 2');
    expect((await call('POST', '/api/workspaces/flush-mapping-cache', { token: viewer.token })).status).toBe(
      403,
    );
    expect((await call('POST', '/api/workspaces/flush-mapping-cache')).status).toBe(401);
  });

  it('benchmarks filesystem, file access and database for org admins only', async () => {
    expect((await call('POST', '/api/workspaces/benchmark', { token: editor.token })).status).toBe(403);
    expect((await call('POST', '/api/workspaces/benchmark')).status).toBe(401);
    const res = await call('POST', '/api/workspaces/benchmark', { token: a.admin.token });
    expect(res.status).toBe(200);
    for (const t of [
      res.body.filesystem.write,
      res.body.filesystem.read,
      res.body.file_access.stat,
      res.body.database.round_trip,
      res.body.database.workspace_query,
    ]) {
      expect(t.operations).toBeGreaterThan(0);
      expect(t.ops_per_sec).toBeGreaterThan(0);
    }
    expect(res.body.total_ms).toBeLessThan(10_000);
  });
});

describe('secrets', () => {
  it('never returns a stored password from any route of workspaces and schemas', async () => {
    const name = unique('secret');
    await createWorkspace(a.admin.token, name, {
      source_config: source(SOURCE_PASSWORD),
      target_config: source(TARGET_PASSWORD),
      template_name: 'customer-360',
    });
    const token = a.admin.token;
    const gets = [
      '/api/workspaces',
      '/api/workspaces/current',
      '/api/workspaces/source-config',
      '/api/workspaces/target-schema/check',
      '/api/workspaces/target-schema/content',
      '/api/workspaces/target-schema/available',
      '/api/workspaces/workflow-status',
      '/api/workspaces/metrics',
      '/api/workspaces/schema',
      '/api/workspaces/admin-settings',
      '/api/workspaces/user-preferences',
      '/api/workspaces/global-settings',
      `/api/workspaces/${name}`,
      `/api/workspaces/${name}/config`,
      `/api/workspaces/${name}/workflow/state`,
      `/api/workspaces/${name}/system-prompt`,
      `/api/workspaces/${name}/prompt`,
      `/api/workspaces/${name}/git-diff`,
      `/api/workspaces/${name}/download`,
      '/api/schemas',
      '/api/schemas/workspace',
    ];
    for (const path of gets) expect((await call('GET', path, { token })).status, path).toBe(200);
    const read = await call('GET', `/api/workspaces/${name}/config`, { token });
    expect((await call('POST', `/api/workspaces/${name}/config`, { token, body: read.body })).status).toBe(
      200,
    );
    expect(
      (await call('POST', '/api/workspaces/select', { token, body: { workspace_name: name } })).status,
    ).toBe(200);
    expect((await call('PUT', `/api/workspaces/${name}`, { token, body: { description: 'x' } })).status).toBe(
      200,
    );
    // Every body this file received, these sweeps included.
    expect(bodies.length).toBeGreaterThan(200);
    for (const body of bodies) {
      expect(body).not.toContain(SOURCE_PASSWORD);
      expect(body).not.toContain(TARGET_PASSWORD);
    }
    const [row] = await server.deps.orm.em
      .fork()
      .getConnection()
      .execute('select * from workspaces where organization_id = ? and name = ?', [a.organization.id, name]);
    expect(JSON.stringify(row)).not.toContain(SOURCE_PASSWORD);
    expect(JSON.stringify(row)).not.toContain(TARGET_PASSWORD);
  });
});
