import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/server.ts';
import { call, createTenant, unique, type Tenant } from '../helpers/api.ts';
import { jsonDepthExceeds } from '../../src/json-depth.ts';

/*
 * What reaches the server from the network before any work: the client address the login limits
 * count (X-Forwarded-For is believed only behind a proxy the operator names), the content type, and
 * how deep a JSON document may nest.
 */
let server: TestServer;
let proxied: TestServer;
let tenant: Tenant;

const PER_ADDRESS = 4;
const limits = {
  LOGIN_MAX_FAILURES_PER_ADDRESS: String(PER_ADDRESS),
  LOGIN_MAX_FAILURES_PER_USER: '100',
};

beforeAll(async () => {
  server = await startTestServer(limits);
  proxied = await startTestServer({ ...limits, TRUST_PROXY: 'loopback' });
  tenant = await createTenant(server);
}, 120_000);

afterAll(async () => {
  await server?.close();
  await proxied?.close();
});

const failedLogin = (target: TestServer, forwardedFor: string) =>
  call(target, 'POST', '/api/auth/login', {
    body: { username: unique('nobody'), domain: tenant.organization.domain, password: 'wrong-password-1' },
    headers: { 'x-forwarded-for': forwardedFor },
  });

const nested = (depth: number) => '['.repeat(depth) + ']'.repeat(depth);

describe('client address of the login limits', () => {
  it('ignores X-Forwarded-For by default: spoofed addresses still reach the per-address limit', async () => {
    const statuses: number[] = [];
    for (let i = 0; i < PER_ADDRESS + 2; i++)
      statuses.push((await failedLogin(server, `203.0.113.${i}`)).status);
    expect(statuses.slice(0, PER_ADDRESS).every((s) => s === 401)).toBe(true);
    expect(statuses.at(-1)).toBe(429);
  });

  it('counts the forwarded address when the operator trusts the proxy (TRUST_PROXY=loopback)', async () => {
    const statuses: number[] = [];
    for (let i = 0; i < PER_ADDRESS + 2; i++)
      statuses.push((await failedLogin(proxied, `198.51.100.${i}`)).status);
    expect(statuses.every((s) => s === 401)).toBe(true);
    // One forwarded address is still limited on its own.
    const same: number[] = [];
    for (let i = 0; i < PER_ADDRESS + 1; i++)
      same.push((await failedLogin(proxied, '198.51.100.200')).status);
    expect(same.at(-1)).toBe(429);
  });
});

describe('content type', () => {
  it('answers 415 with its own code for a body that is not JSON', async () => {
    const res = await call(server, 'POST', '/api/auth/login', {
      body: 'username=a',
      headers: { 'content-type': 'text/plain' },
    });
    expect(res.status).toBe(415);
    expect(res.body).toMatchObject({ code: 'UNSUPPORTED_MEDIA_TYPE' });
  });
});

describe('JSON nesting limit', () => {
  it('measures depth on the bytes, outside strings', () => {
    expect(jsonDepthExceeds(nested(64), 64)).toBe(false);
    expect(jsonDepthExceeds(nested(65), 64)).toBe(true);
    expect(jsonDepthExceeds(`{"a":"${'['.repeat(500)}\\"["}`, 3)).toBe(false);
    expect(jsonDepthExceeds(Buffer.from('{"a":{"b":[1]}}'), 2)).toBe(true);
  });

  it('refuses a REST body nested 5,000 deep with a 400, and keeps accepting ordinary ones', async () => {
    const deep = await call(server, 'POST', '/api/auth/login', { body: `{"username":${nested(5000)}}` });
    expect(deep.status, JSON.stringify(deep.body)).toBe(400);
    expect(deep.body).toMatchObject({ code: 'BAD_REQUEST' });
    expect(deep.body.message).toMatch(/nested deeper than 64/);
    const objects = await call(server, 'POST', '/api/workspaces/create', {
      token: tenant.admin.token,
      body: '{"name":' + '{"a":'.repeat(5000) + '1' + '}'.repeat(5001),
    });
    expect(objects.status).toBe(400);
    const shallow = await call(server, 'POST', '/api/auth/login', {
      body: { username: nested(40), domain: 'x', password: 'y' },
    });
    // 40 levels pass the door; what the route makes of the value is its own answer.
    expect([401, 429]).toContain(shallow.status);
  });

  it('refuses deep tRPC input, in a mutation body, a batch and a query string, without an internal message', async () => {
    const headers = { authorization: `Bearer ${tenant.admin.token}`, 'content-type': 'application/json' };
    const bodies = [
      `{"json":${nested(5000)}}`,
      `{"json":{"workspace_name":"x"},"meta":{"values":${'{"a":'.repeat(5000)}1${'}'.repeat(5000)}}}`,
      `{"0":{"json":${nested(5000)}}}`,
    ];
    for (const [i, body] of bodies.entries()) {
      const url = `${server.url}/trpc/workspaces.select${i === 2 ? '?batch=1' : ''}`;
      const res = await fetch(url, { method: 'POST', headers, body });
      const text = await res.text();
      expect(res.status, text).toBe(400);
      expect(text).not.toMatch(/call stack|internal/i);
    }
    const query = await fetch(
      // 200 levels: a query string of 5,000 would pass Node's header size limit (431) first.
      `${server.url}/trpc/auth.session?input=${encodeURIComponent(`{"json":${nested(200)}}`)}`,
      { headers },
    );
    const text = await query.text();
    expect(query.status, text).toBe(400);
    expect(text).toMatch(/nested deeper than 64/);
    expect(text).not.toMatch(/call stack/i);
  });
});
