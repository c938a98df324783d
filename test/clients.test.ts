import { mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { EventSource } from 'eventsource';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { createDimasClient, type TRPCClientError } from '../src/client/index.ts';
import { createLogger, flushLogFile } from '../src/logger.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { createTenant, type Tenant } from './helpers/api.ts';

/*
 * createDimasClient from Node, where subscriptions authenticate exactly as in a browser (connectionParams,
 * no header), and the request log as an operator reads it.
 */
const logDir = mkdtempSync(join(inject('scratchDir'), 'logs-'));
const logger = createLogger({ level: 'info', logDir, stdout: false });
let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  server = await startTestServer({ LOG_LEVEL: 'info' }, { logger });
  tenant = await createTenant(server);
});
afterAll(async () => server?.close());

/** The first error of a discovery subscription (none of these callers can start one). */
function subscriptionError(token: string | null): Promise<TRPCClientError<never>> {
  const client = createDimasClient({ url: server.url, token, EventSource });
  return new Promise((resolve, reject) => {
    const sub = client.discovery.discover.subscribe(
      {},
      {
        onData: () => reject(new Error('no event expected')),
        onError: (error) => {
          sub.unsubscribe();
          resolve(error as TRPCClientError<never>);
        },
      },
    );
  });
}

describe('createDimasClient in Node', () => {
  it('authenticates subscriptions through connectionParams: 409 (no workspace) for a user, 401 without a token', async () => {
    // Past authentication the procedure itself answers: this user has no workspace selected.
    const signedIn = await subscriptionError(tenant.admin.token);
    expect(signedIn.data).toMatchObject({ code: 'CONFLICT', httpStatus: 409 });
    expect(signedIn.message).toMatch(/workspace/i);
    const anonymous = await subscriptionError(null);
    expect(anonymous.data).toMatchObject({ code: 'UNAUTHORIZED', httpStatus: 401 });
  });

  it('batches queries with the token in the header', async () => {
    const client = createDimasClient({ url: server.url, token: tenant.admin.token });
    const [session, roles] = await Promise.all([
      client.auth.session.query(),
      client.admin.listRoles.query({}),
    ]);
    expect(session.user.username).toBe(tenant.admin.username);
    expect(roles.roles.map((r) => r.name)).toEqual(['admin', 'editor', 'viewer']);
  });
});

describe('the request log', () => {
  it('records the full path of mounted routes and masks the token of subscriptions', async () => {
    await createDimasClient({ url: server.url, token: tenant.admin.token }).auth.session.query();
    await (await fetch(`${server.url}/api/docs/assets/swagger-ui.css`)).arrayBuffer();
    await subscriptionError(tenant.admin.token);
    await flushLogFile(logger);
    const lines = readFileSync(join(logDir, 'dimas.log'), 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as { msg: string; url?: string });
    const urls = lines.filter((l) => l.msg.startsWith('request')).map((l) => l.url!);
    expect(urls.some((u) => u.startsWith('/trpc/auth.session'))).toBe(true);
    expect(urls).toContain('/api/docs/assets/swagger-ui.css');
    const subscription = urls.find((u) => u.startsWith('/trpc/discovery.discover'));
    expect(subscription).toMatch(/connectionParams=\[redacted\]/);
    expect(readFileSync(join(logDir, 'dimas.log'), 'utf8')).not.toContain(tenant.admin.token);
  });
});
