import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, call, createTenant, createWorkspace, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

/*
 * A column whose type is a domain is judged everywhere as the type the domain is over (followed to
 * the end through pg_type.typbasetype), never by the domain's own name. Every area is compared with
 * the same data in columns of the base types: one tenant reads `typed` (domains: over text, over
 * numeric, over a domain over numeric, over float8, over integer, over bigint, over timestamptz),
 * the other `plain`; both target the same warehouse schema, where `accounts` is made of domains and
 * `accounts_plain` of their base types.
 */
const db = scratchDatabase('domains');
const destination = scratchDatabase('domains_dest');

const ROWS = `select i,
       case when i % 4 = 0 then null else '  User' || i || '@Example.COM ' end,
       (array['yes', 'no', 'Y', 'n', 'TRUE', 'false'])[1 + i % 6],
       1600000000 + i * 86400,
       case when i % 5 = 0 then null else i * 125 end,
       i % 7,
       round((i * 3.75)::numeric, 2),
       case when i = 3 then 'NaN'::float8 else i / 8.0 end,
       timestamptz '2024-03-01 00:00:00+00' + make_interval(hours => i)
  from generate_series(1, 40) i`;
const SOURCE_COLUMNS = (t: Record<string, string>) =>
  `(id integer primary key, email ${t.text}, newsletter ${t.text}, created ${t.big}, balance_cents ${t.int},
    visits ${t.int}, price ${t.price}, ratio ${t.float}, updated_at ${t.stamp})`;
const TARGET_COLUMNS = (t: Record<string, string>) =>
  `(account_id integer primary key, email ${t.text}, newsletter boolean, created_at ${t.stamp},
    balance ${t.price}, visits ${t.big}, price ${t.price}, ratio ${t.float}, updated_at ${t.stamp})`;
const DOMAINS = {
  text: 'dom.label_t',
  big: 'dom.big_t',
  int: 'dom.count_t',
  price: 'dom.price_t',
  float: 'dom.ratio_t',
  stamp: 'dom.stamp_t',
};
const BASE = {
  text: 'text',
  big: 'bigint',
  int: 'integer',
  price: 'numeric(12,2)',
  float: 'double precision',
  stamp: 'timestamp with time zone',
};

const FIELDS: [string, string][] = [
  ['account_id', 'integer'],
  ['email', 'text'],
  ['newsletter', 'boolean'],
  ['created_at', 'timestamptz'],
  ['balance', 'numeric'],
  ['visits', 'bigint'],
  ['price', 'numeric'],
  ['ratio', 'numeric'],
  ['updated_at', 'timestamptz'],
];
const targetSchema = {
  name: 'domains',
  tables: ['accounts', 'accounts_plain'].map((name) => ({
    name,
    primary_key: ['account_id'],
    columns: FIELDS.map(([column, type]) => ({ name: column, type, nullable: column !== 'account_id' })),
  })),
};

let server: TestServer;
/** Reads the `typed` source; `plain` reads the same rows in base-typed columns. */
let typed: Tenant;
let plain: Tenant;

beforeAll(async () => {
  await db.create();
  await destination.create();
  await db.sql(`create schema dom; create schema typed; create schema plain; create schema wh;
    create domain dom.label_t as text;
    create domain dom.amount_t as numeric(12,2);
    create domain dom.price_t as dom.amount_t check (value >= 0);
    create domain dom.ratio_t as float8;
    create domain dom.count_t as integer check (value >= 0);
    create domain dom.big_t as bigint;
    create domain dom.stamp_t as timestamptz;
    create table typed.accounts ${SOURCE_COLUMNS(DOMAINS)};
    create table plain.accounts ${SOURCE_COLUMNS(BASE)};
    insert into typed.accounts ${ROWS};
    insert into plain.accounts ${ROWS};
    create table wh.accounts ${TARGET_COLUMNS(DOMAINS)};
    create table wh.accounts_plain ${TARGET_COLUMNS(BASE)};
    insert into wh.accounts select id, email, newsletter in ('yes', 'Y', 'TRUE'), to_timestamp(created),
      coalesce(balance_cents, 0) / 100.0, visits, price, ratio, updated_at from plain.accounts;
    insert into wh.accounts_plain select * from wh.accounts;
    analyze;`);
  server = await startTestServer({ LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'silent' });
  typed = await createTenant(server);
  plain = await createTenant(server);
  for (const [tenant, schema] of [
    [typed, 'typed'],
    [plain, 'plain'],
  ] as const)
    await createWorkspace(server, tenant.admin.token, {
      source_config: pgConfig(db.name, { schemas: [schema] }),
      target_config: pgConfig(db.name, { schemas: ['wh'] }),
      target_schema: targetSchema,
    });
}, 120_000);

afterAll(async () => {
  await server?.close();
  await db.drop();
  await destination.drop();
});

/** Text with the source schema's name (bare or quoted) written as S: the two sources compared. */
const unschema = (text: string) => text.replace(/"?\b(typed|plain)\b"?(?=\."?accounts\b)/g, 'S');

const asTyped = bindCall(
  () => server,
  () => typed.admin.token,
);
const asPlain = bindCall(
  () => server,
  () => plain.admin.token,
);

describe('introspection', () => {
  it('reports beside each column its base type, a domain over a domain followed to the end', async () => {
    const res = await asTyped('GET', '/api/sources/source-schema');
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const columns = res.body.tables.find((t: any) => t.name === 'accounts').columns;
    const byName = Object.fromEntries(columns.map((c: any) => [c.name, [c.type, c.base_type]]));
    expect(byName).toEqual({
      id: ['integer', 'integer'],
      email: ['dom.label_t', 'text'],
      newsletter: ['dom.label_t', 'text'],
      created: ['dom.big_t', 'bigint'],
      balance_cents: ['dom.count_t', 'integer'],
      visits: ['dom.count_t', 'integer'],
      price: ['dom.price_t', 'numeric(12,2)'],
      ratio: ['dom.ratio_t', 'double precision'],
      updated_at: ['dom.stamp_t', 'timestamp with time zone'],
    });
    // The plain source's base types are its types; the flat listing says the same.
    const flat = await asTyped('GET', '/api/sources/unified-schema', {
      query: { schema_type: 'target', flatten: 'true' },
    });
    expect(flat.status, JSON.stringify(flat.body)).toBe(200);
    const of = (table: string) =>
      flat.body.columns
        .filter((c: any) => c.table === table)
        .map((c: any) => [c.column, c.base_type] as [string, string]);
    expect(of('wh.accounts')).toEqual(of('wh.accounts_plain'));
    expect(
      flat.body.columns
        .filter((c: any) => c.table === 'wh.accounts_plain')
        .every((c: any) => c.type === c.base_type),
    ).toBe(true);
  });
});

describe('monitoring metrics', () => {
  it('measures a domain column as its base type: the same figures as the base-typed twin', async () => {
    const res = await asTyped('GET', '/api/monitoring/metrics/workspace');
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.errors).toEqual([]);
    const table = (name: string) => res.body.tables.find((t: any) => t.table === name);
    const domains = table('wh.accounts');
    const base = table('wh.accounts_plain');
    const figures = (t: any) => t.columns.map(({ type: _type, ...rest }: any) => rest);
    expect(figures(domains)).toEqual(figures(base));
    // What the figures are for the numeric domains: a range, NaN left out of the float one.
    const col = (name: string) => domains.columns.find((c: any) => c.name === name);
    expect(col('ratio')).toMatchObject({ type: 'dom.ratio_t', min: 0.125, max: 5, distinct_count: 40 });
    const [{ lo, hi }] = await db.sql(
      `select min(price)::float8 as lo, max(price)::float8 as hi from wh.accounts`,
    );
    expect([Number(col('price').min), Number(col('price').max)]).toEqual([lo, hi]);
    expect(col('visits')).toMatchObject({ type: 'dom.big_t', distinct_count: 7 });
    expect(col('visits').min).not.toBeNull();
    // The freshness column is found among the timestamp domains as among timestamps.
    expect(domains.freshness.column).toBe('updated_at');
    expect(domains.freshness.max_timestamp).toBe(base.freshness.max_timestamp);
  });

  it('a domain over text, numeric or timestamptz satisfies schema.json’s text, numeric, timestamptz', async () => {
    const res = await asTyped('GET', '/api/schemas/workspace/sync/status');
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const accounts = res.body.tables.find((t: any) => t.table_name === 'accounts');
    expect(accounts).toMatchObject({ exists: true, type_mismatches: [], status: 'in_sync' });
    expect(res.body.differences.type_mismatches).toEqual([]);
    expect(res.body.destructive_changes).toEqual([]);
  });

  it('a column test of the source applies to a domain column as to its base type', async () => {
    const path = '/api/api/schema/config/columns/typed.accounts/price/monitoring';
    const put = await asTyped('PUT', path, {
      body: { schema_type: 'source', config: { range: { min: 0, max: 1000 } } },
    });
    expect(put.status, JSON.stringify(put.body)).toBe(200);
    // A number range on a domain over text is still refused: text compares character by character.
    const onText = await asTyped('PUT', '/api/api/schema/config/columns/typed.accounts/email/monitoring', {
      body: { schema_type: 'source', config: { range: { min: 0, max: 10 } } },
    });
    expect(onText.status, JSON.stringify(onText.body)).toBe(400);
    expect(onText.body.message).toMatch(/of type text/);
    // A domain over timestamptz is a freshness column.
    const fresh = await asTyped('PUT', '/api/api/schema/config/tables/typed.accounts/monitoring', {
      body: { schema_type: 'source', config: { freshness: { max_age_seconds: 3600, column: 'updated_at' } } },
    });
    expect(fresh.status, JSON.stringify(fresh.body)).toBe(200);
    // A viewer may not write it.
    const viewer = await typed.addUser(['viewer']);
    const refused = await call(server, 'PUT', path, {
      token: viewer.token,
      body: { schema_type: 'source', config: { range: { min: 0, max: 1 } } },
    });
    expect(refused.status).toBe(403);
  });
});

async function discover(tenant: Tenant): Promise<Record<string, any>[]> {
  const res = await fetch(`${server.url}/api/workspaces/discover`, {
    method: 'POST',
    headers: { authorization: `Bearer ${tenant.admin.token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ target_tables: ['accounts'] }),
  });
  expect(res.status).toBe(200);
  const events = (await res.text())
    .split('\n')
    .filter((l) => l.startsWith('data: '))
    .map((l) => JSON.parse(l.slice(6)));
  expect(events.at(-1), JSON.stringify(events.at(-1))).toMatchObject({ type: 'completed' });
  return events;
}

describe('discovery and mappings', () => {
  let fromDomains: Record<string, any>[];
  let fromBase: Record<string, any>[];
  const suggestions = (events: Record<string, any>[]) =>
    events
      .filter((e) => e.type === 'suggestion')
      .map(({ seq: _seq, ...e }) =>
        JSON.parse(JSON.stringify(e), (_key, value: unknown) =>
          typeof value === 'string' ? unschema(value) : value,
        ),
      )
      .sort((a, b) => a.target_field.localeCompare(b.target_field));

  beforeAll(async () => {
    fromDomains = await discover(typed);
    fromBase = await discover(plain);
  }, 180_000);

  it('suggests the same sources with the same evidence and cleaning as for the base types', () => {
    const got = suggestions(fromDomains);
    expect(got).toEqual(suggestions(fromBase));
    const byField = new Map(got.map((s) => [s.target_field, s]));
    expect(byField.get('email')?.cleaning?.kind).toBe('email_normalised');
    expect(byField.get('newsletter')?.cleaning?.kind).toBe('boolean_text');
    expect(byField.get('created_at')?.cleaning?.kind).toBe('epoch_seconds');
    expect(byField.get('balance')?.cleaning?.kind).toBe('cents_to_units');
  });

  it('a domain over integer feeds a bigint field: compatible, as integer is', () => {
    const visits = suggestions(fromDomains).find((s) => s.target_field === 'visits');
    expect(visits).toMatchObject({ source_field: 'S.accounts.visits' });
    const base = suggestions(fromBase).find((s) => s.target_field === 'visits');
    expect(visits.evidence).toEqual(base.evidence);
    expect(visits.evidence.type).toBeGreaterThan(0.9);
  });

  it('the Python export reads a domain column as its base type', async () => {
    const code = async (api: typeof asTyped) => {
      const res = await api('POST', '/api/mappings/accounts/generate-code');
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      return res.body.code as string;
    };
    const fromTyped = await code(asTyped);
    expect(unschema(fromTyped)).toBe(unschema(await code(asPlain)));
    // The source columns are parsed as their base types before they are compared or computed with.
    expect(fromTyped).toMatch(/"price": _to_numeric,/);
    expect(fromTyped).toMatch(/"ratio": _to_float,/);
    expect(fromTyped).toMatch(/"visits": lambda v: _to_int\(v, 'integer'\),/);
  });
});

describe('audiences', () => {
  it('takes numeric operators on a numeric field stored in a domain column, and selects by its values', async () => {
    const rules = {
      all: [
        { field: 'balance', op: 'between', value: [0.5, 20] },
        { field: 'ratio', op: '>', value: 1 },
      ],
    };
    const created = await asTyped('POST', '/api/api/audiences', {
      body: {
        name: 'domains',
        target_table: 'accounts',
        definition: { type: 'rules', rules },
        attribute_columns: ['email', 'balance', 'ratio', 'updated_at'],
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const id = created.body.id;
    const run = await asTyped('POST', `/api/api/audiences/${id}/materialize`);
    expect(run.status, JSON.stringify(run.body)).toBe(200);
    const done = await until(
      'materialize',
      async () => (await asTyped('GET', `/api/api/audiences/${id}`)).body,
      (a) =>
        ['succeeded', 'failed'].includes(a.materialization.status) &&
        a.materialization.run_id === run.body.run_id,
    );
    expect(done.materialization.status, done.materialization.error).toBe('succeeded');
    const [{ n }] = await db.sql(
      `select count(*)::int as n from wh.accounts where balance between 0.5 and 20 and ratio > 1`,
    );
    expect(n).toBeGreaterThan(0);
    expect(done.materialization.row_count).toBe(n);
    // A text operator on it is still refused, naming the field.
    const wrong = await asTyped('POST', '/api/api/audiences', {
      body: {
        name: 'wrong',
        target_table: 'accounts',
        definition: { type: 'rules', rules: { all: [{ field: 'balance', op: 'contains', value: '1' }] } },
      },
    });
    expect(wrong.status).toBe(400);
    expect(wrong.body.message).toMatch(/balance/);

    // Exported into another database, which has none of the domains: the base types, the same values.
    const exp = await asTyped('POST', '/api/api/audiences/exports', {
      body: {
        audience_id: id,
        destination: pgConfig(destination.name, { password: 'unused', schema: 'out', table: 'members' }),
        field_mapping: ['account_id', 'email', 'balance', 'ratio', 'updated_at'].map((c) => ({
          source: c,
          destination: c,
        })),
      },
    });
    expect(exp.status, JSON.stringify(exp.body)).toBe(200);
    const finished = await until(
      'export',
      async () =>
        (await asTyped('GET', `/api/api/audiences/${id}/exports`)).body.exports.find(
          (e: any) => e.id === exp.body.export.id,
        ),
      (e) =>
        e?.last_run?.run_id === exp.body.run.run_id && ['succeeded', 'failed'].includes(e.last_run.status),
    );
    expect(finished.last_run.status, finished.last_run.error).toBe('succeeded');
    const types = await destination.sql(
      `select column_name as name, format_type(atttypid, atttypmod) as type
         from information_schema.columns c join pg_attribute a
           on a.attrelid = 'out.members'::regclass and a.attname = c.column_name
        where c.table_schema = 'out' and c.table_name = 'members' order by c.ordinal_position`,
    );
    expect(types).toEqual([
      { name: 'account_id', type: 'integer' },
      { name: 'email', type: 'text' },
      { name: 'balance', type: 'numeric(12,2)' },
      { name: 'ratio', type: 'double precision' },
      { name: 'updated_at', type: 'timestamp with time zone' },
    ]);
    const exported = await destination.sql(
      `select account_id, email, balance::text, ratio, updated_at from out.members order by 1`,
    );
    const expected = await db.sql(
      `select account_id, email, balance::text, ratio, updated_at from wh.accounts
        where balance between 0.5 and 20 and ratio > 1 order by 1`,
    );
    expect(exported).toEqual(expected);
  });
});
