import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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
import { SUPERADMIN_PASSWORD, SUPERADMIN_USERNAME, TEST_PASSWORD } from './helpers/constants.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';

let server: TestServer;
let tenant: Tenant;
let editor: TestUser;
let superAdmin: string;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
  editor = await tenant.addUser(['editor']);
  superAdmin = await superAdminToken(server);
});
afterAll(async () => server?.close());

let second: Promise<Tenant> | undefined;
/** A second organization, made once and only by the tests that need one. */
const otherTenant = () => (second ??= createTenant(server));

describe('login and sessions', () => {
  it('logs in with username, domain and password and reads the session', async () => {
    const res = await call(server, 'POST', '/api/auth/login', {
      body: { username: tenant.admin.username, domain: tenant.organization.domain, password: TEST_PASSWORD },
    });
    expect(res.status).toBe(200);
    expect(res.body.token).toMatch(/^[a-z2-7]{32}$/);
    expect(res.body.user).toMatchObject({
      username: tenant.admin.username,
      organization_id: tenant.organization.id,
    });
    expect(res.body.user.permissions).toContain('org.admin');
    const session = await call(server, 'GET', '/api/auth/session', { token: res.body.token });
    expect(session.status).toBe(200);
    expect(new Date(session.body.expires_at).getTime()).toBeGreaterThan(Date.now());
  });

  it('refuses a wrong password with 401 in the error shape', async () => {
    const res = await call(server, 'POST', '/api/auth/login', {
      body: {
        username: tenant.admin.username,
        domain: tenant.organization.domain,
        password: 'wrong-password-123',
      },
    });
    expect(res.status).toBe(401);
    expect(res.body).toEqual({ message: expect.any(String), code: 'UNAUTHORIZED' });
  });

  it('answers 400 with issues for a bad body', async () => {
    const res = await call(server, 'POST', '/api/auth/login', { body: { username: 'x' } });
    expect(res.status).toBe(400);
    expect(res.body.code).toBe('BAD_REQUEST');
    expect(res.body.issues.length).toBeGreaterThan(0);
  });

  it('ends the session on logout', async () => {
    const token = await login(server, tenant.admin.username, tenant.organization.domain);
    expect((await call(server, 'POST', '/api/auth/logout', { token })).status).toBe(200);
    expect((await call(server, 'GET', '/api/auth/session', { token })).status).toBe(401);
  });

  it('rate limits failed logins per username with retry_after', async () => {
    const username = unique('victim');
    let last;
    for (let i = 0; i < 6; i++)
      last = await call(server, 'POST', '/api/auth/login', {
        body: { username, domain: tenant.organization.domain, password: 'nope-nope-nope' },
      });
    expect(last!.status).toBe(429);
    expect(last!.body.retry_after).toBeGreaterThan(0);
  });

  it('lets a super admin in without a domain', async () => {
    const token = await superAdminToken(server);
    const res = await call(server, 'GET', '/api/auth/session', { token });
    expect(res.body.user.is_super_admin).toBe(true);
  });
});

const MISSING_ID = '00000000-0000-4000-8000-000000000000';

describe('organizations for login (public)', () => {
  it('lists organizations without credentials', async () => {
    const res = await call(server, 'GET', '/api/auth/organizations');
    expect(res.status).toBe(200);
    expect(res.body.organizations).toContainEqual({
      id: tenant.organization.id,
      name: tenant.organization.name,
      domain: tenant.organization.domain,
    });
  });
});

describe('session routes', () => {
  it('answers 401 without or with a bad token', async () => {
    expect((await call(server, 'GET', '/api/auth/session')).status).toBe(401);
    expect((await call(server, 'GET', '/api/auth/session', { token: 'a'.repeat(32) })).status).toBe(401);
    expect((await call(server, 'POST', '/api/auth/logout')).status).toBe(401);
  });

  it('lists the active sessions of the own organization only (org.admin)', async () => {
    const other = await otherTenant();
    const res = await call(server, 'GET', '/api/auth/sessions', { token: tenant.admin.token });
    expect(res.status).toBe(200);
    const users = new Set(res.body.sessions.map((s: { user_id: string }) => s.user_id));
    expect(users).toContain(tenant.admin.id);
    expect(users).not.toContain(other.admin.id);
    expect(res.body.total).toBeGreaterThanOrEqual(res.body.sessions.length);
    // The id is a short piece of the hash, never the token itself.
    for (const s of res.body.sessions) expect(s.id).toHaveLength(12);
    expect(JSON.stringify(res.body)).not.toContain(tenant.admin.token);
  });

  it('guards the session list: 401, 403 for an editor, 400 for a bad page', async () => {
    expect((await call(server, 'GET', '/api/auth/sessions')).status).toBe(401);
    const res = await call(server, 'GET', '/api/auth/sessions', { token: editor.token });
    expect(res.status).toBe(403);
    expect(res.body.code).toBe('FORBIDDEN');
    const bad = await call(server, 'GET', '/api/auth/sessions', {
      token: tenant.admin.token,
      query: { limit: 0 },
    });
    expect(bad.status).toBe(400);
  });
});

describe('preferences', () => {
  it('merges keys, removes a key set to null, and keeps them per user', async () => {
    const user = await tenant.addUser(['viewer']);
    const empty = await call(server, 'GET', '/api/auth/preferences', { token: user.token });
    expect(empty).toMatchObject({ status: 200, body: { preferences: {} } });
    let res = await call(server, 'PUT', '/api/auth/preferences', {
      token: user.token,
      body: { preferences: { theme: 'dark', page_size: 50 } },
    });
    expect(res.body.preferences).toEqual({ theme: 'dark', page_size: 50 });
    res = await call(server, 'PUT', '/api/auth/preferences', {
      token: user.token,
      body: { preferences: { theme: null, lang: 'de' } },
    });
    expect(res.body.preferences).toEqual({ page_size: 50, lang: 'de' });
    const read = await call(server, 'GET', '/api/auth/preferences', { token: user.token });
    expect(read.body.preferences).toEqual({ page_size: 50, lang: 'de' });
    const mine = await call(server, 'GET', '/api/auth/preferences', { token: editor.token });
    expect(mine.body.preferences).not.toHaveProperty('lang');
  });

  it('answers 401 without a token and 400 for a body that is not an object', async () => {
    expect((await call(server, 'GET', '/api/auth/preferences')).status).toBe(401);
    expect((await call(server, 'PUT', '/api/auth/preferences', { body: { preferences: {} } })).status).toBe(
      401,
    );
    const res = await call(server, 'PUT', '/api/auth/preferences', {
      token: editor.token,
      body: { preferences: 'dark' },
    });
    expect(res.status).toBe(400);
    expect(res.body.issues[0].path).toEqual(['preferences']);
  });
});

describe('temporary passwords and the password policy', () => {
  it('allows only change-password, session and logout until the password is changed', async () => {
    const user = await tenant.addUser(['admin'], { mustChangePassword: true });
    const session = await call(server, 'GET', '/api/auth/session', { token: user.token });
    expect(session.status).toBe(200);
    expect(session.body.user.must_change_password).toBe(true);
    for (const [method, path] of [
      ['GET', '/api/auth/preferences'],
      ['GET', '/api/admin/users'],
      ['GET', '/api/api/service-accounts'],
    ]) {
      const res = await call(server, method, path, { token: user.token });
      expect(res.status, `${method} ${path}`).toBe(403);
      expect(res.body).toMatchObject({ code: 'FORBIDDEN', reason: 'PASSWORD_CHANGE_REQUIRED' });
    }
    const changed = await call(server, 'POST', '/api/auth/change-password', {
      token: user.token,
      body: { current_password: TEST_PASSWORD, new_password: 'a-brand-new-password' },
    });
    expect(changed.status).toBe(200);
    // The same session goes on, now without restrictions.
    expect((await call(server, 'GET', '/api/admin/users', { token: user.token })).status).toBe(200);
    const again = await call(server, 'GET', '/api/auth/session', { token: user.token });
    expect(again.body.user.must_change_password).toBe(false);
    // The old password is gone, the new one works.
    const old = await call(server, 'POST', '/api/auth/login', {
      body: { username: user.username, domain: tenant.organization.domain, password: TEST_PASSWORD },
    });
    expect(old.status).toBe(401);
    await login(server, user.username, tenant.organization.domain, 'a-brand-new-password');
  });

  it('lets a pending user log out', async () => {
    const user = await tenant.addUser(['viewer'], { mustChangePassword: true });
    expect((await call(server, 'POST', '/api/auth/logout', { token: user.token })).status).toBe(200);
    expect((await call(server, 'GET', '/api/auth/session', { token: user.token })).status).toBe(401);
  });

  it('refuses weak new passwords with 400 and says why', async () => {
    const user = await tenant.addUser(['viewer']);
    const attempt = (current_password: string, new_password: string) =>
      call(server, 'POST', '/api/auth/change-password', {
        token: user.token,
        body: { current_password, new_password },
      });
    const short = await attempt(TEST_PASSWORD, 'short-pw');
    expect(short.status).toBe(400);
    expect(short.body.issues).toContainEqual({
      path: ['new_password'],
      message: expect.stringContaining('12'),
    });
    const padded = unique('same').padEnd(12, 'x');
    const sameAsName = await call(server, 'POST', '/api/admin/users', {
      token: tenant.admin.token,
      body: { username: padded, password: padded.toUpperCase() },
    });
    expect(sameAsName.status).toBe(400);
    expect(sameAsName.body.issues[0].message).toMatch(/username/);
    const wrongCurrent = await attempt('not-my-password', 'another-long-password');
    expect(wrongCurrent.status).toBe(400);
    expect(wrongCurrent.body.issues[0].path).toEqual(['current_password']);
    const unchanged = await attempt(TEST_PASSWORD, TEST_PASSWORD);
    expect(unchanged.status).toBe(400);
    const missing = await call(server, 'POST', '/api/auth/change-password', {
      token: user.token,
      body: { new_password: 'another-long-password' },
    });
    expect(missing.status).toBe(400);
    expect(
      (
        await call(server, 'POST', '/api/auth/change-password', {
          body: { current_password: TEST_PASSWORD, new_password: 'another-long-password' },
        })
      ).status,
    ).toBe(401);
  });

  it('ends the other sessions of a user who changes the password', async () => {
    const user = await tenant.addUser(['viewer']);
    const second = await login(server, user.username, tenant.organization.domain);
    const res = await call(server, 'POST', '/api/auth/change-password', {
      token: user.token,
      body: { current_password: TEST_PASSWORD, new_password: 'rotated-password-1' },
    });
    expect(res.status).toBe(200);
    expect((await call(server, 'GET', '/api/auth/session', { token: second })).status).toBe(401);
    expect((await call(server, 'GET', '/api/auth/session', { token: user.token })).status).toBe(200);
  });
});

describe('super admin: login', () => {
  it('refuses a wrong password (401), an organization user (401) and a bad body (400)', async () => {
    const wrong = await call(server, 'POST', '/api/auth/admin/login', {
      body: { username: SUPERADMIN_USERNAME, password: 'not-the-password' },
    });
    expect(wrong.status).toBe(401);
    const orgUser = await call(server, 'POST', '/api/auth/admin/login', {
      body: { username: tenant.admin.username, password: TEST_PASSWORD },
    });
    expect(orgUser.status).toBe(401);
    expect((await call(server, 'POST', '/api/auth/admin/login', { body: {} })).status).toBe(400);
  });

  it('does not let the super admin log in through the organization login', async () => {
    const res = await call(server, 'POST', '/api/auth/login', {
      body: {
        username: SUPERADMIN_USERNAME,
        domain: tenant.organization.domain,
        password: SUPERADMIN_PASSWORD,
      },
    });
    expect(res.status).toBe(401);
  });
});

describe('super admin: organizations', () => {
  it('creates an organization with an admin who must change the temporary password', async () => {
    const domain = `${unique('org')}.example`;
    const res = await call(server, 'POST', '/api/auth/admin/organizations', {
      token: superAdmin,
      body: { name: 'Acme', domain: domain.toUpperCase(), admin: { username: 'owner' } },
    });
    expect(res.status).toBe(200);
    expect(res.body.organization).toMatchObject({ name: 'Acme', domain });
    expect(res.body.admin.temporary_password.length).toBeGreaterThanOrEqual(12);
    const token = await login(server, 'owner', domain, res.body.admin.temporary_password);
    const session = await call(server, 'GET', '/api/auth/session', { token });
    expect(session.body.user).toMatchObject({
      organization_id: res.body.organization.id,
      must_change_password: true,
    });
    expect(session.body.user.permissions).toContain('org.admin');
    const roles = await call(server, 'POST', '/api/auth/change-password', {
      token,
      body: { current_password: res.body.admin.temporary_password, new_password: 'first-admin-passphrase' },
    });
    expect(roles.status).toBe(200);
    const list = await call(server, 'GET', '/api/admin/roles', { token });
    expect(list.body.roles.map((r: { name: string }) => r.name)).toEqual(['admin', 'editor', 'viewer']);
  });

  it('lists organizations with counts', async () => {
    const em = server.deps.orm.em.fork();
    em.create(Workspace, { organization: tenant.organization.id, name: unique('ws') });
    await em.flush();
    const res = await call(server, 'GET', '/api/auth/admin/organizations', {
      token: superAdmin,
      query: { limit: 500 },
    });
    expect(res.status).toBe(200);
    const mine = res.body.organizations.find((o: { id: string }) => o.id === tenant.organization.id);
    expect(mine).toMatchObject({ domain: tenant.organization.domain });
    expect(mine.user_count).toBeGreaterThanOrEqual(2);
    expect(mine.workspace_count).toBeGreaterThanOrEqual(1);
    expect(res.body.total).toBeGreaterThanOrEqual(res.body.organizations.length);
  });

  it('refuses bad bodies (400) and a taken domain (409)', async () => {
    const bad = await call(server, 'POST', '/api/auth/admin/organizations', {
      token: superAdmin,
      body: { name: 'x', domain: 'not a domain' },
    });
    expect(bad.status).toBe(400);
    expect(bad.body.issues[0].path).toEqual(['domain']);
    const taken = await call(server, 'POST', '/api/auth/admin/organizations', {
      token: superAdmin,
      body: { name: 'Copy', domain: tenant.organization.domain },
    });
    expect(taken.status).toBe(409);
    const badPassword = await call(server, 'POST', '/api/auth/admin/organizations', {
      token: superAdmin,
      body: { name: 'x', domain: `${unique('o')}.example`, admin: { username: 'boss', password: 'short' } },
    });
    expect(badPassword.status).toBe(400);
    // All or nothing: the organization of a refused admin was not created.
    const orgs = await call(server, 'GET', '/api/auth/organizations');
    expect(orgs.body.organizations.some((o: { name: string }) => o.name === 'x')).toBe(false);
  });

  it('updates an organization; 404 for an unknown one; 400 for a bad domain', async () => {
    const created = await call(server, 'POST', '/api/auth/admin/organizations', {
      token: superAdmin,
      body: { name: 'Before', domain: `${unique('o')}.example` },
    });
    const id = created.body.organization.id;
    const newDomain = `${unique('renamed')}.example`;
    const res = await call(server, 'PUT', `/api/auth/admin/organizations/${id}`, {
      token: superAdmin,
      body: { name: 'After', domain: newDomain },
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ id, name: 'After', domain: newDomain });
    const missing = await call(server, 'PUT', `/api/auth/admin/organizations/${MISSING_ID}`, {
      token: superAdmin,
      body: { name: 'Nobody' },
    });
    expect(missing.status).toBe(404);
    const bad = await call(server, 'PUT', `/api/auth/admin/organizations/${id}`, {
      token: superAdmin,
      body: { domain: 'under_score' },
    });
    expect(bad.status).toBe(400);
    const taken = await call(server, 'PUT', `/api/auth/admin/organizations/${id}`, {
      token: superAdmin,
      body: { domain: tenant.organization.domain },
    });
    expect(taken.status).toBe(409);
  });

  it('deletes an organization with its users, roles, sessions and workspaces', async () => {
    const doomed = await createTenant(server);
    const member = await doomed.addUser(['viewer']);
    const em = server.deps.orm.em.fork();
    em.create(Workspace, { organization: doomed.organization.id, name: 'doomed' });
    await em.flush();
    const res = await call(server, 'DELETE', `/api/auth/admin/organizations/${doomed.organization.id}`, {
      token: superAdmin,
    });
    expect(res.status).toBe(200);
    expect((await call(server, 'GET', '/api/auth/session', { token: member.token })).status).toBe(401);
    const users = await call(server, 'GET', '/api/auth/admin/users', {
      token: superAdmin,
      query: { organization_id: doomed.organization.id },
    });
    expect(users.body).toEqual({ users: [], total: 0 });
    const rows = await server.deps.orm.em
      .fork()
      .getConnection()
      .execute(
        `select (select count(*) from users where organization_id = ?)::int as users,
                (select count(*) from roles where organization_id = ?)::int as roles,
                (select count(*) from workspaces where organization_id = ?)::int as workspaces`,
        [doomed.organization.id, doomed.organization.id, doomed.organization.id],
      );
    expect(rows[0]).toEqual({ users: 0, roles: 0, workspaces: 0 });
    const again = await call(server, 'DELETE', `/api/auth/admin/organizations/${doomed.organization.id}`, {
      token: superAdmin,
    });
    expect(again.status).toBe(404);
  });

  it('refuses organization admins (403) and anonymous callers (401)', async () => {
    const id = tenant.organization.id;
    const routes: [string, string, unknown?][] = [
      ['GET', '/api/auth/admin/organizations'],
      ['POST', '/api/auth/admin/organizations', { name: 'x', domain: `${unique('o')}.example` }],
      ['PUT', `/api/auth/admin/organizations/${id}`, { name: 'Hijacked' }],
      ['DELETE', `/api/auth/admin/organizations/${id}`],
      ['GET', `/api/auth/admin/organizations/${id}/workspaces`],
      ['DELETE', `/api/auth/admin/workspaces/${id}/anything`],
      ['GET', '/api/auth/admin/users'],
      ['POST', '/api/auth/admin/users', { organization_id: id, username: unique('u') }],
      ['PUT', `/api/auth/admin/users/${tenant.admin.id}`, { is_active: false }],
      ['DELETE', `/api/auth/admin/users/${editor.id}`],
      ['GET', '/api/auth/admin/logs/download'],
    ];
    for (const [method, path, body] of routes) {
      const anonymous = await call(server, method, path, { body });
      expect(anonymous.status, `${method} ${path}`).toBe(401);
      const refused = await call(server, method, path, { token: tenant.admin.token, body });
      expect(refused.status, `${method} ${path}`).toBe(403);
      expect(refused.body.code).toBe('FORBIDDEN');
    }
    // Nothing happened.
    expect((await call(server, 'GET', '/api/auth/session', { token: editor.token })).status).toBe(200);
  });
});

describe('super admin: workspaces of an organization', () => {
  it('lists and deletes workspaces by organization and name', async () => {
    const em = server.deps.orm.em.fork();
    const name = unique('ws');
    em.create(Workspace, { organization: tenant.organization.id, name, description: 'listed' });
    await em.flush();
    const list = await call(
      server,
      'GET',
      `/api/auth/admin/organizations/${tenant.organization.id}/workspaces`,
      {
        token: superAdmin,
      },
    );
    expect(list.status).toBe(200);
    expect(list.body.workspaces).toContainEqual(
      expect.objectContaining({ name, description: 'listed', created_at: expect.any(String) }),
    );
    const other = await otherTenant();
    const wrongTenant = await call(
      server,
      'DELETE',
      `/api/auth/admin/workspaces/${other.organization.id}/${name}`,
      {
        token: superAdmin,
      },
    );
    expect(wrongTenant.status).toBe(404);
    const del = await call(server, 'DELETE', `/api/auth/admin/workspaces/${tenant.organization.id}/${name}`, {
      token: superAdmin,
    });
    expect(del.status).toBe(200);
    const after = await call(
      server,
      'GET',
      `/api/auth/admin/organizations/${tenant.organization.id}/workspaces`,
      {
        token: superAdmin,
      },
    );
    expect(after.body.workspaces.some((w: { name: string }) => w.name === name)).toBe(false);
    const unknownOrg = await call(server, 'GET', `/api/auth/admin/organizations/${MISSING_ID}/workspaces`, {
      token: superAdmin,
    });
    expect(unknownOrg.status).toBe(404);
  });
});

describe('super admin: users', () => {
  it('creates, lists, updates and deletes users of any organization', async () => {
    const other = await otherTenant();
    const username = unique('sa-made');
    const created = await call(server, 'POST', '/api/auth/admin/users', {
      token: superAdmin,
      body: {
        organization_id: other.organization.id,
        username,
        password: 'a-good-long-password',
        roles: ['editor'],
        must_change_password: false,
      },
    });
    expect(created.status).toBe(200);
    expect(created.body.user).toMatchObject({
      username,
      organization_id: other.organization.id,
      roles: ['editor'],
      must_change_password: false,
    });
    expect(created.body).not.toHaveProperty('temporary_password');
    expect(JSON.stringify(created.body)).not.toContain('a-good-long-password');
    const token = await login(server, username, other.organization.domain, 'a-good-long-password');

    const list = await call(server, 'GET', '/api/auth/admin/users', {
      token: superAdmin,
      query: { organization_id: other.organization.id },
    });
    expect(list.status).toBe(200);
    expect(list.body.users.map((u: { username: string }) => u.username).sort()).toEqual(
      [other.admin.username, username].sort(),
    );

    const updated = await call(server, 'PUT', `/api/auth/admin/users/${created.body.user.id}`, {
      token: superAdmin,
      body: { email: 'someone@example.com', roles: ['viewer'], is_active: false },
    });
    expect(updated.status).toBe(200);
    expect(updated.body).toMatchObject({ email: 'someone@example.com', roles: ['viewer'], is_active: false });
    // Deactivation ends the user's sessions at once.
    expect((await call(server, 'GET', '/api/auth/session', { token })).status).toBe(401);

    const deleted = await call(server, 'DELETE', `/api/auth/admin/users/${created.body.user.id}`, {
      token: superAdmin,
    });
    expect(deleted.status).toBe(200);
    const gone = await call(server, 'DELETE', `/api/auth/admin/users/${created.body.user.id}`, {
      token: superAdmin,
    });
    expect(gone.status).toBe(404);
  });

  it('creates another super admin who logs in without a domain', async () => {
    const username = unique('root');
    const created = await call(server, 'POST', '/api/auth/admin/users', {
      token: superAdmin,
      body: { is_super_admin: true, username, password: 'root-password-123', must_change_password: false },
    });
    expect(created.status).toBe(200);
    expect(created.body.user).toMatchObject({ is_super_admin: true, organization_id: null });
    const res = await call(server, 'POST', '/api/auth/admin/login', {
      body: { username, password: 'root-password-123' },
    });
    expect(res.status).toBe(200);
    await call(server, 'DELETE', `/api/auth/admin/users/${created.body.user.id}`, { token: superAdmin });
  });

  it('answers 400 for bad bodies and 404 for unknown users or organizations', async () => {
    const cases: [string, string, unknown, number][] = [
      ['POST', '/api/auth/admin/users', { username: unique('u') }, 400], // neither organization nor super admin
      ['POST', '/api/auth/admin/users', { organization_id: tenant.organization.id, username: 'x' }, 400],
      [
        'POST',
        '/api/auth/admin/users',
        { organization_id: tenant.organization.id, username: unique('u'), roles: ['nope'] },
        400,
      ],
      ['POST', '/api/auth/admin/users', { organization_id: MISSING_ID, username: unique('u') }, 404],
      [
        'POST',
        '/api/auth/admin/users',
        { organization_id: tenant.organization.id, username: tenant.admin.username },
        409,
      ],
      ['PUT', `/api/auth/admin/users/${editor.id}`, { email: 'not-an-email' }, 400],
      ['PUT', `/api/auth/admin/users/${MISSING_ID}`, { is_active: true }, 404],
      ['DELETE', `/api/auth/admin/users/${MISSING_ID}`, undefined, 404],
    ];
    for (const [method, path, body, status] of cases) {
      const res = await call(server, method, path, { token: superAdmin, body });
      expect(res.status, `${method} ${path} ${JSON.stringify(body)}`).toBe(status);
    }
  });

  it('refuses to delete or deactivate the calling super admin', async () => {
    const me = (await call(server, 'GET', '/api/auth/session', { token: superAdmin })).body.user.id;
    expect((await call(server, 'DELETE', `/api/auth/admin/users/${me}`, { token: superAdmin })).status).toBe(
      400,
    );
    const res = await call(server, 'PUT', `/api/auth/admin/users/${me}`, {
      token: superAdmin,
      body: { is_active: false },
    });
    expect(res.status).toBe(400);
  });
});

describe('super admin: logs download', () => {
  it('streams the log directory as a real .tar.gz', async () => {
    const dir = join(server.deps.env.dataDir, 'logs');
    mkdirSync(dir, { recursive: true });
    const line = `{"msg":"marker ${unique('log')}"}\n`;
    writeFileSync(join(dir, 'dimas.log'), line);
    const res = await fetch(new URL('/api/auth/admin/logs/download', server.url), {
      headers: { authorization: `Bearer ${superAdmin}` },
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/gzip');
    expect(res.headers.get('content-disposition')).toMatch(/attachment; filename="dimas-logs-.*\.tar\.gz"/);
    const archive = Buffer.from(await res.arrayBuffer());
    expect([...archive.subarray(0, 2)]).toEqual([0x1f, 0x8b]);
    const out = mkdtempSync(join(tmpdir(), 'dimas-logs-'));
    try {
      writeFileSync(join(out, 'logs.tar.gz'), archive);
      execFileSync('tar', ['-xzf', 'logs.tar.gz'], { cwd: out });
      expect(readFileSync(join(out, 'dimas.log'), 'utf8')).toBe(line);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });

  it('answers 401 and 403 in the JSON error shape, not as a download', async () => {
    const anonymous = await call(server, 'GET', '/api/auth/admin/logs/download');
    expect(anonymous.status).toBe(401);
    expect(anonymous.body.code).toBe('UNAUTHORIZED');
    const refused = await call(server, 'GET', '/api/auth/admin/logs/download', { token: tenant.admin.token });
    expect(refused.status).toBe(403);
    expect(refused.body.code).toBe('FORBIDDEN');
  });
});
