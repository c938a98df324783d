import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import type { DiscoveryEvent } from '../src/modules/discovery/discovery.schemas.ts';

/*
 * Each setting changed through the API and its effect seen through the API (issue 21): the admin
 * settings discovery and ad-hoc queries run with, and the `mappings` and `requests` caches with their
 * switch, time to live, size and invalidation. README's "Settings and their tests" lists where every
 * other setting is shown.
 */
const warehouse = scratchDatabase('sett');

const connection = (schemas: string[]) => pgConfig(warehouse.name, { schemas });

const contacts = {
  name: 'contacts',
  primary_key: ['id'],
  columns: [
    { name: 'id', type: 'integer', nullable: false },
    { name: 'email', type: 'text' },
    { name: 'full_name', type: 'text' },
    { name: 'tier', type: 'text' },
    { name: 'city', type: 'text' },
  ],
};

let server: TestServer;

beforeAll(async () => {
  await warehouse.create();
  // 60 people; two e-mail columns, so the email field has two close candidates.
  await warehouse.sql(`create schema app; create schema mart;
    create table app.people (id integer primary key, email text, email_address text, full_name text, plan text);
    insert into app.people
      select i, 'p' || i || '@example.com', 'p' || i || '@example.org', 'Person ' || i, case when i % 2 = 0 then 'gold' else 'tin' end
      from generate_series(1, 60) i;
    create table app.accounts (id integer primary key, email text);
    insert into app.accounts select i, 'a' || i || '@example.com' from generate_series(1, 5) i;
    create table mart.scores (id integer primary key, score integer);
    insert into mart.scores select i, i * 10 from generate_series(1, 40) i;
    -- Two seconds to read (the SQL guard refuses pg_sleep in a statement, not behind a view).
    create view app.nap as select g, pg_sleep(0.5)::text as slept from generate_series(1, 4) g;
    create view mart.nap as select g, pg_sleep(0.5)::text as slept from generate_series(1, 4) g;`);
  server = await startTestServer();
});
afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

/** A selected workspace of the tenant's admin over the scratch source (app) and target (mart). */
async function workspaceOf(tenant: Tenant, settings: Record<string, unknown> = {}) {
  const token = tenant.admin.token;
  const name = await createWorkspace(server, token, {
    name: unique('sett'),
    source_config: connection(['app']),
    target_config: connection(['mart']),
    target_schema: { name: 'crm', tables: [contacts] },
  });
  if (Object.keys(settings).length) {
    const saved = await call(server, 'PUT', '/api/workspaces/admin-settings', {
      token,
      body: { workspace_name: name, ...settings },
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
  }
  return name;
}

/** One discovery of the current workspace, read to its end. */
async function discover(token: string): Promise<DiscoveryEvent[]> {
  const res = await fetch(new URL('/api/workspaces/discover', server.url), {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ target_tables: ['contacts'] }),
  });
  expect(res.status).toBe(200);
  const events = (await res.text())
    .split('\n')
    .filter((line) => line.startsWith('data: '))
    .map((line) => JSON.parse(line.slice(6)) as DiscoveryEvent);
  expect(events.at(-1)?.type, JSON.stringify(events.at(-1))).toBe('completed');
  return events;
}

const ofType = <T extends DiscoveryEvent['type']>(events: DiscoveryEvent[], type: T) =>
  events.filter((e): e is Extract<DiscoveryEvent, { type: T }> => e.type === type);

describe('admin settings discovery runs with', () => {
  let tenant: Tenant;
  let defaults: DiscoveryEvent[];
  beforeAll(async () => {
    tenant = await createTenant(server);
    await workspaceOf(tenant);
    defaults = await discover(tenant.admin.token);
  });

  it('sample_size: the rows profiled per source table', async () => {
    const people = (events: DiscoveryEvent[]) =>
      ofType(events, 'table_profiled').find((e) => e.table === 'app.people')!;
    expect(people(defaults).rows_profiled).toBe(60);
    await workspaceOf(tenant, { sample_size: 10 });
    expect(people(await discover(tenant.admin.token)).rows_profiled).toBe(10);
  });

  it('discovery_confidence_threshold: no suggestion below it', async () => {
    const suggestions = ofType(defaults, 'suggestion');
    expect(suggestions.length).toBeGreaterThan(0);
    const lowest = Math.min(...suggestions.map((s) => s.confidence));
    const highest = Math.max(...suggestions.map((s) => s.confidence));
    expect(lowest).toBeLessThan(highest);
    await workspaceOf(tenant, { discovery_confidence_threshold: highest });
    const strict = ofType(await discover(tenant.admin.token), 'suggestion');
    expect(strict.length).toBeGreaterThan(0);
    expect(strict.length).toBeLessThan(suggestions.length);
    for (const s of strict) expect(s.confidence).toBeGreaterThanOrEqual(highest);
  });

  it('auto_confirm_threshold: suggestions at or above it are confirmed (null: none)', async () => {
    expect(ofType(defaults, 'suggestion').every((s) => s.status === 'suggested')).toBe(true);
    await workspaceOf(tenant, { auto_confirm_threshold: 0 });
    const confirmed = ofType(await discover(tenant.admin.token), 'suggestion');
    expect(confirmed.length).toBeGreaterThan(0);
    expect(confirmed.every((s) => s.status === 'confirmed')).toBe(true);
    const mapping = await call(server, 'GET', '/api/mappings/contacts', { token: tenant.admin.token });
    expect(mapping.status, JSON.stringify(mapping.body)).toBe(200);
    const statuses = mapping.body.connections.map((c: { status: string }) => c.status);
    expect(statuses.length).toBeGreaterThan(0);
    expect(new Set(statuses)).toEqual(new Set(['confirmed']));
  });

  it('ambiguity_margin: candidates that close are an ambiguity (0: never)', async () => {
    await workspaceOf(tenant, { ambiguity_margin: 1 });
    const wide = ofType(await discover(tenant.admin.token), 'ambiguity');
    const email = wide.find((a) => a.target_field === 'email');
    expect(email, JSON.stringify(wide)).toBeDefined();
    expect(email!.candidates.map((c) => c.source_field)).toEqual(
      expect.arrayContaining(['app.people.email', 'app.people.email_address']),
    );
    await workspaceOf(tenant, { ambiguity_margin: 0 });
    // (An ambiguity of another kind may remain: a single candidate in a table without a one-to-one join.)
    const close = ofType(await discover(tenant.admin.token), 'ambiguity').filter(
      (a) => a.candidates.length > 1,
    );
    expect(close).toEqual([]);
  });
});

describe('admin settings ad-hoc queries run with', () => {
  let tenant: Tenant;
  let name: string;
  const query = (path: string, body: unknown) =>
    call(server, 'POST', path, { token: tenant.admin.token, body });
  beforeAll(async () => {
    tenant = await createTenant(server);
    name = await workspaceOf(tenant);
  });

  it('query_row_limit: the default and largest row cap of source and target queries', async () => {
    let source = await query('/api/sources/execute-query', { sql: 'select id from app.people' });
    expect(source.body).toMatchObject({ row_count: 60, truncated: false });
    await call(server, 'PUT', '/api/workspaces/admin-settings', {
      token: tenant.admin.token,
      body: { workspace_name: name, query_row_limit: 3 },
    });
    source = await query('/api/sources/execute-query', { sql: 'select id from app.people order by id' });
    expect(source.body).toMatchObject({
      row_count: 3,
      truncated: true,
      limit: 3,
      rows: [{ id: 1 }, { id: 2 }, { id: 3 }],
    });
    const target = await query('/api/analytics/execute', { sql: 'select * from mart.scores' });
    expect(target.body).toMatchObject({ row_count: 3, truncated: true, limit: 3 });
    for (const path of ['/api/sources/execute-query', '/api/analytics/execute']) {
      const above = await query(path, { sql: 'select 1', limit: 4 });
      expect(above.status).toBe(400);
      expect(above.body.message).toMatch(/at most 3 \(the workspace's query_row_limit\)/);
    }
    expect((await query('/api/sources/execute-query', { sql: 'select 1', limit: 2 })).body.limit).toBe(2);
  });

  it('query_timeout_seconds: the statement timeout of source and target queries', async () => {
    // Two seconds of reading run under the default 30 s, and are cut off at 1 s.
    const slow = (schema: string) => ({ sql: `select count(*)::int as n from ${schema}.nap` });
    expect((await query('/api/sources/execute-query', slow('app'))).body.rows).toEqual([{ n: 4 }]);
    expect((await query('/api/analytics/execute', slow('mart'))).body.rows).toEqual([{ n: 4 }]);
    await call(server, 'PUT', '/api/workspaces/admin-settings', {
      token: tenant.admin.token,
      body: { workspace_name: name, query_timeout_seconds: 1 },
    });
    for (const [path, schema] of [
      ['/api/sources/execute-query', 'app'],
      ['/api/analytics/execute', 'mart'],
    ]) {
      const res = await query(path, slow(schema));
      expect(res.status, JSON.stringify(res.body)).toBe(422);
      expect(res.body.message).toMatch(/statement timeout/);
    }
    expect((await query('/api/sources/execute-query', { sql: 'select 1 as one' })).body.rows).toEqual([
      { one: 1 },
    ]);
  });
});

describe('cache settings', () => {
  let tenant: Tenant;
  let token: string;
  const cacheSettings = (body: unknown) => call(server, 'POST', '/api/admin/cache-settings', { token, body });
  const entries = async (cache: string) =>
    (await call(server, 'GET', '/api/admin/cache-settings', { token })).body.caches.find(
      (c: { name: string }) => c.name === cache,
    ).entries as number;
  /** How the wildcard `accounts.*` maps the contacts fields: read through the cached source catalog. */
  const wildcard = async () => {
    const res = await call(server, 'GET', '/api/mappings/contacts/wildcard/effective', { token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return Object.fromEntries(
      res.body.fields.map((f: { target_field: string; origin: string }) => [f.target_field, f.origin]),
    );
  };
  let name: string;

  beforeAll(async () => {
    tenant = await createTenant(server);
    token = tenant.admin.token;
    name = await workspaceOf(tenant);
    const res = await call(server, 'POST', '/api/mappings/contacts/connection', {
      token,
      body: { connection: { source_field: 'accounts.*', target_field: '*' } },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
  });

  it('mappings: reads are served from the cached source catalog until a write, a config save or the TTL', async () => {
    expect(await wildcard()).toMatchObject({ id: 'wildcard', email: 'wildcard', full_name: 'unmapped' });
    expect(await entries('mappings')).toBeGreaterThan(0);
    // A column added behind dimas's back is not seen while the cached catalog holds…
    await warehouse.sql('alter table app.accounts add column full_name text');
    expect((await wildcard()).full_name).toBe('unmapped');
    // …until the source config is saved (the event that changes what the catalog describes).
    const saved = await call(server, 'POST', `/api/workspaces/${name}/config`, {
      token,
      body: { source_config: connection(['app']) },
    });
    expect(saved.status).toBe(200);
    expect((await wildcard()).full_name).toBe('wildcard');

    // ttl_seconds: a shorter TTL applies to entries already held.
    await warehouse.sql('alter table app.accounts add column tier text');
    expect((await wildcard()).tier).toBe('unmapped');
    expect((await cacheSettings({ caches: { mappings: { ttl_seconds: 1 } } })).status).toBe(200);
    await new Promise((resolve) => setTimeout(resolve, 1100));
    expect((await wildcard()).tier).toBe('wildcard');
  });

  it('mappings: switched off, every read sees the source at once and nothing is held', async () => {
    const off = await cacheSettings({ caches: { mappings: { enabled: false, ttl_seconds: 300 } } });
    expect(off.body.cleared).toEqual(['mappings']);
    await wildcard();
    await warehouse.sql('alter table app.accounts add column city text');
    expect((await wildcard()).city).toBe('wildcard');
    expect(await entries('mappings')).toBe(0);
  });

  it('mappings: max_entries bounds what one organization holds', async () => {
    await cacheSettings({ caches: { mappings: { enabled: true, max_entries: 1 } } });
    await wildcard();
    // The generated SQL is a second entry (the catalog is the first); only one is kept.
    const sql = await call(server, 'GET', '/api/mappings/contacts/transform-code', { token });
    expect(sql.status, JSON.stringify(sql.body)).toBe(200);
    expect(await entries('mappings')).toBe(1);
    await cacheSettings({ caches: { mappings: { max_entries: 100 } } });
    await wildcard();
    await call(server, 'GET', '/api/mappings/contacts/transform-code', { token });
    expect(await entries('mappings')).toBe(2);
  });

  it('requests: the selected workspace, held per caller for its TTL unless switched off', async () => {
    const other = unique('sel');
    expect(
      (await call(server, 'POST', '/api/workspaces/create', { token, body: { name: other, select: false } }))
        .status,
    ).toBe(200);
    const current = async () => (await call(server, 'GET', '/api/workspaces/current', { token })).body.name;
    /** What another API process does: change the stored selection without touching this process. */
    const selectElsewhere = (workspace: string) =>
      server.deps.orm.em
        .fork()
        .getConnection()
        .execute(
          `update users set preferences = jsonb_set(preferences, '{current_workspace}', to_jsonb((select id::text from workspaces where organization_id = ? and name = ?))) where id = ?`,
          [tenant.organization.id, workspace, tenant.admin.id],
        );
    expect(await current()).toBe(name);
    await selectElsewhere(other);
    expect(await current()).toBe(name);
    expect(await entries('requests')).toBe(1);

    await cacheSettings({ caches: { requests: { ttl_seconds: 1 } } });
    await new Promise((resolve) => setTimeout(resolve, 1100));
    expect(await current()).toBe(other);

    await cacheSettings({ caches: { requests: { enabled: false } } });
    await selectElsewhere(name);
    expect(await current()).toBe(name);
    expect(await entries('requests')).toBe(0);

    await cacheSettings({ caches: { requests: { enabled: true, ttl_seconds: 60, max_entries: 0 } } });
    await current();
    expect(await entries('requests')).toBe(0);
  });
});

describe('the introspection cache and the identity_resolution feature', () => {
  let tenant: Tenant;
  let token: string;
  const completed = async () => {
    const events = await discover(token);
    return (events.at(-1) as Extract<DiscoveryEvent, { type: 'completed' }>).summary;
  };
  const cacheSettings = (caches: unknown) =>
    call(server, 'POST', '/api/admin/cache-settings', { token, body: { caches } });

  beforeAll(async () => {
    tenant = await createTenant(server);
    token = tenant.admin.token;
    await workspaceOf(tenant);
  });

  it('introspection: ttl_seconds and max_entries decide whether the next discovery reads the source again', async () => {
    expect((await completed()).introspection_cached).toBe(false);
    expect((await completed()).introspection_cached).toBe(true);
    expect((await cacheSettings({ introspection: { ttl_seconds: 1 } })).status).toBe(200);
    await new Promise((resolve) => setTimeout(resolve, 1100));
    expect((await completed()).introspection_cached).toBe(false);
    await cacheSettings({ introspection: { ttl_seconds: 600, max_entries: 0 } });
    await completed();
    expect((await completed()).introspection_cached).toBe(false);
    await cacheSettings({ introspection: { max_entries: 200 } });
    await completed();
    expect((await completed()).introspection_cached).toBe(true);
  });

  it('identity_resolution: creating the identity schema queues a build only while the feature is on', async () => {
    let res = await call(server, 'POST', '/api/admin/feature-settings', {
      token,
      body: { features: { identity_resolution: false } },
    });
    expect(res.status).toBe(200);
    const off = await call(server, 'POST', '/api/monitoring/identity-graph/create-schema', { token });
    expect(off.status, JSON.stringify(off.body)).toBe(200);
    expect(off.body.build).toBeNull();
    expect(off.body.message).toMatch(/feature identity_resolution/);
    res = await call(server, 'POST', '/api/admin/feature-settings', {
      token,
      body: { features: { identity_resolution: null } },
    });
    const on = await call(server, 'POST', '/api/monitoring/identity-graph/create-schema', { token });
    expect(on.status, JSON.stringify(on.body)).toBe(200);
    expect(on.body.build.run_id).toBeTruthy();
  });
});
