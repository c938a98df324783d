import { readFileSync } from 'node:fs';
import { afterAll, describe, expect, it } from 'vitest';
import { startTestServer } from '../helpers/server.ts';
import { call, createTenant, superAdminToken, unique, type TestUser } from '../helpers/api.ts';
import { ALL_PERMISSIONS, isPermission } from '../../src/auth/permissions.ts';

/**
 * The route table is the contract. Every row the server documents is checked here against its guard;
 * rows nobody serves yet are reported as pending, so this file grows with every area that lands.
 */
interface Route {
  area: string;
  method: string;
  path: string;
  guard: string;
}

const table: Route[] = readFileSync(new URL('./routes.tsv', import.meta.url), 'utf8')
  .trim()
  .split('\n')
  .slice(1)
  .map((line) => {
    const [area, method, path, guard] = line.split('\t');
    return { area, method, path, guard };
  });

const shape = (path: string) => path.replace(/\{[^}]+\}/g, '{}').replace(/\/+$/, '');
const key = (method: string, path: string) => `${method.toUpperCase()} ${shape(path)}`;
const probePath = (path: string) => path.replace(/\{[^}]+\}/g, 'probe-x');
/** A documented template that also matches a concrete path (e.g. /x/{name} for /x/current). */
const templateMatches = (template: string, concrete: string) =>
  new RegExp(`^${template.replace(/\{[^}]+\}/g, '[^/]+')}$`, 'i').test(concrete);
/** Callable with a temporary password (DESIGN §5, auth). */
const PENDING_ALLOWED = new Set([
  'POST /api/auth/change-password',
  'GET /api/auth/session',
  'POST /api/auth/logout',
]);

// The document decides which tests exist, so the server starts while the file is collected.
const server = await startTestServer();
afterAll(async () => server.close());

const doc = (await call(server, 'GET', '/api/openapi.json')).body as {
  paths: Record<string, Record<string, { security?: unknown[] }>>;
};
const operations = new Map<string, { path: string; method: string; security?: unknown[] }>();
for (const [path, ops] of Object.entries(doc.paths))
  for (const [method, op] of Object.entries(ops))
    operations.set(key(method, path), { path, method: method.toUpperCase(), security: op.security });

const served = table.filter((r) => operations.has(key(r.method, r.path)));
const pending = table.filter((r) => !operations.has(key(r.method, r.path)));
console.log(
  `route contract: ${served.length}/${table.length} routes served; ${pending.length} pending:\n` +
    pending.map((r) => `  pending ${r.method} ${r.path} (${r.area})`).join('\n'),
);

// Callers: an org admin (refused by super_admin routes), a member whose only role grants nothing,
// one member per permission holding exactly that permission, and a user with a temporary password.
const tenant = await createTenant(server);
const superAdmin = await superAdminToken(server);
async function roleWith(permissions: string[]): Promise<string> {
  const name = unique('role');
  const res = await call(server, 'POST', '/api/admin/roles', {
    token: tenant.admin.token,
    body: { name, permissions },
  });
  if (res.status !== 200) throw new Error(`creating a role answered ${res.status}`);
  return name;
}
const nobody = await tenant.addUser([await roleWith([])]);
const guardsInUse = new Set(served.map((r) => r.guard).filter(isPermission));
const holders = new Map<string, TestUser>();
for (const permission of guardsInUse)
  holders.set(permission, await tenant.addUser([await roleWith([permission])]));
const temporary = await tenant.addUser(['admin'], { mustChangePassword: true });

async function probe(route: Route, token?: string) {
  return call(server, route.method, probePath(route.path), {
    token,
    body: ['GET', 'DELETE'].includes(route.method) ? undefined : '{}',
  });
}

describe('route table', () => {
  it('names only known guards', () => {
    const known = new Set(['public', 'user', 'super_admin', ...ALL_PERMISSIONS]);
    expect(table.filter((r) => !known.has(r.guard))).toEqual([]);
  });

  it('documents no operation outside the table', () => {
    const rows = new Set(table.map((r) => key(r.method, r.path)));
    expect([...operations.keys()].filter((k) => !rows.has(k))).toEqual([]);
  });

  it('serves no route that the document leaves out', async () => {
    const undocumented: string[] = [];
    for (const route of pending) {
      const concrete = probePath(route.path);
      // A documented sibling template answering this path is that route's business, not this one's.
      const shadowed = [...operations.values()].some(
        (op) => op.method === route.method && templateMatches(op.path, concrete),
      );
      if (shadowed) continue;
      const res = await probe(route);
      if (res.status !== 404) undocumented.push(`${route.method} ${route.path} answered ${res.status}`);
    }
    expect(undocumented).toEqual([]);
  });
});

describe.each(served)('$method $path [$guard]', (route) => {
  const op = operations.get(key(route.method, route.path))!;

  if (route.guard === 'public') {
    it('needs no credentials', async () => {
      const res = await probe(route);
      expect(res.status).not.toBe(401);
      expect(res.status).toBeLessThan(500);
      expect(op.security ?? []).toEqual([]);
    });
    return;
  }

  it('answers 401 without a token, in the error shape', async () => {
    const res = await probe(route);
    expect(res.status).toBe(401);
    expect(res.body).toMatchObject({ code: 'UNAUTHORIZED', message: expect.any(String) });
    expect(op.security?.length).toBeGreaterThan(0);
  });

  if (!PENDING_ALLOWED.has(`${route.method} ${route.path}`))
    it('refuses a user who must change a temporary password', async () => {
      const res = await probe(route, temporary.token);
      expect(res.status).toBe(403);
      expect(res.body.reason).toBe('PASSWORD_CHANGE_REQUIRED');
    });

  if (route.guard === 'super_admin') {
    it('refuses an organization admin with 403', async () => {
      const res = await probe(route, tenant.admin.token);
      expect(res.status).toBe(403);
      expect(res.body.code).toBe('FORBIDDEN');
    });
    it('lets the super admin past the guard', async () => {
      const res = await probe(route, superAdmin);
      expect([401, 403]).not.toContain(res.status);
      expect(res.status).toBeLessThan(500);
    });
  } else if (isPermission(route.guard)) {
    const permission = route.guard;
    it('refuses a member whose roles grant nothing with 403', async () => {
      const res = await probe(route, nobody.token);
      expect(res.status).toBe(403);
      expect(res.body.code).toBe('FORBIDDEN');
    });
    it(`lets a member holding only ${permission} past the guard`, async () => {
      const res = await probe(route, holders.get(permission)!.token);
      expect([401, 403]).not.toContain(res.status);
      expect(res.status).toBeLessThan(500);
    });
  }
});

if (pending.length)
  describe.each(pending)('$method $path [$guard]', (route) => {
    it.todo(`pending: ${route.area} has not served ${route.method} ${route.path} yet`);
  });
