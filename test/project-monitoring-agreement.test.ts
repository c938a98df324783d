import type { EntityManager } from '@mikro-orm/postgresql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';
import { generateDbtProject, resolveProjectSql, type ProjectFile } from '../src/transform/dbt.ts';
import type { Mapping, TargetTable } from '../src/transform/mapping.ts';
import { enqueueMonitoringRun, runDueMonitoring } from '../src/modules/monitoring/monitoring.jobs.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';
import { renderJinja, renderValue, type JinjaContext } from './helpers/dbt.ts';

/*
 * The generated dbt project and dimas's monitoring run the same tests with the same counts, on names
 * dbt reads otherwise than SQL does (capitals, a reserved word, spaces, a double quote, unicode, Jinja
 * braces) and accepted values holding quotes and braces. dbt's side is an emulation of what dbt-core
 * does with the files, kept to what matters here: Jinja renders model SQL and test arguments (a string
 * argument that looks like ref()/source() is called), source() and ref() print each part of a relation
 * between double quotes without doubling one inside (or as written, with quoting off), a test's column
 * is quoted when `quote: true`, `field` and the accepted values are put in the SQL as given; the SQL of
 * the generic tests is dbt-core's. Everything runs on a real PostgreSQL scratch database.
 */
const warehouse = scratchDatabase('pma');

const SHOP = 'Shop "Data" Ü';
const KUNDEN = 'Kunden {{x}}';
const ACCEPTED = ["O'Brien", '{{ x }}', "ref('x')", 'a"b', 'Zürich'];

const targetSchema = {
  name: 'pma',
  version: '1.0.0',
  tables: [
    {
      name: 'Customer',
      primary_key: ['UserId'],
      columns: [
        { name: 'UserId', type: 'integer', nullable: false },
        { name: 'select', type: 'text' },
        { name: 'Group', type: 'text', nullable: false },
        { name: 'Ref', type: 'integer' },
        { name: 'since', type: 'date' },
      ],
    },
    {
      name: 'order',
      primary_key: ['order_id', 'line'],
      columns: [
        { name: 'order_id', type: 'integer' },
        { name: 'line', type: 'integer' },
        { name: 'CustomerRef', type: 'integer' },
        { name: 'From', type: 'text' },
      ],
    },
  ],
};

let server: TestServer;
let tenant: Tenant;
let workspaceName: string;
let workspaceId: string;
const api = (method: string, path: string, body?: unknown) =>
  call(server, method, path, { token: tenant.admin.token, body });
const testPath = (table: string, column: string) => `/api/api/schema/config/columns/${table}/${column}/test`;

// ---- dbt, as far as these files need it ----

/** dbt's add_rendered_test_kwargs: a bare ref(...)/source(...) is called. */
const renderArgument = (value: unknown, ctx: JinjaContext) =>
  typeof value !== 'string'
    ? value
    : renderValue(
        /^\s*(env_var|ref|var|source|doc)\s*\(.+\)\s*$/.test(value) ? `{{ ${value} }}` : value,
        ctx,
      );

/** BaseRelation.quoted: between double quotes, nothing escaped. */
const dbtQuote = (part: string) => `"${part}"`;
const pyStr = (value: unknown) => (value === true ? 'True' : value === false ? 'False' : String(value));

function dbtProject(files: ProjectFile[]) {
  const file = (path: string) => files.find((f) => f.path === path)!.content;
  const sources = parseYaml(file('models/sources.yml')).sources as any[];
  const ctx: JinjaContext = {
    source(sourceName, tableName) {
      const source = sources.find((s) => s.name === sourceName);
      const table = source?.tables.find((t: any) => t.name === tableName);
      if (!table) throw new Error(`dbt: source('${sourceName}', '${tableName}') not found`);
      const schema = renderValue(source.schema ?? source.name, ctx);
      const identifier = renderValue(table.identifier ?? table.name, ctx);
      const quoting = { ...source.quoting, ...table.quoting };
      return [
        dbtQuote(warehouse.name),
        quoting.schema === false ? schema : dbtQuote(schema),
        quoting.identifier === false ? identifier : dbtQuote(identifier),
      ].join('.');
    },
    ref: (model) => [warehouse.name, 'mart', model].map(dbtQuote).join('.'),
  };
  const models = parseYaml(file('models/schema.yml')).models as any[];
  /** Each test's SQL as dbt-core's generic tests write it, by `model.column.test`. */
  const tests = new Map<string, string>();
  for (const model of models)
    for (const column of model.columns) {
      const col = column.quote ? dbtQuote(column.name) : column.name;
      const from = ctx.ref(model.name);
      for (const test of column.data_tests ?? []) {
        const kind = typeof test === 'string' ? test : Object.keys(test)[0];
        const args = Object.fromEntries(
          Object.entries(typeof test === 'string' ? {} : test[kind]).map(([k, v]) => [
            k,
            Array.isArray(v) ? v.map((x) => renderArgument(x, ctx)) : renderArgument(v, ctx),
          ]),
        ) as Record<string, any>;
        const key = `${model.name}.${column.name}.${kind}`;
        if (kind === 'not_null') tests.set(key, `select ${col}\nfrom ${from}\nwhere ${col} is null`);
        else if (kind === 'unique')
          tests.set(
            key,
            `select ${col} as unique_field, count(*) as n_records\nfrom ${from}\nwhere ${col} is not null\n` +
              `group by ${col}\nhaving count(*) > 1`,
          );
        else if (kind === 'accepted_values')
          tests.set(
            key,
            `with all_values as (select ${col} as value_field, count(*) as n_records from ${from} group by ${col})\n` +
              `select * from all_values where value_field not in (${args.values
                .map((v: unknown) => (args.quote === false ? pyStr(v) : `'${pyStr(v)}'`))
                .join(',')})`,
          );
        else if (kind === 'relationships')
          tests.set(
            key,
            `with child as (select ${col} as from_field from ${from} where ${col} is not null),\n` +
              `parent as (select ${args.field} as to_field from ${args.to})\n` +
              `select from_field from child left join parent on child.from_field = parent.to_field\n` +
              `where parent.to_field is null`,
          );
        else throw new Error(`no dbt test ${kind}`);
      }
    }
  for (const f of files.filter((x) => /^tests\/[^/]+\.sql$/.test(x.path)))
    tests.set(
      f.path.slice('tests/'.length, -'.sql'.length).replace(/_primary_key$/, '.primary_key'),
      renderJinja(f.content, ctx),
    );
  const modelSql = (name: string) => renderJinja(file(`models/${name}.sql`), ctx);
  return { models: models.map((m) => m.name as string), modelSql, ref: ctx.ref, tests };
}

// ---- dimas's side ----

async function monitoringAlerts(id = workspaceId) {
  const queued = await enqueueMonitoringRun(server.deps, {
    organizationId: tenant.organization.id,
    workspaceId: id,
    reason: 'on_demand',
  });
  const run = await until(
    `run ${queued.run_id}`,
    () => server.deps.jobs.getRun(queued.run_id, tenant.organization.id),
    (r) => !!r && ['succeeded', 'failed', 'cancelled'].includes(r.status),
  );
  expect(run!.status, JSON.stringify(run)).toBe('succeeded');
  return run!.result as Record<string, any>;
}

async function activeAlerts(workspace = workspaceName) {
  const res = await call(server, 'GET', '/api/api/alerts/active', {
    token: tenant.admin.token,
    query: { workspace },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.alerts as any[];
}

/** The project as generated from the workspace's schema.json, over the crafted source tables. */
async function generatedProject(): Promise<ProjectFile[]> {
  const schema = (await api('GET', '/api/schemas/workspace')).body.schema;
  const source = (table: string, fields: Record<string, string>): Mapping => ({
    table_name: '',
    tables: { [`${SHOP}.${table}`]: { relationship: 'primary' } },
    connections: Object.entries(fields).map(([target, column]) => ({
      source_field: `${SHOP}.${table}.${column}`,
      target_field: target,
      status: 'confirmed' as const,
      confidence: 1,
    })),
  });
  const mappings: Record<string, Mapping> = {
    Customer: source(KUNDEN, { UserId: 'Kund Id', select: 'Kund Name', Group: 'Grp', Ref: 'ref' }),
    order: source('order', { order_id: 'id', line: 'line', CustomerRef: 'kunde', From: 'from' }),
  };
  return generateDbtProject({
    projectName: 'pma',
    models: schema.tables.map((target: TargetTable) => ({
      mapping: { ...mappings[target.name], table_name: target.name },
      target,
    })),
  });
}

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema "Shop ""Data"" Ü"; create schema app; create schema mart;
    create table "Shop ""Data"" Ü"."Kunden {{x}}" ("Kund Id" int, "Kund Name" text, "Grp" text, ref int);
    insert into "Shop ""Data"" Ü"."Kunden {{x}}" values
      (1, 'O''Brien', 'A', 1), (2, '{{ x }}', 'B', 1), (3, 'ref(''x'')', null, 42), (4, 'a"b', 'C', null),
      (5, 'Zürich', 'C', 5), (5, 'Other', 'D', 5), (6, 'Nope', null, 6), (7, 'O''Brien', 'E', 43);
    create table app.people as select * from "Shop ""Data"" Ü"."Kunden {{x}}";
    create table "Shop ""Data"" Ü"."order" (id int, line int, kunde int, "from" text);
    insert into "Shop ""Data"" Ü"."order" values
      (1, 1, 1, 'web'), (1, 1, 9, null), (2, 1, 5, 'shop'), (2, 2, null, 'x'), (3, 1, 8, 'y');`);
  server = await startTestServer();
  tenant = await createTenant(server);
  workspaceName = unique('pma');
  await createWorkspace(server, tenant.admin.token, {
    name: workspaceName,
    source_config: pgConfig(warehouse.name, { schemas: ['app'] }),
    target_config: pgConfig(warehouse.name, { schemas: ['mart'] }),
    target_schema: targetSchema,
  });
  expect((await api('POST', '/api/workspaces/select', { workspace_name: workspaceName })).status).toBe(200);
  workspaceId = (
    await (server.deps.orm.em.fork() as EntityManager).findOneOrFail(Workspace, {
      name: workspaceName,
      organization: tenant.organization.id,
    })
  ).id;
}, 120_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('the project and monitoring run one list of tests', () => {
  it('tests keys and NOT NULL columns in both, with nothing stored, and schedules such a workspace', async () => {
    // Nothing stored: no sync, no PUT …/test. dbt's project tests the key and the NOT NULL column.
    const group = await api('GET', testPath('Customer', 'Group'));
    expect(group.body).toMatchObject({ configured: false, config: null, implied: ['not_null'] });
    expect((await api('GET', testPath('Customer', 'UserId'))).body.implied).toEqual(['unique', 'not_null']);
    expect((await api('GET', testPath('order', 'line'))).body.implied).toEqual(['not_null']);

    // The tables are not there yet: tests implied by schema.json alone raise no alert.
    const before = await monitoringAlerts();
    expect(before.failures).toEqual([]);
    expect(await activeAlerts()).toEqual([]);

    // A workspace with keys and nothing configured is scheduled, as its project has tests.
    const keyed = unique('pmk');
    await createWorkspace(server, tenant.admin.token, {
      name: keyed,
      select: false,
      target_config: pgConfig(warehouse.name, { schemas: ['mart'] }),
      target_schema: { ...targetSchema, tables: [targetSchema.tables[1]] },
    });
    const keyedId = (
      await (server.deps.orm.em.fork() as EntityManager).findOneOrFail(Workspace, {
        name: keyed,
        organization: tenant.organization.id,
      })
    ).id;
    const due = await runDueMonitoring(server.deps, { organizationId: tenant.organization.id });
    expect(due.monitoring).toContain(keyedId);
  });

  it('counts every test of the generated project as `dbt test` does, on names dbt reads otherwise', async () => {
    for (const [table, column, config] of [
      ['Customer', 'select', { accepted_values: ACCEPTED }],
      ['Customer', 'Ref', { relationships: { to: 'Customer', field: 'UserId' } }],
      ['order', 'CustomerRef', { relationships: { to: 'Customer', field: 'UserId' } }],
      ['order', 'From', { not_null: true }],
    ] as const) {
      const res = await api('PUT', testPath(table, column), { config });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
    }
    const files = await generatedProject();
    const dbt = dbtProject(files);

    // dbt run, then dbt test.
    const dbtFailures: Record<string, number> = {};
    await withClient(warehouse.url, async (client) => {
      for (const model of dbt.models)
        await client.query(`create table ${dbt.ref(model)} as (\n${dbt.modelSql(model)}\n)`);
      for (const [key, sql] of dbt.tests)
        dbtFailures[key] = (
          await client.query(`select count(*)::int as n from (\n${sql}\n) dbt_internal_test`)
        ).rows[0].n;
      // dimas reads the models (test-model) as dbt does.
      for (const model of dbt.models) {
        const ours = resolveProjectSql(files, files.find((f) => f.path === `models/${model}.sql`)!.content);
        const order = `order by 1, 2, 3`;
        expect((await client.query(`select * from (${ours}) m ${order}`)).rows).toEqual(
          (await client.query(`select * from (${dbt.modelSql(model)}) m ${order}`)).rows,
        );
      }
    });
    expect(dbtFailures).toEqual({
      'Customer.UserId.unique': 1,
      'Customer.UserId.not_null': 0,
      'Customer.select.accepted_values': 2,
      'Customer.Group.not_null': 2,
      'Customer.Ref.relationships': 2,
      'order.order_id.not_null': 0,
      'order.line.not_null': 0,
      'order.CustomerRef.relationships': 2,
      'order.From.not_null': 1,
      'order.primary_key': 1,
    });

    await monitoringAlerts();
    const alerts = (await activeAlerts()).filter((a) => a.kind === 'test');
    const dimas = Object.fromEntries(
      alerts.map((a) => [
        [a.table_name.split('.')[1], a.column_name, a.check].filter((x) => x !== null).join('.'),
        a.measured,
      ]),
    );
    // The same tests, and no other, with the same counts (a passing test raises no alert).
    expect(Object.fromEntries(Object.keys(dbtFailures).map((k) => [k, dimas[k] ?? 0]))).toEqual(dbtFailures);
    expect(Object.keys(dimas).filter((k) => !(k in dbtFailures))).toEqual([]);
    expect(alerts.find((a) => a.check === 'primary_key')?.message).toBe(
      '1 value(s) of mart.order.(order_id, line) repeat: primary_key fails (2 row(s) hold them)',
    );
  });

  it('test-model reads the quoted field and the written values back as dbt does', async () => {
    const steps: [string, unknown][] = [
      ['tables', { source_table: 'people', relationship: 'primary' }],
      ['connection', { connection: { source_field: 'people.Kund Id', target_field: 'UserId' } }],
      ['connection', { connection: { source_field: 'people.Kund Name', target_field: 'select' } }],
      ['connection', { connection: { source_field: 'people.Grp', target_field: 'Group' } }],
      ['connection', { connection: { source_field: 'people.ref', target_field: 'Ref' } }],
      ['commit-transformation', { message: 'Customer' }],
    ];
    for (const [route, body] of steps) {
      const step = await api('POST', `/api/mappings/Customer/${route}`, body);
      expect(step.status, `${route}: ${JSON.stringify(step.body)}`).toBe(200);
    }
    expect((await api('POST', '/api/pipelines/generate-project', {})).status).toBe(200);
    const res = await api('POST', '/api/pipelines/test-model', { table_name: 'Customer' });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const failures = Object.fromEntries(
      res.body.tests.map((t: any) => [
        `${t.column}.${t.test}`,
        t.status === 'error' ? t.message : t.failures,
      ]),
    );
    // app.people holds the rows the dbt model above was built from: the same counts.
    expect(failures).toEqual({
      'UserId.unique': 1,
      'UserId.not_null': 0,
      'select.accepted_values': 2,
      'Group.not_null': 2,
      'Ref.relationships': 2,
    });
  });
});

describe('a schema.json upload follows the rule of PUT …/test', () => {
  const doc = async () => structuredClone((await api('GET', '/api/schemas/workspace')).body.schema);
  const column = (schema: any, table: string, name: string) =>
    schema.tables.find((t: any) => t.name === table).columns.find((c: any) => c.name === name);

  it('refuses a test that does not apply to its column, as PUT …/test does, and stores nothing', async () => {
    const next = await doc();
    column(next, 'Customer', 'since').tests = { range: { min: 0 } };
    column(next, 'Customer', 'Ref').tests = { regex: '^[0-9]+$' };
    const res = await api('POST', '/api/schemas/workspace', { schema: next });
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect(res.body.issues).toEqual([
      {
        path: ['schema', 'tables', 0, 'columns', 3, 'tests', 'regex'],
        message:
          'regex does not apply to column Customer.Ref of type integer: a regular expression matches text',
      },
      {
        path: ['schema', 'tables', 0, 'columns', 4, 'tests', 'range', 'min'],
        message:
          'range does not apply to column Customer.since of type date: min 0 is not an ISO date or timestamp',
      },
    ]);
    const put = await api('PUT', testPath('Customer', 'since'), { config: { range: { min: 0 } } });
    expect(put.status).toBe(400);
    expect(put.body.message).toBe(res.body.issues[1].message);
    expect(column(await doc(), 'Customer', 'since').tests).toBeUndefined();

    const added = await api('POST', '/api/schemas/workspace/tables/Customer/columns', {
      column: { name: 'tier', type: 'boolean', tests: { accepted_values: ['gold'] } },
    });
    expect(added.status, JSON.stringify(added.body)).toBe(400);
    expect(added.body.issues).toEqual([
      {
        path: ['column', 'tests', 'accepted_values', 0],
        message:
          'accepted_values does not apply to column Customer.tier of type boolean: "gold" is not true or false',
      },
    ]);
  });

  it('keeps saving a document that held such a test before, and refuses a new one', async () => {
    const stored = await doc();
    column(stored, 'Customer', 'since').tests = { range: { min: 0 } };
    await (server.deps.orm.em.fork() as EntityManager)
      .getConnection()
      .execute(`update workspaces set target_schema = ?::jsonb where id = ?`, [
        JSON.stringify(stored),
        workspaceId,
      ]);
    // GET, edit elsewhere, POST back: the old test stays, GET …/test tells its problem.
    const edited = await doc();
    column(edited, 'Customer', 'Group').description = 'The group';
    const saved = await api('POST', '/api/schemas/workspace', { schema: edited });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    expect((await api('GET', testPath('Customer', 'since'))).body).toMatchObject({
      configured: true,
      problems: [
        'range does not apply to column Customer.since of type date: min 0 is not an ISO date or timestamp',
      ],
    });
    // A problem of its own is new: refused.
    column(edited, 'Customer', 'since').tests = { range: { min: 0, max: 5 } };
    const worse = await api('POST', '/api/schemas/workspace', { schema: edited });
    expect(worse.status).toBe(400);
    expect(worse.body.issues.map((i: any) => i.message)).toEqual([
      'range does not apply to column Customer.since of type date: max 5 is not an ISO date or timestamp',
    ]);
    // Put right, it saves.
    column(edited, 'Customer', 'since').tests = { range: { min: '2020-01-01' } };
    expect((await api('POST', '/api/schemas/workspace', { schema: edited })).status).toBe(200);
  });
});

describe('column monitoring ranges follow the rule of column tests', () => {
  const monitoring = (table: string, column: string, config: unknown) =>
    api('PUT', `/api/api/schema/config/columns/${table}/${column}/monitoring`, { config });

  it('refuses a bound that is no value of the column type, with the message of PUT …/test', async () => {
    for (const [table, column, range, message] of [
      [
        'Customer',
        'since',
        { min: 0 },
        'range does not apply to column Customer.since of type date: min 0 is not an ISO date or timestamp',
      ],
      [
        'Customer',
        'since',
        { max: '12' },
        'range does not apply to column Customer.since of type date: max "12" is not an ISO date or timestamp',
      ],
      [
        'Customer',
        'select',
        { min: 5 },
        `range does not apply to column Customer.select of type text: 5 is a number, and text compares character by character ('10' < '9')`,
      ],
    ] as const) {
      const res = await monitoring(table, column, { range });
      expect(res.status, `${JSON.stringify(range)} → ${JSON.stringify(res.body)}`).toBe(400);
      expect(res.body.message).toBe(message);
      expect(res.body.issues[0].path[0]).toBe('config');
      const test = await api('PUT', testPath(table, column), { config: { range } });
      expect(test.body.message).toBe(message);
    }
    expect((await monitoring('Customer', 'since', { range: { min: '2020-01-01' } })).status).toBe(200);
    expect((await monitoring('Customer', 'select', { range: { min: 'a', max: 'z' } })).status).toBe(200);
  });
});

describe('schema.json columns', () => {
  it('document `tests` and no `monitoring` key that nothing reads', async () => {
    const spec = JSON.stringify((await call(server, 'GET', '/api/openapi.json')).body);
    expect(spec.includes('tests, monitoring'), 'a monitoring key kept for nothing').toBe(false);
    expect(spec.includes('Monitoring thresholds are not set here')).toBe(true);
  });
});
