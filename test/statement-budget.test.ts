import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, unique, type Tenant } from './helpers/api.ts';

/**
 * Each route's SQL statements (every statement MikroORM sends for it, the row-level-security setting
 * included) counted on a small and on a larger data set of one organization: the count may not grow
 * with the rows (no N+1), and may not pass the budget recorded in fixtures/statement-budgets.json.
 * Background work of the server (the job queue's polling) can add a statement to one call, so each
 * count is the fewest of three calls.
 */
const budgets: Record<string, number> = JSON.parse(
  readFileSync(new URL('./fixtures/statement-budgets.json', import.meta.url), 'utf8'),
);

let server: TestServer;
let tenant: Tenant;
let counting = false;
let statements = 0;
const ids: { query?: string; user?: string; audience?: string; workspace?: string } = {};

interface Route {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  path: () => string;
  body?: () => unknown;
}

const routes: Record<string, Route> = {
  'GET /api/auth/session': { method: 'GET', path: () => '/api/auth/session' },
  'GET /api/workspaces': { method: 'GET', path: () => '/api/workspaces' },
  'GET /api/workspaces/current': { method: 'GET', path: () => '/api/workspaces/current' },
  'GET /api/queries': { method: 'GET', path: () => '/api/queries' },
  'GET /api/queries/{query_id}': { method: 'GET', path: () => `/api/queries/${ids.query}` },
  'POST /api/queries': {
    method: 'POST',
    path: () => '/api/queries',
    body: () => ({ name: unique('q'), sql: 'select 1' }),
  },
  'PUT /api/queries/{query_id}': {
    method: 'PUT',
    path: () => `/api/queries/${ids.query}`,
    body: () => ({ description: unique('d') }),
  },
  'GET /api/admin/users': { method: 'GET', path: () => '/api/admin/users' },
  'GET /api/admin/roles': { method: 'GET', path: () => '/api/admin/roles' },
  'GET /api/api/audiences': { method: 'GET', path: () => '/api/api/audiences' },
  'GET /api/api/audiences/dashboard': { method: 'GET', path: () => '/api/api/audiences/dashboard' },
};

async function count(route: Route): Promise<number> {
  let fewest = Infinity;
  for (let i = 0; i < 3; i++) {
    statements = 0;
    counting = true;
    const res = await call(server, route.method, route.path(), {
      token: tenant.admin.token,
      body: route.body?.(),
    });
    counting = false;
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    fewest = Math.min(fewest, statements);
  }
  return fewest;
}

/** Adds `n` rows of each kind the routes list. */
async function grow(n: number) {
  for (let i = 0; i < n; i++) {
    const q = await call(server, 'POST', '/api/queries', {
      token: tenant.admin.token,
      body: { name: unique('q'), sql: 'select 1', visibility: i % 2 ? 'shared' : 'private' },
    });
    ids.query ??= q.body.id;
    await call(server, 'POST', '/api/workspaces/create', {
      token: tenant.admin.token,
      body: { name: unique('w') },
    });
    await tenant.addUser(['viewer']);
  }
}

describe('statement budget per route', () => {
  beforeAll(async () => {
    server = await startTestServer();
    const onQuery = server.deps.orm.config.get('onQuery');
    server.deps.orm.config.set('onQuery', (sql: string, params: readonly unknown[]) => {
      if (counting) statements++;
      return onQuery(sql, params);
    });
    tenant = await createTenant(server);
    const ws = await call(server, 'POST', '/api/workspaces/create', {
      token: tenant.admin.token,
      body: { name: unique('w'), select: true },
    });
    expect(ws.status).toBe(200);
  }, 60_000);
  afterAll(() => server?.close());

  it('every route listed has a budget, and every budget a route', () => {
    expect(Object.keys(routes).sort()).toEqual(Object.keys(budgets).sort());
  });

  it('no route sends more statements with more rows, nor more than its budget', async () => {
    await grow(2);
    const small: Record<string, number> = {};
    for (const [label, route] of Object.entries(routes)) small[label] = await count(route);
    await grow(12);
    const large: Record<string, number> = {};
    for (const [label, route] of Object.entries(routes)) large[label] = await count(route);
    console.log(
      Object.keys(routes)
        .map((l) => `${l.padEnd(36)} ${small[l]} → ${large[l]} statements (budget ${budgets[l]})`)
        .join('\n'),
    );
    expect(large, 'statements with 14 rows of each kind').toEqual(small);
    for (const label of Object.keys(routes)) expect(large[label], label).toBeLessThanOrEqual(budgets[label]);
  }, 180_000);
});
