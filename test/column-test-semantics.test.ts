import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';
import { generateDbtProject } from '../src/transform/dbt.ts';
import type { Mapping, TargetTable } from '../src/transform/mapping.ts';
import { enqueueMonitoringRun } from '../src/modules/monitoring/monitoring.jobs.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';

/*
 * A column test reports the same failure count in dimas monitoring as `dbt test` of the generated
 * project on the same data, and a test that cannot apply to the column's type is refused when saved.
 * dimas's side runs through the API (tests PUT, a monitoring run, its alerts); dbt's side is the
 * generated schema.yml rendered with the SQL of dbt-core's built-in generic tests and run on the
 * warehouse (a real PostgreSQL scratch database on 127.0.0.1:5432, dropped at the end).
 */
const warehouse = scratchDatabase('cts');

const targetSchema = {
  name: 'cts',
  version: '1.0.0',
  tables: [
    {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false },
        { name: 'email', type: 'text' },
        { name: 'tier', type: 'text' },
        { name: 'score', type: 'numeric' },
        { name: 'active', type: 'boolean' },
        { name: 'signup', type: 'date' },
        { name: 'ref', type: 'uuid' },
        { name: 'attrs', type: 'json' },
      ],
    },
    {
      name: 'orders',
      primary_key: [],
      columns: [
        { name: 'order_id', type: 'integer' },
        { name: 'customer_id', type: 'integer' },
        { name: 'status', type: 'text' },
      ],
    },
  ],
};

let server: TestServer;
let tenant: Tenant;
let workspaceName: string;
let workspaceId: string;
const testPath = (table: string, column: string) => `/api/api/schema/config/columns/${table}/${column}/test`;
const put = (table: string, column: string, config: unknown) =>
  call(server, 'PUT', testPath(table, column), { token: tenant.admin.token, body: { config } });

/** One monitoring run, awaited: dimas's verdicts are its alerts (a passing test raises none). */
async function dimasFailures(): Promise<{ failures: Map<string, number>; alerts: any[] }> {
  const queued = await enqueueMonitoringRun(server.deps, {
    organizationId: tenant.organization.id,
    workspaceId,
    reason: 'on_demand',
  });
  const run = await until(
    `run ${queued.run_id}`,
    () => server.deps.jobs.getRun(queued.run_id, tenant.organization.id),
    (r) => !!r && ['succeeded', 'failed', 'cancelled'].includes(r.status),
  );
  expect(run!.status, JSON.stringify(run)).toBe('succeeded');
  const res = await call(server, 'GET', '/api/api/alerts/active', {
    token: tenant.admin.token,
    query: { workspace: workspaceName },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  const alerts = res.body.alerts.filter((a: any) => a.kind === 'test');
  const failures = new Map<string, number>(
    alerts.map((a: any) => [`${a.table_name.split('.')[1]}.${a.column_name}.${a.check}`, a.measured]),
  );
  return { failures, alerts };
}

// ---- dbt's side: the SQL of dbt-core's generic tests (global_project/macros/generic_test_sql) ----

const quoted = (name: string) => `"${name.replaceAll('"', '""')}"`;
const relation = (table: string) => `${quoted('mart')}.${quoted(table)}`;
/** How Jinja prints a YAML scalar inside '{{ value }}' (Python's str; a quote is not doubled). */
const jinja = (value: unknown) => (value === true ? 'True' : value === false ? 'False' : String(value));

function dbtTestSql(model: string, column: string, test: string | Record<string, any>): [string, string] {
  const kind = typeof test === 'string' ? test : Object.keys(test)[0];
  const args = typeof test === 'string' ? {} : test[kind];
  const col = quoted(column); // quote: true on every column of the generated schema.yml
  const from = relation(model);
  switch (kind) {
    case 'not_null':
      return [kind, `select ${col}\nfrom ${from}\nwhere ${col} is null`];
    case 'unique':
      return [
        kind,
        `select ${col} as unique_field, count(*) as n_records\nfrom ${from}\nwhere ${col} is not null\n` +
          `group by ${col}\nhaving count(*) > 1`,
      ];
    case 'accepted_values': {
      const values = (args.values as unknown[])
        .map((v) => (args.quote === false ? String(v) : `'${jinja(v)}'`))
        .join(',');
      return [
        kind,
        `with all_values as (\n  select ${col} as value_field, count(*) as n_records\n  from ${from}\n` +
          `  group by ${col}\n)\nselect *\nfrom all_values\nwhere value_field not in (${values})`,
      ];
    }
    case 'relationships': {
      const to = /^ref\('([^']+)'\)$/.exec(args.to)![1];
      return [
        kind,
        `with child as (\n  select ${col} as from_field\n  from ${from}\n  where ${col} is not null\n),\n` +
          `parent as (\n  select ${args.field} as to_field\n  from ${relation(to)}\n)\n` +
          `select from_field\nfrom child\nleft join parent on child.from_field = parent.to_field\n` +
          `where parent.to_field is null`,
      ];
    }
    default:
      throw new Error(`no dbt SQL for ${kind}`);
  }
}

/** The generated project's schema.yml, each data test run as dbt runs it: failures = count(*). */
async function dbtFailures(): Promise<Map<string, number>> {
  const schema = (await call(server, 'GET', '/api/schemas/workspace', { token: tenant.admin.token })).body
    .schema;
  const models = schema.tables.map((target: TargetTable) => ({
    mapping: {
      table_name: target.name,
      tables: { src: { relationship: 'primary' } },
      connections: [
        {
          source_field: `src.${target.columns[0].name}`,
          target_field: target.columns[0].name,
          status: 'confirmed',
          confidence: 1,
        },
      ],
    } as Mapping,
    target,
  }));
  const files = await generateDbtProject({ projectName: 'cts', models, defaultSourceSchema: 'shop' });
  const yml = parseYaml(files.find((f) => f.path === 'models/schema.yml')!.content);
  const failures = new Map<string, number>();
  await withClient(warehouse.url, async (client) => {
    for (const model of yml.models)
      for (const column of model.columns)
        for (const test of column.data_tests ?? []) {
          const [kind, sql] = dbtTestSql(model.name, column.name, test);
          // dbt's get_test_sql: fail_calc count(*) over the test's rows.
          const { rows } = await client.query(
            `select count(*)::int as failures from (\n${sql}\n) dbt_internal_test`,
          );
          failures.set(`${model.name}.${column.name}.${kind}`, rows[0].failures);
        }
  });
  return failures;
}

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema mart;
    create table mart.customers (customer_id int, email text, tier text, score numeric, active boolean,
      signup date, ref uuid, attrs jsonb);
    insert into mart.customers (customer_id, email, tier, score, active) values
      (1, 'a@x.io', 'gold', 1.50, true),
      (2, 'a@x.io', 'GOLD', 2, false),
      (3, 'a@x.io', 'GOLD', 2.0, null),
      (4, 'b@x.io', 'bronze', 7, true),
      (5, 'b@x.io', null, null, true),
      (6, 'c@x.io', 'silver', 1.5, true),
      (7, null, 'silver', 2, true),
      (7, null, 'gold', 2, true);
    create table mart.orders (order_id int, customer_id int, status text);
    insert into mart.orders values (1, 1, 'paid'), (2, 99, 'paid'), (3, 99, null), (4, 100, 'open'),
      (5, null, 'open'), (6, 6, 'paid');`);
  server = await startTestServer();
  tenant = await createTenant(server);
  workspaceName = unique('cts');
  await createWorkspace(server, tenant.admin.token, {
    name: workspaceName,
    target_config: pgConfig(warehouse.name, { schemas: ['mart'] }),
    target_schema: targetSchema,
  });
  const selected = await call(server, 'POST', '/api/workspaces/select', {
    token: tenant.admin.token,
    body: { workspace_name: workspaceName },
  });
  expect(selected.status).toBe(200);
  workspaceId = (
    await server.deps.orm.em.fork().findOneOrFail(Workspace, {
      name: workspaceName,
      organization: tenant.organization.id,
    })
  ).id;
}, 120_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('column tests count failures as dbt does', () => {
  it('reports for each test of the generated project the count `dbt test` reports', async () => {
    for (const [table, column, config] of [
      // The key: dbt declares not_null and unique on it; 7 is held twice.
      ['customers', 'customer_id', { not_null: true, unique: true }],
      // a@x.io ×3 and b@x.io ×2: 2 repeated values (5 rows hold them, 3 rows are surplus); the two
      // nulls repeat too, and count for not_null only.
      ['customers', 'email', { not_null: true, unique: true }],
      // GOLD ×2 and bronze: 2 values not accepted, 3 rows; null is no failure.
      ['customers', 'tier', { accepted_values: ['gold', 'silver'] }],
      // Compared as numbers: 1.50 is 1.5 and 2.0 is 2; only 7 fails.
      ['customers', 'score', { accepted_values: [1.5, 2] }],
      ['customers', 'active', { accepted_values: [true] }],
      // 99 ×2 and 100 have no customer: 3 rows; null is no failure.
      ['orders', 'customer_id', { relationships: { to: 'customers', field: 'customer_id' } }],
      ['orders', 'status', { not_null: true }],
    ] as const) {
      const res = await put(table, column, config);
      expect(res.status, JSON.stringify(res.body)).toBe(200);
    }

    const dbt = await dbtFailures();
    const dimas = await dimasFailures();
    expect(Object.fromEntries(dbt)).toEqual({
      'customers.customer_id.unique': 1,
      'customers.customer_id.not_null': 0,
      'customers.email.unique': 2,
      'customers.email.not_null': 2,
      'customers.tier.accepted_values': 2,
      'customers.score.accepted_values': 1,
      'customers.active.accepted_values': 1,
      'orders.customer_id.relationships': 3,
      'orders.status.not_null': 1,
    });
    // Every test of the project, and no other, with dbt's count (a passing one raises no alert).
    expect(Object.fromEntries([...dbt.keys()].map((k) => [k, dimas.failures.get(k) ?? 0]))).toEqual(
      Object.fromEntries(dbt),
    );
    expect([...dimas.failures.keys()].filter((k) => !dbt.has(k))).toEqual([]);

    // The rows holding the failing values, as the message tells them.
    const message = (key: string) =>
      dimas.alerts.find((a) => `${a.table_name.split('.')[1]}.${a.column_name}.${a.check}` === key)?.message;
    expect(message('customers.email.unique')).toBe(
      '2 value(s) of mart.customers.email repeat: unique fails (5 row(s) hold them)',
    );
    expect(message('customers.tier.accepted_values')).toBe(
      '2 value(s) of mart.customers.tier are not accepted: accepted_values fails (3 row(s) hold them)',
    );
    expect(message('orders.customer_id.relationships')).toBe(
      '3 row(s) of mart.orders fail relationships on customer_id',
    );
  });
});

describe('a test that does not apply to the column type', () => {
  it('is refused when saved, naming the column, its type and why', async () => {
    const before = await call(server, 'GET', testPath('customers', 'email'), { token: tenant.admin.token });
    for (const [table, column, config, message] of [
      [
        'customers',
        'email',
        { range: { min: 0, max: 100 } },
        `range does not apply to column customers.email of type text: 0 is a number, and text compares character by character ('10' < '9')`,
      ],
      [
        'customers',
        'active',
        { accepted_values: [1, 0] },
        'accepted_values does not apply to column customers.active of type boolean: 1 is not true or false',
      ],
      [
        'customers',
        'customer_id',
        { regex: '^[0-9]+$' },
        'regex does not apply to column customers.customer_id of type integer: a regular expression matches text',
      ],
      [
        'orders',
        'customer_id',
        { relationships: { to: 'customers', field: 'email' } },
        'relationships does not apply to column orders.customer_id of type integer: customers.email is text, and integer values cannot be compared with text ones',
      ],
      [
        'customers',
        'signup',
        { range: { min: 0 } },
        'range does not apply to column customers.signup of type date: min 0 is not an ISO date or timestamp',
      ],
      [
        'customers',
        'customer_id',
        { accepted_values: [1, 2.5] },
        'accepted_values does not apply to column customers.customer_id of type integer: 2.5 is not a whole number',
      ],
      [
        'customers',
        'customer_id',
        { accepted_values: [3_000_000_000] },
        'accepted_values does not apply to column customers.customer_id of type integer: 3000000000 is out of the range of integer',
      ],
      [
        'customers',
        'ref',
        { accepted_values: ['x'] },
        'accepted_values does not apply to column customers.ref of type uuid: "x" is not a UUID',
      ],
      [
        'customers',
        'tier',
        { accepted_values: ['gold', true] },
        `accepted_values does not apply to column customers.tier of type text: true is a boolean: give it as the text "true" (dbt would compare 'True' or 'False')`,
      ],
      [
        'customers',
        'attrs',
        { accepted_values: ['a'] },
        'accepted_values does not apply to column customers.attrs of type json: JSON documents are not compared with a list',
      ],
      [
        'customers',
        'active',
        { range: { min: 'a' } },
        'range does not apply to column customers.active of type boolean: a boolean column has no order to bound',
      ],
    ] as const) {
      const res = await put(table, column, config);
      expect(res.status, `${JSON.stringify(config)} → ${JSON.stringify(res.body)}`).toBe(400);
      expect(res.body.message).toBe(message);
      expect(res.body.issues[0].path[0]).toBe('config');
    }
    // Several problems at once are all told.
    const both = await put('customers', 'score', { regex: 'x', accepted_values: ['a'] });
    expect(both.status).toBe(400);
    expect(both.body.issues.map((i: { message: string }) => i.message)).toEqual([
      'accepted_values does not apply to column customers.score of type numeric: "a" is not a number',
      'regex does not apply to column customers.score of type numeric: a regular expression matches text',
    ]);
    // Nothing was stored.
    const after = await call(server, 'GET', testPath('customers', 'email'), { token: tenant.admin.token });
    expect(after.body).toEqual(before.body);
  });

  it('accepts the same kinds of test given in the column type', async () => {
    for (const [table, column, config] of [
      ['customers', 'signup', { range: { min: '2020-01-01', max: '2030-12-31T00:00:00Z' } }],
      ['customers', 'score', { range: { min: 0, max: '100.5' }, accepted_values: ['1.5', 2] }],
      ['customers', 'active', { accepted_values: [true, 'false'] }],
      ['customers', 'ref', { accepted_values: ['A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'] }],
      ['customers', 'tier', { accepted_values: ['gold', 'silver', 1], range: { min: 'a', max: 'z' } }],
      ['customers', 'attrs', { not_null: true, unique: true }],
    ] as const) {
      const res = await put(table, column, config);
      expect(res.status, `${JSON.stringify(config)} → ${JSON.stringify(res.body)}`).toBe(200);
      expect(res.body.problems).toEqual([]);
    }
  });

  it('keeps running one stored before such tests were refused, and says why it does not apply', async () => {
    // A schema.json stored before holds what PUT …/test (and a schema.json upload) refuses now.
    const doc = (await call(server, 'GET', '/api/schemas/workspace', { token: tenant.admin.token })).body
      .schema;
    const customers = doc.tables.find((t: { name: string }) => t.name === 'customers');
    const columnOf = (name: string) => customers.columns.find((c: { name: string }) => c.name === name);
    columnOf('customer_id').tests = { not_null: true, unique: true, regex: '^[0-6]$' };
    columnOf('score').tests = { accepted_values: ['high'] };
    await server.deps.orm.em
      .fork()
      .execute(`update workspaces set target_schema = ?::jsonb where id = ?`, [
        JSON.stringify(doc),
        workspaceId,
      ]);

    const got = await call(server, 'GET', testPath('customers', 'customer_id'), {
      token: tenant.admin.token,
    });
    expect(got.status).toBe(200);
    expect(got.body).toMatchObject({
      configured: true,
      config: { regex: '^[0-6]$' },
      problems: [
        'regex does not apply to column customers.customer_id of type integer: a regular expression matches text',
      ],
    });
    // As before: the regex runs on the integers' text (7 ×2 fails); a list the column's type cannot
    // hold makes its test fail to run, an alert of its own, and the table's other tests still run.
    const { alerts } = await dimasFailures();
    const byKey = new Map(alerts.map((a) => [a.check_key, a]));
    expect(byKey.get('test:mart.customers:customer_id:regex')).toMatchObject({ measured: 2 });
    expect(byKey.get('test:mart.customers:score:runs')?.message).toMatch(
      /The tests of mart.customers.score cannot run: .*numeric/,
    );
    expect(byKey.get('test:mart.customers:email:unique')).toMatchObject({ measured: 2 });
  });
});
