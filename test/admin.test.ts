import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  call,
  createTenant,
  login,
  superAdminToken,
  unique,
  type Tenant,
  type TestUser,
} from './helpers/api.ts';
import { ALL_PERMISSIONS } from '../src/auth/permissions.ts';

let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let editor: TestUser;
let superAdmin: string;

const MISSING_ID = '00000000-0000-4000-8000-000000000000';

beforeAll(async () => {
  server = await startTestServer();
  [tenant, other] = await Promise.all([createTenant(server), createTenant(server)]);
  editor = await tenant.addUser(['editor']);
  superAdmin = await superAdminToken(server);
});
afterAll(async () => server?.close());

const asAdmin = (method: string, path: string, body?: unknown) =>
  call(server, method, path, { token: tenant.admin.token, body });

async function roleId(t: Tenant, name: string): Promise<number> {
  const res = await call(server, 'GET', '/api/admin/roles', { token: t.admin.token });
  return res.body.roles.find((r: { name: string }) => r.name === name).id;
}

describe('guards of the organization administration', () => {
  it('answers 401 without a token and 403 to an editor on every org.admin route', async () => {
    const role = await roleId(tenant, 'viewer');
    const routes: [string, string, unknown?][] = [
      ['GET', '/api/admin/users'],
      ['POST', '/api/admin/users', { username: unique('u') }],
      ['PUT', `/api/admin/users/${editor.id}`, { email: 'e@example.com' }],
      ['PUT', `/api/admin/users/${editor.id}/roles`, { roles: ['admin'] }],
      ['DELETE', `/api/admin/users/${tenant.admin.id}`],
      ['GET', '/api/admin/roles'],
      ['POST', '/api/admin/roles', { name: unique('r'), permissions: [] }],
      ['PUT', `/api/admin/roles/${role}`, { description: 'x' }],
      ['PUT', `/api/admin/roles/${role}/permissions`, { permissions: ['org.admin'] }],
      ['DELETE', `/api/admin/roles/${role}`],
      ['GET', '/api/admin/permissions'],
    ];
    for (const [method, path, body] of routes) {
      const anonymous = await call(server, method, path, { body });
      expect(anonymous.status, `${method} ${path}`).toBe(401);
      const refused = await call(server, method, path, { token: editor.token, body });
      expect(refused.status, `${method} ${path}`).toBe(403);
      expect(refused.body).toEqual({ code: 'FORBIDDEN', message: expect.any(String) });
    }
    // The editor did not promote itself.
    const me = await call(server, 'GET', '/api/auth/session', { token: editor.token });
    expect(me.body.user.permissions).not.toContain('org.admin');
  });

  it('refuses a super admin on organization routes: it belongs to no organization', async () => {
    const res = await call(server, 'GET', '/api/admin/users', { token: superAdmin });
    expect(res.status).toBe(403);
  });

  it('answers 401 and 403 (to an organization admin) on the super-admin routes', async () => {
    for (const [method, path, body] of [
      ['PUT', `/api/admin/users/${editor.id}/password`, { password: 'another-password-1' }],
      ['GET', '/api/admin/system-info', undefined],
    ] as const) {
      expect((await call(server, method, path, { body })).status).toBe(401);
      const refused = await call(server, method, path, { token: tenant.admin.token, body });
      expect(refused.status).toBe(403);
      expect(refused.body.code).toBe('FORBIDDEN');
    }
  });
});

describe('users of the organization', () => {
  it('lists only the users of the own organization', async () => {
    const res = await asAdmin('GET', '/api/admin/users');
    expect(res.status).toBe(200);
    const names = res.body.users.map((u: { username: string }) => u.username);
    expect(names).toContain(tenant.admin.username);
    expect(names).toContain(editor.username);
    expect(names).not.toContain(other.admin.username);
    expect(
      res.body.users.every((u: { organization_id: string }) => u.organization_id === tenant.organization.id),
    ).toBe(true);
    expect(JSON.stringify(res.body)).not.toMatch(/password_hash|passwordHash|\$argon2/);
    const page = await call(server, 'GET', '/api/admin/users', {
      token: tenant.admin.token,
      query: { limit: 1, offset: 1 },
    });
    expect(page.body.users).toHaveLength(1);
    expect(page.body.total).toBe(res.body.total);
    const bad = await call(server, 'GET', '/api/admin/users', {
      token: tenant.admin.token,
      query: { limit: 'many' },
    });
    expect(bad.status).toBe(400);
  });

  it('creates a user with a temporary password that must be changed', async () => {
    const username = unique('new');
    const res = await asAdmin('POST', '/api/admin/users', { username, roles: ['editor'] });
    expect(res.status).toBe(200);
    expect(res.body.user).toMatchObject({
      username,
      organization_id: tenant.organization.id,
      roles: ['editor'],
      must_change_password: true,
      is_active: true,
    });
    const token = await login(server, username, tenant.organization.domain, res.body.temporary_password);
    const blocked = await call(server, 'GET', '/api/auth/preferences', { token });
    expect(blocked.body.reason).toBe('PASSWORD_CHANGE_REQUIRED');
  });

  it('creates a user with a given password and default role viewer', async () => {
    const username = unique('given');
    const res = await asAdmin('POST', '/api/admin/users', {
      username,
      email: 'given@example.com',
      password: 'a-given-password',
      must_change_password: false,
    });
    expect(res.status).toBe(200);
    expect(res.body.user).toMatchObject({ roles: ['viewer'], email: 'given@example.com' });
    expect(res.body).not.toHaveProperty('temporary_password');
    const token = await login(server, username, tenant.organization.domain, 'a-given-password');
    const session = await call(server, 'GET', '/api/auth/session', { token });
    expect(session.body.user.permissions).toEqual(['workspace.read']);
  });

  it('refuses bad users with 400 and a taken username with 409', async () => {
    const name = unique('bad').padEnd(12, 'x');
    const cases: [unknown, number, RegExp?][] = [
      [{}, 400],
      [{ username: 'ab' }, 400],
      [{ username: unique('u'), password: 'too-short' }, 400, /12/],
      [{ username: name, password: name }, 400, /username/],
      [{ username: unique('u'), roles: ['no-such-role'] }, 400, /no-such-role/],
      [{ username: unique('u'), email: 'nope' }, 400],
      [{ username: editor.username }, 409],
    ];
    for (const [body, status, message] of cases) {
      const res = await asAdmin('POST', '/api/admin/users', body);
      expect(res.status, JSON.stringify(body)).toBe(status);
      if (message) expect(JSON.stringify(res.body)).toMatch(message);
    }
    // The same name in another organization is fine.
    const res = await call(server, 'POST', '/api/admin/users', {
      token: other.admin.token,
      body: { username: editor.username },
    });
    expect(res.status).toBe(200);
  });

  it('updates a user; deactivating ends its sessions; 404 for another organization', async () => {
    const user = await tenant.addUser(['viewer']);
    const res = await asAdmin('PUT', `/api/admin/users/${user.id}`, {
      email: 'u@example.com',
      is_active: false,
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ id: user.id, email: 'u@example.com', is_active: false });
    expect((await call(server, 'GET', '/api/auth/session', { token: user.token })).status).toBe(401);
    const relogin = await call(server, 'POST', '/api/auth/login', {
      body: {
        username: user.username,
        domain: tenant.organization.domain,
        password: 'correct-horse-battery',
      },
    });
    expect(relogin.status).toBe(401);
    const foreign = await asAdmin('PUT', `/api/admin/users/${other.admin.id}`, { is_active: false });
    expect(foreign.status).toBe(404);
    expect((await call(server, 'GET', '/api/auth/session', { token: other.admin.token })).status).toBe(200);
    expect((await asAdmin('PUT', `/api/admin/users/${MISSING_ID}`, { is_active: true })).status).toBe(404);
    expect((await asAdmin('PUT', `/api/admin/users/${user.id}`, { email: 'x' })).status).toBe(400);
    expect((await asAdmin('PUT', `/api/admin/users/${tenant.admin.id}`, { is_active: false })).status).toBe(
      400,
    );
  });

  it('replaces the roles of a user, which take effect at once', async () => {
    const user = await tenant.addUser(['viewer']);
    expect((await call(server, 'GET', '/api/admin/roles', { token: user.token })).status).toBe(403);
    const res = await asAdmin('PUT', `/api/admin/users/${user.id}/roles`, { roles: ['admin', 'editor'] });
    expect(res.status).toBe(200);
    expect(res.body.roles.sort()).toEqual(['admin', 'editor']);
    expect((await call(server, 'GET', '/api/admin/roles', { token: user.token })).status).toBe(200);
    const foreign = await asAdmin('PUT', `/api/admin/users/${other.admin.id}/roles`, { roles: ['viewer'] });
    expect(foreign.status).toBe(404);
    expect((await asAdmin('PUT', `/api/admin/users/${user.id}/roles`, { roles: ['ghost'] })).status).toBe(
      400,
    );
    expect((await asAdmin('PUT', `/api/admin/users/${user.id}/roles`, { roles: 'admin' })).status).toBe(400);
    // An admin cannot lock itself out.
    const self = await asAdmin('PUT', `/api/admin/users/${tenant.admin.id}/roles`, { roles: ['viewer'] });
    expect(self.status).toBe(400);
  });

  it('deletes a user of the own organization only', async () => {
    const user = await tenant.addUser(['viewer']);
    expect((await asAdmin('DELETE', `/api/admin/users/${other.admin.id}`)).status).toBe(404);
    expect((await asAdmin('DELETE', `/api/admin/users/${tenant.admin.id}`)).status).toBe(400);
    const res = await asAdmin('DELETE', `/api/admin/users/${user.id}`);
    expect(res).toMatchObject({ status: 200, body: { success: true } });
    expect((await call(server, 'GET', '/api/auth/session', { token: user.token })).status).toBe(401);
    expect((await asAdmin('DELETE', `/api/admin/users/${user.id}`)).status).toBe(404);
  });

  it('lets the super admin set any password; the user must change it unless told otherwise', async () => {
    const user = await tenant.addUser(['viewer']);
    const res = await call(server, 'PUT', `/api/admin/users/${user.id}/password`, {
      token: superAdmin,
      body: { password: 'set-by-the-super-admin' },
    });
    expect(res.status).toBe(200);
    // Sessions opened with the old password end.
    expect((await call(server, 'GET', '/api/auth/session', { token: user.token })).status).toBe(401);
    const token = await login(server, user.username, tenant.organization.domain, 'set-by-the-super-admin');
    const session = await call(server, 'GET', '/api/auth/session', { token });
    expect(session.body.user.must_change_password).toBe(true);
    const kept = await call(server, 'PUT', `/api/admin/users/${user.id}/password`, {
      token: superAdmin,
      body: { password: 'set-again-by-the-super-admin', must_change_password: false },
    });
    expect(kept.status).toBe(200);
    const t2 = await login(server, user.username, tenant.organization.domain, 'set-again-by-the-super-admin');
    expect((await call(server, 'GET', '/api/auth/preferences', { token: t2 })).status).toBe(200);

    const weak = await call(server, 'PUT', `/api/admin/users/${user.id}/password`, {
      token: superAdmin,
      body: { password: 'short' },
    });
    expect(weak.status).toBe(400);
    const asName = await call(server, 'PUT', `/api/admin/users/${user.id}/password`, {
      token: superAdmin,
      body: { password: user.username },
    });
    expect(asName.status).toBe(400);
    expect(
      (await call(server, 'PUT', `/api/admin/users/${user.id}/password`, { token: superAdmin, body: {} }))
        .status,
    ).toBe(400);
    const missing = await call(server, 'PUT', `/api/admin/users/${MISSING_ID}/password`, {
      token: superAdmin,
      body: { password: 'a-long-enough-password' },
    });
    expect(missing.status).toBe(404);
  });
});

describe('roles and permissions', () => {
  it('lists the permission catalogue with descriptions', async () => {
    const res = await asAdmin('GET', '/api/admin/permissions');
    expect(res.status).toBe(200);
    expect(res.body.permissions.map((p: { name: string }) => p.name)).toEqual(ALL_PERMISSIONS);
    for (const p of res.body.permissions) expect(p.description.length).toBeGreaterThan(10);
  });

  it('lists the built-in roles of the organization with their permissions and user counts', async () => {
    const res = await asAdmin('GET', '/api/admin/roles');
    expect(res.status).toBe(200);
    const byName = Object.fromEntries(res.body.roles.map((r: { name: string }) => [r.name, r]));
    expect(byName.admin).toMatchObject({ is_builtin: true, permissions: ALL_PERMISSIONS });
    expect(byName.editor.permissions).not.toContain('org.admin');
    expect(byName.editor.permissions).not.toContain('settings.manage');
    expect(byName.viewer.permissions).toEqual(['workspace.read']);
    expect(byName.admin.user_count).toBeGreaterThanOrEqual(1);
    expect(byName.editor.user_count).toBeGreaterThanOrEqual(1);
    const theirs = await call(server, 'GET', '/api/admin/roles', { token: other.admin.token });
    const ids = new Set(res.body.roles.map((r: { id: number }) => r.id));
    expect(theirs.body.roles.some((r: { id: number }) => ids.has(r.id))).toBe(false);
  });

  it('creates a custom role whose permissions take effect, and changes them', async () => {
    const name = unique('auditor');
    const created = await asAdmin('POST', '/api/admin/roles', {
      name,
      description: 'Sees sessions',
      permissions: [],
    });
    expect(created.status).toBe(200);
    expect(created.body).toMatchObject({ name, is_builtin: false, permissions: [], user_count: 0 });
    const user = await tenant.addUser([name]);
    expect((await call(server, 'GET', '/api/auth/sessions', { token: user.token })).status).toBe(403);
    const granted = await asAdmin('PUT', `/api/admin/roles/${created.body.id}/permissions`, {
      permissions: ['org.admin', 'workspace.read', 'org.admin'],
    });
    expect(granted.status).toBe(200);
    expect(granted.body.permissions.sort()).toEqual(['org.admin', 'workspace.read']);
    expect((await call(server, 'GET', '/api/auth/sessions', { token: user.token })).status).toBe(200);
    const session = await call(server, 'GET', '/api/auth/session', { token: user.token });
    expect(session.body.user.permissions).toEqual(ALL_PERMISSIONS);
    const revoked = await asAdmin('PUT', `/api/admin/roles/${created.body.id}/permissions`, {
      permissions: ['workspace.read'],
    });
    expect(revoked.status).toBe(200);
    expect((await call(server, 'GET', '/api/auth/sessions', { token: user.token })).status).toBe(403);
  });

  it('renames and describes a custom role', async () => {
    const created = await asAdmin('POST', '/api/admin/roles', {
      name: unique('r'),
      permissions: ['sql.execute'],
    });
    const name = unique('renamed');
    const res = await asAdmin('PUT', `/api/admin/roles/${created.body.id}`, {
      name,
      description: 'new words',
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      id: created.body.id,
      name,
      description: 'new words',
      permissions: ['sql.execute'],
    });
    expect((await asAdmin('PUT', `/api/admin/roles/${created.body.id}`, { name: 'editor' })).status).toBe(
      409,
    );
    expect((await asAdmin('PUT', `/api/admin/roles/${created.body.id}`, { name: '!bad' })).status).toBe(400);
  });

  it('refuses bad roles (400) and duplicates (409)', async () => {
    const cases: [unknown, number][] = [
      [{}, 400],
      [{ name: unique('r') }, 400],
      [{ name: unique('r'), permissions: ['fly'] }, 400],
      [{ name: '', permissions: [] }, 400],
      [{ name: 'viewer', permissions: [] }, 409],
    ];
    for (const [body, status] of cases)
      expect((await asAdmin('POST', '/api/admin/roles', body)).status, JSON.stringify(body)).toBe(status);
  });

  it('never changes or deletes a built-in role', async () => {
    for (const name of ['admin', 'editor', 'viewer']) {
      const id = await roleId(tenant, name);
      expect((await asAdmin('DELETE', `/api/admin/roles/${id}`)).status, name).toBe(400);
      expect((await asAdmin('PUT', `/api/admin/roles/${id}`, { description: 'x' })).status).toBe(400);
      expect(
        (await asAdmin('PUT', `/api/admin/roles/${id}/permissions`, { permissions: ['org.admin'] })).status,
      ).toBe(400);
    }
    const res = await asAdmin('GET', '/api/admin/roles');
    const viewer = res.body.roles.find((r: { name: string }) => r.name === 'viewer');
    expect(viewer.permissions).toEqual(['workspace.read']);
  });

  it("answers 404 for another organization's role and 400 for a role id that is not a number", async () => {
    const theirs = await call(server, 'POST', '/api/admin/roles', {
      token: other.admin.token,
      body: { name: unique('theirs'), permissions: ['workspace.read'] },
    });
    const id = theirs.body.id;
    expect((await asAdmin('PUT', `/api/admin/roles/${id}`, { description: 'mine now' })).status).toBe(404);
    expect((await asAdmin('PUT', `/api/admin/roles/${id}/permissions`, { permissions: [] })).status).toBe(
      404,
    );
    expect((await asAdmin('DELETE', `/api/admin/roles/${id}`)).status).toBe(404);
    expect((await asAdmin('DELETE', '/api/admin/roles/abc')).status).toBe(400);
    expect((await asAdmin('DELETE', '/api/admin/roles/99999999999')).status).toBe(400);
    const still = await call(server, 'GET', '/api/admin/roles', { token: other.admin.token });
    expect(still.body.roles.find((r: { id: number }) => r.id === id).description).toBe('');
  });

  it('deletes a custom role once nobody holds it; a role in use is refused and kept', async () => {
    const created = await asAdmin('POST', '/api/admin/roles', {
      name: unique('temp'),
      permissions: ['org.admin'],
    });
    const user = await tenant.addUser([created.body.name]);
    expect((await call(server, 'GET', '/api/admin/permissions', { token: user.token })).status).toBe(200);
    const refused = await asAdmin('DELETE', `/api/admin/roles/${created.body.id}`);
    expect(refused).toMatchObject({ status: 409, body: { reason: 'ROLE_IN_USE' } });
    expect((await call(server, 'GET', '/api/admin/permissions', { token: user.token })).status).toBe(200);
    expect((await asAdmin('PUT', `/api/admin/users/${user.id}/roles`, { roles: ['viewer'] })).status).toBe(
      200,
    );
    expect((await call(server, 'GET', '/api/admin/permissions', { token: user.token })).status).toBe(403);
    const res = await asAdmin('DELETE', `/api/admin/roles/${created.body.id}`);
    expect(res).toMatchObject({ status: 200, body: { success: true } });
    expect((await asAdmin('DELETE', `/api/admin/roles/${created.body.id}`)).status).toBe(404);
  });
});

describe('system information', () => {
  it('tells the super admin the version, uptime, database and Node version', async () => {
    const res = await call(server, 'GET', '/api/admin/system-info', { token: superAdmin });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      version: expect.stringMatching(/^\d+\.\d+\.\d+/),
      database: { kind: server.deps.dbKind, version: expect.stringContaining('PostgreSQL') },
      node_version: process.version,
      uptime_seconds: expect.any(Number),
    });
    expect(new Date(res.body.started_at).getTime()).toBeLessThanOrEqual(Date.now());
    expect(res.body.git_commit === null || /^[0-9a-f]{7,40}$/.test(res.body.git_commit)).toBe(true);
  });
});
