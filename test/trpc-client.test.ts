import { createTRPCClient, httpLink, TRPCClientError } from '@trpc/client';
import superjson from 'superjson';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { createTenant, type Tenant } from './helpers/api.ts';
import { TEST_PASSWORD } from './helpers/constants.ts';
import type { AppRouter } from '../src/trpc/router.ts';

let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
});
afterAll(async () => server?.close());

/** A typed client as internal scripts make one: superjson, the token in the headers. */
function client(token?: string) {
  return createTRPCClient<AppRouter>({
    links: [
      httpLink({
        url: `${server.url}/trpc`,
        transformer: superjson,
        headers: () => (token ? { authorization: `Bearer ${token}` } : {}),
      }),
    ],
  });
}

describe('tRPC client', () => {
  it('logs in and calls procedures; dates arrive as Date objects', async () => {
    const { token, expires_at, user } = await client().auth.login.mutate({
      username: tenant.admin.username,
      domain: tenant.organization.domain,
      password: TEST_PASSWORD,
    });
    expect(expires_at).toBeInstanceOf(Date);
    expect(user.organization_id).toBe(tenant.organization.id);

    const api = client(token);
    const session = await api.auth.session.query();
    expect(session.expires_at).toBeInstanceOf(Date);
    expect(session.expires_at!.getTime()).toBeGreaterThan(Date.now());
    expect(session.user.username).toBe(tenant.admin.username);

    const { users } = await api.admin.listUsers.query({ limit: 10, offset: 0 });
    expect(users[0].created_at).toBeInstanceOf(Date);
    const { roles } = await api.admin.listRoles.query({});
    expect(roles.map((r) => r.name)).toEqual(['admin', 'editor', 'viewer']);
  });

  it('carries errors with their code and HTTP status, never a stack', async () => {
    const anonymous = client().auth.session.query();
    await expect(anonymous).rejects.toBeInstanceOf(TRPCClientError);
    await expect(anonymous).rejects.toMatchObject({ data: { code: 'UNAUTHORIZED', httpStatus: 401 } });
    const error = (await client()
      .auth.login.mutate({ username: 'x', domain: 'y', password: '' })
      .catch((e: unknown) => e)) as TRPCClientError<AppRouter>;
    expect(error.data).toMatchObject({ code: 'BAD_REQUEST', httpStatus: 400 });
    expect(JSON.stringify(error.shape)).not.toMatch(/stack|node_modules|\.ts:/);
  });

  it('refuses a user with a temporary password with reason PASSWORD_CHANGE_REQUIRED', async () => {
    const user = await tenant.addUser(['admin'], { mustChangePassword: true });
    const error = (await client(user.token)
      .admin.listRoles.query({})
      .catch((e: unknown) => e)) as TRPCClientError<AppRouter>;
    expect(error.data).toMatchObject({ code: 'FORBIDDEN', reason: 'PASSWORD_CHANGE_REQUIRED' });
  });
});
