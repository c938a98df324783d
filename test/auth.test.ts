import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, login, superAdminToken, unique, type Tenant } from './helpers/api.ts';
import { TEST_PASSWORD } from './helpers/constants.ts';

let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
});
afterAll(async () => server?.close());

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
