import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  call,
  createTenant,
  createWorkspace,
  superAdminToken,
  unique,
  until,
  type Tenant,
  type TestUser,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import type { EntityManager } from '@mikro-orm/postgresql';
import { enqueueMonitoringRun } from '../src/modules/monitoring/monitoring.jobs.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';
import { SavedQuery } from '../src/modules/queries/queries.entity.ts';
import { createContextFactory } from '../src/trpc/context.ts';
import { createCallerFactory } from '../src/trpc/procedures.ts';
import { tenantSession } from '../src/auth/tenancy.ts';
import { appRouter } from '../src/trpc/router.ts';

/**
 * Two organizations with the same shapes of data; every id-taking route called as B's admin with
 * A's identifiers answers 404 (403 where the guard refuses first) and never carries A's data.
 * The target warehouse is a scratch database on 127.0.0.1:5432, created here and dropped at the end.
 */
const warehouse = scratchDatabase('iso');

const targetSchema = {
  name: 'crm',
  version: '1.0.0',
  tables: [
    {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false },
        { name: 'email', type: 'text' },
        { name: 'country', type: 'text' },
        { name: 'plan', type: 'text' },
        { name: 'spend', type: 'numeric' },
      ],
    },
  ],
};

interface Shapes {
  tenant: Tenant;
  workspace: string;
  user: TestUser;
  role_id: number;
  role_name: string;
  query_id: string;
  query_name: string;
  account_id: string;
  account_name: string;
  audience_id: string;
  audience_name: string;
  export_id: string;
  hypothesis_id: string;
  hypothesis_statement: string;
  alert_id: string;
  insight_id: string;
}

let server: TestServer;
let a: Shapes;
let b: Shapes;

async function ok(res: { status: number; body: any }) {
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

/** One organization with a workspace, a user, a role, a saved query, a service account, an audience, an export and a hypothesis. */
async function build(): Promise<Shapes> {
  const tenant = await createTenant(server);
  const token = tenant.admin.token;
  const as = (method: string, path: string, body?: unknown) => call(server, method, path, { token, body });
  const workspace = await createWorkspace(server, token, {
    name: unique('iso'),
    target_config: pgConfig(warehouse.name, { schemas: ['crm'] }),
    target_schema: targetSchema,
  });
  const user = await tenant.addUser(['viewer']);
  const role_name = unique('role');
  const role = await ok(
    await as('POST', '/api/admin/roles', { name: role_name, permissions: ['workspace.read'] }),
  );
  const query_name = unique('query');
  const query = await ok(
    await as('POST', '/api/queries', {
      name: query_name,
      sql: 'select customer_id from crm.customers',
      schema_identifier: 'crm',
    }),
  );
  const account_name = unique('sa');
  const account = await ok(
    await as('POST', '/api/api/service-accounts', { name: account_name, roles: ['viewer'] }),
  );
  const audience_name = unique('aud');
  const audience = await ok(
    await as('POST', '/api/api/audiences', {
      name: audience_name,
      target_table: 'customers',
      definition: { type: 'rules', rules: { all: [{ field: 'country', op: '=', value: 'US' }] } },
      attribute_columns: ['email'],
    }),
  );
  const audience_id = audience.id ?? audience.audience?.id;
  const run = await ok(await as('POST', `/api/api/audiences/${audience_id}/materialize`));
  const materialized = await until(
    'materialization',
    async () => (await ok(await as('GET', `/api/api/audiences/${audience_id}`))).materialization,
    (m) => m.run_id === run.run_id && ['succeeded', 'failed'].includes(m.status),
  );
  expect(materialized.status).toBe('succeeded');
  const exported = await ok(
    await as('POST', '/api/api/audiences/exports', {
      audience_id,
      name: unique('export'),
      destination: { type: 'csv' },
      field_mapping: [{ source: 'customer_id', destination: 'id' }],
    }),
  );
  const hypothesis_statement = `${unique('h')}: pro customers spend more than basic ones`;
  const hypothesis = await ok(
    await as('POST', '/api/analytics/hypotheses', {
      statement: hypothesis_statement,
      table: 'customers',
      metric: { expression: 'spend' },
      segment: { column: 'plan', groups: ['pro', 'basic'] },
      test: 'welch_t',
      alpha: 0.05,
      minimum_detectable_effect: 0.2,
    }),
  );
  // An insight needs a significant, tested hypothesis (pro customers spend far more in the warehouse).
  const started = await ok(
    await as('POST', '/api/analytics/hypotheses/test', { hypothesis_id: hypothesis.id }),
  );
  await until(
    'hypothesis test',
    async () => ok(await as('GET', `/api/analytics/status/${hypothesis.id}`)),
    (status) => status.run?.id === started.run_id && ['succeeded', 'failed'].includes(status.run.status),
  );
  const insight = await ok(await as('POST', '/api/analytics/insights', { hypothesis_id: hypothesis.id }));
  // An alert: a null-rate threshold the warehouse's e-mails cross, measured by one monitoring run.
  await ok(
    await as('PUT', '/api/api/schema/config/columns/customers/email/monitoring', {
      config: { null_rate: { max: 0.1 }, severity: 'warning' },
    }),
  );
  const em = server.deps.orm.em.fork() as EntityManager;
  const workspaceId = (
    await em.findOneOrFail(Workspace, { name: workspace, organization: tenant.organization.id })
  ).id;
  const queued = await enqueueMonitoringRun(server.deps, {
    organizationId: tenant.organization.id,
    workspaceId,
    reason: 'on_demand',
  });
  await until(
    'monitoring run',
    () => server.deps.jobs.getRun(queued.run_id, tenant.organization.id),
    (job) => !!job && ['succeeded', 'failed', 'cancelled'].includes(job.status),
  );
  const alerts = await ok(
    await call(server, 'GET', '/api/api/alerts/active', { token, query: { workspace } }),
  );
  expect(alerts.alerts.length).toBeGreaterThan(0);
  return {
    tenant,
    alert_id: alerts.alerts[0].id,
    insight_id: insight.id,
    workspace,
    user,
    role_id: role.id ?? role.role?.id,
    role_name,
    query_id: query.id ?? query.query?.id,
    query_name,
    account_id: account.service_account.id,
    account_name,
    audience_id,
    audience_name,
    export_id: exported.export.id,
    hypothesis_id: hypothesis.id,
    hypothesis_statement,
  };
}

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema crm`);
  await warehouse.sql(`create table crm.customers (customer_id integer primary key, email text, country text, plan text, spend numeric);
     insert into crm.customers select i, case when i % 4 = 0 then null else 'user' || i || '@example.com' end, case when i % 2 = 0 then 'US' else 'DE' end,
       case when i % 3 = 0 then 'pro' else 'basic' end, case when i % 3 = 0 then 1000 + i else i end from generate_series(1, 200) i`);
  server = await startTestServer();
  a = await build();
  b = await build();
}, 120_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop().catch(() => undefined);
});

/** Every id-taking route with A's identifiers, and a body that passes validation. */
function routesWithIdsOf(x: Shapes): [string, string, unknown?][] {
  const ws = x.workspace;
  const org = x.tenant.organization.id;
  const SA = `/api/api/service-accounts/${x.account_id}`;
  const AUD = `/api/api/audiences/${x.audience_id}`;
  return [
    // super_admin routes: B's admin is refused before any lookup.
    ['GET', `/api/auth/admin/organizations/${org}/workspaces`],
    ['PUT', `/api/auth/admin/organizations/${org}`, { name: 'stolen' }],
    ['DELETE', `/api/auth/admin/organizations/${org}`],
    ['DELETE', `/api/auth/admin/workspaces/${org}/${ws}`],
    ['PUT', `/api/auth/admin/users/${x.user.id}`, { is_active: false }],
    ['DELETE', `/api/auth/admin/users/${x.user.id}`],
    ['PUT', `/api/admin/users/${x.user.id}/password`, { password: 'Stolen-password-1' }],
    // workspaces by name
    ['GET', `/api/workspaces/${ws}`],
    ['PUT', `/api/workspaces/${ws}`, { description: 'stolen' }],
    ['GET', `/api/workspaces/${ws}/config`],
    ['POST', `/api/workspaces/${ws}/config`, { settings: { sample_size: 1 } }],
    ['GET', `/api/workspaces/${ws}/workflow/state`],
    ['POST', `/api/workspaces/${ws}/workflow/complete`, { task_data: { task: 'review_mappings' } }],
    ['POST', `/api/workspaces/${ws}/workflow/incomplete`, { task_data: { task: 'review_mappings' } }],
    ['GET', `/api/workspaces/${ws}/database/check`],
    ['POST', `/api/workspaces/${ws}/database/test`],
    ['POST', `/api/workspaces/${ws}/database/catalogs`],
    ['GET', `/api/workspaces/${ws}/system-prompt`],
    ['PUT', `/api/workspaces/${ws}/system-prompt`, { prompt: 'stolen' }],
    ['POST', `/api/workspaces/${ws}/system-prompt/clone`],
    ['DELETE', `/api/workspaces/${ws}/system-prompt`],
    ['GET', `/api/workspaces/${ws}/prompt`],
    ['PUT', `/api/workspaces/${ws}/prompt`, { content: 'stolen' }],
    ['GET', `/api/workspaces/${ws}/git-diff`],
    ['GET', `/api/workspaces/${ws}/download`],
    ['POST', '/api/workspaces/select', { workspace_name: ws }],
    ['GET', `/api/workspaces/admin-settings?workspace_name=${ws}`],
    ['PUT', '/api/workspaces/admin-settings', { workspace_name: ws, reverse_etl_connections: [] }],
    ['DELETE', `/api/workspaces/admin-settings?workspace_name=${ws}`],
    ['GET', `/api/api/alerts/active?workspace=${ws}`],
    ['POST', `/api/api/alerts/${x.alert_id}/dismiss`, { reason: 'stolen' }],
    ['DELETE', `/api/workspaces/${ws}`],
    // organization administration
    ['PUT', `/api/admin/users/${x.user.id}`, { is_active: false }],
    ['PUT', `/api/admin/users/${x.user.id}/roles`, { roles: ['admin'] }],
    ['DELETE', `/api/admin/users/${x.user.id}`],
    ['PUT', `/api/admin/roles/${x.role_id}`, { description: 'stolen' }],
    ['PUT', `/api/admin/roles/${x.role_id}/permissions`, { permissions: ['org.admin'] }],
    ['DELETE', `/api/admin/roles/${x.role_id}`],
    // service accounts
    ['GET', SA],
    ['PATCH', SA, { name: 'stolen' }],
    ['GET', `${SA}/api-key-info`],
    ['POST', `${SA}/rotate-key`, {}],
    ['DELETE', SA],
    // saved queries
    ['GET', `/api/queries/${x.query_id}`],
    ['PUT', `/api/queries/${x.query_id}`, { name: 'stolen' }],
    ['DELETE', `/api/queries/${x.query_id}`],
    // audiences and their exports
    ['GET', AUD],
    ['PUT', AUD, { name: 'stolen' }],
    ['POST', `${AUD}/materialize`],
    ['GET', `${AUD}/exports`],
    ['GET', `${AUD}/exports/${x.export_id}/preview`],
    ['GET', `${AUD}/performance-summary`],
    ['GET', `${AUD}/size`],
    ['PUT', `/api/api/audiences/exports/${x.export_id}`, { name: 'stolen' }],
    ['GET', `/api/api/audiences/exports/${x.export_id}/download`],
    [
      'POST',
      '/api/api/audiences/exports',
      {
        audience_id: x.audience_id,
        name: 'stolen',
        destination: { type: 'csv' },
        field_mapping: [{ source: 'customer_id', destination: 'id' }],
      },
    ],
    ['DELETE', AUD],
    // hypotheses
    ['GET', `/api/analytics/hypotheses/${x.hypothesis_id}`],
    ['GET', `/api/analytics/status/${x.hypothesis_id}`],
    ['GET', `/api/analytics/results/mining/${x.hypothesis_id}`],
    ['POST', '/api/analytics/hypotheses/test', { hypothesis_id: x.hypothesis_id }],
    ['POST', '/api/analytics/insights', { hypothesis_id: x.hypothesis_id }],
    ['PUT', `/api/analytics/insights/${x.insight_id}/performance`, { metrics: { ctr: 0.5 } }],
  ];
}

/** Everything that names A's data; none of it may reach B. */
function identifiersOf(x: Shapes): string[] {
  return [
    x.tenant.organization.id,
    x.tenant.organization.domain,
    x.tenant.admin.id,
    x.tenant.admin.username,
    x.user.id,
    x.user.username,
    x.role_name,
    x.query_id,
    x.query_name,
    x.account_id,
    x.account_name,
    x.audience_id,
    x.audience_name,
    x.export_id,
    x.hypothesis_id,
    x.hypothesis_statement,
    x.alert_id,
    x.insight_id,
  ];
}

describe('tenant isolation', () => {
  it('answers B with 404 (or 403) for every one of A’s identifiers, never with A’s data', async () => {
    const forbidden = identifiersOf(a);
    const failures: string[] = [];
    const routes = routesWithIdsOf(a);
    for (const [method, path, body] of routes) {
      const res = await call(server, method, path, { token: b.tenant.admin.token, body });
      const text = typeof res.body === 'string' ? res.body : JSON.stringify(res.body);
      // The workspace name is in the path; an error message may repeat what the caller sent.
      const seen = forbidden.filter((id) => text.includes(id) && !path.includes(id));
      const expected = path.startsWith('/api/auth/admin/') || path.endsWith('/password') ? [403] : [404];
      if (!expected.includes(res.status))
        failures.push(`${method} ${path} → ${res.status} ${text.slice(0, 200)}`);
      if (seen.length) failures.push(`${method} ${path} carries A's ${seen.join(', ')}`);
    }
    console.log(`called ${routes.length} id-taking routes as B with A's identifiers`);
    expect(failures).toEqual([]);
  }, 120_000);

  it('left all of A’s data in place and unchanged', async () => {
    const as = (path: string) => call(server, 'GET', path, { token: a.tenant.admin.token });
    expect((await as(`/api/workspaces/${a.workspace}`)).status).toBe(200);
    const query = await as(`/api/queries/${a.query_id}`);
    expect(query.status).toBe(200);
    expect(JSON.stringify(query.body)).toContain(a.query_name);
    const account = await as(`/api/api/service-accounts/${a.account_id}`);
    expect(account.status).toBe(200);
    expect(JSON.stringify(account.body)).toContain(a.account_name);
    const audience = await as(`/api/api/audiences/${a.audience_id}`);
    expect(audience.status).toBe(200);
    expect(JSON.stringify(audience.body)).toContain(a.audience_name);
    expect((await as(`/api/analytics/hypotheses/${a.hypothesis_id}`)).status).toBe(200);
    const alerts = await call(server, 'GET', '/api/api/alerts/active', {
      token: a.tenant.admin.token,
      query: { workspace: a.workspace },
    });
    expect(alerts.body.alerts.find((x: { id: string }) => x.id === a.alert_id)).toMatchObject({
      dismissal: null,
    });
    const users = await as('/api/admin/users');
    const user = users.body.users.find((u: { id: string }) => u.id === a.user.id);
    expect(user).toMatchObject({ is_active: true });
    expect(JSON.stringify(user)).not.toContain('"admin"');
    const roles = await as('/api/admin/roles');
    const role = roles.body.roles.find((r: { id: number }) => r.id === a.role_id);
    expect(role.permissions).toEqual(['workspace.read']);
    expect(role.description ?? '').not.toBe('stolen');
  });

  it('lists none of A’s data on any list route B can call', async () => {
    const spec = (await call(server, 'GET', '/api/openapi.json')).body;
    // The login page's organization picker is public by design: it names every organization.
    const lists = Object.entries(spec.paths as Record<string, Record<string, unknown>>)
      .filter(([path, ops]) => 'get' in ops && !path.includes('{') && path !== '/api/auth/organizations')
      .map(([path]) => path);
    expect(lists.length).toBeGreaterThan(30);
    const forbidden = identifiersOf(a);
    const failures: string[] = [];
    for (const path of lists) {
      const query = path === '/api/api/alerts/active' ? { workspace: b.workspace } : undefined;
      const res = await call(server, 'GET', path, { token: b.tenant.admin.token, query });
      const text = typeof res.body === 'string' ? res.body : JSON.stringify(res.body);
      expect(res.status, `${path}: ${text.slice(0, 200)}`).toBeLessThan(500);
      const seen = forbidden.filter((id) => text.includes(id));
      if (seen.length) failures.push(`GET ${path} carries A's ${seen.join(', ')}`);
    }
    console.log(`listed ${lists.length} routes as B: ${lists.join(' ')}`);
    expect(failures).toEqual([]);
  });

  it('gives B its own data through the same routes', async () => {
    const res = await call(server, 'GET', `/api/queries/${b.query_id}`, { token: b.tenant.admin.token });
    expect(res.status).toBe(200);
    expect(JSON.stringify(res.body)).not.toContain(a.query_name);
    const list = await call(server, 'GET', '/api/api/audiences', { token: b.tenant.admin.token });
    expect(list.status).toBe(200);
    expect(JSON.stringify(list.body)).not.toContain(a.audience_id);
  });
});

describe('row-level security (the second wall)', () => {
  /** Every table the policies cover, and the rows of A and B in each, counted as the owner (no policy applies). */
  async function tenantTables(em: EntityManager) {
    return (await em.execute(
      `select c.relname as name from pg_class c join pg_namespace n on n.oid = c.relnamespace
       where n.nspname = 'public' and c.relkind = 'r' and c.relrowsecurity order by 1`,
    )) as { name: string }[];
  }
  const asTenant = (organizationId: string) => {
    const em = server.deps.orm.em.fork() as EntityManager;
    em.setSessionContext(tenantSession(organizationId));
    return em;
  };

  it('covers every table with an organization_id, and the tables owned through a parent', async () => {
    const em = server.deps.orm.em.fork() as EntityManager;
    const withOrganization = (await em.execute(
      `select table_name as name from information_schema.columns
       where table_schema = 'public' and column_name = 'organization_id' order by 1`,
    )) as { name: string }[];
    const covered = new Set((await tenantTables(em)).map((t) => t.name));
    for (const { name } of withOrganization) expect(covered, name).toContain(name);
    for (const name of ['organizations', 'sessions', 'user_roles', 'service_account_roles'])
      expect(covered).toContain(name);
  });

  it('returns nothing of another organization to a query without a tenant filter', async () => {
    const owner = server.deps.orm.em.fork() as EntityManager;
    const em = asTenant(b.tenant.organization.id);
    let foreignRowsSeenByOwner = 0;
    for (const { name } of await tenantTables(owner)) {
      const unfiltered = `select count(*)::int as n from "${name}"`;
      const [{ n: all }] = (await owner.execute(unfiltered)) as { n: number }[];
      const [{ n: visible }] = (await em.execute(unfiltered)) as { n: number }[];
      const [{ n: own }] = (await owner.execute(
        ['organizations', 'sessions', 'user_roles', 'service_account_roles'].includes(name)
          ? `select count(*)::int as n from "${name}" t where ${ownedBy(name)}`
          : `select count(*)::int as n from "${name}" where organization_id = ?`,
        [b.tenant.organization.id],
      )) as { n: number }[];
      expect(visible, name).toBe(own);
      foreignRowsSeenByOwner += all - own;
    }
    // The owner does see A's rows (and everyone else's): the policies, not an empty table, hid them.
    expect(foreignRowsSeenByOwner).toBeGreaterThan(0);
    // Through the entity manager as well: a find without a filter.
    const queries = await em.find(SavedQuery, {});
    expect(queries.length).toBeGreaterThan(0);
    expect(queries.map((q) => q.organization.id)).toEqual(queries.map(() => b.tenant.organization.id));
    expect(queries.map((q) => q.id)).not.toContain(a.query_id);
  });

  it('refuses to write a row into another organization, and to change or delete its rows', async () => {
    const em = asTenant(b.tenant.organization.id);
    await expect(
      em.execute(
        `insert into saved_queries (id, organization_id, name, sql, owner_id, owner_name, created_at, updated_at)
         values (gen_random_uuid(), ?, 'planted', 'select 1', ?, 'x', now(), now())`,
        [a.tenant.organization.id, b.tenant.admin.id],
      ),
    ).rejects.toThrow(/row-level security/);
    const affected = async (statement: string) =>
      ((await em.execute(statement, [a.query_id], 'run')) as unknown as { affectedRows: number })
        .affectedRows;
    expect(await affected(`update saved_queries set name = 'stolen' where id = ?`)).toBe(0);
    expect(await affected(`delete from saved_queries where id = ?`)).toBe(0);
    const owner = server.deps.orm.em.fork() as EntityManager;
    const [row] = (await owner.execute(`select name from saved_queries where id = ?`, [a.query_id])) as {
      name: string;
    }[];
    expect(row.name).toBe(a.query_name);
  });

  it('is switched on by the guard for every request of an organization member, and not for a super admin', async () => {
    const contextOf = createContextFactory(server.deps, 'internal');
    const request = (token: string) =>
      ({
        headers: { authorization: `Bearer ${token}` },
        get: (h: string) => (h === 'authorization' ? `Bearer ${token}` : undefined),
        socket: {},
      }) as never;
    const member = contextOf({ req: request(b.tenant.admin.token) });
    await createCaller(member).queries.list({});
    expect(member.em.getSessionContext()).toEqual(tenantSession(b.tenant.organization.id));
    const admin = contextOf({ req: request(await superAdminToken(server)) });
    await createCaller(admin).auth.adminListOrganizations({ limit: 10, offset: 0 });
    expect(admin.em.getSessionContext()).toBeUndefined();
  });
});

const createCaller = createCallerFactory(appRouter);

function ownedBy(table: string): string {
  if (table === 'organizations') return `t.id = ?`;
  if (table === 'service_account_roles')
    return `exists (select 1 from service_accounts p where p.id = t.service_account_id and p.organization_id = ?)`;
  return `exists (select 1 from users p where p.id = t.user_id and p.organization_id = ?)`;
}
