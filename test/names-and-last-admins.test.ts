import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { MikroORM } from '@mikro-orm/postgresql';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, superAdminToken, unique, until, type Tenant } from './helpers/api.ts';
import { TEST_PASSWORD } from './helpers/constants.ts';
import { pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';
import { openDatabase } from '../src/db/orm.ts';

/**
 * One identity of names (organization, role and service-account names compared regardless of case, as
 * usernames; role names looked up the same way; names trimmed), and the installation keeps an active
 * super admin whatever the change, as an organization keeps an administrator (org-admins.test.ts).
 */

let server: TestServer;
let superAdmin: string;
let tenant: Tenant;

beforeAll(async () => {
  server = await startTestServer();
  [superAdmin, tenant] = await Promise.all([superAdminToken(server), createTenant(server)]);
});
afterAll(async () => server?.close());

const as = (token: string | undefined) => (method: string, path: string, body?: unknown) =>
  call(server, method, path, { token, body });

function expectTaken(
  res: { status: number; body: { code: string; reason?: string; message: string } },
  message: RegExp,
  reason: string,
) {
  expect(res.status, JSON.stringify(res.body)).toBe(409);
  expect(res.body).toMatchObject({ code: 'CONFLICT', reason });
  expect(res.body.message).toMatch(message);
}

function expectBadRequest(res: { status: number; body: { code: string } }, what: string) {
  expect(res.status, `${what}: ${JSON.stringify(res.body)}`).toBe(400);
  expect(res.body.code).toBe('BAD_REQUEST');
}

const ORGS = '/api/auth/admin/organizations';
const newOrganization = (name: string) =>
  as(superAdmin)('POST', ORGS, { name, domain: `${unique('o')}.test` });
const publicNames = async () =>
  (await call(server, 'GET', '/api/auth/organizations')).body.organizations.map(
    (o: { name: string }) => o.name,
  );

describe('organization names are unique regardless of case', () => {
  it('refuses a second organization whose name differs only by case (or not at all), on create and rename', async () => {
    const name = unique('Acme Corp ');
    const first = await newOrganization(name);
    expect(first.status).toBe(200);
    for (const spelling of [name, name.toUpperCase(), name.toLowerCase(), `  ${name.toLowerCase()}  `]) {
      const trimmed = spelling.trim();
      expectTaken(
        await newOrganization(spelling),
        new RegExp(
          `^An organization named ${trimmed} already exists \\(organization names are compared regardless of case\\)$`,
        ),
        'ORGANIZATION_NAME_TAKEN',
      );
    }
    // The login page's list shows it once.
    expect((await publicNames()).filter((n: string) => n.toLowerCase() === name.toLowerCase())).toEqual([
      name,
    ]);

    const other = await newOrganization(unique('Other '));
    expect(other.status).toBe(200);
    const rename = (id: string, body: unknown) => as(superAdmin)('PUT', `${ORGS}/${id}`, body);
    expectTaken(
      await rename(other.body.organization.id, { name: name.toUpperCase() }),
      /^An organization named ACME CORP \S+ already exists/,
      'ORGANIZATION_NAME_TAKEN',
    );
    // A refused rename changes nothing, the domain given with it included.
    const domain = `${unique('moved')}.test`;
    expect((await rename(other.body.organization.id, { name: name.toLowerCase(), domain })).status).toBe(409);
    const after = (
      await call(server, 'GET', ORGS, { token: superAdmin, query: { limit: 500 } })
    ).body.organizations.find((o: { id: string }) => o.id === other.body.organization.id);
    expect(after).toMatchObject({
      name: other.body.organization.name,
      domain: other.body.organization.domain,
    });
    // An organization may change the case of its own name, and keep its name while changing its domain.
    const recased = await rename(first.body.organization.id, { name: name.toLowerCase() });
    expect(recased.status, JSON.stringify(recased.body)).toBe(200);
    expect(recased.body.name).toBe(name.toLowerCase());
    expect((await rename(first.body.organization.id, { name: name.toLowerCase(), domain })).status).toBe(200);
  });

  it('refuses names of spaces only (400) and trims the others', async () => {
    for (const name of ['', '   ', '\t \n'])
      expectBadRequest(await newOrganization(name), `create ${JSON.stringify(name)}`);
    const padded = unique('Padded ');
    const created = await newOrganization(`   ${padded}   `);
    expect(created.status).toBe(200);
    expect(created.body.organization.name).toBe(padded);
    expectBadRequest(
      await as(superAdmin)('PUT', `${ORGS}/${created.body.organization.id}`, { name: '    ' }),
      'rename to spaces',
    );
  });

  it('refuses the same name in setup-environment before contacting the source', async () => {
    const name = unique('Setup Co ');
    expect((await newOrganization(name)).status).toBe(200);
    const res = await as(superAdmin)('POST', '/api/admin/setup-environment', {
      organization: { name: name.toUpperCase(), domain: `${unique('setup')}.test` },
      admin: { username: unique('admin') },
      workspace: { name: unique('ws') },
      // Nothing listens there: a 409 proves the name was checked before the source was read.
      source: pgConfig('nowhere', { port: 1 }),
      template: 'customer-360',
    });
    expectTaken(res, /^An organization named SETUP CO \S+ already exists/, 'ORGANIZATION_NAME_TAKEN');
  });

  it('answers one 200 and one 409 to the same name created at once in two cases', async () => {
    for (let round = 0; round < 4; round++) {
      const name = unique('Race Org ');
      const results = await Promise.all([newOrganization(name), newOrganization(name.toLowerCase())]);
      expect(results.map((r) => r.status).sort(), JSON.stringify(results.map((r) => r.body))).toEqual([
        200, 409,
      ]);
      expect(results.find((r) => r.status === 409)!.body).toMatchObject({
        reason: 'ORGANIZATION_NAME_TAKEN',
      });
    }
  });

  it('refuses organization admins (403) and anonymous callers (401)', async () => {
    for (const token of [undefined, tenant.admin.token]) {
      const created = await as(token)('POST', ORGS, { name: unique('x'), domain: `${unique('o')}.test` });
      const renamed = await as(token)('PUT', `${ORGS}/${tenant.organization.id}`, { name: unique('y') });
      for (const res of [created, renamed]) expect(res.status).toBe(token ? 403 : 401);
    }
  });
});

describe('role names are looked up as they are compared: regardless of case, trimmed', () => {
  it('assigns a role named in any case, to users and service accounts, by every route', async () => {
    const asAdmin = as(tenant.admin.token);
    const custom = await asAdmin('POST', '/api/admin/roles', { name: unique('Ops_Team'), permissions: [] });
    expect(custom.status).toBe(200);
    const member = await tenant.addUser(['viewer']);
    const assigned = await asAdmin('PUT', `/api/admin/users/${member.id}/roles`, {
      roles: ['Editor', ' VIEWER ', 'viewer', custom.body.name.toLowerCase()],
    });
    expect(assigned.status, JSON.stringify(assigned.body)).toBe(200);
    // Answered under the roles' own names, each once.
    expect([...assigned.body.roles].sort()).toEqual([custom.body.name, 'editor', 'viewer'].sort());

    const created = await asAdmin('POST', '/api/admin/users', {
      username: unique('made'),
      password: TEST_PASSWORD,
      roles: ['ADMIN'],
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    expect(created.body.user.roles).toEqual(['admin']);

    const byRoot = await as(superAdmin)('POST', '/api/auth/admin/users', {
      organization_id: tenant.organization.id,
      username: unique('rooted'),
      password: TEST_PASSWORD,
      roles: ['Viewer'],
    });
    expect(byRoot.status).toBe(200);
    expect(byRoot.body.user.roles).toEqual(['viewer']);
    const rootUpdate = await as(superAdmin)('PUT', `/api/auth/admin/users/${byRoot.body.user.id}`, {
      roles: ['EDITOR'],
    });
    expect(rootUpdate.body.roles).toEqual(['editor']);

    const account = await asAdmin('POST', '/api/api/service-accounts', {
      name: unique('bot'),
      roles: ['Viewer'],
    });
    expect(account.status).toBe(200);
    expect(account.body.service_account.roles).toEqual(['viewer']);
    const patched = await asAdmin('PATCH', `/api/api/service-accounts/${account.body.service_account.id}`, {
      roles: ['EDITOR', 'editor'],
    });
    expect(patched.body.roles).toEqual(['editor']);
  });

  it('refuses unknown roles and names of spaces with 400 naming them', async () => {
    const asAdmin = as(tenant.admin.token);
    const member = await tenant.addUser(['viewer']);
    const unknown = await asAdmin('PUT', `/api/admin/users/${member.id}/roles`, {
      roles: ['Admins', 'viewer', 'nope'],
    });
    expectBadRequest(unknown, 'unknown');
    expect(unknown.body.message).toBe('Unknown roles: Admins, nope');
    for (const roles of [['   '], ['']])
      expectBadRequest(
        await asAdmin('PUT', `/api/admin/users/${member.id}/roles`, { roles }),
        JSON.stringify(roles),
      );
    expectBadRequest(
      await asAdmin('POST', '/api/api/service-accounts', { name: unique('bot'), roles: [' '] }),
      'account roles',
    );
    for (const name of ['   ', ''])
      expectBadRequest(await asAdmin('POST', '/api/admin/roles', { name, permissions: [] }), `role ${name}`);
    // Nothing changed for the member.
    const users = await asAdmin('GET', '/api/admin/users?limit=500');
    expect(users.body.users.find((u: { id: string }) => u.id === member.id).roles).toEqual(['viewer']);
  });

  it("reads the caller's own roles the same way: ADMIN keeps org.admin, VIEWER does not", async () => {
    const own = await createTenant(server);
    await own.addUser(['admin']);
    const path = `/api/admin/users/${own.admin.id}/roles`;
    const kept = await as(own.admin.token)('PUT', path, { roles: ['ADMIN', 'Viewer'] });
    expect(kept.status, JSON.stringify(kept.body)).toBe(200);
    const dropped = await as(own.admin.token)('PUT', path, { roles: ['VIEWER'] });
    expectBadRequest(dropped, 'dropping own org.admin');
    expect(dropped.body.message).toMatch(/cannot take org\.admin away from yourself/);
  });
});

describe('service-account names are unique regardless of case', () => {
  const SA = '/api/api/service-accounts';

  it('refuses a name that differs only by case on create and rename; an account may recase its own', async () => {
    const asAdmin = as(tenant.admin.token);
    const name = unique('Deploy_Bot');
    const first = await asAdmin('POST', SA, { name });
    expect(first.status).toBe(200);
    const message = (spelling: string) =>
      new RegExp(
        `^A service account named ${spelling} already exists \\(service-account names are compared regardless of case\\)$`,
      );
    for (const spelling of [name, name.toLowerCase(), name.toUpperCase()])
      expectTaken(
        await asAdmin('POST', SA, { name: spelling }),
        message(spelling),
        'SERVICE_ACCOUNT_NAME_TAKEN',
      );
    const other = await asAdmin('POST', SA, { name: unique('other') });
    const otherId = other.body.service_account.id;
    expectTaken(
      await asAdmin('PATCH', `${SA}/${otherId}`, { name: name.toUpperCase(), description: 'changed' }),
      message(name.toUpperCase()),
      'SERVICE_ACCOUNT_NAME_TAKEN',
    );
    // The refused rename changed nothing.
    expect((await asAdmin('GET', `${SA}/${otherId}`)).body).toMatchObject({
      name: other.body.service_account.name,
      description: '',
    });
    const recased = await asAdmin('PATCH', `${SA}/${first.body.service_account.id}`, {
      name: name.toLowerCase(),
    });
    expect(recased.status, JSON.stringify(recased.body)).toBe(200);
    expect(recased.body.name).toBe(name.toLowerCase());
    // Another organization may use it.
    const elsewhere = await createTenant(server);
    expect((await as(elsewhere.admin.token)('POST', SA, { name: name.toUpperCase() })).status).toBe(200);
  });

  it('refuses names of spaces only (400) and callers without org.admin (403, 401)', async () => {
    const asAdmin = as(tenant.admin.token);
    for (const name of ['', '   '])
      expectBadRequest(await asAdmin('POST', SA, { name }), `create ${JSON.stringify(name)}`);
    const account = await asAdmin('POST', SA, { name: `  ${unique('padded')}  ` });
    expect(account.status).toBe(200);
    expect(account.body.service_account.name).not.toMatch(/^\s|\s$/);
    expectBadRequest(
      await asAdmin('PATCH', `${SA}/${account.body.service_account.id}`, { name: '   ' }),
      'rename to spaces',
    );
    const viewer = await tenant.addUser(['viewer']);
    expect((await as(viewer.token)('POST', SA, { name: unique('sa') })).status).toBe(403);
    expect((await as(undefined)('POST', SA, { name: unique('sa') })).status).toBe(401);
  });

  it('answers one 200 and one 409 to the same name created at once in two cases', async () => {
    for (let round = 0; round < 4; round++) {
      const name = unique('Twin');
      const results = await Promise.all(
        [name, name.toLowerCase()].map((n) => as(tenant.admin.token)('POST', SA, { name: n })),
      );
      expect(results.map((r) => r.status).sort(), JSON.stringify(results.map((r) => r.body))).toEqual([
        200, 409,
      ]);
      expect(results.find((r) => r.status === 409)!.body).toMatchObject({
        reason: 'SERVICE_ACCOUNT_NAME_TAKEN',
      });
    }
  });
});

/** Other spellings PostgreSQL reads as the same uuid. */
const spellings = (id: string) => [id.toUpperCase(), id.replace(/-/g, ''), `{${id}}`];

describe('the rules about oneself hold however the caller spells its own id', () => {
  it('refuses an org admin deleting, deactivating or demoting itself by another spelling of its id', async () => {
    const own = await createTenant(server);
    await own.addUser(['admin']);
    const asOwn = as(own.admin.token);
    for (const id of spellings(own.admin.id)) {
      expect((await asOwn('DELETE', `/api/admin/users/${id}`)).body.message).toBe(
        'You cannot delete yourself',
      );
      expect((await asOwn('PUT', `/api/admin/users/${id}`, { is_active: false })).body.message).toBe(
        'You cannot deactivate yourself',
      );
      expectBadRequest(await asOwn('PUT', `/api/admin/users/${id}/roles`, { roles: ['viewer'] }), id);
    }
    const me = (await asOwn('GET', '/api/admin/users?limit=500')).body.users.find(
      (u: { id: string }) => u.id === own.admin.id,
    );
    expect(me).toMatchObject({ is_active: true, roles: ['admin'] });
  });
});

// ---- the installation keeps an active super admin: on a database of its own ----

describe('the installation keeps an active super admin', () => {
  const database = scratchDatabase('super_admins');
  let isolated: TestServer;
  let root: { id: string; token: string };

  beforeAll(async () => {
    // Super admins are taken away here, which the run's shared database (every file's super admin)
    // cannot afford: a database of its own, seeded with the test super admin.
    await database.create();
    isolated = await startTestServer({}, { databaseUrl: database.url });
    const token = await superAdminToken(isolated);
    const session = await call(isolated, 'GET', '/api/auth/session', { token });
    root = { id: session.body.user.id, token };
  });
  afterAll(async () => {
    await isolated?.close();
    await database.drop().catch(() => undefined);
  });

  const asRoot = (token: string) => (method: string, path: string, body?: unknown) =>
    call(isolated, method, path, { token, body });

  async function newSuperAdmin() {
    const username = unique('root');
    const res = await asRoot(root.token)('POST', '/api/auth/admin/users', {
      is_super_admin: true,
      username,
      password: 'another-root-passphrase',
      must_change_password: false,
    });
    if (res.status !== 200) throw new Error(`creating a super admin answered ${res.status}`);
    const login = await call(isolated, 'POST', '/api/auth/admin/login', {
      body: { username, password: 'another-root-passphrase' },
    });
    return { id: res.body.user.id as string, token: login.body.token as string };
  }

  const activeSuperAdmins = async () =>
    (
      await database.sql(
        'select count(*)::int as n from users where organization_id is null and is_super_admin and is_active',
      )
    )[0].n;

  function expectLastSuperAdmin(res: {
    status: number;
    body: { code: string; reason?: string; message: string };
  }) {
    expect(res.status, JSON.stringify(res.body)).toBe(409);
    expect(res.body).toMatchObject({ code: 'CONFLICT', reason: 'LAST_SUPER_ADMIN' });
    expect(res.body.message).toMatch(/without an active super admin.*Create another super admin first/);
  }

  it('refuses the last super admin deleting or deactivating itself, however it spells its id', async () => {
    expect(await activeSuperAdmins()).toBe(1);
    for (const id of [root.id, ...spellings(root.id)]) {
      const deleted = await asRoot(root.token)('DELETE', `/api/auth/admin/users/${id}`);
      expectBadRequest(deleted, `delete ${id}`);
      expect(deleted.body.message).toBe('You cannot delete yourself');
      expectBadRequest(
        await asRoot(root.token)('PUT', `/api/auth/admin/users/${id}`, { is_active: false }),
        `deactivate ${id}`,
      );
      // No organization roles to take away either.
      expectBadRequest(
        await asRoot(root.token)('PUT', `/api/auth/admin/users/${id}`, { roles: ['viewer'] }),
        id,
      );
    }
    expect(await activeSuperAdmins()).toBe(1);
    expect((await call(isolated, 'GET', '/api/auth/session', { token: root.token })).status).toBe(200);
  });

  /**
   * Two super admins each take the other away at once. A transaction of the test holds the super
   * admins' rows until both requests wait behind it (both signed in by then), so they meet the rule
   * one after the other every time rather than by chance of timing.
   */
  async function removeEachOther(action: 'delete' | 'deactivate') {
    const other = await newSuperAdmin();
    const request = (caller: { token: string }, target: { id: string }) =>
      action === 'delete'
        ? asRoot(caller.token)('DELETE', `/api/auth/admin/users/${target.id}`)
        : asRoot(caller.token)('PUT', `/api/auth/admin/users/${target.id}`, { is_active: false });
    const [a, b] = await withClient(database.url, async (client) => {
      await client.query('begin');
      await client.query('select id from users where organization_id is null and is_super_admin for update');
      const requests = Promise.all([request(root, other), request(other, root)]);
      await until(
        'both requests waiting',
        async () =>
          (
            await database.sql(
              `select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`,
            )
          )[0].n,
        (n) => n >= 2,
        10_000,
        50,
      ).catch(() => undefined);
      await client.query('commit');
      return requests;
    });
    const [winner, loser] = a.status === 200 ? [a, b] : [b, a];
    expect(winner.status, JSON.stringify([a.body, b.body])).toBe(200);
    expectLastSuperAdmin(loser);
    expect(await activeSuperAdmins()).toBe(1);
    // The survivor is whoever the loser tried to take away: still signed in, still a super admin.
    const survivor = winner === a ? root : other;
    expect(
      (await call(isolated, 'GET', '/api/auth/admin/organizations', { token: survivor.token })).status,
    ).toBe(200);
    root = survivor;
  }

  it('lets only one of two super admins deleting each other at once pass (409 LAST_SUPER_ADMIN)', async () => {
    for (let round = 0; round < 2; round++) await removeEachOther('delete');
  });

  it('lets only one of two super admins deactivating each other at once pass', async () => {
    for (let round = 0; round < 2; round++) await removeEachOther('deactivate');
  });

  it('without a lock held by the test, still never leaves none (409, or 401 once the other is gone)', async () => {
    for (let round = 0; round < 4; round++) {
      const other = await newSuperAdmin();
      const [a, b] = await Promise.all([
        asRoot(root.token)('DELETE', `/api/auth/admin/users/${other.id}`),
        asRoot(other.token)('DELETE', `/api/auth/admin/users/${root.id}`),
      ]);
      const [winner, loser] = a.status === 200 ? [a, b] : [b, a];
      expect(winner.status, JSON.stringify([a.body, b.body])).toBe(200);
      if (loser.status === 409) expectLastSuperAdmin(loser);
      else expect(loser.status).toBe(401);
      expect(await activeSuperAdmins()).toBe(1);
      if (winner !== a) root = other;
    }
  });

  it('still lets a super admin remove another while one remains, and reactivate one', async () => {
    const other = await newSuperAdmin();
    expect(
      (await asRoot(root.token)('PUT', `/api/auth/admin/users/${other.id}`, { is_active: false })).status,
    ).toBe(200);
    expect(
      (await asRoot(root.token)('PUT', `/api/auth/admin/users/${other.id}`, { is_active: true })).status,
    ).toBe(200);
    expect((await asRoot(root.token)('DELETE', `/api/auth/admin/users/${other.id}`)).status).toBe(200);
    expect(await activeSuperAdmins()).toBe(1);
  });
});

// ---- the migration ----

describe('the migration that makes organization and service-account names unique regardless of case', () => {
  const database = scratchDatabase('org_names');
  let orm: MikroORM | undefined;
  afterAll(async () => {
    await orm?.close(true);
    await database.drop().catch(() => undefined);
  });

  const NEW_INDEXES = [
    'organizations_lower_name_unique',
    'service_accounts_organization_id_lower_name_unique',
  ];
  const OLD_CONSTRAINTS = [
    'roles_organization_id_name_unique',
    'service_accounts_organization_id_name_unique',
    'users_organization_id_username_unique',
    'users_super_admin_username_unique',
  ];

  it('refuses, naming them and changing nothing, a database that holds such names; then drops the exact-case constraints', async () => {
    await database.create();
    const db = await openDatabase({ databaseUrl: database.url });
    orm = db.orm;
    await orm.migrator.up({ to: 'Migration20261130090000_case_insensitive_names' });
    const org = (n: number) => `00000000-0000-4000-8000-00000000000${n}`;
    await database.sql(`insert into organizations (id, name, domain, created_at, updated_at) values
      ('${org(1)}', 'Acme', 'acme.test', now(), now()),
      ('${org(2)}', 'ACME', 'acme-copy.test', now(), now()),
      ('${org(3)}', 'Other', 'other.test', now(), now())`);
    const account = (n: number, name: string, organization: string) =>
      database.sql(
        `insert into service_accounts (id, organization_id, name, key_prefix, key_hash, key_created_at, created_at, updated_at)
         values ($1, $2, $3, $4, 'x', now(), now(), now())`,
        [`00000000-0000-4000-8000-00000000010${n}`, organization, name, `prefix${n}`],
      );
    await account(1, 'Deploy', org(1));
    await account(2, 'deploy', org(1));
    // The same name in another organization is no duplicate.
    await account(3, 'DEPLOY', org(3));

    const failed = await orm.migrator.up().catch((error: Error) => error);
    expect(failed).toBeInstanceOf(Error);
    const message = (failed as Error).message;
    expect(message).toMatch(/differ only by case .* Nothing was changed/);
    const line = (scope: string) => message.split('\n').find((l) => l.startsWith(`  ${scope}: `)) ?? '';
    expect(line('organization names')).toContain(`ACME (organization ${org(2)}, domain acme-copy.test)`);
    expect(line('organization names')).toContain(`Acme (organization ${org(1)}, domain acme.test)`);
    const accounts = line('service-account names of organization acme.test');
    expect(accounts).toContain('Deploy (service account 00000000-0000-4000-8000-000000000101)');
    expect(accounts).toContain('deploy (service account 00000000-0000-4000-8000-000000000102)');
    expect(message).not.toContain('other.test');
    const present = async (names: string[]) =>
      (
        await database.sql(`select indexname from pg_indexes where indexname = any($1) order by indexname`, [
          names,
        ])
      ).map((r) => r.indexname);
    expect(await present(NEW_INDEXES)).toEqual([]);
    expect(await present(OLD_CONSTRAINTS)).toEqual(OLD_CONSTRAINTS);
    const pending = (await orm.migrator.getPending()).map((m) => m.name);
    expect(pending).toContain('Migration20261201094000_case_insensitive_organization_and_account_names');
    expect(pending).toContain('Migration20261201095000_drop_exact_case_name_constraints');

    await database.sql(`update organizations set name = 'Acme (copy)' where id = '${org(2)}'`);
    await database.sql(`update service_accounts set name = 'deploy-2' where name = 'deploy'`);
    await orm.migrator.up();
    expect(await present(NEW_INDEXES)).toEqual(NEW_INDEXES);
    expect(await present(OLD_CONSTRAINTS)).toEqual([]);
    // The case-insensitive indexes hold exact duplicates off as well.
    const duplicate = await database
      .sql(
        `insert into service_accounts (id, organization_id, name, key_prefix, key_hash, key_created_at, created_at, updated_at)
        values ('00000000-0000-4000-8000-000000000109', '${org(1)}', 'Deploy', 'prefix9', 'x', now(), now(), now())`,
      )
      .catch((error: { constraint?: string }) => error.constraint);
    expect(duplicate).toBe('service_accounts_organization_id_lower_name_unique');
  });
});
