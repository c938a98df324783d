import { createTRPCClient, httpLink } from '@trpc/client';
import superjson from 'superjson';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, unique, type Tenant, type TestUser } from './helpers/api.ts';
import type { AppRouter } from '../src/trpc/router.ts';

let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let editor: TestUser;

const BASE = '/api/api/service-accounts';
const MISSING_ID = '00000000-0000-4000-8000-000000000000';

beforeAll(async () => {
  server = await startTestServer();
  [tenant, other] = await Promise.all([createTenant(server), createTenant(server)]);
  editor = await tenant.addUser(['editor']);
});
afterAll(async () => server?.close());

const asAdmin = (method: string, path: string, body?: unknown) =>
  call(server, method, path, { token: tenant.admin.token, body });

async function createAccount(body: Record<string, unknown> = {}) {
  const res = await asAdmin('POST', BASE, { name: unique('sa'), ...body });
  if (res.status !== 200) throw new Error(`create answered ${res.status}: ${JSON.stringify(res.body)}`);
  return res.body as { service_account: { id: string; name: string; key_prefix: string }; api_key: string };
}

const sessionWith = (key: string) => call(server, 'GET', '/api/auth/session', { token: key });

function trpcWith(key: string) {
  return createTRPCClient<AppRouter>({
    links: [
      httpLink({
        url: `${server.url}/trpc`,
        transformer: superjson,
        headers: { authorization: `Bearer ${key}` },
      }),
    ],
  });
}

describe('guards', () => {
  it('answers 401 without a token and 403 to an editor on all seven routes', async () => {
    const { service_account: account } = await createAccount();
    const routes: [string, string, unknown?][] = [
      ['GET', BASE],
      ['POST', BASE, { name: unique('sa') }],
      ['GET', `${BASE}/${account.id}`],
      ['PATCH', `${BASE}/${account.id}`, { is_active: false }],
      ['DELETE', `${BASE}/${account.id}`],
      ['GET', `${BASE}/${account.id}/api-key-info`],
      ['POST', `${BASE}/${account.id}/rotate-key`, {}],
    ];
    for (const [method, path, body] of routes) {
      expect((await call(server, method, path, { body })).status, `${method} ${path}`).toBe(401);
      const refused = await call(server, method, path, { token: editor.token, body });
      expect(refused.status, `${method} ${path}`).toBe(403);
      expect(refused.body.code).toBe('FORBIDDEN');
    }
    const still = await asAdmin('GET', `${BASE}/${account.id}`);
    expect(still.body.is_active).toBe(true);
  });

  it("answers 404 for another organization's account on every route that names one", async () => {
    const theirs = await call(server, 'POST', BASE, {
      token: other.admin.token,
      body: { name: unique('theirs') },
    });
    const id = theirs.body.service_account.id;
    for (const accountId of [id, MISSING_ID]) {
      const routes: [string, string, unknown?][] = [
        ['GET', `${BASE}/${accountId}`],
        ['PATCH', `${BASE}/${accountId}`, { is_active: false }],
        ['GET', `${BASE}/${accountId}/api-key-info`],
        ['POST', `${BASE}/${accountId}/rotate-key`, {}],
        ['DELETE', `${BASE}/${accountId}`],
      ];
      for (const [method, path, body] of routes)
        expect((await asAdmin(method, path, body)).status, `${method} ${path}`).toBe(404);
    }
    const list = await asAdmin('GET', BASE);
    expect(list.body.service_accounts.some((a: { id: string }) => a.id === id)).toBe(false);
    // Their key still works: nothing above touched it.
    expect((await sessionWith(theirs.body.api_key)).status).toBe(200);
  });
});

describe('service accounts', () => {
  it('creates an account whose key is shown once and works as a Bearer token on REST', async () => {
    const name = unique('etl');
    const res = await asAdmin('POST', BASE, {
      name,
      description: 'nightly load',
      roles: ['editor'],
      expires_in_days: 30,
    });
    expect(res.status).toBe(200);
    const { service_account: account, api_key: key } = res.body;
    expect(key).toMatch(/^dms_[a-z0-9]{12}_[a-z0-9]{32,}$/);
    expect(account).toMatchObject({
      name,
      description: 'nightly load',
      is_active: true,
      roles: ['editor'],
      key_prefix: key.split('_')[1],
      last_used_at: null,
    });
    const expires = new Date(account.key_expires_at).getTime() - Date.now();
    expect(Math.round(expires / 86_400_000)).toBe(30);
    const session = await sessionWith(key);
    expect(session.status).toBe(200);
    expect(session.body).toMatchObject({
      kind: 'service_account',
      user: { id: account.id, username: name, organization_id: tenant.organization.id },
    });
    expect(session.body.user.permissions).not.toContain('org.admin');
    // The key never shows again.
    for (const path of [BASE, `${BASE}/${account.id}`, `${BASE}/${account.id}/api-key-info`])
      expect(JSON.stringify((await asAdmin('GET', path)).body)).not.toContain(key.split('_')[2]);
    const read = await asAdmin('GET', `${BASE}/${account.id}`);
    expect(read.body.last_used_at).not.toBeNull();
  });

  it('works as a Bearer token on tRPC, with the roles of the account', async () => {
    const { api_key: key } = await createAccount({ roles: ['admin'] });
    const client = trpcWith(key);
    const session = await client.auth.session.query();
    expect(session.kind).toBe('service_account');
    expect(session.user.permissions).toContain('org.admin');
    const accounts = await client.serviceAccounts.list.query({});
    expect(accounts.service_accounts.length).toBeGreaterThan(0);
    expect(accounts.service_accounts[0].created_at).toBeInstanceOf(Date);
    // An account with the admin role administers through REST as well.
    expect((await call(server, 'GET', '/api/admin/users', { token: key })).status).toBe(200);
  });

  it('gives a viewer account 403 on administration and 401 to a made-up key', async () => {
    const { api_key: key } = await createAccount({ roles: ['viewer'] });
    expect((await call(server, 'GET', BASE, { token: key })).status).toBe(403);
    const forged = `${key.slice(0, -4)}aaaa`;
    expect((await sessionWith(forged)).status).toBe(401);
    expect((await sessionWith('dms_nothing')).status).toBe(401);
  });

  it('lists the accounts of the own organization with their roles', async () => {
    const { service_account: account } = await createAccount({ roles: ['viewer', 'editor'] });
    const res = await asAdmin('GET', BASE);
    expect(res.status).toBe(200);
    const listed = res.body.service_accounts.find((a: { id: string }) => a.id === account.id);
    expect(listed.roles.sort()).toEqual(['editor', 'viewer']);
    expect(JSON.stringify(res.body)).not.toMatch(/key_hash|keyHash/);
  });

  it('updates name, description and roles; the roles take effect at once', async () => {
    const { service_account: account, api_key: key } = await createAccount({ roles: ['viewer'] });
    expect((await call(server, 'GET', BASE, { token: key })).status).toBe(403);
    const name = unique('renamed');
    const res = await asAdmin('PATCH', `${BASE}/${account.id}`, {
      name,
      description: 'now an admin',
      roles: ['admin'],
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ name, description: 'now an admin', roles: ['admin'] });
    expect((await call(server, 'GET', BASE, { token: key })).status).toBe(200);
  });

  it('stops the key at once when the account is disabled, and again accepts it when enabled', async () => {
    const { service_account: account, api_key: key } = await createAccount();
    expect((await sessionWith(key)).status).toBe(200);
    const off = await asAdmin('PATCH', `${BASE}/${account.id}`, { is_active: false });
    expect(off.body.is_active).toBe(false);
    expect((await sessionWith(key)).status).toBe(401);
    await asAdmin('PATCH', `${BASE}/${account.id}`, { is_active: true });
    expect((await sessionWith(key)).status).toBe(200);
  });

  it('stops the key at once when the account is deleted', async () => {
    const { service_account: account, api_key: key } = await createAccount();
    expect((await sessionWith(key)).status).toBe(200);
    const res = await asAdmin('DELETE', `${BASE}/${account.id}`);
    expect(res).toMatchObject({ status: 200, body: { success: true } });
    expect((await sessionWith(key)).status).toBe(401);
    expect((await asAdmin('GET', `${BASE}/${account.id}`)).status).toBe(404);
  });

  it('refuses logout with a key (400, pointing to rotation and revocation); the key goes on working', async () => {
    const { api_key: key } = await createAccount({ roles: ['viewer'] });
    const res = await call(server, 'POST', '/api/auth/logout', { token: key });
    expect(res.status).toBe(400);
    expect(res.body).toEqual({
      message: expect.stringMatching(/rotate.*disable.*delete/),
      code: 'BAD_REQUEST',
    });
    // Like change-password, which a key cannot call either.
    const change = await call(server, 'POST', '/api/auth/change-password', {
      token: key,
      body: { current_password: 'x', new_password: 'another-long-password' },
    });
    expect(change.status).toBe(400);
    // The same answer over tRPC.
    await expect(trpcWith(key).auth.logout.mutate()).rejects.toMatchObject({
      data: { code: 'BAD_REQUEST', httpStatus: 400 },
      message: res.body.message,
    });
    // Nothing was ended: the caller is not led to believe otherwise.
    expect((await sessionWith(key)).status).toBe(200);
  });

  it('refuses an expired key', async () => {
    const { service_account: account, api_key: key } = await createAccount({ expires_in_days: 1 });
    expect((await sessionWith(key)).status).toBe(200);
    await server.deps.orm.em
      .fork()
      .getConnection()
      .execute(`update service_accounts set key_expires_at = now() - interval '1 minute' where id = ?`, [
        account.id,
      ]);
    expect((await sessionWith(key)).status).toBe(401);
  });

  it('refuses bad bodies with 400 and a taken name with 409', async () => {
    const { service_account: account } = await createAccount();
    const cases: [string, string, unknown, number][] = [
      ['POST', BASE, {}, 400],
      ['POST', BASE, { name: '' }, 400],
      ['POST', BASE, { name: '!bang' }, 400],
      ['POST', BASE, { name: unique('sa'), roles: ['ghost'] }, 400],
      ['POST', BASE, { name: unique('sa'), expires_in_days: 0 }, 400],
      ['POST', BASE, { name: account.name }, 409],
      ['PATCH', `${BASE}/${account.id}`, { is_active: 'yes' }, 400],
      // JSON has booleans: a string "false" must not be read as true.
      ['PATCH', `${BASE}/${account.id}`, { is_active: 'false' }, 400],
      ['PATCH', `${BASE}/${account.id}`, { is_active: null }, 400],
      ['PATCH', `${BASE}/${account.id}`, { roles: ['ghost'] }, 400],
      ['POST', `${BASE}/${account.id}/rotate-key`, { grace_period_minutes: -1 }, 400],
      ['POST', `${BASE}/${account.id}/rotate-key`, { grace_period_minutes: 'soon' }, 400],
      ['GET', `${BASE}/not-a-uuid`, undefined, 400],
    ];
    for (const [method, path, body, status] of cases)
      expect((await asAdmin(method, path, body)).status, `${method} ${path} ${JSON.stringify(body)}`).toBe(
        status,
      );
    // The same name in another organization is fine.
    const theirs = await call(server, 'POST', BASE, {
      token: other.admin.token,
      body: { name: account.name },
    });
    expect(theirs.status).toBe(200);
  });
});

describe('API keys', () => {
  it('describes the key without revealing it', async () => {
    const { service_account: account, api_key: key } = await createAccount({ expires_in_days: 7 });
    await sessionWith(key);
    const res = await asAdmin('GET', `${BASE}/${account.id}/api-key-info`);
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      key_prefix: account.key_prefix,
      masked_key: expect.stringMatching(new RegExp(`^dms_${account.key_prefix}_`)),
      previous_key_valid_until: null,
    });
    expect(new Date(res.body.created_at).getTime()).toBeLessThanOrEqual(Date.now());
    expect(new Date(res.body.expires_at).getTime()).toBeGreaterThan(Date.now());
    expect(res.body.last_used_at).not.toBeNull();
    const secret = key.split('_')[2];
    const text = JSON.stringify(res.body);
    expect(text).not.toContain(secret);
    expect(text).not.toContain(key);
    for (let i = 0; i + 8 <= secret.length; i += 8) expect(text).not.toContain(secret.slice(i, i + 8));
  });

  it('rotates without grace: the old key stops at once, the new one works', async () => {
    const { service_account: account, api_key: oldKey } = await createAccount();
    expect((await sessionWith(oldKey)).status).toBe(200);
    const res = await asAdmin('POST', `${BASE}/${account.id}/rotate-key`, {});
    expect(res.status).toBe(200);
    const newKey = res.body.api_key;
    expect(newKey).not.toBe(oldKey);
    expect(res.body.service_account.key_prefix).toBe(newKey.split('_')[1]);
    expect((await sessionWith(oldKey)).status).toBe(401);
    expect((await sessionWith(newKey)).status).toBe(200);
    const info = await asAdmin('GET', `${BASE}/${account.id}/api-key-info`);
    expect(info.body.previous_key_valid_until).toBeNull();
  });

  it('rotates with grace: both keys work until the grace period ends', async () => {
    const { service_account: account, api_key: oldKey } = await createAccount();
    const res = await asAdmin('POST', `${BASE}/${account.id}/rotate-key`, {
      grace_period_minutes: 60,
      expires_in_days: 90,
    });
    expect(res.status).toBe(200);
    const newKey = res.body.api_key;
    expect((await sessionWith(oldKey)).status).toBe(200);
    expect((await sessionWith(newKey)).status).toBe(200);
    const info = await asAdmin('GET', `${BASE}/${account.id}/api-key-info`);
    const until = new Date(info.body.previous_key_valid_until).getTime() - Date.now();
    expect(until).toBeGreaterThan(59 * 60_000);
    expect(until).toBeLessThanOrEqual(60 * 60_000);
    expect(Math.round((new Date(info.body.expires_at).getTime() - Date.now()) / 86_400_000)).toBe(90);
    // The old key through tRPC too.
    expect((await trpcWith(oldKey).auth.session.query()).kind).toBe('service_account');

    // When the grace period is over, the old key is refused.
    await server.deps.orm.em
      .fork()
      .getConnection()
      .execute(
        `update service_accounts set previous_key_expires_at = now() - interval '1 second' where id = ?`,
        [account.id],
      );
    expect((await sessionWith(oldKey)).status).toBe(401);
    expect((await sessionWith(newKey)).status).toBe(200);

    // Rotating again without grace ends the grace of the first rotation's key too.
    const again = await asAdmin('POST', `${BASE}/${account.id}/rotate-key`, { grace_period_minutes: 0 });
    expect((await sessionWith(newKey)).status).toBe(401);
    expect((await sessionWith(again.body.api_key)).status).toBe(200);
  });

  it('disabling stops a key that is inside its grace period as well', async () => {
    const { service_account: account, api_key: oldKey } = await createAccount();
    const rotated = await asAdmin('POST', `${BASE}/${account.id}/rotate-key`, { grace_period_minutes: 30 });
    await asAdmin('PATCH', `${BASE}/${account.id}`, { is_active: false });
    expect((await sessionWith(oldKey)).status).toBe(401);
    expect((await sessionWith(rotated.body.api_key)).status).toBe(401);
  });
});
