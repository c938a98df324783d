import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { MikroORM } from '@mikro-orm/postgresql';
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
import { scratchDatabase } from './helpers/scratch-db.ts';
import { openDatabase } from '../src/db/orm.ts';

/**
 * The rules around who administers an organization and what names mean: an organization keeps an
 * active person with org.admin whatever the change, a role in use is not deleted under its holders,
 * role answers count holders alike, and usernames and role names are unique regardless of case.
 */

let server: TestServer;
let superAdmin: string;

beforeAll(async () => {
  server = await startTestServer();
  superAdmin = await superAdminToken(server);
});
afterAll(async () => server?.close());

const as = (token: string) => (method: string, path: string, body?: unknown) =>
  call(server, method, path, { token, body });

async function customRole(tenant: Tenant, permissions: string[], name = unique('owner')) {
  const res = await as(tenant.admin.token)('POST', '/api/admin/roles', { name, permissions });
  if (res.status !== 200) throw new Error(`creating role ${name} answered ${res.status}`);
  return res.body as { id: number; name: string };
}

async function serviceAccount(tenant: Tenant, roles: string[]) {
  const res = await as(tenant.admin.token)('POST', '/api/api/service-accounts', {
    name: unique('sa'),
    roles,
  });
  if (res.status !== 200) throw new Error(`creating a service account answered ${res.status}`);
  return res.body as { service_account: { id: string; name: string }; api_key: string };
}

/** Whether the user can still administer the organization: the org.admin route answers it. */
const administers = async (user: TestUser) =>
  (await call(server, 'GET', '/api/admin/users', { token: user.token })).status === 200;

const userOf = async (tenant: Tenant, id: string) =>
  (
    await call(server, 'GET', '/api/admin/users', { token: tenant.admin.token, query: { limit: 200 } })
  ).body.users.find((u: { id: string }) => u.id === id);

function expectLastAdmin(res: { status: number; body: { code: string; reason?: string; message: string } }) {
  expect(res.status, JSON.stringify(res.body)).toBe(409);
  expect(res.body).toMatchObject({ code: 'CONFLICT', reason: 'LAST_ADMIN' });
  expect(res.body.message).toMatch(/without an administrator.*org\.admin.*another user first/);
}

describe('an organization keeps an active person with org.admin', () => {
  it('refuses to strip or delete the custom role that holds the last administrator (S1 a)', async () => {
    const tenant = await createTenant(server);
    const owner = await customRole(tenant, ['org.admin']);
    const holder = await tenant.addUser([owner.name]);
    const asHolder = as(holder.token);
    // The holder removes the built-in admin: it remains an administrator itself.
    expect((await asHolder('DELETE', `/api/admin/users/${tenant.admin.id}`)).status).toBe(200);

    expectLastAdmin(
      await asHolder('PUT', `/api/admin/roles/${owner.id}/permissions`, { permissions: ['workspace.read'] }),
    );
    expectLastAdmin(await asHolder('PUT', `/api/admin/roles/${owner.id}/permissions`, { permissions: [] }));
    // Nothing changed: the role still grants org.admin and its holder still administers.
    const roles = await asHolder('GET', '/api/admin/roles');
    expect(roles.body.roles.find((r: { id: number }) => r.id === owner.id).permissions).toEqual([
      'org.admin',
    ]);
    expect(await administers(holder)).toBe(true);

    // Deleting the role is refused too (it is in use), and the holder stays an administrator.
    const deleted = await asHolder('DELETE', `/api/admin/roles/${owner.id}`);
    expect(deleted.status).toBe(409);
    expect(await administers(holder)).toBe(true);

    // With a second administrator the same permission change is fine.
    const other = await tenant.addUser(['admin']);
    const changed = await asHolder('PUT', `/api/admin/roles/${owner.id}/permissions`, {
      permissions: ['workspace.read'],
    });
    expect(changed.status).toBe(200);
    expect(await administers(holder)).toBe(false);
    expect(await administers(other)).toBe(true);
  });

  it('refuses an admin service account demoting, deactivating or deleting the only human admin (S1 b)', async () => {
    const tenant = await createTenant(server);
    const { api_key: key } = await serviceAccount(tenant, ['admin']);
    const asAccount = as(key);
    const path = `/api/admin/users/${tenant.admin.id}`;

    expectLastAdmin(await asAccount('PUT', `${path}/roles`, { roles: ['viewer'] }));
    expectLastAdmin(await asAccount('PUT', path, { is_active: false }));
    expectLastAdmin(await asAccount('DELETE', path));
    // Nothing changed, and the refused deactivation left the admin's session alone.
    expect(await userOf(tenant, tenant.admin.id)).toMatchObject({ roles: ['admin'], is_active: true });
    expect(await administers(tenant.admin)).toBe(true);

    // A change that keeps the admin an admin passes, as do all of them once another admin exists.
    expect((await asAccount('PUT', `${path}/roles`, { roles: ['admin', 'viewer'] })).status).toBe(200);
    await tenant.addUser(['admin']);
    expect((await asAccount('PUT', `${path}/roles`, { roles: ['viewer'] })).status).toBe(200);
    expect((await asAccount('PUT', path, { is_active: false })).status).toBe(200);
  });

  it('counts active people only: neither an inactive admin nor an admin service account keeps the org', async () => {
    const tenant = await createTenant(server);
    const second = await tenant.addUser(['admin']);
    const { api_key: key } = await serviceAccount(tenant, ['admin']);
    const asAdmin = as(tenant.admin.token);
    expect((await asAdmin('PUT', `/api/admin/users/${second.id}`, { is_active: false })).status).toBe(200);
    expectLastAdmin(await as(key)('PUT', `/api/admin/users/${tenant.admin.id}/roles`, { roles: ['editor'] }));
    expect((await asAdmin('PUT', `/api/admin/users/${second.id}`, { is_active: true })).status).toBe(200);
    expect(
      (await as(key)('PUT', `/api/admin/users/${tenant.admin.id}/roles`, { roles: ['editor'] })).status,
    ).toBe(200);
  });

  it("takes a custom role's org.admin into account for the caller's own roles (S1 c)", async () => {
    const tenant = await createTenant(server);
    const owner = await customRole(tenant, ['org.admin']);
    const holder = await tenant.addUser([owner.name]);
    const asHolder = as(holder.token);
    const self = `/api/admin/users/${holder.id}/roles`;
    const kept = await asHolder('PUT', self, { roles: [owner.name, 'viewer'] });
    expect(kept.status, JSON.stringify(kept.body)).toBe(200);
    expect(kept.body.roles.sort()).toEqual([owner.name, 'viewer'].sort());
    const dropped = await asHolder('PUT', self, { roles: ['viewer'] });
    expect(dropped.status).toBe(400);
    expect(dropped.body.message).toMatch(/cannot take org\.admin away from yourself/);
    expect(dropped.body.message).not.toMatch(/admin role/);
    // The built-in admin's self-demotion is refused with the same words.
    const builtin = await as(tenant.admin.token)('PUT', `/api/admin/users/${tenant.admin.id}/roles`, {
      roles: [owner.name],
    });
    expect(builtin.status).toBe(200);
    expect(
      (
        await as(tenant.admin.token)('PUT', `/api/admin/users/${tenant.admin.id}/roles`, {
          roles: ['editor'],
        })
      ).body.message,
    ).toMatch(/cannot take org\.admin away from yourself/);
  });

  it('holds the super admin to the same rule, but not when it deletes the organization', async () => {
    const tenant = await createTenant(server);
    const path = `/api/auth/admin/users/${tenant.admin.id}`;
    const asRoot = as(superAdmin);
    expectLastAdmin(await asRoot('PUT', path, { roles: ['viewer'] }));
    expectLastAdmin(await asRoot('PUT', path, { is_active: false }));
    expectLastAdmin(await asRoot('DELETE', path));
    expect(await administers(tenant.admin)).toBe(true);
    // Other changes of the same user still pass.
    expect((await asRoot('PUT', path, { email: 'root-set@example.com' })).status).toBe(200);
    expect((await asRoot('DELETE', `/api/auth/admin/organizations/${tenant.organization.id}`)).status).toBe(
      200,
    );

    // An organization made without an administrator is not held to a rule it never met.
    const bare = await asRoot('POST', '/api/auth/admin/organizations', {
      name: 'Bare',
      domain: `${unique('bare')}.test`,
    });
    expect(bare.status).toBe(200);
    const member = await asRoot('POST', '/api/auth/admin/users', {
      organization_id: bare.body.organization.id,
      username: unique('member'),
      password: 'a-good-long-password',
      roles: ['viewer'],
    });
    expect(member.status).toBe(200);
    expect(
      (await asRoot('PUT', `/api/auth/admin/users/${member.body.user.id}`, { is_active: false })).status,
    ).toBe(200);
  });

  it('lets only one of two admins demoting or deactivating each other at once pass', async () => {
    for (let round = 0; round < 4; round++) {
      const tenant = await createTenant(server);
      const second = await tenant.addUser(['admin']);
      const [a, b] = await Promise.all(
        round % 2
          ? [
              as(tenant.admin.token)('PUT', `/api/admin/users/${second.id}`, { is_active: false }),
              as(second.token)('PUT', `/api/admin/users/${tenant.admin.id}`, { is_active: false }),
            ]
          : [
              as(tenant.admin.token)('PUT', `/api/admin/users/${second.id}/roles`, { roles: ['viewer'] }),
              as(second.token)('PUT', `/api/admin/users/${tenant.admin.id}/roles`, { roles: ['viewer'] }),
            ],
      );
      // The loser is refused by the rule (409) or, when it is authenticated after the winner's change
      // is committed (the embedded database runs one statement at a time), as no longer an admin (403)
      // or no longer signed in (401: deactivation ends sessions).
      const [winner, loser] = a.status === 200 ? [a, b] : [b, a];
      expect(winner.status, `round ${round}: ${JSON.stringify([a.body, b.body])}`).toBe(200);
      if (loser.status === 409) expectLastAdmin(loser);
      else expect([401, 403], `round ${round}`).toContain(loser.status);
      const users = await call(server, 'GET', '/api/auth/admin/users', {
        token: superAdmin,
        query: { organization_id: tenant.organization.id },
      });
      const admins = users.body.users.filter(
        (u: { roles: string[]; is_active: boolean }) => u.is_active && u.roles.includes('admin'),
      );
      expect(admins, JSON.stringify(users.body)).toHaveLength(1);
    }
  });
});

describe('a role in use is not deleted (D1) and its answers count its holders (W1)', () => {
  it('refuses to delete a role held by users and service accounts, naming them; deletes it once free', async () => {
    const tenant = await createTenant(server);
    const role = await customRole(tenant, ['sql.execute']);
    const users = [await tenant.addUser([role.name]), await tenant.addUser([role.name, 'viewer'])];
    const { service_account: account, api_key: key } = await serviceAccount(tenant, [role.name]);
    const asAdmin = as(tenant.admin.token);

    const refused = await asAdmin('DELETE', `/api/admin/roles/${role.id}`);
    expect(refused.status).toBe(409);
    expect(refused.body).toMatchObject({ code: 'CONFLICT', reason: 'ROLE_IN_USE' });
    expect(refused.body.message).toContain('2 users');
    expect(refused.body.message).toContain('1 service account');
    for (const name of [...users.map((u) => u.username), account.name])
      expect(refused.body.message).toContain(name);
    expect(refused.body.message).toMatch(/take it from them first/);
    // Nothing changed: the holders keep its permission.
    const session = await call(server, 'GET', '/api/auth/session', { token: key });
    expect(session.body.user.permissions).toContain('sql.execute');
    const still = await call(server, 'GET', '/api/auth/session', { token: users[0].token });
    expect(still.body.user.permissions).toContain('sql.execute');

    for (const user of users)
      expect((await asAdmin('PUT', `/api/admin/users/${user.id}/roles`, { roles: ['viewer'] })).status).toBe(
        200,
      );
    const onlyAccount = await asAdmin('DELETE', `/api/admin/roles/${role.id}`);
    expect(onlyAccount.status).toBe(409);
    expect(onlyAccount.body.message).toContain('1 service account');
    expect(onlyAccount.body.message).not.toMatch(/\d users?\b/);
    expect((await asAdmin('PATCH', `/api/api/service-accounts/${account.id}`, { roles: [] })).status).toBe(
      200,
    );
    expect(await asAdmin('DELETE', `/api/admin/roles/${role.id}`)).toMatchObject({
      status: 200,
      body: { success: true },
    });
  });

  it('answers the same holder counts from the list, the permission change and the rename', async () => {
    const tenant = await createTenant(server);
    const role = await customRole(tenant, ['workspace.read']);
    await tenant.addUser([role.name]);
    await serviceAccount(tenant, [role.name]);
    const asAdmin = as(tenant.admin.token);
    const listed = (await asAdmin('GET', '/api/admin/roles')).body.roles.find(
      (r: { id: number }) => r.id === role.id,
    );
    expect(listed).toMatchObject({ user_count: 1, service_account_count: 1 });
    const permissions = await asAdmin('PUT', `/api/admin/roles/${role.id}/permissions`, {
      permissions: ['workspace.read', 'sql.execute'],
    });
    expect(permissions.status).toBe(200);
    expect(permissions.body).toMatchObject({ user_count: 1, service_account_count: 1 });
    const renamed = await asAdmin('PUT', `/api/admin/roles/${role.id}`, { description: 'readers' });
    expect(renamed.status).toBe(200);
    expect(renamed.body).toMatchObject({ user_count: 1, service_account_count: 1 });
    const builtin = (await asAdmin('GET', '/api/admin/roles')).body.roles.find(
      (r: { name: string }) => r.name === 'admin',
    );
    expect(builtin).toMatchObject({ user_count: 1, service_account_count: 0 });
  });
});

describe('names are unique regardless of case (S2, S3)', () => {
  it('refuses a username that differs from another only by case, in one organization', async () => {
    const tenant = await createTenant(server);
    const base = unique('U_Editor');
    const asAdmin = as(tenant.admin.token);
    const first = await asAdmin('POST', '/api/admin/users', { username: base, password: TEST_PASSWORD });
    expect(first.status).toBe(200);
    for (const spelling of [base.toLowerCase(), base.toUpperCase()]) {
      const res = await asAdmin('POST', '/api/admin/users', { username: spelling, password: TEST_PASSWORD });
      expect(res.status, spelling).toBe(409);
      expect(res.body.message).toMatch(new RegExp(`^The username ${spelling} is taken`));
    }
    const bySuperAdmin = await as(superAdmin)('POST', '/api/auth/admin/users', {
      organization_id: tenant.organization.id,
      username: base.toLowerCase(),
      password: TEST_PASSWORD,
    });
    expect(bySuperAdmin.status).toBe(409);
    // Another organization may use it.
    const other = await createTenant(server);
    expect(
      (await as(other.admin.token)('POST', '/api/admin/users', { username: base.toLowerCase() })).status,
    ).toBe(200);
  });

  it('refuses a super-admin username that differs from another only by case', async () => {
    const res = await as(superAdmin)('POST', '/api/auth/admin/users', {
      is_super_admin: true,
      username: SUPERADMIN_USERNAME.replace(/^s/, 'S').replace('admin', 'Admin'),
      password: 'root-password-123',
    });
    expect(res.status).toBe(409);
    expect(res.body.message).toMatch(/^The username SuperAdmin is taken/);
  });

  it('logs in whatever the case of the username; failures of one spelling count for the user', async () => {
    const tenant = await createTenant(server);
    const name = unique('Mixed_Case');
    const created = await as(tenant.admin.token)('POST', '/api/admin/users', {
      username: name,
      password: TEST_PASSWORD,
      must_change_password: false,
    });
    expect(created.status).toBe(200);
    for (const spelling of [name, name.toLowerCase(), name.toUpperCase()]) {
      const token = await login(server, spelling, tenant.organization.domain);
      const session = await call(server, 'GET', '/api/auth/session', { token });
      expect(session.body.user).toMatchObject({ id: created.body.user.id, username: name });
    }
    const root = await call(server, 'POST', '/api/auth/admin/login', {
      body: { username: SUPERADMIN_USERNAME.toUpperCase(), password: SUPERADMIN_PASSWORD },
    });
    expect(root.status).toBe(200);
    expect(root.body.user.is_super_admin).toBe(true);
    // Wrong passwords under any spelling lock the one user out (the counter was always lowercased).
    const wrong = (username: string) =>
      call(server, 'POST', '/api/auth/login', {
        body: { username, domain: tenant.organization.domain, password: 'wrong-password-123' },
      });
    for (let i = 0; i < 5; i++) await wrong(i % 2 ? name.toUpperCase() : name.toLowerCase());
    expect((await wrong(name)).status).toBe(429);
  });

  it('answers one 200 and one 409 "is taken" to the same username created at once in two cases', async () => {
    const tenant = await createTenant(server);
    for (let round = 0; round < 4; round++) {
      const name = unique('Race');
      const results = await Promise.all(
        [name, name.toLowerCase()].map((username) =>
          as(tenant.admin.token)('POST', '/api/admin/users', { username, password: TEST_PASSWORD }),
        ),
      );
      expect(results.map((r) => r.status).sort(), JSON.stringify(results.map((r) => r.body))).toEqual([
        200, 409,
      ]);
      const loser = results.find((r) => r.status === 409)!;
      expect(loser.body.message).toMatch(
        /^The username \S+ is taken \(usernames are compared regardless of case\)$/,
      );
    }
  });

  it('refuses role names that differ from another only by case, built-in ones included', async () => {
    const tenant = await createTenant(server);
    const asAdmin = as(tenant.admin.token);
    for (const name of ['Admin', 'VIEWER', 'Editor']) {
      const res = await asAdmin('POST', '/api/admin/roles', { name, permissions: [] });
      expect(res.status, name).toBe(409);
      expect(res.body.message).toMatch(new RegExp(`^A role named ${name} already exists`));
    }
    const owner = await customRole(tenant, [], unique('Owner'));
    expect(
      (await asAdmin('POST', '/api/admin/roles', { name: owner.name.toUpperCase(), permissions: [] })).status,
    ).toBe(409);
    const other = await customRole(tenant, []);
    expect(
      (await asAdmin('PUT', `/api/admin/roles/${other.id}`, { name: owner.name.toLowerCase() })).status,
    ).toBe(409);
    expect((await asAdmin('PUT', `/api/admin/roles/${other.id}`, { name: 'ADMIN' })).status).toBe(409);
    // A role may change the case of its own name.
    const recased = await asAdmin('PUT', `/api/admin/roles/${owner.id}`, { name: owner.name.toLowerCase() });
    expect(recased.status).toBe(200);
    expect(recased.body.name).toBe(owner.name.toLowerCase());
  });

  it('answers one 200 and one 409 to the same role name created at once in two cases', async () => {
    const tenant = await createTenant(server);
    for (let round = 0; round < 6; round++) {
      const name = unique('Crew');
      const results = await Promise.all(
        [name, name.toLowerCase()].map((n) =>
          as(tenant.admin.token)('POST', '/api/admin/roles', { name: n, permissions: [] }),
        ),
      );
      expect(results.map((r) => r.status).sort(), JSON.stringify(results.map((r) => r.body))).toEqual([
        200, 409,
      ]);
      expect(results.find((r) => r.status === 409)!.body.message).toMatch(
        /^A role named \S+ already exists \(role names are compared regardless of case\)$/,
      );
    }
  });
});

describe('the migration that makes names unique regardless of case', () => {
  const database = scratchDatabase('case_names');
  let orm: MikroORM | undefined;
  afterAll(async () => {
    await orm?.close(true);
    await database.drop().catch(() => undefined);
  });

  it('refuses, naming them and changing nothing, a database that holds names equal but for case', async () => {
    await database.create();
    const db = await openDatabase({ databaseUrl: database.url });
    orm = db.orm;
    await orm.migrator.up({ to: 'Migration20261129100000_document_revisions' });
    await database.sql(`insert into organizations (id, name, domain, created_at, updated_at)
      values ('00000000-0000-4000-8000-000000000001', 'Acme', 'acme.test', now(), now())`);
    const user = (id: number, name: string, org: string | null) =>
      database.sql(
        `insert into users (id, organization_id, username, password_hash, created_at, updated_at)
         values ($1, $2, $3, 'x', now(), now())`,
        [`00000000-0000-4000-8000-00000000010${id}`, org, name],
      );
    const acme = '00000000-0000-4000-8000-000000000001';
    await user(1, 'U_Editor', acme);
    await user(2, 'u_editor', acme);
    await user(3, 'root', null);
    await user(4, 'ROOT', null);
    await database.sql(`insert into roles (organization_id, name, permissions, created_at, updated_at)
      values ('${acme}', 'admin', '{}', now(), now()), ('${acme}', 'Admin', '{}', now(), now())`);

    const failed = await orm.migrator.up().catch((error: Error) => error);
    expect(failed).toBeInstanceOf(Error);
    const message = (failed as Error).message;
    expect(message).toMatch(/differ only by case/);
    expect(message).toContain(
      'usernames of organization acme.test: U_Editor (user 00000000-0000-4000-8000-000000000101), u_editor',
    );
    expect(message).toContain('super-admin usernames: ROOT');
    expect(message).toContain('role names of organization acme.test: Admin');
    const indexes = async () =>
      (
        await database.sql(`select indexname from pg_indexes where indexname in
          ('roles_organization_id_lower_name_unique', 'users_organization_id_lower_username_unique',
           'users_super_admin_lower_username_unique')`)
      ).map((r) => r.indexname);
    expect(await indexes()).toEqual([]);
    expect((await orm.migrator.getPending()).map((m) => m.name)).toContain(
      'Migration20261130090000_case_insensitive_names',
    );

    await database.sql(`update users set username = 'u_editor2' where username = 'u_editor'`);
    await database.sql(`update users set username = 'root2' where username = 'ROOT'`);
    await database.sql(`update roles set name = 'Admin2' where name = 'Admin'`);
    await orm.migrator.up();
    expect((await indexes()).sort()).toEqual([
      'roles_organization_id_lower_name_unique',
      'users_organization_id_lower_username_unique',
      'users_super_admin_lower_username_unique',
    ]);
  });
});
