import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, call, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';

/*
 * Unified profiles next to the runaway-merge guards, built through the API: identifiers the guards
 * flag (a support phone over max_degree, the identifiers of a component over max_cluster_size)
 * place no record, so their clusters have no members and no profile, in a full build and in the
 * incremental refresh alike; the build's `profiles` counts the rows of the table. A flagged
 * identifier is no person's own either: a profile's phone is never the support line, even where
 * the person's records hold it more often than their own phone. A record whose every identifier is
 * flagged is in no profile: the build, the graph's read route and an identity alert count them.
 * One source table in the target database, confirmed in the workspace's settings.
 */
const warehouse = scratchDatabase('upflag');
let server: TestServer;
let tenant: Tenant;
let workspaceName: string;

const connection = (schema: string) => pgConfig(warehouse.name, { schemas: [schema] });
const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

const SUPPORT = '555 000 0000';
const settings = (incremental: boolean) => ({
  incremental,
  max_degree: 2,
  max_cluster_size: 3,
  sources: [
    {
      table: 'shop.people',
      key_column: 'id',
      identifiers: [
        { column: 'email', type: 'email' },
        { column: 'phone', type: 'phone' },
      ],
    },
  ],
  profile_fields: [{ name: 'name' }],
});

async function buildWith(value: Record<string, unknown>) {
  const saved = await api('PUT', '/api/workspaces/admin-settings', {
    body: { workspace_name: workspaceName, identity_resolution: value },
  });
  expect(saved.status, JSON.stringify(saved.body)).toBe(200);
  const created = await api('POST', '/api/monitoring/identity-graph/create-schema');
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  const runId = created.body.build.run_id;
  const run = await until(
    `run ${runId}`,
    () => server.deps.jobs.getRun(runId, tenant.organization.id),
    (r) => !!r && ['succeeded', 'failed', 'cancelled'].includes(r.status),
  );
  expect(run!.status, JSON.stringify(run)).toBe('succeeded');
  const graph = await api('GET', '/api/monitoring/identity-graph/workspace');
  expect(graph.status, JSON.stringify(graph.body)).toBe(200);
  return graph.body;
}

/** Every profile without its cluster id (a full build numbers clusters anew), in one order. */
const profileRows = () =>
  withClient(warehouse.url, async (client) => {
    const { rows } = await client.query(`
      select to_jsonb(p) - 'cluster_id' as profile from analytics_identity.unified_profiles p order by 1`);
    return rows.map((r) => r.profile);
  });

beforeAll(async () => {
  await warehouse.create();
  await withClient(warehouse.url, async (client) => {
    await client.query('create schema shop');
    await client.query('create schema analytics');
    await client.query('create table shop.people (id text primary key, email text, phone text, name text)');
    // The support line is on three people's records (over max_degree 2), on one of its own and
    // twice on Fay's, beside her own phone; e1, p1, p2 and e2 chain into a component of four,
    // over max_cluster_size 3.
    await client.query(
      `insert into shop.people values
         ('a1', 'ann@x.io', $1, 'Ann'), ('a2', 'bob@x.io', $1, 'Bob'), ('a3', 'cy@x.io', $1, 'Cy'),
         ('a4', null, $1, 'Front desk'),
         ('f1', 'fay@x.io', '555 200 0007', 'Fay'), ('f2', 'fay@x.io', $1, 'Fay'), ('f3', 'fay@x.io', $1, 'Fay'),
         ('d1', 'e1@x.io', '555 100 0001', 'Dora'), ('d2', 'e1@x.io', '555 100 0002', 'Dora'),
         ('d3', 'e2@x.io', '555 100 0002', 'Dan')`,
      [SUPPORT],
    );
  });
  server = await startTestServer();
  tenant = await createTenant(server);
  workspaceName = unique('upf');
  await createWorkspace(server, tenant.admin.token, {
    name: workspaceName,
    source_config: connection('shop'),
    target_config: connection('analytics'),
  });
}, 120_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('unified profiles of clusters the runaway-merge guards leave without records', () => {
  it('a full build makes profiles only of clusters that hold a record, counts them, and never takes a flagged identifier', async () => {
    const graph = await buildWith(settings(false));
    const result = graph.last_build.result;
    // The support phone and the four identifiers of the oversized component: singletons, flagged.
    expect(graph.flagged_identifiers).toBe(5);
    expect(result.oversized_components).toBe(1);
    expect(graph.clusters).toBe(9);
    expect(result.profiles).toBe(4);
    const full = await profileRows();
    expect(full.map((p: any) => [p.email, p.phone, p.name])).toEqual([
      ['ann@x.io', null, 'Ann'],
      ['bob@x.io', null, 'Bob'],
      ['cy@x.io', null, 'Cy'],
      ['fay@x.io', '5552000007', 'Fay'],
    ]);
    expect(full.find((p: any) => p.email === 'fay@x.io')).toMatchObject({
      lineage: { phone: { table: 'shop.people', record_key: 'f1' } },
    });
    // a4 carries only the support line, d1–d3 only identifiers of the oversized component: in no
    // profile. The other six are each in one.
    expect(result).toMatchObject({
      records_without_profile: 4,
      records_without_profile_by_source: { 'shop.people': 4 },
    });
    expect(graph.unified_profiles).toEqual({
      table: 'analytics_identity.unified_profiles',
      profiles: 4,
      records_without_profile: 4,
      records_without_profile_by_source: { 'shop.people': 4 },
    });
    // fay@ has two neighbours (her phone and the support line), at max_degree 2: near the limit.
    expect(graph).toMatchObject({ identifiers_near_max_degree: 1, near_max_degree_from: 2 });
    const health = Object.fromEntries(result.health.map((h: any) => [h.check, h.status]));
    expect(health).toMatchObject({ records_without_profile: 'fail', degree_near_limit: 'fail' });
    const alerts = await api('GET', '/api/api/alerts/active', { query: { workspace: workspaceName } });
    expect(alerts.status, JSON.stringify(alerts.body)).toBe(200);
    const identity = alerts.body.alerts.filter((a: any) => a.kind === 'identity');
    expect(identity.find((a: any) => a.check === 'records_without_profile')).toMatchObject({
      table_name: 'analytics_identity.unified_profiles',
      measured: 4,
      threshold: 0,
    });
    expect(identity.find((a: any) => a.check === 'degree_near_limit')).toMatchObject({
      table_name: 'analytics_identity.identity_nodes',
      measured: 1,
      threshold: 2,
    });
    // Without a token the figures are refused.
    expect((await call(server, 'GET', '/api/monitoring/identity-graph/workspace')).status).toBe(401);
  });

  it('the incremental refresh makes none either, and equals a full build', async () => {
    await buildWith(settings(true));
    await withClient(warehouse.url, (client) =>
      client.query(
        `insert into shop.people values ('a5', 'dee@x.io', null, 'Dee'), ('a6', 'eve@x.io', $1, 'Eve')`,
        [SUPPORT],
      ),
    );
    const added = await buildWith(settings(true));
    expect(added.last_build.result).toMatchObject({
      mode: 'incremental',
      profiles_mode: 'incremental',
      profiles: 6,
    });
    expect(added.clusters).toBe(11);
    // a6 is on the support line beside an e-mail of its own: in a profile; the four stay outside.
    expect(added.unified_profiles).toMatchObject({ profiles: 6, records_without_profile: 4 });
    expect(added.last_build.result.records_without_profile).toBe(4);
    const refreshed = await profileRows();
    expect(refreshed.map((p: any) => [p.email, p.phone])).toEqual([
      ['ann@x.io', null],
      ['bob@x.io', null],
      ['cy@x.io', null],
      ['dee@x.io', null],
      ['eve@x.io', null],
      ['fay@x.io', '5552000007'],
    ]);
    // Nothing new: the count carries over.
    const again = await buildWith(settings(true));
    expect(again.last_build.result).toMatchObject({ profiles_mode: 'incremental', profiles: 6 });

    const rebuilt = await buildWith(settings(false));
    expect(rebuilt.last_build.result).toMatchObject({
      mode: 'full',
      profiles: 6,
      records_without_profile: 4,
    });
    expect(rebuilt.unified_profiles).toEqual(added.unified_profiles);
    expect(await profileRows()).toEqual(refreshed);
  });
});
