import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';
import { demoSchemaSql, demoSourceStatements } from '../seeds/demo-source/generate.ts';
import { generateDbtProject } from '../src/transform/dbt.ts';
import { dbtModelSchema } from './helpers/dbt.ts';
import { profileOptionsOf } from '../src/quality/golden-records.ts';

/*
 * Unified profiles on the demo shop: the source (schema shop) and the target (schema analytics) are
 * one database, as in the embedded demo, so the source tables with e-mail and phone columns are
 * proposed as identity sources and resolved together, out of the box.
 */
const warehouse = scratchDatabase('idprof');
let server: TestServer;
let tenant: Tenant;

const connection = (schema: string) => pgConfig(warehouse.name, { schemas: [schema] });

const finished = (runId: string) =>
  until(
    `run ${runId}`,
    () => server.deps.jobs.getRun(runId, tenant.organization.id),
    (r) => !!r && ['succeeded', 'failed', 'cancelled'].includes(r.status),
  );

/** The same clusters computed here: e-mail and phone of customers and CRM contacts, union-find. */
async function independentClusters() {
  const rows = await withClient(warehouse.url, async (client) => {
    const customers = await client.query('select email, phone from shop.customers');
    const contacts = await client.query('select email, phone from shop.crm_contacts');
    return [...customers.rows, ...contacts.rows] as { email: string | null; phone: string | null }[];
  });
  const parent = new Map<string, string>();
  const find = (x: string): string => {
    if (!parent.has(x)) parent.set(x, x);
    let root = x;
    while (parent.get(root) !== root) root = parent.get(root)!;
    parent.set(x, root);
    return root;
  };
  for (const row of rows) {
    const email = row.email?.trim().toLowerCase();
    const ids = [];
    if (email && /^[^@\s]+@[^@\s]+$/.test(email)) ids.push(`email:${email}`);
    const digits = (row.phone ?? '').replace(/[^0-9]/g, '');
    if (digits.length >= 6) ids.push(`phone:${digits}`);
    ids.forEach((id) => find(id));
    if (ids.length === 2) parent.set(find(ids[0]), find(ids[1]));
  }
  const roots = new Set([...parent.keys()].map(find));
  return { identifiers: parent.size, clusters: roots.size };
}

beforeAll(async () => {
  await warehouse.create();
  await withClient(warehouse.url, async (client) => {
    for (const statement of [demoSchemaSql(), ...demoSourceStatements(), 'analyze'])
      await client.query(statement);
  });
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: unique('idp'),
    source_config: connection('shop'),
    target_config: connection('analytics'),
  });
}, 120_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

describe('unified profiles on the demo', () => {
  it('resolves customers and CRM contacts together and builds one profile per cluster that holds a record', async () => {
    const created = await api('POST', '/api/monitoring/identity-graph/create-schema');
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const run = await finished(created.body.build.run_id);
    expect(run!.status, JSON.stringify(run)).toBe('succeeded');
    const graph = await api('GET', '/api/monitoring/identity-graph/workspace');
    expect(graph.status).toBe(200);
    const result = graph.body.last_build.result;
    expect(result.sources_origin).toBe('proposed');
    expect(result.sources.map((s: any) => s.table).sort()).toEqual(['shop.crm_contacts', 'shop.customers']);
    const expected = await independentClusters();
    expect(graph.body.identifiers).toBe(expected.identifiers);
    expect(graph.body.clusters).toBe(expected.clusters);
    // Every cluster holds a record (the independent union-find makes clusters of the records' own
    // identifiers), and no identifier is flagged, so no record is left outside the profiles.
    expect(graph.body.flagged_identifiers).toBe(0);
    expect(result.profiles).toBe(expected.clusters);
    expect(result.records_without_profile).toBe(0);
    expect(graph.body.unified_profiles).toEqual({
      table: 'analytics_identity.unified_profiles',
      profiles: expected.clusters,
      records_without_profile: 0,
      records_without_profile_by_source: {},
    });
    expect(result.profile_table).toBe('analytics_identity.unified_profiles');
    expect(result.profile_fields.map((f: any) => f.name)).toEqual(
      expect.arrayContaining(['email', 'phone', 'country']),
    );

    // Lineage: every profile e-mail is, normalised, the e-mail of the record it names.
    await withClient(warehouse.url, async (client) => {
      const { rows } = await client.query(`
        select p.email, p.lineage->'email'->>'table' as tbl, p.lineage->'email'->>'record_key' as k,
               coalesce(c.email, m.email) as source_email
        from analytics_identity.unified_profiles p
        left join shop.customers c on p.lineage->'email'->>'table' = 'shop.customers'
          and c.customer_id::text = p.lineage->'email'->>'record_key'
        left join shop.crm_contacts m on p.lineage->'email'->>'table' = 'shop.crm_contacts'
          and m.contact_id = p.lineage->'email'->>'record_key'
        where p.email is not null`);
      expect(rows.length).toBeGreaterThan(1000);
      for (const row of rows) expect(row.source_email.trim().toLowerCase()).toBe(row.email);
      const merged = await client.query(`
        select count(*)::int as n from analytics_identity.unified_profiles
        where lineage::text like '%shop.customers%' and lineage::text like '%shop.crm_contacts%'`);
      // Profiles whose fields came from both systems (each field names the one record it took).
      expect(merged.rows[0].n).toBeGreaterThan(50);
    });
  });

  it('puts the unified profiles in the dbt-compatible project, as a model that gives the same rows', async () => {
    const graph = await api('GET', '/api/monitoring/identity-graph/workspace');
    const profile = profileOptionsOf(graph.body.schema, graph.body.last_build.result)!;
    const files = await generateDbtProject({ projectName: 'demo', models: [], identityProfile: profile });
    const model = files.find((f) => f.path === 'models/unified_profiles.sql')!;
    expect(model.content).toContain("{{ source('analytics_identity', 'identity_records') }}");
    expect(files.find((f) => f.path === 'models/sources.yml')!.content).toMatch(/crm_contacts/);
    const schemaYml = parseYaml(files.find((f) => f.path === 'models/schema.yml')!.content);
    const described = schemaYml.models.find((m: any) => m.name === 'unified_profiles');
    // Every column the built table has is described, the cluster's identifier count included.
    expect(described.columns.map((c: any) => c.name)).toEqual([
      'cluster_id',
      'identifiers',
      ...profile.fields.map((f) => f.name),
      'lineage',
    ]);
    // What dbt would run, with its source() calls resolved, equals the table the build wrote.
    const sql = model.content.replace(/\{\{ source\('([^']+)', '([^']+)'\) \}\}/g, '"$1"."$2"');
    await withClient(warehouse.url, async (client) => {
      const { rows } = await client.query(
        `select count(*)::int as n from ((${sql}) except (select * from analytics_identity.unified_profiles)) d`,
      );
      expect(rows[0].n).toBe(0);
      const total = await client.query(`select count(*)::int as n from (${sql}) m`);
      expect(total.rows[0].n).toBe(graph.body.clusters);
    });
  });

  it('names the profile model apart from a target table called unified_profiles, building the same relation', async () => {
    const graph = await api('GET', '/api/monitoring/identity-graph/workspace');
    const profile = profileOptionsOf(graph.body.schema, graph.body.last_build.result)!;
    const files = await generateDbtProject({
      projectName: 'demo',
      targetSchema: 'analytics',
      identityProfile: profile,
      models: [
        {
          target: { name: 'unified_profiles', columns: [{ name: 'email', type: 'text' as const }] },
          mapping: {
            table_name: 'unified_profiles',
            tables: { 'shop.customers': { relationship: 'primary' as const } },
            connections: [
              { source_field: 'shop.customers.email', target_field: 'email', status: 'confirmed' as const },
            ],
          },
        },
      ],
    });
    const models = files.filter((f) => /^models\/[^/]+\.sql$/.test(f.path)).map((f) => f.path);
    expect(models.sort()).toEqual(['models/unified_profiles.sql', 'models/unified_profiles_identity.sql']);
    expect(files.find((f) => f.path === 'models/unified_profiles.sql')!.content).toContain(
      "{{ source('shop', 'customers') }}",
    );
    const project = parseYaml(files.find((f) => f.path === 'dbt_project.yml')!.content);
    expect(project.models.demo.unified_profiles_identity).toEqual({
      '+schema': graph.body.schema,
      '+alias': 'unified_profiles',
    });
    expect(dbtModelSchema(files, 'unified_profiles_identity', 'dbt_user')).toBe(graph.body.schema);
    expect(dbtModelSchema(files, 'unified_profiles', 'dbt_user')).toBe('analytics');
    const schemaYml = parseYaml(files.find((f) => f.path === 'models/schema.yml')!.content);
    expect(schemaYml.models.map((m: any) => m.name).sort()).toEqual([
      'unified_profiles',
      'unified_profiles_identity',
    ]);
    // The renamed model still gives the rows of the table the build wrote.
    const model = files.find((f) => f.path === 'models/unified_profiles_identity.sql')!;
    const sql = model.content.replace(/\{\{ source\('([^']+)', '([^']+)'\) \}\}/g, '"$1"."$2"');
    await withClient(warehouse.url, async (client) => {
      const { rows } = await client.query(
        `select count(*)::int as n from ((${sql}) except (select * from analytics_identity.unified_profiles)) d`,
      );
      expect(rows[0].n).toBe(0);
    });
  });

  it('measures the unified profiles with the target tables', async () => {
    const graph = await api('GET', '/api/monitoring/identity-graph/workspace');
    const metrics = await api('GET', '/api/monitoring/metrics/workspace');
    expect(metrics.status, JSON.stringify(metrics.body)).toBe(200);
    const profiles = metrics.body.tables.find((t: any) => t.table === 'analytics_identity.unified_profiles');
    expect(profiles.row_count).toBe(graph.body.clusters);
    expect(profiles.columns.find((c: any) => c.name === 'cluster_id').null_count).toBe(0);
  });

  it('builds from confirmed sources and fields set through the admin settings', async () => {
    const workspace = (await api('GET', '/api/workspaces/current')).body.name ?? undefined;
    const bad = await api('PUT', '/api/workspaces/admin-settings', {
      body: {
        workspace_name: workspace,
        identity_resolution: { sources: [{ table: 'customers', identifiers: [] }] },
      },
    });
    expect(bad.status).toBe(400);
    const saved = await api('PUT', '/api/workspaces/admin-settings', {
      body: {
        workspace_name: workspace,
        identity_resolution: {
          sources: [
            {
              table: 'shop.customers',
              identifiers: [{ column: 'email', type: 'email', normalize: 'email' }],
            },
          ],
          profile_fields: [{ name: 'city', rule: 'most_recent' }],
        },
      },
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    const created = await api('POST', '/api/monitoring/identity-graph/create-schema');
    expect((await finished(created.body.build.run_id))!.status).toBe('succeeded');
    const graph = await api('GET', '/api/monitoring/identity-graph/workspace');
    const result = graph.body.last_build.result;
    expect(result.sources_origin).toBe('confirmed');
    expect(result.sources).toEqual([
      {
        table: 'shop.customers',
        identifiers: [{ column: 'email', type: 'email' }],
        key_column: 'customer_id',
        timestamp_column: 'updated_at',
      },
    ]);
    expect(result.profile_fields.map((f: any) => [f.name, f.rule])).toEqual([
      ['email', 'most_frequent'],
      ['city', 'most_recent'],
    ]);
    expect(graph.body.identifiers_by_type).toEqual({ email: graph.body.identifiers });
  });
});
