import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  bindCall,
  createTenant,
  createWorkspace,
  materializeMapping,
  unique,
  until,
  type Tenant,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';
import { readZip } from './helpers/zip.ts';
import { dbtModelSchema } from './helpers/dbt.ts';
import { generateDbtProject, type ProjectFile } from '../src/transform/dbt.ts';

/*
 * `dbt run` on the generated project builds every model where dimas builds it, whatever schema the
 * user's profile names: the target tables in the workspace target's schema, the unified profiles
 * in the identity graph's. dbt's schema resolution is emulated (test/helpers/dbt.ts: dbt_project.yml
 * `+schema` by fqn, the project's generate_schema_name macro rendered by Jinja2, else dbt's default).
 */
const warehouse = scratchDatabase('pschema');
let server: TestServer;
let tenant: Tenant;
let workspaceName: string;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
);
/** The schema a person's profiles.yml would name: dbt's default for models configured with none. */
const PROFILE_SCHEMA = 'dbt_ann';

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema shop; create schema analytics; create schema ${PROFILE_SCHEMA};
    create table shop.people (id text primary key, email text, name text);
    insert into shop.people values ('a1', 'ann@x.io', 'Ann'), ('b1', 'bob@x.io', 'Bob');`);
  server = await startTestServer();
  tenant = await createTenant(server);
  workspaceName = unique('psch');
  await createWorkspace(server, tenant.admin.token, {
    name: workspaceName,
    source_config: pgConfig(warehouse.name, { schemas: ['shop'] }),
    target_config: pgConfig(warehouse.name, { schemas: ['analytics'] }),
    target_schema: {
      name: 'c360',
      tables: [
        {
          name: 'people',
          primary_key: ['person_id'],
          columns: [
            { name: 'person_id', type: 'text', nullable: false },
            { name: 'email', type: 'text' },
          ],
        },
      ],
    },
  });
}, 120_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

async function ok(method: string, path: string, body?: unknown) {
  const res = await api(method, path, body === undefined ? {} : { body });
  expect(res.status, `${method} ${path}: ${JSON.stringify(res.body)}`).toBe(200);
  return res.body;
}

/** The project's files as the workspace download holds them. */
async function projectFiles(): Promise<ProjectFile[]> {
  const res = await fetch(new URL(`/api/workspaces/${workspaceName}/download`, server.url), {
    headers: { authorization: `Bearer ${tenant.admin.token}` },
  });
  expect(res.status).toBe(200);
  const dir = 'transformation/';
  return [...readZip(Buffer.from(await res.arrayBuffer()))]
    .filter(([path]) => path.startsWith(dir))
    .map(([path, content]) => ({ path: path.slice(dir.length), content: content.toString('utf8') }));
}

describe('the generated project builds its models where dimas does', () => {
  it('puts the target tables in the target schema and the unified profiles in the graph schema', async () => {
    await ok('POST', '/api/mappings/people/tables', { source_table: 'people', relationship: 'primary' });
    for (const [source, target] of [
      ['id', 'person_id'],
      ['email', 'email'],
    ])
      await ok('POST', '/api/mappings/people/connection', {
        connection: { source_field: `people.${source}`, target_field: target, status: 'confirmed' },
      });
    await ok('POST', '/api/mappings/people/commit-transformation', { message: 'people' });
    const { run } = await materializeMapping(server, tenant.admin.token, 'people');
    expect(run.status, JSON.stringify(run)).toBe('succeeded');

    await ok('PUT', '/api/workspaces/admin-settings', {
      workspace_name: workspaceName,
      identity_resolution: {
        sources: [
          { table: 'shop.people', key_column: 'id', identifiers: [{ column: 'email', type: 'email' }] },
        ],
        profile_fields: [{ name: 'name' }],
      },
    });
    const built = await ok('POST', '/api/monitoring/identity-graph/create-schema');
    const graphRun = await until(
      `run ${built.build.run_id}`,
      () => server.deps.jobs.getRun(built.build.run_id, tenant.organization.id),
      (r) => !!r && ['succeeded', 'failed', 'cancelled'].includes(r.status),
    );
    expect(graphRun!.status, JSON.stringify(graphRun)).toBe('succeeded');
    const graph = await ok('GET', '/api/monitoring/identity-graph/workspace');

    await ok('POST', '/api/pipelines/generate-project', {});
    const files = await projectFiles();
    const models = files
      .filter((f) => /^models\/[^/]+\.sql$/.test(f.path))
      .map((f) => f.path.slice('models/'.length, -'.sql'.length))
      .sort();
    expect(models).toEqual(['people', 'unified_profiles']);
    const project = parseYaml(files.find((f) => f.path === 'dbt_project.yml')!.content);
    expect(Object.values(project.models)[0]).toMatchObject({
      '+schema': 'analytics',
      unified_profiles: { '+schema': 'analytics_identity' },
    });

    // Where `dbt run` builds each model, for a profile of another schema: where dimas built it.
    const where = Object.fromEntries(models.map((m) => [m, dbtModelSchema(files, m, PROFILE_SCHEMA)]));
    expect(where).toEqual({ people: 'analytics', unified_profiles: graph.schema });
    // They are the tables dimas built and monitoring measures.
    await withClient(warehouse.url, async (client) => {
      for (const [model, schema] of Object.entries(where)) {
        const { rows } = await client.query(`select to_regclass($1) is not null as found`, [
          `"${schema}"."${model}"`,
        ]);
        expect(rows[0].found, `${schema}.${model}`).toBe(true);
      }
    });
    const metrics = await ok('GET', '/api/monitoring/metrics/workspace');
    expect(metrics.tables.map((t: { table: string }) => t.table).sort()).toEqual(
      Object.entries(where).map(([model, schema]) => `${schema}.${model}`),
    );
  }, 120_000);

  it('takes a configured name as it is, where dbt by default would prefix the profile schema', async () => {
    const schema = 'Mart {{x}} Ü';
    const models = [
      {
        target: { name: 'people', columns: [{ name: 'email', type: 'text' as const }] },
        mapping: {
          table_name: 'people',
          tables: { 'shop.people': { relationship: 'primary' as const } },
          connections: [
            { source_field: 'shop.people.email', target_field: 'email', status: 'confirmed' as const },
          ],
        },
      },
    ];
    const files = await generateDbtProject({ projectName: 'shop', targetSchema: schema, models });
    expect(dbtModelSchema(files, 'people', PROFILE_SCHEMA)).toBe(schema);
    // Without the project's macro, dbt's own: the profile's schema, then the configured one.
    const withoutMacro = files.filter((f) => !f.path.startsWith('macros/'));
    expect(dbtModelSchema(withoutMacro, 'people', PROFILE_SCHEMA)).toBe(`${PROFILE_SCHEMA}_${schema}`);
    // Without a target schema (a workspace without a target), the profile's.
    const untargeted = await generateDbtProject({ projectName: 'shop', models });
    expect(dbtModelSchema(untargeted, 'people', PROFILE_SCHEMA)).toBe(PROFILE_SCHEMA);
  });
});
