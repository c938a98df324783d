import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';
import { demoSchemaSql, demoSourceStatements } from '../seeds/demo-source/generate.ts';

/*
 * Each field of the workspace admin setting `identity_resolution`, changed through
 * PUT /api/workspaces/admin-settings and observed through the identity build that
 * POST /api/monitoring/identity-graph/create-schema queues and GET identity-graph/workspace reports.
 * The demo shop (customers and CRM contacts, both with e-mail and phone) is source and target database
 * at once, so its tables are proposed as identity sources. The tests run in order: some compare a
 * build with the one before it.
 */
const warehouse = scratchDatabase('idset');
let server: TestServer;
let tenant: Tenant;
let workspaceName: string;

const connection = (schema: string) => pgConfig(warehouse.name, { schemas: [schema] });

const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

const saveSetting = async (value: Record<string, unknown>) => {
  const res = await api('PUT', '/api/workspaces/admin-settings', {
    body: {
      workspace_name: workspaceName,
      identity_resolution: value,
    },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
};

/** Saves the setting, runs a build through the API and answers the graph as GET reports it. */
async function buildWith(value: Record<string, unknown>) {
  await saveSetting(value);
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
  expect(graph.body.last_build.run_id).toBe(runId);
  return graph.body;
}

const FULL_BUILD_STEPS = ['staging', 'edges', 'components', 'tables', 'keys', 'statistics'];

/**
 * The build's steps, as the result reports them (in the order they ran), each a duration within
 * the build's; and the profiles' time beside them.
 */
function expectSteps(result: any, steps: string[]) {
  expect(result.steps.map((s: { step: string }) => s.step)).toEqual(steps);
  const times = result.steps.map((s: { ms: number }) => s.ms) as number[];
  for (const ms of times) expect(ms).toBeGreaterThanOrEqual(0);
  // Each step and the whole are rounded to a millisecond apart.
  expect(times.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(result.duration_ms + times.length);
  expect(result.profiles_ms).toBeGreaterThanOrEqual(0);
}

const healthOf = (graph: any, check: string) =>
  (graph.last_build.result.health as { check: string; status: string }[]).find((h) => h.check === check);

/** Where each profile took its country from (lineage), counted per source table. */
const countryOrigins = () =>
  withClient(warehouse.url, async (client) => {
    const { rows } = await client.query(`
      select lineage->'country'->>'table' as tbl, count(*)::int as n
      from analytics_identity.unified_profiles where country is not null group by 1`);
    return Object.fromEntries(rows.map((r) => [r.tbl, r.n])) as Record<string, number>;
  });

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
    for (const statement of [demoSchemaSql(), ...demoSourceStatements(), 'analyze'])
      await client.query(statement);
  });
  server = await startTestServer();
  tenant = await createTenant(server);
  workspaceName = unique('ids');
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

describe('identity_resolution settings, changed and observed through the API', () => {
  let baseline: any;

  it('refuses invalid values with a 400 and keeps what was saved', async () => {
    await saveSetting({ max_cluster_size: 500 });
    const invalid: Record<string, unknown>[] = [
      { max_degree: 0 },
      { max_degree: 2.5 },
      { max_cluster_size: 1 },
      { max_merge_jump_ratio: 0 },
      { max_merge_jump_ratio: -1 },
      { max_merge_jump_ratio: 101 },
      { incremental: 'yes' },
      { source_priority: ['customers'] },
      { source_priority: 'shop.customers' },
      { profile_fields: [{ name: 'Country' }] },
      { profile_fields: [{ name: 'country', rule: 'newest' }] },
      { profile_fields: [{ name: 'country', columns: [] }] },
      { sources: [{ table: 'shop.customers', identifiers: [] }] },
      {
        sources: [
          { table: 'shop.customers', identifiers: [{ column: 'email', type: 'email', normalize: 'x' }] },
        ],
      },
      { max_degre: 5 },
    ];
    for (const value of invalid) {
      const res = await api('PUT', '/api/workspaces/admin-settings', {
        body: {
          workspace_name: workspaceName,
          identity_resolution: value,
        },
      });
      expect(res.status, JSON.stringify(value)).toBe(400);
    }
    const stored = await api('GET', `/api/workspaces/admin-settings?workspace_name=${workspaceName}`);
    expect(stored.status).toBe(200);
    expect(stored.body.settings.identity_resolution).toEqual({ max_cluster_size: 500 });
  });

  it('builds with the defaults: a full build, nothing flagged, no cluster over the limit', async () => {
    baseline = await buildWith({});
    const result = baseline.last_build.result;
    expect(result.mode).toBe('full');
    // Far under IDENTITY_IN_PROCESS_IDENTIFIERS: the components come from the union-find in the job.
    expect(result).toMatchObject({ components_in: 'process', iterations: 1 });
    expect(result.sources_origin).toBe('proposed');
    expect(result.oversized_components).toBe(0);
    expect(baseline.flagged_identifiers).toBe(0);
    expect(baseline.recent_runs[0].max_cluster_size).toBe(1000);
    expect(healthOf(baseline, 'cluster_size_limit')!.status).toBe('pass');
    // The demo has clusters of more than two identifiers (a customer's e-mail and phone met in the CRM).
    expect(baseline.largest_cluster.size).toBeGreaterThan(2);
  });

  it('max_degree: identifiers with more neighbours are flagged and link nothing', async () => {
    const graph = await buildWith({ max_degree: 1 });
    expect(graph.flagged_identifiers).toBeGreaterThan(0);
    expect(graph.ignored_edges).toBeGreaterThan(0);
    expect(graph.identifiers).toBe(baseline.identifiers);
    expect(graph.clusters).toBeGreaterThan(baseline.clusters);
    // With at most one neighbour per merging identifier, no cluster can hold more than two.
    expect(graph.largest_cluster.size).toBeLessThanOrEqual(2);
    expect(graph.last_build.result.oversized_components).toBe(0);
  });

  it('max_cluster_size: larger components stay unmerged, are flagged and fail the health check', async () => {
    const graph = await buildWith({ max_cluster_size: 2 });
    const result = graph.last_build.result;
    expect(result.oversized_components).toBeGreaterThan(0);
    expect(result.largest_oversized_component).toBe(baseline.largest_cluster.size);
    expect(graph.flagged_identifiers).toBeGreaterThan(0);
    expect(graph.largest_cluster.size).toBeLessThanOrEqual(2);
    expect(graph.clusters).toBeGreaterThan(baseline.clusters);
    expect(graph.recent_runs[0].max_cluster_size).toBe(2);
    expect(healthOf(graph, 'cluster_size_limit')!.status).toBe('fail');
  });

  it('max_merge_jump_ratio: the same jump in merged identifiers passes or fails by the ratio', async () => {
    // From the build bounded at two identifiers to an unbounded one, merges jump.
    const allowed = await buildWith({ max_merge_jump_ratio: 100 });
    const [last, previous] = allowed.recent_runs;
    const growth = (last.merged_identifiers - previous.merged_identifiers) / previous.merged_identifiers;
    expect(growth).toBeGreaterThan(0.01);
    expect(growth).toBeLessThan(100);
    expect(healthOf(allowed, 'merge_jump')!.status).toBe('pass');

    await buildWith({ max_cluster_size: 2 });
    const refused = await buildWith({ max_merge_jump_ratio: 0.01 });
    const [last2, previous2] = refused.recent_runs;
    expect((last2.merged_identifiers - previous2.merged_identifiers) / previous2.merged_identifiers).toBe(
      growth,
    );
    expect(healthOf(refused, 'merge_jump')!.status).toBe('fail');

    // A rebuild of the same data does not jump, whatever the ratio.
    const steady = await buildWith({ max_merge_jump_ratio: 0.01 });
    expect(healthOf(steady, 'merge_jump')!.status).toBe('pass');
  });

  it('source_priority: a source_priority field takes its value from the source listed first', async () => {
    const field = [{ name: 'country', rule: 'source_priority' }];
    const crmFirst = await buildWith({
      profile_fields: field,
      source_priority: ['shop.crm_contacts', 'shop.customers'],
    });
    expect(crmFirst.last_build.result.source_priority).toEqual(['shop.crm_contacts', 'shop.customers']);
    const fromCrmFirst = await countryOrigins();
    const shopFirst = await buildWith({
      profile_fields: field,
      source_priority: ['shop.customers', 'shop.crm_contacts'],
    });
    expect(shopFirst.last_build.result.source_priority).toEqual(['shop.customers', 'shop.crm_contacts']);
    const fromShopFirst = await countryOrigins();
    // Same clusters, so the same profiles have a country; the merged ones change source.
    expect(shopFirst.clusters).toBe(crmFirst.clusters);
    const moved = fromCrmFirst['shop.crm_contacts'] - fromShopFirst['shop.crm_contacts'];
    expect(moved).toBeGreaterThan(50);
    expect(fromShopFirst['shop.customers'] - fromCrmFirst['shop.customers']).toBe(moved);
  });

  it('incremental: a build reads only the added records, and falls back to a full build when it must', async () => {
    const full = await buildWith({ incremental: true });
    // The previous build read the same sources under the same limits: this one is already incremental.
    expect(full.last_build.result).toMatchObject({ mode: 'incremental', full_reason: null });
    expect(full.clusters).toBe(baseline.clusters);

    const email = `${unique('new')}@example.org`;
    await withClient(warehouse.url, async (client) => {
      await client.query(
        `insert into shop.customers (customer_id, email, phone, country, signup_date, created_at, updated_at)
         values (900001, $1, '+1 555 010 9999', 'US', current_date, now(), now())`,
        [email.toUpperCase()],
      );
      await client.query(
        `insert into shop.crm_contacts (contact_id, email, phone, country)
         values ('NEW-1', $1, '+1-555-010-7777', 'US')`,
        [email],
      );
    });
    const added = await buildWith({ incremental: true });
    // The profiles of the clusters it changed are rebuilt, not the whole table.
    expect(added.last_build.result).toMatchObject({
      mode: 'incremental',
      full_reason: null,
      profiles_mode: 'incremental',
    });
    expectSteps(added.last_build.result, ['staging', 'merge', 'tables', 'statistics']);
    // One e-mail and two phones, merged into one new cluster.
    expect(added.identifiers).toBe(baseline.identifiers + 3);
    expect(added.clusters).toBe(baseline.clusters + 1);

    const refreshed = await profileRows();

    // Other limits than the last build's: the incremental step cannot apply them, so it rebuilds.
    const changed = await buildWith({ incremental: true, max_degree: 50 });
    expect(changed.last_build.result).toMatchObject({
      mode: 'full',
      full_reason: 'limits_changed',
      profiles_mode: 'full',
    });
    // What the discarded incremental attempt cost, then the full build's steps.
    expectSteps(changed.last_build.result, ['incremental_attempt', ...FULL_BUILD_STEPS]);
    expect(changed.identifiers).toBe(added.identifiers);
    expect(changed.clusters).toBe(added.clusters);
    expect(await profileRows()).toEqual(refreshed);

    // Off (the default): every build is a full one, and gives what the incremental one gave.
    const off = await buildWith({ max_degree: 50 });
    // Nobody asked for an incremental build, so there is nothing to explain.
    expect(off.last_build.result).toMatchObject({ mode: 'full', full_reason: null });
    expectSteps(off.last_build.result, FULL_BUILD_STEPS);
    expect(off.clusters).toBe(added.clusters);

    // Other sources than the last build's: rebuilt, then incremental again over the new sources.
    const customersOnly = {
      incremental: true,
      max_degree: 50,
      sources: [
        { table: 'shop.customers', identifiers: [{ column: 'email', type: 'email', normalize: 'email' }] },
      ],
    };
    const narrowed = await buildWith(customersOnly);
    expect(narrowed.last_build.result.sources_origin).toBe('confirmed');
    expect(narrowed.last_build.result).toMatchObject({ mode: 'full', full_reason: 'sources_changed' });
    expect(Object.keys(narrowed.identifiers_by_type)).toEqual(['email']);
    const again = await buildWith(customersOnly);
    expect(again.last_build.result).toMatchObject({ mode: 'incremental', full_reason: null });
    expect(again.identifiers).toBe(narrowed.identifiers);
  });
});
