import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, unique, type Tenant } from './helpers/api.ts';
import { AppError } from '../src/app-error.ts';
import { errorAnswer } from '../src/trpc/errors.ts';

const ORIGIN = 'https://app.example';
let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  server = await startTestServer({ LOGIN_MAX_FAILURES_PER_USER: '2', CORS_ORIGINS: ORIGIN });
  tenant = await createTenant(server);
});
afterAll(async () => server?.close());

/** Fails logins for a new username until its next attempt is throttled. */
async function throttle(): Promise<{ username: string; domain: string; password: string }> {
  const attempt = {
    username: unique('victim'),
    domain: tenant.organization.domain,
    password: 'nope-nope-nope',
  };
  for (let i = 0; i < 2; i++)
    expect((await call(server, 'POST', '/api/auth/login', { body: attempt })).status).toBe(401);
  return attempt;
}

describe('Retry-After on answers that carry retry_after', () => {
  it('REST: a throttled login answers 429 with the header in whole seconds, equal to the body', async () => {
    const res = await call(server, 'POST', '/api/auth/login', {
      body: await throttle(),
      headers: { origin: ORIGIN },
    });
    expect(res.status).toBe(429);
    expect(res.body).toMatchObject({ code: 'TOO_MANY_REQUESTS', retry_after: expect.any(Number) });
    expect(res.headers.get('retry-after')).toMatch(/^\d+$/);
    expect(Number(res.headers.get('retry-after'))).toBe(res.body.retry_after);
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThan(0);
    // A browser app on another origin may read it too.
    expect(res.headers.get('access-control-expose-headers')).toMatch(/retry-after/i);
  });

  it('tRPC over HTTP: the same 429 carries the header', async () => {
    const res = await call(server, 'POST', '/trpc/auth.login', { body: { json: await throttle() } });
    expect(res.status).toBe(429);
    expect(res.body.error.json.data).toMatchObject({
      code: 'TOO_MANY_REQUESTS',
      retry_after: expect.any(Number),
    });
    expect(Number(res.headers.get('retry-after'))).toBe(res.body.error.json.data.retry_after);
  });

  it('answers without a retry_after carry no header', async () => {
    const res = await call(server, 'POST', '/api/auth/login', {
      body: { username: unique('u'), domain: tenant.organization.domain, password: 'wrong-password-1' },
    });
    expect(res.status).toBe(401);
    expect(res.headers.get('retry-after')).toBeNull();
  });

  it('rounds a fractional delay up: waiting that long is never too early', () => {
    const answer = errorAnswer(new AppError('TOO_MANY_REQUESTS', 'slow down', { retryAfter: 2.2 }));
    expect(answer).toMatchObject({ status: 429, headers: { 'retry-after': '3' } });
  });
});
