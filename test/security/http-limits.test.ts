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

beforeAll(async () => {
  server = await startTestServer();
  proxied = await startTestServer({ TRUST_PROXY: 'loopback' });
  tenant = await createTenant(server);
}, 120_000);

// The test files share one control-plane database: failed logins recorded here would count against
// 127.0.0.1 in every other file, so each one is found by its unique user name and removed again.
const usernames: string[] = [];
afterAll(async () => {
  if (usernames.length)
    await server.deps.orm.em
      .fork()
      .getConnection()
      .execute('delete from login_failures where username in (?)', [usernames]);
  await server?.close();
  await proxied?.close();
});

async function recordedAddress(target: TestServer, forwardedFor: string): Promise<string> {
  const username = unique('httplim');
  // Failures are keyed by domain/username, lower-cased.
  const key = `${tenant.organization.domain}/${username}`.toLowerCase();
  usernames.push(key);
  const res = await call(target, 'POST', '/api/auth/login', {
    body: { username, domain: tenant.organization.domain, password: 'wrong-password-1' },
    headers: { 'x-forwarded-for': forwardedFor },
  });
  expect([401, 429]).toContain(res.status);
  const rows = await target.deps.orm.em
    .fork()
    .getConnection()
    .execute('select ip_address from login_failures where username = ?', [key]);
  return String(rows[0]?.ip_address);
}

const nested = (depth: number) => '['.repeat(depth) + ']'.repeat(depth);

describe('client address of the login limits', () => {
  it('ignores X-Forwarded-For by default: the per-address limit counts the real peer', async () => {
    expect(await recordedAddress(server, '203.0.113.7')).toMatch(/^(::ffff:)?127\.0\.0\.1$/);
  });

  it('counts the forwarded address when the operator trusts the proxy (TRUST_PROXY=loopback)', async () => {
    expect(await recordedAddress(proxied, '198.51.100.7')).toBe('198.51.100.7');
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
    const shallow = await call(server, 'POST', '/api/workspaces/create', {
      token: tenant.admin.token,
      body: { name: nested(40) },
    });
    // 40 levels pass the door; the route's own validation answers.
    expect(shallow.status).toBe(400);
    expect(shallow.body.message).not.toMatch(/nested deeper/);
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
