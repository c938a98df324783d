import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { proposeCleaning, type CleaningProposal } from '../src/modules/discovery/cleaning.ts';
import { profileTable, sourceTableOf } from '../src/llm/profile.ts';
import type { Mapping, TargetTable } from '../src/transform/mapping.ts';
import { generateSelectSql } from '../src/transform/sql.ts';
import { generatePythonScript } from '../src/transform/python.ts';
import { demoSchemaSql, demoSourceStatements } from '../seeds/demo-source/generate.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, call, createTenant, createWorkspace, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { parseCsv } from './helpers/csv.ts';

/*
 * Discovery's cleaning proposals on a real PostgreSQL source: each kind is proposed from the profiled
 * column, carries the share of sampled values it converts, and gives the same values in the generated
 * SQL (what preview and materialize run) and in the generated Python script fed CSV exports. Then the
 * demo shop over HTTP: discovery proposes the country and phone cleaning of `customers`, the country
 * groups into a handful of codes, and a person's own transformation is never overwritten.
 */
const run = promisify(execFile);
const source = scratchDatabase('cleaning');
const demo = scratchDatabase('cleaning_demo');
// Every value as PostgreSQL prints it, so SQL and Python compare as text.
const rawText = { getTypeParser: () => (value: string) => value } as unknown as typeof pg.types;
let client: pg.Client;
let workDir: string;

const query = async (sql: string, params: unknown[] = []) => (await client.query(sql, params)).rows;

beforeAll(async () => {
  await source.create();
  await demo.create();
  client = new pg.Client({ connectionString: source.url, types: rawText, options: '-c TimeZone=UTC' });
  await client.connect();
  workDir = mkdtempSync(join(tmpdir(), 'dimas-cleaning-'));
  await client.query(`
    create schema app;
    create table app.accounts (
      id integer primary key, country text, phone text, email text, created bigint, last_seen_ms bigint,
      signup_epoch text, newsletter text, opted_out boolean, unsubscribed text, balance_cents integer,
      amount integer, currency text);
    insert into app.accounts values
      (1, 'United States', '(212) 555-0101', '  Ann@Example.COM ', 1700000000, 1700000000123, '1600000000', 'yes', false, 'N', 1999, 2500, 'USD'),
      (2, 'U.S.', '1-212-555-0102', 'bob@example.com', 1700000001, 1700000001999, '1600000001', 'No', true, 'y', 0, 100, 'USD'),
      (3, 'Deutschland', '030 1234567', 'CARL@EXAMPLE.DE', 1600000000, 1600000000500, '1500000000', 'Y', null, null, -250, 99, 'EUR'),
      (4, 'de', '+49 (0)30 7654321', null, null, null, null, 'n', false, 'false', null, null, 'EUR'),
      (5, 'United Kingdom', '020 7946 0958', 'dee@example.co.uk', 1500000000, 1500000000000, '1400000000', '1', true, 'TRUE', 5, 1, 'GBP'),
      (6, 'UK', '0044 20 7946 0000', 'eve@example.org', 1400000000, 1400000000001, '1300000000', '0', false, '0', 100000, 123456, 'GBP'),
      (7, 'England', '07700 900123', 'fay@example.org', 1300000000, 1300000000999, '1200000000', 'TRUE', false, '1', 7, 7, 'GBP'),
      (8, 'France', '01 23 45 67 89', 'gus@example.fr', 1200000000, 1200000000002, '1100000000', 'false', true, 'no', 12, 12, 'EUR'),
      (9, null, '555 0199', 'hal@example.com', 1100000000, 1100000000003, '1000000000', 'yes', false, 'yes', 1, 1, 'USD'),
      (10, 'fr', '', 'ivy@example.com', 1000000000, 1000000000004, '999999999', null, false, 'off', 3, 3, 'EUR');
  `);
});

afterAll(async () => {
  await client?.end();
  await server?.close();
  if (workDir) rmSync(workDir, { recursive: true, force: true });
  await source.drop();
  await demo.drop();
});

const target: TargetTable = {
  name: 'accounts',
  primary_key: ['account_id'],
  columns: [
    { name: 'account_id', type: 'integer', nullable: false },
    { name: 'country_code', type: 'text' },
    { name: 'phone', type: 'text' },
    { name: 'email', type: 'text' },
    { name: 'created_at', type: 'timestamptz' },
    { name: 'last_seen_at', type: 'timestamptz' },
    { name: 'signed_up_at', type: 'timestamptz' },
    { name: 'newsletter', type: 'boolean' },
    { name: 'email_opt_in', type: 'boolean' },
    { name: 'sms_opt_in', type: 'boolean' },
    { name: 'balance', type: 'numeric' },
    { name: 'amount', type: 'numeric' },
  ],
};
const CONNECTIONS: Record<string, string> = {
  account_id: 'id',
  country_code: 'country',
  phone: 'phone',
  email: 'email',
  created_at: 'created',
  last_seen_at: 'last_seen_ms',
  signed_up_at: 'signup_epoch',
  newsletter: 'newsletter',
  email_opt_in: 'opted_out',
  sms_opt_in: 'unsubscribed',
  balance: 'balance_cents',
  amount: 'amount',
};

/** CSV export of a table as COPY writes it, NULL as \N. */
async function exportCsv(url: string, table: string): Promise<string> {
  const c = new pg.Client({ connectionString: url, types: rawText, options: '-c TimeZone=UTC' });
  await c.connect();
  try {
    const res = await c.query(`select * from ${table}`);
    const cell = (v: string | null) =>
      v === null ? '\\N' : v === '' || /[",\n\r\\]/.test(v) ? `"${v.replaceAll('"', '""')}"` : v;
    const names = res.fields.map((f) => f.name);
    return (
      [names.join(','), ...res.rows.map((r) => names.map((n) => cell(r[n])).join(','))].join('\n') + '\n'
    );
  } finally {
    await c.end();
  }
}

/** The rows of the mapping's generated SQL (what preview and materialize run) and of its Python script. */
async function sqlAndPython(url: string, mapping: Mapping, t: TargetTable, tables: string[], key: string) {
  const c = new pg.Client({ connectionString: url, types: rawText, options: '-c TimeZone=UTC' });
  await c.connect();
  let sqlRows: (string | null)[][];
  const types: Record<string, Record<string, string>> = {};
  try {
    const { sql } = await generateSelectSql(mapping, t);
    sqlRows = (await c.query(`select * from (${sql}) t`)).rows.map((r) =>
      t.columns.map((col) => r[col.name] as string | null),
    );
    const res = await c.query(
      `select table_schema || '.' || table_name as key, column_name, data_type from information_schema.columns
        where table_schema || '.' || table_name = any($1)`,
      [tables],
    );
    for (const r of res.rows) (types[r.key] ??= {})[r.column_name] = r.data_type;
  } finally {
    await c.end();
  }
  for (const table of tables) writeFileSync(join(workDir, `${table}.csv`), await exportCsv(url, table));
  const script = await generatePythonScript(mapping, t, { sourceColumns: types });
  const scriptPath = join(workDir, `${t.name}.py`);
  writeFileSync(scriptPath, script);
  const out = join(workDir, `${t.name}.out.csv`);
  await run('python3', [scriptPath, '--input-dir', workDir, '--null', '\\N', '--output', out], {
    maxBuffer: 1 << 26,
  });
  const [header, ...pyRows] = parseCsv(readFileSync(out, 'utf8'), '\\N');
  expect(header).toEqual(t.columns.map((col) => col.name));
  const index = t.columns.findIndex((col) => col.name === key);
  const byKey = (a: (string | null)[], b: (string | null)[]) => Number(a[index]) - Number(b[index]);
  sqlRows.sort(byKey);
  pyRows.sort(byKey);
  return { sqlRows, pyRows };
}

describe('cleaning proposals on a PostgreSQL source', () => {
  let proposals: CleaningProposal[];
  const byField = () => new Map(proposals.map((p) => [p.target_field, p]));

  beforeAll(async () => {
    const columns = (
      await query(
        `select column_name as name, data_type as type from information_schema.columns
          where table_schema = 'app' and table_name = 'accounts' order by ordinal_position`,
      )
    ).map((r) => ({ name: String(r.name), type: String(r.type) }));
    const profiles = await profileTable((sql, params) => query(sql, params), 'app', 'accounts', columns);
    const table = sourceTableOf(
      { name: 'accounts', primary_key: ['id'], foreign_keys: [], columns } as never,
      profiles,
      'app.accounts',
    );
    proposals = await proposeCleaning({
      target,
      connections: Object.entries(CONNECTIONS).map(([field, column]) => ({
        target_field: field,
        source_field: `app.accounts.${column}`,
      })),
      sources: new Map([['app.accounts', table]]),
      run: (sql, params) => query(sql, params),
      rowLimit: 10_000,
    });
  });

  it('proposes each kind, with the share of sampled values it converts', () => {
    const got = Object.fromEntries(proposals.map((p) => [p.target_field, [p.kind, p.share, p.sampled]]));
    expect(got).toEqual({
      // England is no country of ISO 3166: 8 of 9 filled values convert.
      country_code: ['country_alpha2', 0.8889, 9],
      // England's 07700 900123 and 555 0199 have no known country; '' is blank: 7 of 9.
      phone: ['phone_e164', 0.7778, 9],
      email: ['email_normalised', 1, 9],
      created_at: ['epoch_seconds', 1, 9],
      last_seen_at: ['epoch_milliseconds', 1, 9],
      signed_up_at: ['epoch_seconds', 1, 9],
      newsletter: ['boolean_text', 1, 9],
      email_opt_in: ['inverted_flag', 1, 9],
      sms_opt_in: ['inverted_flag', 1, 9],
      balance: ['cents_to_units', 1, 9],
      amount: ['cents_to_units', 1, 9],
    });
    expect(byField().get('account_id')).toBeUndefined();
    expect(byField().get('email_opt_in')!.expression).toBe('NOT "app"."accounts"."opted_out"');
    expect(byField().get('country_code')!.description).toMatch(/i18n-iso-countries/);
    expect(byField().get('phone')!.description).toMatch(/libphonenumber-js/);
  });

  it('gives the same values in the generated SQL and in the Python export', async () => {
    const mapping: Mapping = {
      table_name: 'accounts',
      tables: { 'app.accounts': { relationship: 'primary' } },
      connections: Object.entries(CONNECTIONS).map(([field, column]) => ({
        source_field: `app.accounts.${column}`,
        target_field: field,
        status: 'confirmed' as const,
      })),
      transformations: Object.fromEntries(
        proposals.map((p) => [p.target_field, { expression: p.expression }]),
      ),
    };
    const { sqlRows, pyRows } = await sqlAndPython(
      source.url,
      mapping,
      target,
      ['app.accounts'],
      'account_id',
    );
    expect(pyRows).toEqual(sqlRows);
    const column = (name: string) => sqlRows.map((r) => r[target.columns.findIndex((c) => c.name === name)]);
    expect(column('country_code')).toEqual(['US', 'US', 'DE', 'DE', 'GB', 'GB', null, 'FR', null, 'FR']);
    expect(column('phone')).toEqual([
      '+12125550101',
      '+12125550102',
      '+49301234567',
      '+49307654321',
      '+442079460958',
      '+442079460000',
      null, // England: no country, national number
      '+33123456789',
      null,
      null,
    ]);
    expect(column('email').slice(0, 3)).toEqual(['ann@example.com', 'bob@example.com', 'carl@example.de']);
    expect(column('created_at')[0]).toBe('2023-11-14 22:13:20+00');
    expect(column('last_seen_at')[0]).toBe('2023-11-14 22:13:20.123+00');
    expect(column('signed_up_at')[0]).toBe('2020-09-13 12:26:40+00');
    expect(column('newsletter')).toEqual(['t', 'f', 't', 'f', 't', 'f', 't', 'f', 't', null]);
    expect(column('email_opt_in')).toEqual(['t', 'f', null, 't', 'f', 't', 't', 'f', 't', 't']);
    expect(column('sms_opt_in')).toEqual(['t', 'f', null, 't', 'f', 't', 'f', 't', 'f', 't']);
    expect(column('balance')).toEqual([
      '19.99',
      '0.00',
      '-2.50',
      null,
      '0.05',
      '1000.00',
      '0.07',
      '0.12',
      '0.01',
      '0.03',
    ]);
    expect(column('amount')[0]).toBe('25.00');
  });

  it('proposes nothing where no cleaning is needed', async () => {
    await client.query(
      `create table app.clean (id integer primary key, cc text, mail text, flag boolean, n integer)`,
    );
    await client.query(
      `insert into app.clean values (1, 'US', 'a@b.co', true, 5), (2, 'DE', 'c@d.co', false, 7)`,
    );
    const columns = [
      { name: 'id', type: 'integer' },
      { name: 'cc', type: 'text' },
      { name: 'flag', type: 'boolean' },
      { name: 'n', type: 'integer' },
    ];
    const profiles = await profileTable((sql, params) => query(sql, params), 'app', 'clean', columns);
    const table = sourceTableOf(
      { name: 'clean', primary_key: ['id'], foreign_keys: [], columns } as never,
      profiles,
      'app.clean',
    );
    const none = await proposeCleaning({
      target: {
        name: 't',
        columns: [
          { name: 'country_code', type: 'text' },
          { name: 'is_active', type: 'boolean' },
          { name: 'total_orders', type: 'numeric' },
        ],
      },
      connections: [
        { target_field: 'country_code', source_field: 'app.clean.cc' },
        { target_field: 'is_active', source_field: 'app.clean.flag' },
        { target_field: 'total_orders', source_field: 'app.clean.n' },
      ],
      sources: new Map([['app.clean', table]]),
      run: (sql, params) => query(sql, params),
      rowLimit: null,
    });
    expect(none).toEqual([]);
  });

  it('proposes nothing for array columns: no cleaning function takes an array', async () => {
    await client.query(`create table app.lists (id integer primary key, emails text[], phones text[],
      opted_out boolean[], balance_cents integer[])`);
    await client.query(`insert into app.lists values
      (1, '{" Ann@Example.COM "}', '{"(212) 555-0101"}', '{true}', '{1999}'),
      (2, '{bob@example.com,b@x.io}', '{"030 1234567"}', '{false,true}', '{0,5}')`);
    // The types as introspection reports them (format_type): `text[]`, not information_schema's ARRAY.
    const columns = (
      await query(
        `select attname as name, format_type(atttypid, atttypmod) as type from pg_attribute
          where attrelid = 'app.lists'::regclass and attnum > 0 and not attisdropped order by attnum`,
      )
    ).map((r) => ({ name: String(r.name), type: String(r.type) }));
    expect(columns.map((c) => c.type)).toEqual(['integer', 'text[]', 'text[]', 'boolean[]', 'integer[]']);
    const profiles = await profileTable((sql, params) => query(sql, params), 'app', 'lists', columns);
    const table = sourceTableOf(
      { name: 'lists', primary_key: ['id'], foreign_keys: [], columns } as never,
      profiles,
      'app.lists',
    );
    const proposed = await proposeCleaning({
      target: {
        name: 't',
        columns: [
          { name: 'email', type: 'text' },
          { name: 'phone', type: 'text' },
          { name: 'email_opt_in', type: 'boolean' },
          { name: 'balance', type: 'numeric' },
        ],
      },
      connections: [
        { target_field: 'email', source_field: 'app.lists.emails' },
        { target_field: 'phone', source_field: 'app.lists.phones' },
        { target_field: 'email_opt_in', source_field: 'app.lists.opted_out' },
        { target_field: 'balance', source_field: 'app.lists.balance_cents' },
      ],
      sources: new Map([['app.lists', table]]),
      run: (sql, params) => query(sql, params),
      rowLimit: null,
    });
    expect(proposed).toEqual([]);
  });
});

// ---- the demo shop over HTTP ----

let server: TestServer;
let tenant: Tenant;
const customer360 = JSON.parse(
  readFileSync(new URL('../seeds/schemas/customer-360.json', import.meta.url), 'utf8'),
);
const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

async function discover(): Promise<Record<string, any>[]> {
  const res = await fetch(`${server.url}/api/workspaces/discover`, {
    method: 'POST',
    headers: { authorization: `Bearer ${tenant.admin.token}`, 'content-type': 'application/json' },
    body: JSON.stringify({}),
  });
  const events = (await res.text())
    .split('\n')
    .filter((l) => l.startsWith('data: '))
    .map((l) => JSON.parse(l.slice(6)));
  expect(events.at(-1), JSON.stringify(events.at(-1))).toMatchObject({ type: 'completed' });
  return events;
}

describe('discovery on the demo shop proposes the country and phone cleaning', () => {
  let events: Record<string, any>[];

  beforeAll(async () => {
    await demo.sql(demoSchemaSql());
    for (const statement of demoSourceStatements()) await demo.sql(statement);
    server = await startTestServer({ LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'silent' });
    tenant = await createTenant(server);
    const workspace = unique('clean');
    const connection = pgConfig(demo.name);
    await createWorkspace(server, tenant.admin.token, {
      name: workspace,
      source_config: { ...connection, schemas: ['shop'] },
      target_config: { ...connection, schemas: ['analytics'] },
      target_schema: customer360,
    });
    events = await discover();
  }, 180_000);

  it('shows the proposals with their share in the suggestion events and in the mapping', async () => {
    const suggestion = (field: string): Record<string, any> =>
      events.find(
        (e) => e.type === 'suggestion' && e.target_table === 'customers' && e.target_field === field,
      ) ?? {};
    expect(suggestion('country_code')).toMatchObject({
      source_field: 'shop.customers.country',
      cleaning: { kind: 'country_alpha2' },
    });
    expect(suggestion('phone')).toMatchObject({
      source_field: 'shop.customers.phone',
      cleaning: { kind: 'phone_e164' },
    });
    const proposed = events.filter((e) => e.type === 'suggestion' && e.cleaning);
    console.info(
      'cleaning proposed on the demo:',
      proposed
        .map((e) => `${e.target_table}.${e.target_field} ${e.cleaning.kind} ${e.cleaning.share}`)
        .join('; '),
    );
    expect(suggestion('country_code').cleaning.share).toBeGreaterThan(0.9);
    expect(suggestion('phone').cleaning.share).toBeGreaterThan(0.9);
    const mapping = await api('GET', '/api/mappings/customers');
    expect(mapping.status).toBe(200);
    expect(mapping.body.transformations.country_code).toMatchObject({
      proposed: { kind: 'country_alpha2', source_field: 'shop.customers.country' },
    });
    expect(mapping.body.transformations.country_code.proposed.share).toBe(
      suggestion('country_code').cleaning.share,
    );
  });

  it('groups the ~19 spellings into a handful of codes; the Python export agrees', async () => {
    const preview = await api('POST', '/api/mappings/customers/preview-transformation', {
      body: {
        target_field: 'country_code',
        limit: 1000,
      },
    });
    expect(preview.status, JSON.stringify(preview.body)).toBe(200);
    const codes = new Set(preview.body.rows.map((r: { country_code: string | null }) => r.country_code));
    expect([...codes].filter((c) => c !== null).sort()).toEqual(['CA', 'DE', 'FR', 'GB', 'US']);
    const raw = await demo.sql(`select count(distinct country) as n from shop.customers`);
    expect(Number(raw[0].n)).toBeGreaterThanOrEqual(15);

    const mapping = (await api('GET', '/api/mappings/customers')).body;
    const t = customer360.tables.find((x: TargetTable) => x.name === 'customers') as TargetTable;
    const tables = Object.keys(mapping.tables);
    const { sqlRows, pyRows } = await sqlAndPython(demo.url, mapping, t, tables, 'customer_id');
    expect(pyRows.length).toBe(sqlRows.length);
    expect(pyRows).toEqual(sqlRows);
    const phone = t.columns.findIndex((c) => c.name === 'phone');
    const phones = sqlRows.map((r) => r[phone]).filter((p) => p !== null);
    const e164 = phones.filter((p) => /^\+[1-9][0-9]{6,14}$/.test(p!));
    expect(e164.length / phones.length).toBeGreaterThan(0.9);
  });

  it('a person’s transformation stays; removing a proposal refuses it; nothing changed keeps the version', async () => {
    const own = await api('POST', '/api/mappings/customers/transformation', {
      body: {
        transformation: { target_field: 'country_code', expression: `upper(trim(customers.country))` },
      },
    });
    expect(own.status, JSON.stringify(own.body)).toBe(200);
    const del = await api('DELETE', '/api/mappings/customers/transformation/phone');
    expect(del.status, JSON.stringify(del.body)).toBe(200);
    const again = await discover();
    const before = (await api('GET', '/api/mappings/customers')).body;
    // A third run finds what the second wrote: the version stays.
    await discover();
    const after = (await api('GET', '/api/mappings/customers')).body;
    expect(after.transformations.country_code).toEqual({
      expression: 'upper(trim(customers.country))',
      description: null,
    });
    expect(after.transformations.phone).toBeUndefined();
    expect(after.transformations.email).toMatchObject({ proposed: { kind: 'email_normalised' } });
    expect(after.decisions).toContainEqual({
      target_field: 'phone',
      source_field: 'shop.customers.phone',
      cleaning: 'refused',
    });
    expect(after.version).toBe(before.version);

    // Removing the connection takes discovery's cleaning of that source with it.
    const gone = await call(server, 'DELETE', '/api/mappings/customers/connection', {
      token: tenant.admin.token,
      query: { source_field: 'shop.customers.email', target_field: 'email' },
    });
    expect(gone.status, JSON.stringify(gone.body)).toBe(200);
    expect(gone.body.transformations.email).toBeUndefined();
    expect(again.filter((e) => e.type === 'kept').map((e) => e.decision)).toEqual(
      expect.arrayContaining(['transformation', 'cleaning_refused']),
    );
  });
});
