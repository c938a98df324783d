import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Mapping, TargetTable } from '../src/transform/mapping.ts';
import { generateSelectSql, materializeSql } from '../src/transform/sql.ts';
import { POSTGRES_TYPES } from '../src/warehouse/types.ts';
import { generatePythonScript } from '../src/transform/python.ts';
import { generateDbtProject, projectFingerprint } from '../src/transform/dbt.ts';
import { parse as parseYaml } from 'yaml';
import { scratchDatabase } from './helpers/scratch-db.ts';
import { parseCsv } from './helpers/csv.ts';

const run = promisify(execFile);

/*
 * The generators against a real PostgreSQL server (a scratch database, dropped afterwards): the
 * generated SQL and the generated Python script, fed CSV exports of the same source tables, must
 * produce exactly the same rows.
 */
const scratch = scratchDatabase('transform');
let client: pg.Client;
let workDir: string;

// Every value as PostgreSQL prints it (booleans t/f, numerics with their scale): compare as text.
const rawText = { getTypeParser: () => (value: string) => value } as unknown as typeof pg.types;

async function connect(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: scratch.url, types: rawText, options: '-c TimeZone=UTC' });
  await c.connect();
  return c;
}

beforeAll(async () => {
  await scratch.create();
  client = await connect();
  workDir = mkdtempSync(join(tmpdir(), 'dimas-transform-'));
  await client.query(`
    create schema shop;
    create table shop.customers (
      id integer primary key, email text, phone text, first_name text, last_name text,
      signup text, vip text, spend text, external_ref uuid, country_code varchar(10));
    create table shop.loyalty (customer_id integer, points text, tier text, updated_at timestamptz);
    insert into shop.customers values
      (1, '  John.Doe@Example.COM ', '(555) 123-4567', ' john', 'doe ', '2023-01-15', 't', '100.50',
          'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', 'us'),
      (2, 'JANE@EXAMPLE.com', '555.987.6543', 'JANE', 'smith', '2023-02-01', 'no', '0', null, 'GB '),
      (3, 'bob@test.org  ', '+44 20 7946 0958', 'bob', null, '2023-03-10', 'YES', null, null, null),
      (4, '"Quoted",Comma@X.io', '1-800-555-0199', null, null, null, null, '7', null, ''),
      (5, 'üNïcode@EXämple.de', '', 'emile', 'ZOLA', '2024-12-31', 'false', '10', null, 'fr'),
      (6, null, '  555 000 1111 ext', 'multi
line', 'o''brien', ' 2024-02-29 ', 'on', '-3.335', null, 'de');
    insert into shop.loyalty values
      (1, '250', ' gold ', '2024-01-02 03:04:05.5+02'),
      (2, null, '', '2024-05-06 07:08:09+00'),
      (3, ' 15 ', null, null),
      (99, '1', 'ghost', null);
  `);
});

afterAll(async () => {
  await client?.end();
  if (workDir) rmSync(workDir, { recursive: true, force: true });
  await scratch.drop();
});

const target: TargetTable = {
  name: 'customer_profiles',
  primary_key: ['customer_id'],
  columns: [
    { name: 'customer_id', type: 'integer', nullable: false },
    { name: 'email', type: 'text', nullable: true },
    { name: 'phone', type: 'text', nullable: true },
    { name: 'full_name', type: 'text', nullable: true },
    { name: 'signup_date', type: 'date', nullable: true },
    { name: 'is_vip', type: 'boolean', nullable: true },
    { name: 'lifetime_value', type: 'numeric', nullable: true },
    { name: 'loyalty_points', type: 'integer', nullable: false },
    { name: 'tier', type: 'text', nullable: true },
    { name: 'last_seen', type: 'timestamptz', nullable: true },
    { name: 'external_id', type: 'uuid', nullable: true },
    { name: 'country', type: 'text', nullable: true },
    { name: 'segment', type: 'text', nullable: true },
    { name: 'preferences', type: 'json', nullable: true },
  ],
};

const phoneDigits = `regexp_replace(customers.phone, '[^0-9]', '', 'g')`;
const mapping: Mapping = {
  table_name: 'customer_profiles',
  tables: {
    'shop.customers': { relationship: 'primary' },
    'shop.loyalty': {
      relationship: 'join',
      join_type: 'left',
      join_on: 'shop.customers.id = loyalty.customer_id',
    },
  },
  connections: [
    { source_field: 'shop.customers.id', target_field: 'customer_id', status: 'confirmed', confidence: 1 },
    { source_field: 'shop.customers.email', target_field: 'email', status: 'confirmed', confidence: 0.9 },
    {
      source_field: 'shop.loyalty.updated_at',
      target_field: 'last_seen',
      status: 'suggested',
      confidence: 0.7,
    },
    {
      source_field: 'shop.customers.signup',
      target_field: 'last_seen',
      status: 'suggested',
      confidence: 0.4,
    },
    {
      source_field: 'shop.customers.external_ref',
      target_field: 'external_id',
      status: 'confirmed',
      confidence: 0.8,
    },
  ],
  transformations: {
    email: { expression: 'lower(trim(customers.email))', description: 'normalized e-mail' },
    phone: {
      expression: `CASE WHEN ${phoneDigits} ~ '^1?[0-9]{10}$' THEN '+1' || right(${phoneDigits}, 10)
        WHEN customers.phone LIKE '+%' THEN '+' || ${phoneDigits}
        ELSE nullif(${phoneDigits}, '') END`,
      description: 'E.164 where possible',
    },
    full_name: {
      expression: `initcap(concat_ws(' ', btrim(customers.first_name), btrim(customers.last_name)))`,
    },
    signup_date: { expression: 'CAST(customers.signup AS date)' },
    is_vip: { expression: 'customers.vip::boolean' },
    lifetime_value: { expression: 'round(customers.spend::numeric / 3, 2)' },
    loyalty_points: { expression: 'COALESCE(loyalty.points::integer, 0)' },
    tier: { expression: `upper(coalesce(nullif(trim(loyalty.tier), ''), 'basic'))` },
    country: { expression: `upper(nullif(btrim(customers.country_code), ''))` },
    segment: {
      expression: `CASE WHEN customers.id IN (1, 2) AND NOT (customers.vip IS NULL) THEN 'early'
        WHEN customers.id BETWEEN 3 AND 4 THEN concat('mid-', customers.id, '-', customers.vip::boolean) ELSE NULL END`,
    },
  },
};

/** What COPY … (FORMAT csv, HEADER, NULL '\N') writes. */
function toCsv(columns: string[], rows: Record<string, string | null>[]): string {
  const cell = (v: string | null) =>
    v === null ? '\\N' : /[",\n\r]|^\\N$/.test(v) ? `"${v.replaceAll('"', '""')}"` : v;
  return (
    [columns.map((c) => cell(c)), ...rows.map((r) => columns.map((c) => cell(r[c])))]
      .map((l) => l.join(','))
      .join('\n') + '\n'
  );
}

async function exportTable(table: string): Promise<string> {
  const res = await client.query(`select * from ${table}`);
  return toCsv(
    res.fields.map((f) => f.name),
    res.rows,
  );
}

async function sourceColumnTypes(): Promise<Record<string, Record<string, string>>> {
  const res = await client.query(
    `select table_schema || '.' || table_name as key, column_name, data_type from information_schema.columns
     where table_schema = 'shop'`,
  );
  const out: Record<string, Record<string, string>> = {};
  for (const r of res.rows) (out[r.key] ??= {})[r.column_name] = r.data_type;
  return out;
}

describe('generated SQL and Python agree on a real PostgreSQL database', () => {
  it('maps two joined tables with messy data to the same rows', async () => {
    const { sql, columns } = await generateSelectSql(mapping, target);
    expect(columns.map((c) => c.name)).toEqual(target.columns.map((c) => c.name));
    const sqlRows = (await client.query(`select * from (${sql}) t order by customer_id`)).rows.map((r) =>
      target.columns.map((c) => r[c.name] as string | null),
    );
    expect(sqlRows).toHaveLength(6);
    // Spot checks that the transformations really did their work in the database.
    expect(sqlRows[0]).toEqual([
      '1',
      'john.doe@example.com',
      '+15551234567',
      'John Doe',
      '2023-01-15',
      't',
      '33.50',
      '250',
      'GOLD',
      '2024-01-02 01:04:05.5+00',
      'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
      'US',
      'early',
      null,
    ]);
    expect(sqlRows[1].slice(0, 9)).toEqual([
      '2',
      'jane@example.com',
      '+15559876543',
      'Jane Smith',
      '2023-02-01',
      'f',
      '0.00',
      '0',
      'BASIC',
    ]);
    expect(sqlRows[2].slice(2, 4)).toEqual(['+442079460958', 'Bob']);

    writeFileSync(join(workDir, 'shop.customers.csv'), await exportTable('shop.customers'));
    writeFileSync(join(workDir, 'shop.loyalty.csv'), await exportTable('shop.loyalty'));
    const script = await generatePythonScript(mapping, target, { sourceColumns: await sourceColumnTypes() });
    const scriptPath = join(workDir, 'customer_profiles.py');
    writeFileSync(scriptPath, script);
    const outPath = join(workDir, 'out.csv');
    await run('python3', [scriptPath, '--input-dir', workDir, '--null', '\\N', '--output', outPath]);
    const [header, ...pyRows] = parseCsv(readFileSync(outPath, 'utf8'), '\\N');
    expect(header).toEqual(target.columns.map((c) => c.name));
    pyRows.sort((a, b) => Number(a[0]) - Number(b[0]));
    expect(pyRows).toEqual(sqlRows);
  });

  it('reports a value the cast refuses, in SQL and in Python alike', async () => {
    const bad: Mapping = {
      ...mapping,
      transformations: { ...mapping.transformations, tier: { expression: 'loyalty.tier::integer' } },
    };
    const { sql } = await generateSelectSql(bad, target);
    await expect(client.query(sql)).rejects.toThrow(/invalid input syntax for type integer: " gold "/);
    const script = await generatePythonScript(bad, target, { sourceColumns: await sourceColumnTypes() });
    const scriptPath = join(workDir, 'bad.py');
    writeFileSync(scriptPath, script);
    const failed = await run('python3', [scriptPath, '--input-dir', workDir, '--null', '\\N']).catch(
      (e) => e,
    );
    expect(failed.code).toBe(1);
    expect(failed.stderr).toMatch(/invalid input syntax for type integer: " gold "/);
  });
});

describe('materialization into the target table', () => {
  const columnsDdl = target.columns
    .map(
      (c) =>
        `"${c.name}" ${POSTGRES_TYPES[c.type as keyof typeof POSTGRES_TYPES]}${c.nullable ? '' : ' not null'}`,
    )
    .join(', ');

  async function inTransaction(statements: string[]) {
    await client.query('begin');
    try {
      for (const s of statements) await client.query(s);
      await client.query('commit');
    } catch (error) {
      await client.query('rollback');
      throw error;
    }
  }

  it('swaps a fully loaded staging table in; readers see the old rows until then', async () => {
    await client.query(`create table public.customer_profiles (${columnsDdl}, primary key (customer_id))`);
    await client.query(`insert into public.customer_profiles (customer_id, loyalty_points) values (42, 1)`);
    const { sql, columns } = await generateSelectSql(mapping, target);
    const plan = materializeSql({
      target: { schema: 'public', name: 'customer_profiles' },
      columns: columns.map((c) => c.name),
      selectSql: sql,
      runId: 'run-1',
    });
    await inTransaction(plan.prepare);
    await client.query(plan.load);
    const reader = await connect();
    try {
      expect((await reader.query('select customer_id from public.customer_profiles')).rows).toEqual([
        { customer_id: '42' },
      ]);
      await inTransaction(plan.swap);
      const after = await reader.query('select customer_id, email from public.customer_profiles order by 1');
      expect(after.rows.map((r) => r.customer_id)).toEqual(['1', '2', '3', '4', '5', '6']);
    } finally {
      await reader.end();
    }
    const expected = (await client.query(`select * from (${sql}) t order by customer_id`)).rows;
    expect((await client.query('select * from public.customer_profiles order by customer_id')).rows).toEqual(
      expected,
    );
    // The primary key came along with LIKE … INCLUDING ALL; staging and old tables are gone.
    await expect(
      client.query(`insert into public.customer_profiles (customer_id, loyalty_points) values (1, 0)`),
    ).rejects.toThrow(/duplicate key/);
    const leftovers = await client.query(
      `select tablename from pg_tables where schemaname = 'public' and tablename like 'customer_profiles\\_\\_%'`,
    );
    expect(leftovers.rows).toEqual([]);
  });

  it('leaves the previous content intact when the load fails', async () => {
    const before = (await client.query('select * from public.customer_profiles order by customer_id')).rows;
    const bad: Mapping = {
      ...mapping,
      transformations: { ...mapping.transformations, tier: { expression: 'loyalty.tier::integer::text' } },
    };
    const { sql, columns } = await generateSelectSql(bad, target);
    const plan = materializeSql({
      target: { schema: 'public', name: 'customer_profiles' },
      columns: columns.map((c) => c.name),
      selectSql: sql,
      runId: 'run-2',
    });
    await inTransaction(plan.prepare);
    await expect(client.query(plan.load)).rejects.toThrow(/invalid input syntax/);
    await inTransaction(plan.cleanup);
    expect((await client.query('select * from public.customer_profiles order by customer_id')).rows).toEqual(
      before,
    );
    const staging = await client.query(`select to_regclass('public.${plan.staging.name}') as t`);
    expect(staging.rows[0].t).toBeNull();
  });
});

describe('SQL generation rules', () => {
  it('is deterministic, quotes identifiers and casts to the target types', async () => {
    const small: Mapping = {
      table_name: 'people',
      tables: { customers: { relationship: 'primary' } },
      connections: [
        { source_field: 'customers.Email', target_field: 'email', status: 'confirmed', confidence: 1 },
      ],
      transformations: { id: { expression: 'customers.id::bigint' } },
    };
    const people: TargetTable = {
      name: 'people',
      primary_key: ['id'],
      columns: [
        { name: 'id', type: 'bigint', nullable: false },
        { name: 'email', type: 'text' },
        { name: 'born', type: 'date' },
        { name: 'Select', type: 'json' },
      ],
    };
    const first = await generateSelectSql(small, people);
    const second = await generateSelectSql(structuredClone(small), people);
    expect(first.sql).toBe(second.sql);
    expect(first.sql).toBe(
      [
        'SELECT',
        '  CAST((customers.id::bigint) AS bigint) AS "id",',
        '  CAST("customers"."Email" AS text) AS "email",',
        '  CAST(NULL AS date) AS "born",',
        '  CAST(NULL AS jsonb) AS "Select"',
        'FROM "customers"',
      ].join('\n'),
    );
  });

  it('lists every unmapped NOT NULL field and every bad reference in one error', async () => {
    const broken: Mapping = {
      table_name: 'customer_profiles',
      tables: {
        'shop.customers': { relationship: 'primary' },
        'shop.orders': {
          relationship: 'join',
          join_type: 'inner',
          join_on: 'orders.customer_id = payments.id',
        },
        'shop.returns': { relationship: 'join', join_on: 'returns.refund_id = refunds.id' },
        'shop.refunds': { relationship: 'join', join_on: 'refunds.return_id = returns.id' },
      },
      connections: [
        { source_field: 'shop.nowhere.x', target_field: 'email', status: 'confirmed', confidence: 1 },
      ],
      transformations: { phone: { expression: 'lower(customers.phone' }, nope: { expression: '1' } },
    };
    const error = await generateSelectSql(broken, target).catch((e) => e);
    expect(error.code).toBe('BAD_REQUEST');
    const messages = error.details.issues.map((i: { message: string }) => i.message).join('\n');
    expect(messages).toMatch(/Unmapped NOT NULL fields of customer_profiles: customer_id, loyalty_points/);
    expect(messages).toMatch(/payments\.id names table payments/);
    expect(messages).toMatch(/Join shop\.refunds is not reachable/);
    expect(messages).toMatch(/Join shop\.returns is not reachable/);
    expect(messages).toMatch(/shop\.nowhere\.x names table shop\.nowhere/);
    expect(messages).toMatch(/Transformation for phone: expression syntax error/);
    expect(messages).toMatch(/customer_profiles has no column nope/);
  });

  it('orders joins so that each ON only uses tables already joined', async () => {
    const chained: Mapping = {
      table_name: 't',
      tables: {
        c: { relationship: 'join', join_on: 'b.id = c.b_id' },
        a: { relationship: 'primary' },
        b: { relationship: 'join', join_type: 'inner', join_on: 'a.id = b.a_id' },
      },
      connections: [{ source_field: 'c.x', target_field: 'x', status: 'confirmed' }],
    };
    const { sql } = await generateSelectSql(chained, { name: 't', columns: [{ name: 'x', type: 'text' }] });
    expect(sql.split('\n').slice(-3)).toEqual([
      'FROM "a"',
      'INNER JOIN "b" ON (a.id = b.a_id)',
      'LEFT JOIN "c" ON (b.id = c.b_id)',
    ]);
  });

  it('refuses what the Python translation does not support, naming it', async () => {
    const withNow: Mapping = {
      table_name: 'people',
      tables: { customers: { relationship: 'primary' } },
      connections: [],
      transformations: { born: { expression: `customers.born + (select 1)` } },
    };
    const people: TargetTable = { name: 'people', columns: [{ name: 'born', type: 'date' }] };
    await expect(generatePythonScript(withNow, people)).rejects.toThrow(/SubLink is not supported/);
    withNow.transformations!.born.expression = 'to_char(customers.born)';
    await expect(generatePythonScript(withNow, people)).rejects.toThrow(
      /function to_char\(\) is not supported/,
    );
  });
});

describe('dbt project', () => {
  const options = () => ({
    projectName: 'Acme Workspace',
    models: [
      {
        mapping,
        target: {
          ...target,
          description: 'One row per customer',
          columns: target.columns.map((c) =>
            c.name === 'tier'
              ? { ...c, description: 'Loyalty tier', tests: { accepted_values: ['GOLD', 'BASIC'] } }
              : c,
          ),
        },
      },
    ],
    columnTests: {
      customer_profiles: {
        email: { unique: true },
        external_id: { relationships: { to: 'identities', field: 'id' } },
      },
    },
  });

  it('writes dbt_project.yml, models with sources, schema.yml with data_tests and sources.yml', async () => {
    const files = await generateDbtProject(options());
    expect(files.map((f) => f.path)).toEqual([
      'dbt_project.yml',
      'models/schema.yml',
      'models/sources.yml',
      'macros/generate_schema_name.sql',
      'models/customer_profiles.sql',
    ]);
    const file = (path: string) => files.find((f) => f.path === path)!.content;
    const project = parseYaml(file('dbt_project.yml'));
    expect(project).toMatchObject({ name: 'acme_workspace', profile: 'acme_workspace', 'config-version': 2 });
    const schema = parseYaml(file('models/schema.yml'));
    const model = schema.models[0];
    expect(model).toMatchObject({ name: 'customer_profiles', description: 'One row per customer' });
    const column = (name: string) => model.columns.find((c: { name: string }) => c.name === name);
    expect(column('customer_id').data_tests).toEqual(['unique', 'not_null']);
    expect(column('loyalty_points').data_tests).toEqual(['not_null']);
    expect(column('email').data_tests).toEqual(['unique']);
    expect(column('tier')).toMatchObject({
      description: 'Loyalty tier',
      data_type: 'text',
      data_tests: [{ accepted_values: { values: ['GOLD', 'BASIC'] } }],
    });
    expect(column('external_id').data_tests).toEqual([
      // Quoted: dbt's test writes the field as given, and the model names its columns quoted.
      { relationships: { to: "ref('identities')", field: '"id"' } },
    ]);
    expect(column('country').data_tests).toBeUndefined();
    expect(parseYaml(file('models/sources.yml'))).toEqual({
      version: 2,
      sources: [{ name: 'shop', schema: 'shop', tables: [{ name: 'customers' }, { name: 'loyalty' }] }],
    });
    // The model is the generated SQL over dbt sources: rendered, it gives the same rows.
    const modelSql = file('models/customer_profiles.sql');
    expect(modelSql).toContain(`FROM {{ source('shop', 'customers') }}`);
    const rendered = modelSql.replace(/\{\{ source\('(\w+)', '(\w+)'\) \}\}/g, '"$1"."$2"');
    const { sql } = await generateSelectSql(mapping, target);
    const [a, b] = await Promise.all([
      client.query(`select * from (${rendered}) t order by 1`),
      client.query(`select * from (${sql}) t order by 1`),
    ]);
    expect(a.rows).toEqual(b.rows);
  });

  it('tests a composite key as a combination and quotes columns, so valid data passes as dbt runs it', async () => {
    await client.query(`
      create table shop.order_lines (order_id integer, customer_name text, "from" text, "Group" text,
        "UserId" integer);
      insert into shop.order_lines values
        (1, 'ann', 'web', 'A', 10), (1, 'bob', 'shop', 'B', 11), (2, 'ann', 'web', 'A', 12);`);
    const lines: TargetTable = {
      name: 'order_lines',
      primary_key: ['order_id', 'customer_name'],
      columns: [
        { name: 'order_id', type: 'integer', nullable: false },
        { name: 'customer_name', type: 'text', nullable: false },
        { name: 'from', type: 'text', tests: { accepted_values: ['web', 'shop'] } },
        { name: 'Group', type: 'text', tests: { not_null: true } },
        { name: 'UserId', type: 'integer', tests: { unique: true } },
      ],
    };
    const files = await generateDbtProject({
      projectName: 'lines',
      models: [
        {
          mapping: {
            table_name: 'order_lines',
            tables: { 'shop.order_lines': { relationship: 'primary' } },
            connections: lines.columns.map((c) => ({
              source_field: `shop.order_lines.${c.name}`,
              target_field: c.name,
              status: 'confirmed' as const,
            })),
          },
          target: lines,
        },
      ],
    });
    const file = (path: string) => files.find((f) => f.path === path)?.content;
    const columns = parseYaml(file('models/schema.yml')!).models[0].columns as {
      name: string;
      quote?: boolean;
      data_tests?: (string | Record<string, any>)[];
    }[];
    // Build the model, then run each test as dbt renders it: `{{ column_name }}` is the name as
    // written, quoted when the column says `quote: true`; a test passes when it returns no rows.
    const model = file('models/order_lines.sql')!.replace(
      /\{\{ source\('(\w+)', '(\w+)'\) \}\}/g,
      '"$1"."$2"',
    );
    await client.query(`create table public.order_lines as ${model}`);
    const dbtTests = columns.flatMap((c) =>
      (c.data_tests ?? []).map((test) => {
        const col = c.quote ? `"${c.name.replaceAll('"', '""')}"` : c.name;
        if (test === 'unique')
          return `select ${col} as unique_field, count(*) as n_records from public.order_lines
                   where ${col} is not null group by ${col} having count(*) > 1`;
        if (test === 'not_null') return `select ${col} from public.order_lines where ${col} is null`;
        const values = (test as Record<string, any>).accepted_values.values as string[];
        return `select ${col} as value_field from public.order_lines
                 where ${col} not in (${values.map((v) => `'${v}'`).join(', ')})`;
      }),
    );
    for (const sql of dbtTests) expect((await client.query(sql)).rows, sql).toEqual([]);
    const keyTest = file('tests/order_lines_primary_key.sql')!.replace(
      `{{ ref('order_lines') }}`,
      'public.order_lines',
    );
    expect((await client.query(keyTest)).rows).toEqual([]);
    // Each key column alone repeats (order 1 has two lines): not_null only, the pair is tested apart.
    expect(columns.map((col) => [col.name, col.data_tests])).toEqual([
      ['order_id', ['not_null']],
      ['customer_name', ['not_null']],
      ['from', [{ accepted_values: { values: ['web', 'shop'] } }]],
      ['Group', ['not_null']],
      ['UserId', ['unique']],
    ]);
    // The key test does catch a repeated combination.
    await client.query(`insert into public.order_lines values (1, 'ann', 'web', 'A', 13)`);
    expect((await client.query(keyTest)).rows).toEqual([
      { order_id: '1', customer_name: 'ann', duplicates: '2' },
    ]);
  });

  it('fingerprints its inputs so drift shows', async () => {
    const base = projectFingerprint(options());
    expect(projectFingerprint(options())).toBe(base);
    const changed = options();
    changed.models[0].mapping = {
      ...mapping,
      transformations: { ...mapping.transformations, tier: { expression: 'lower(loyalty.tier)' } },
    };
    expect(projectFingerprint(changed)).not.toBe(base);
  });
});
