import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.ts';
import { TEST_SECRET_KEY } from './helpers/constants.ts';
import { loadEnv } from '../src/env.ts';
import { openDatabase } from '../src/db/orm.ts';
import { createLogger } from '../src/logger.ts';
import { startServer } from '../src/server.ts';
import { call, createTenant, type Tenant } from './helpers/api.ts';

let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
});
afterAll(async () => server?.close());

/** The error body of DESIGN §4: message and code (and issues/reason/retry_after), nothing internal. */
function expectErrorShape(body: Record<string, unknown>, code: string) {
  expect(body).toMatchObject({ code, message: expect.any(String) });
  expect(
    Object.keys(body).every((k) => ['message', 'code', 'issues', 'reason', 'retry_after'].includes(k)),
  ).toBe(true);
  expect(JSON.stringify(body)).not.toMatch(/\bat .+:\d+:\d+|node_modules|stack/);
}

describe('HTTP basics', () => {
  it('answers GET /api/health with 200 and the database kind', async () => {
    const res = await call(server, 'GET', '/api/health');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ status: 'ok', database: server.deps.dbKind });
  });

  it('answers an unknown /api path with 404 in the error shape', async () => {
    for (const [method, path] of [
      ['GET', '/api/no-such-thing'],
      ['POST', '/api/auth/no-such-thing'],
      ['DELETE', '/api/auth/session'],
    ]) {
      const res = await call(server, method, path, { token: tenant.admin.token });
      expect(res.status, `${method} ${path}`).toBe(404);
      expect(res.headers.get('content-type')).toMatch(/application\/json/);
      expectErrorShape(res.body, 'NOT_FOUND');
    }
  });

  it('answers malformed JSON with 400 in the error shape', async () => {
    const res = await call(server, 'POST', '/api/auth/login', { body: '{"username": "a",' });
    expect(res.status).toBe(400);
    expect(res.headers.get('content-type')).toMatch(/application\/json/);
    expectErrorShape(res.body, 'BAD_REQUEST');
  });

  it('answers a body that fails validation with 400 and the issues', async () => {
    const res = await call(server, 'POST', '/api/auth/login', { body: { username: 42 } });
    expect(res.status).toBe(400);
    expectErrorShape(res.body, 'BAD_REQUEST');
    expect((res.body.issues as { path: string[] }[]).map((i) => i.path[0]).sort()).toEqual([
      'domain',
      'password',
      'username',
    ]);
  });

  it('tags every response with a request id, echoing one the client sent', async () => {
    const res = await call(server, 'GET', '/api/health', { headers: { 'x-request-id': 'trace-me-123' } });
    expect(res.headers.get('x-request-id')).toBe('trace-me-123');
    const fresh = await call(server, 'GET', '/api/health');
    expect(fresh.headers.get('x-request-id')).toMatch(/^[0-9a-f-]{36}$/);
  });

  it('sends the security headers of helmet and no x-powered-by', async () => {
    const res = await call(server, 'GET', '/api/health');
    // The same on a REST answer, which the REST adapter sends itself.
    const rest = await call(server, 'GET', '/api/auth/session');
    expect(rest.status).toBe(401);
    for (const name of ['content-security-policy', 'cross-origin-resource-policy', 'referrer-policy'])
      expect(rest.headers.get(name)).toBe(res.headers.get(name));
    expect(res.headers.get('referrer-policy')).toBe('no-referrer');
    expect(res.headers.get('cross-origin-resource-policy')).toBe('same-origin');
    expect(res.headers.get('x-content-type-options')).toBe('nosniff');
    expect(res.headers.get('x-frame-options')).toBe('SAMEORIGIN');
    expect(res.headers.get('content-security-policy')).toBe("default-src 'none';frame-ancestors 'none'");
    expect(res.headers.get('strict-transport-security')).toMatch(/max-age=\d+/);
    expect(res.headers.get('x-powered-by')).toBeNull();
  });
});

describe('body limit', () => {
  let small: TestServer;
  let token: string;
  beforeAll(async () => {
    small = await startTestServer({ BODY_LIMIT: '1kb' });
    token = (await createTenant(small)).admin.token;
  });
  afterAll(async () => small?.close());

  it('answers a body over BODY_LIMIT with 413 in the error shape', async () => {
    const res = await call(small, 'PUT', '/api/auth/preferences', {
      token,
      body: { preferences: { blob: 'x'.repeat(2048) } },
    });
    expect(res.status).toBe(413);
    expectErrorShape(res.body, 'PAYLOAD_TOO_LARGE');
  });

  it('accepts a body under the limit', async () => {
    const res = await call(small, 'PUT', '/api/auth/preferences', {
      token,
      body: { preferences: { blob: 'x'.repeat(100) } },
    });
    expect(res.status).toBe(200);
  });
});

describe('an internal error', () => {
  it('answers 500 with a generic message on REST and tRPC, never the error itself', async () => {
    const { authenticator } = server.deps;
    const original = authenticator.authenticate;
    authenticator.authenticate = async () => {
      throw new Error('secret detail from /srv/dimas/src/x.ts:1:1');
    };
    // The log line of each 500 names what failed (the answer does not): it said only "Internal
    // server error" before, the thrown error dropped on the way.
    const { logger } = server.deps;
    const logged: unknown[] = [];
    const log = logger.error;
    logger.error = ((entry: unknown) => void logged.push(entry)) as typeof logger.error;
    const causes = (entry: unknown) => {
      const messages: string[] = [];
      for (let e = (entry as { err?: unknown }).err; e instanceof Error; e = e.cause)
        messages.push(e.message);
      return messages.join(' <- ');
    };
    try {
      const res = await call(server, 'GET', '/api/auth/session', { token: tenant.admin.token });
      expect(res.status).toBe(500);
      expectErrorShape(res.body, 'INTERNAL_SERVER_ERROR');
      expect(res.body.message).toBe('Internal server error');
      expect(JSON.stringify(res.body)).not.toContain('secret detail');
      const trpc = await call(server, 'GET', '/trpc/auth.session', { token: tenant.admin.token });
      expect(trpc.status).toBe(500);
      expect(JSON.stringify(trpc.body)).not.toMatch(/secret detail|stack|x\.ts/);
      expect(logged.map(causes)).toEqual([
        expect.stringContaining('secret detail'),
        expect.stringContaining('secret detail'),
      ]);
    } finally {
      authenticator.authenticate = original;
      logger.error = log;
    }
  });
});

describe('environment', () => {
  it('reads IDENTITY_IN_PROCESS_IDENTIFIERS as a non-negative integer, 1,000,000 by default', () => {
    const base = { DIMAS_SECRET_KEY: TEST_SECRET_KEY };
    expect(loadEnv(base).IDENTITY_IN_PROCESS_IDENTIFIERS).toBe(1_000_000);
    expect(loadEnv({ ...base, IDENTITY_IN_PROCESS_IDENTIFIERS: '0' }).IDENTITY_IN_PROCESS_IDENTIFIERS).toBe(
      0,
    );
    expect(() => loadEnv({ ...base, IDENTITY_IN_PROCESS_IDENTIFIERS: '-1' })).toThrow(
      /IDENTITY_IN_PROCESS_IDENTIFIERS/,
    );
  });
});

describe('a server whose database is gone', () => {
  let broken: TestServer;
  let token: string;
  let cut: () => Promise<void> | void;
  let relay: TcpProxy | undefined;
  beforeAll(async () => {
    const databaseUrl = inject('databaseUrl');
    if (databaseUrl) {
      relay = await startTcpProxy(new URL(databaseUrl));
      const env = loadEnv({
        PORT: '0',
        DIMAS_DATA_DIR: mkdtempSync(join(inject('scratchDir'), 'broken-')),
        DIMAS_SECRET_KEY: TEST_SECRET_KEY,
        LOG_LEVEL: 'silent',
        AUTH_CACHE_TTL_MS: '0',
        DATABASE_URL: relay.url,
      });
      broken = await startServer(env, {
        db: await openDatabase({ databaseUrl: relay.url }),
        seed: false,
        logger: createLogger({ level: 'silent' }),
      });
      cut = relay.cut;
    } else {
      broken = await startTestServer();
      cut = () => broken.db.close();
    }
    token = (await createTenant(broken)).admin.token;
    await cut();
  });
  afterAll(async () => {
    broken.db.close = async () => {};
    await broken?.close();
    await relay?.close();
  });

  it('answers health with 503', async () => {
    const res = await call(broken, 'GET', '/api/health');
    expect(res.status).toBe(503);
    expectErrorShape(res.body, 'SERVICE_UNAVAILABLE');
  });

  it('answers data routes with 503 or a generic 500, never the internal error', async () => {
    for (const [method, path, body] of [
      ['GET', '/api/auth/session', undefined],
      ['GET', '/api/admin/users', undefined],
      ['POST', '/api/auth/login', { username: 'a', domain: 'b.c', password: 'x' }],
    ] as const) {
      const res = await call(broken, method, path, { token, body });
      expect([500, 503], `${method} ${path}`).toContain(res.status);
      expectErrorShape(res.body, res.status === 503 ? 'SERVICE_UNAVAILABLE' : 'INTERNAL_SERVER_ERROR');
      if (res.status === 500) expect(res.body.message).toBe('Internal server error');
      expect(JSON.stringify(res.body)).not.toMatch(/pool|PGlite|closed|destroyed|ECONN|kysely|mikro/i);
    }
  });
});
