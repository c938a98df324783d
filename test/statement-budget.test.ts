import { AsyncLocalStorage } from 'node:async_hooks';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, superAdminToken, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

/**
 * Each route's SQL statements on the control-plane database (every statement MikroORM sends for it,
 * the row-level-security setting included; a warehouse's own statements go through its own driver and
 * are not counted) on a small and on a larger data set of one organization: the count may not grow
 * with the rows (no N+1), and may not pass the budget recorded in fixtures/statement-budgets.json.
 * Only the statements of the counted request are counted: each request the server takes while
 * counting runs in an async context of its own, which the statements it sends carry; background work
 * of the server (the job queue's polling, scheduled monitoring runs) has none. Each count is still the
 * fewest of three calls.
 *
 * The data set: a workspace with a source and a target warehouse (a scratch database on the test
 * server), a target schema of 15 tables, mapped tables, saved queries, workspaces, users, audiences
 * with exports, service accounts and hypotheses — 2 of each kind that grows, then 14.
 *
 * Counted: every GET route of routes.tsv but those in EXCLUDED (with the reason), and the main writes.
 * Not counted: the other writes (deletes, job-starting and warehouse-writing routes, discovery streams).
 */
const budgets: Record<string, number> = JSON.parse(
  readFileSync(new URL('./fixtures/statement-budgets.json', import.meta.url), 'utf8'),
);

const warehouse = scratchDatabase('budget');
const TABLES = Array.from({ length: 14 }, (_, i) => `t${String(i + 1).padStart(2, '0')}`);

let server: TestServer;
let tenant: Tenant;
let superAdmin: string;
let counting = false;
let statements = 0;
/** Set for the requests taken while counting: their statements are the ones counted. */
const counted = new AsyncLocalStorage<true>();
const ids: Record<string, string> = {};
let grown = 0;

/** GET routes of routes.tsv that are not counted, and why. */
const EXCLUDED: Record<string, string> = {
  'GET /api/auth/admin/logs/download': "a download of the server's log file, not a database read",
  'GET /api/workspaces/{workspace_name}/download': 'a zip download; this test reads JSON answers',
  'GET /api/analytics/results/mining/{hypothesis_id}': 'answers only once a hypothesis test (a job) has run',
};

type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
interface Route {
  method: Method;
  path: () => string;
  body?: () => unknown;
  /** The caller: the organization's admin unless said otherwise. */
  superAdmin?: boolean;
}

const get = (path: () => string, superAdmin = false): Route => ({ method: 'GET', path, superAdmin });

const routes: Record<string, Route> = {
  // auth
  'GET /api/auth/organizations': get(() => '/api/auth/organizations'),
  'GET /api/auth/session': get(() => '/api/auth/session'),
  'GET /api/auth/sessions': get(() => '/api/auth/sessions'),
  'GET /api/auth/preferences': get(() => '/api/auth/preferences'),
  'GET /api/auth/admin/organizations': get(() => '/api/auth/admin/organizations', true),
  'GET /api/auth/admin/users': get(() => '/api/auth/admin/users', true),
  'GET /api/auth/admin/organizations/{org_id}/workspaces': get(
    () => `/api/auth/admin/organizations/${tenant.organization.id}/workspaces`,
    true,
  ),
  // workspaces
  'GET /api/workspaces': get(() => '/api/workspaces'),
  'GET /api/workspaces/current': get(() => '/api/workspaces/current'),
  'GET /api/workspaces/admin-settings': get(() => '/api/workspaces/admin-settings'),
  'GET /api/workspaces/user-preferences': get(() => '/api/workspaces/user-preferences'),
  'GET /api/workspaces/global-settings': get(() => '/api/workspaces/global-settings'),
  'GET /api/workspaces/source-config': get(() => '/api/workspaces/source-config'),
  'GET /api/workspaces/target-schema/check': get(() => '/api/workspaces/target-schema/check'),
  'GET /api/workspaces/target-schema/content': get(() => '/api/workspaces/target-schema/content'),
  'GET /api/workspaces/target-schema/available': get(() => '/api/workspaces/target-schema/available'),
  'GET /api/workspaces/workflow-status': get(() => '/api/workspaces/workflow-status'),
  'GET /api/workspaces/{workspace_name}/workflow/state': get(
    () => `/api/workspaces/${ids.workspace}/workflow/state`,
  ),
  'GET /api/workspaces/{workspace_name}/config': get(() => `/api/workspaces/${ids.workspace}/config`),
  'GET /api/workspaces/metrics': get(() => '/api/workspaces/metrics'),
  'GET /api/workspaces/{workspace_name}': get(() => `/api/workspaces/${ids.workspace}`),
  'GET /api/workspaces/schema': get(() => '/api/workspaces/schema'),
  'GET /api/workspaces/{workspace_name}/system-prompt': get(
    () => `/api/workspaces/${ids.workspace}/system-prompt`,
  ),
  'GET /api/workspaces/{workspace_name}/prompt': get(() => `/api/workspaces/${ids.workspace}/prompt`),
  'GET /api/workspaces/{workspace}/database/check': get(
    () => `/api/workspaces/${ids.workspace}/database/check`,
  ),
  'GET /api/workspaces/{workspace_name}/git-diff': get(() => `/api/workspaces/${ids.workspace}/git-diff`),
  'POST /api/workspaces/select': {
    method: 'POST',
    path: () => '/api/workspaces/select',
    body: () => ({ workspace_name: ids.workspace }),
  },
  'POST /api/workspaces/{workspace_name}/workflow/complete': {
    method: 'POST',
    path: () => `/api/workspaces/${ids.workspace}/workflow/complete`,
    body: () => ({ task_data: { task: 'connect_source' } }),
  },
  // schemas
  'GET /api/api/schema/config/summary': get(() => '/api/api/schema/config/summary'),
  'GET /api/api/schema/config/tables/{table_name}/monitoring': get(
    () => '/api/api/schema/config/tables/customers/monitoring',
  ),
  'GET /api/api/schema/config/columns/{table_name}/{column_name}/test': get(
    () => '/api/api/schema/config/columns/customers/email/test',
  ),
  'GET /api/api/schema/config/columns/{table_name}/{column_name}/monitoring': get(
    () => '/api/api/schema/config/columns/customers/email/monitoring',
  ),
  'GET /api/schemas': get(() => '/api/schemas'),
  'GET /api/schemas/workspace': get(() => '/api/schemas/workspace'),
  'GET /api/schemas/workspace/sync/status': get(() => '/api/schemas/workspace/sync/status'),
  'GET /api/schemas/templates': get(() => '/api/schemas/templates'),
  'GET /api/schemas/templates/{template_name}': get(() => '/api/schemas/templates/customer-360'),
  'GET /api/schemas/workspace/ddl': get(() => '/api/schemas/workspace/ddl'),
  'GET /api/schemas/workspace/connections': get(() => '/api/schemas/workspace/connections'),
  // admin
  'GET /api/admin/llm-parameters': get(() => '/api/admin/llm-parameters'),
  'GET /api/admin/cache-settings': get(() => '/api/admin/cache-settings'),
  'GET /api/admin/feature-settings': get(() => '/api/admin/feature-settings'),
  'GET /api/admin/user-feature-access': get(() => '/api/admin/user-feature-access'),
  'GET /api/admin/user-feature-overrides': get(() => '/api/admin/user-feature-overrides'),
  'GET /api/admin/vcs-config': get(() => '/api/admin/vcs-config'),
  'GET /api/admin/users': get(() => '/api/admin/users'),
  'GET /api/admin/roles': get(() => '/api/admin/roles'),
  'GET /api/admin/permissions': get(() => '/api/admin/permissions'),
  'GET /api/admin/get-llm-mode': get(() => '/api/admin/get-llm-mode'),
  'GET /api/admin/system-info': get(() => '/api/admin/system-info', true),
  // audiences
  'GET /api/api/audiences': get(() => '/api/api/audiences'),
  'GET /api/api/audiences/dashboard': get(() => '/api/api/audiences/dashboard'),
  'GET /api/api/audiences/performance-metrics': get(() => '/api/api/audiences/performance-metrics'),
  'GET /api/api/audiences/{audience_id}': get(() => `/api/api/audiences/${ids.audience}`),
  'GET /api/api/audiences/{audience_id}/exports': get(() => `/api/api/audiences/${ids.audience}/exports`),
  'GET /api/api/audiences/{audience_id}/performance-summary': get(
    () => `/api/api/audiences/${ids.audience}/performance-summary`,
  ),
  'GET /api/api/audiences/{audience_id}/exports/{export_id}/preview': get(
    () => `/api/api/audiences/${ids.audience}/exports/${ids.export}/preview`,
  ),
  'GET /api/api/audiences/{audience_id}/size': get(() => `/api/api/audiences/${ids.audience}/size`),
  'POST /api/api/audiences': {
    method: 'POST',
    path: () => '/api/api/audiences',
    body: () => ({
      name: unique('a'),
      target_table: 'customers',
      definition: { type: 'rules', rules: { all: [{ field: 'country', op: '=', value: 'DE' }] } },
    }),
  },
  'POST /api/api/audiences/performance-metrics': {
    method: 'POST',
    path: () => '/api/api/audiences/performance-metrics',
    body: () => ({
      audience_segment_id: ids.audience,
      ad_platform: 'google',
      campaign_id: unique('c'),
      date: '2026-01-01',
      impressions: 1000,
      clicks: 25,
      spend: 12.5,
      conversions: 2,
      revenue: 80,
    }),
  },
  'PUT /api/api/audiences/{audience_id}': {
    method: 'PUT',
    path: () => `/api/api/audiences/${ids.audience}`,
    body: () => ({ description: unique('d') }),
  },
  // service accounts
  'GET /api/api/service-accounts': get(() => '/api/api/service-accounts'),
  'GET /api/api/service-accounts/{account_id}': get(() => `/api/api/service-accounts/${ids.account}`),
  'GET /api/api/service-accounts/{account_id}/api-key-info': get(
    () => `/api/api/service-accounts/${ids.account}/api-key-info`,
  ),
  'PATCH /api/api/service-accounts/{account_id}': {
    method: 'PATCH',
    path: () => `/api/api/service-accounts/${ids.account}`,
    body: () => ({ description: unique('d') }),
  },
  // saved queries
  'GET /api/queries': get(() => '/api/queries'),
  'GET /api/queries/{query_id}': get(() => `/api/queries/${ids.query}`),
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
  // mappings
  'GET /api/mappings': get(() => '/api/mappings'),
  'GET /api/mappings/{table_name}': get(() => '/api/mappings/customers'),
  'GET /api/mappings/{table_name}/transform-code': get(() => '/api/mappings/customers/transform-code'),
  'GET /api/mappings/{table_name}/field-transform/{target_field}': get(
    () => '/api/mappings/customers/field-transform/email',
  ),
  'GET /api/mappings/{table_name}/tables': get(() => '/api/mappings/customers/tables'),
  'GET /api/mappings/{table_name}/wildcard/effective': get(
    () => '/api/mappings/customers/wildcard/effective',
  ),
  'POST /api/mappings/{table_name}/connection': {
    method: 'POST',
    path: () => '/api/mappings/customers/connection',
    body: () => ({ connection: { source_field: 'customers.country', target_field: 'country' } }),
  },
  'POST /api/mappings/{table_name}/transformation': {
    method: 'POST',
    path: () => '/api/mappings/customers/transformation',
    body: () => ({ transformation: { target_field: 'email', expression: 'lower(customers.email)' } }),
  },
  // analytics
  'GET /api/analytics/hypotheses/{hypothesis_id}': get(() => `/api/analytics/hypotheses/${ids.hypothesis}`),
  'GET /api/analytics/status/{hypothesis_id}': get(() => `/api/analytics/status/${ids.hypothesis}`),
  'GET /api/analytics/insights/performance': get(() => '/api/analytics/insights/performance'),
  'GET /api/analytics/budget/status': get(() => '/api/analytics/budget/status'),
  // pipelines
  'GET /api/pipelines/status': get(() => '/api/pipelines/status'),
  'GET /api/pipelines/drift-status': get(() => '/api/pipelines/drift-status'),
  'GET /api/pipelines/model/{table_name}': get(() => '/api/pipelines/model/customers'),
  // sources (the warehouse is read through its own driver; the control plane only for the workspace)
  'GET /api/sources/unified-schema': get(() => '/api/sources/unified-schema'),
  'GET /api/sources/source-schema': get(() => '/api/sources/source-schema'),
  'GET /api/sources/sample-values/{table_name}/{column_name}': get(
    () => '/api/sources/sample-values/customers/country',
  ),
  // monitoring and alerts
  'GET /api/monitoring/metrics/datasource/{config_name}': get(
    () => '/api/monitoring/metrics/datasource/source',
  ),
  'GET /api/monitoring/metrics/workspace': get(() => '/api/monitoring/metrics/workspace'),
  'GET /api/monitoring/identity-graph/workspace': get(() => '/api/monitoring/identity-graph/workspace'),
  'GET /api/api/alerts/active': get(() => `/api/api/alerts/active?workspace=${ids.workspace}`),
};

async function count(route: Route): Promise<number> {
  let fewest = Infinity;
  for (let i = 0; i < 3; i++) {
    const body = route.body?.();
    const path = route.path();
    statements = 0;
    counting = true;
    const res = await call(server, route.method, path, {
      token: route.superAdmin ? superAdmin : tenant.admin.token,
      body,
    });
    counting = false;
    expect(res.status, `${route.method} ${path}: ${JSON.stringify(res.body)}`).toBe(200);
    fewest = Math.min(fewest, statements);
  }
  return fewest;
}

async function ok(method: Method, path: string, body?: unknown) {
  const res = await call(server, method, path, { token: tenant.admin.token, body });
  expect(res.status, `${method} ${path}: ${JSON.stringify(res.body)}`).toBe(200);
  return res.body;
}

/** Adds rows of each kind the routes list, up to `n` of each. */
async function grow(n: number) {
  for (; grown < n; grown++) {
    const i = grown;
    const q = await ok('POST', '/api/queries', {
      name: unique('q'),
      sql: 'select 1',
      visibility: i % 2 ? 'shared' : 'private',
    });
    ids.query ??= q.id;
    await ok('POST', '/api/workspaces/create', { name: unique('w'), select: false });
    await tenant.addUser(['viewer']);
    const audience = await ok('POST', '/api/api/audiences', {
      name: unique('a'),
      target_table: 'customers',
      definition: { type: 'rules', rules: { all: [{ field: 'age', op: '>=', value: 20 + i }] } },
    });
    if (!ids.audience) {
      // Exports need a materialized audience: the first one is materialized (a job) and waited for.
      ids.audience = audience.id as string;
      const run = await ok('POST', `/api/api/audiences/${ids.audience}/materialize`);
      await until(
        'the audience materialized',
        async () => (await ok('GET', `/api/api/audiences/${ids.audience}`)).materialization,
        (m) => m.run_id === run.run_id && ['succeeded', 'failed'].includes(m.status),
      );
    }
    const exported = await ok('POST', '/api/api/audiences/exports', {
      audience_id: ids.audience,
      destination: { type: 'csv' },
      run_now: false,
    });
    ids.export ??= exported.export.id;
    const account = await ok('POST', '/api/api/service-accounts', { name: unique('sa') });
    ids.account ??= account.service_account.id;
    const hypothesis = await ok('POST', '/api/analytics/hypotheses', {
      statement: `German customers are older (${i})`,
      table: 'customers',
      metric: { expression: 'age' },
      segment: { column: 'country', groups: ['DE', 'FR'] },
    });
    ids.hypothesis ??= hypothesis.id;
    // One more mapped table: the mapping list and everything that reads every mapping grow with it.
    await ok('POST', `/api/mappings/${TABLES[i]}/tables`, {
      source_table: 'shop.customers',
      relationship: 'primary',
    });
    await ok('POST', `/api/mappings/${TABLES[i]}/connection`, {
      connection: { source_field: 'customers.customer_id', target_field: 'id' },
    });
  }
}

const column = (name: string, type: string, nullable = true) => ({ name, type, nullable });

describe('statement budget per route', () => {
  beforeAll(async () => {
    await warehouse.create();
    await warehouse.sql(`create schema shop; create schema analytics;
      create table shop.customers (customer_id integer primary key, email text, country text, age integer);
      insert into shop.customers select g, 'c' || g || '@example.com', (array['DE', 'FR'])[1 + g % 2], 20 + g % 50
        from generate_series(1, 200) g;
      create table analytics.customers as select * from shop.customers;
      alter table analytics.customers add primary key (customer_id);`);
    server = await startTestServer();
    // Runs first, synchronously in the emit of 'request', so the app's handler and everything it
    // awaits run in the store entered here.
    server.server.prependListener('request', () => {
      if (counting) counted.enterWith(true);
    });
    const onQuery = server.deps.orm.config.get('onQuery');
    server.deps.orm.config.set('onQuery', (sql: string, params: readonly unknown[]) => {
      if (counting && counted.getStore()) statements++;
      return onQuery(sql, params);
    });
    [tenant, superAdmin] = await Promise.all([createTenant(server), superAdminToken(server)]);
    const config = (schemas: string[]) => pgConfig(warehouse.name, { schemas });
    ids.workspace = unique('w');
    await ok('POST', '/api/workspaces/create', {
      name: ids.workspace,
      select: true,
      source_config: config(['shop']),
      target_config: config(['analytics']),
    });
    await ok('POST', `/api/workspaces/${ids.workspace}/config`, {
      target_schema: {
        name: 'budget',
        version: '1.0.0',
        tables: [
          {
            name: 'customers',
            primary_key: ['customer_id'],
            columns: [
              column('customer_id', 'integer', false),
              column('email', 'text'),
              column('country', 'text'),
              column('age', 'integer'),
            ],
          },
          ...TABLES.map((name) => ({ name, primary_key: ['id'], columns: [column('id', 'integer', false)] })),
        ],
      },
    });
    await ok('POST', '/api/mappings/customers/tables', {
      source_table: 'shop.customers',
      relationship: 'primary',
    });
    for (const field of ['customer_id', 'email', 'country', 'age'])
      await ok('POST', '/api/mappings/customers/connection', {
        connection: { source_field: `customers.${field}`, target_field: field },
      });
    await ok('POST', '/api/mappings/customers/commit-transformation', { message: 'budget' });
    await ok('POST', '/api/pipelines/generate-project', {});
  }, 120_000);
  afterAll(async () => {
    await server?.close();
    await warehouse.drop();
  });

  it('every route listed has a budget, and every budget a route', () => {
    expect(Object.keys(routes).sort()).toEqual(Object.keys(budgets).sort());
  });

  it('counts every GET route of routes.tsv, or says why not', () => {
    const table = readFileSync(new URL('./contract/routes.tsv', import.meta.url), 'utf8');
    const gets = table
      .split('\n')
      .slice(1)
      .map((line) => line.split('\t'))
      .filter((cells) => cells[1] === 'GET')
      .map((cells) => `GET ${cells[2]}`);
    expect(gets.filter((route) => !routes[route] && !EXCLUDED[route])).toEqual([]);
    expect(Object.keys(EXCLUDED).filter((route) => !gets.includes(route))).toEqual([]);
  });

  it('no route sends more statements with more rows, nor more than its budget', async () => {
    await grow(2);
    const small: Record<string, number> = {};
    for (const [label, route] of Object.entries(routes)) small[label] = await count(route);
    await grow(14);
    const large: Record<string, number> = {};
    for (const [label, route] of Object.entries(routes)) large[label] = await count(route);
    console.log(
      Object.keys(routes)
        .map((l) => `${l.padEnd(72)} ${small[l]} → ${large[l]} statements (budget ${budgets[l]})`)
        .join('\n'),
    );
    expect(large, 'statements with 14 rows of each kind').toEqual(small);
    for (const label of Object.keys(routes)) {
      expect(large[label], label).toBeLessThanOrEqual(budgets[label]);
      // Every route reads the session at least: none counted would mean the counting saw nothing.
      expect(large[label], label).toBeGreaterThan(0);
    }
  }, 600_000);
});
