import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { mariadbUnavailable, MARIADB, scratchMysql } from './helpers/mariadb.ts';

/*
 * Generated columns in the source and target schema listings: a generated column's expression is no
 * default (an insert cannot fill the column at all), so it is listed as `generated` and `default` is
 * null, on PostgreSQL and on MySQL/MariaDB.
 */
const pg = scratchDatabase('gen');
const unavailable = await mariadbUnavailable();
const my = scratchMysql('gen');

let server: TestServer;
let tenant: Tenant;

interface Column {
  name: string;
  default: string | null;
  generated: string | null;
}

async function columnsOf(workspace: string, side: 'source' | 'target', table: string) {
  await call(server, 'POST', '/api/workspaces/select', {
    token: tenant.admin.token,
    body: { workspace_name: workspace },
  });
  const res = await call(server, 'GET', '/api/sources/unified-schema', {
    token: tenant.admin.token,
    query: { schema_type: side },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  const found = res.body.tables.find((t: { name: string }) => t.name === table);
  expect(
    found,
    `${table} in ${JSON.stringify(res.body.tables.map((t: { name: string }) => t.name))}`,
  ).toBeTruthy();
  return Object.fromEntries(
    (found.columns as Column[]).map((c) => [c.name, { default: c.default, generated: c.generated }]),
  );
}

beforeAll(async () => {
  await pg.create();
  await pg.sql(`create schema shop`);
  await pg.sql(`create table shop.lines (
    id int generated always as identity primary key,
    legacy_id serial,
    quantity int not null default 1,
    unit_price numeric(10,2) not null,
    total numeric(12,2) generated always as (quantity * unit_price) stored,
    created_at timestamptz not null default now()
  )`);
  server = await startTestServer();
  tenant = await createTenant(server);
  const config = pgConfig(pg.name, { password: 'not-needed-with-trust', schemas: ['shop'] });
  await createWorkspace(server, tenant.admin.token, {
    name: 'gen_pg',
    source_config: config,
    target_config: config,
  });
});

afterAll(async () => {
  await server?.close();
  await pg.drop();
});

describe('PostgreSQL', () => {
  it('lists a stored generated column with its expression as generated, not as a default', async () => {
    const columns = await columnsOf('gen_pg', 'source', 'lines');
    expect(columns.total).toEqual({ default: null, generated: '((quantity)::numeric * unit_price)' });
    // Ordinary defaults are unchanged and are not generated.
    expect(columns.quantity).toEqual({ default: '1', generated: null });
    expect(columns.created_at).toEqual({ default: 'now()', generated: null });
    expect(columns.legacy_id.default).toMatch(/^nextval\('shop\.lines_legacy_id_seq'::regclass\)$/);
    expect(columns.legacy_id.generated).toBeNull();
    // An identity column has no pg_attrdef row: neither a default expression nor a generated one.
    expect(columns.id).toEqual({ default: null, generated: null });
    expect(columns.unit_price).toEqual({ default: null, generated: null });
  });

  it('says the same of the target connection and of the source-schema route', async () => {
    const target = await columnsOf('gen_pg', 'target', 'lines');
    expect(target.total).toEqual({ default: null, generated: '((quantity)::numeric * unit_price)' });
    const res = await call(server, 'GET', '/api/sources/source-schema', { token: tenant.admin.token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const total = res.body.tables[0].columns.find((c: Column) => c.name === 'total');
    expect(total).toMatchObject({ default: null, generated: '((quantity)::numeric * unit_price)' });
  });

  it('describes generated in the OpenAPI document', async () => {
    const doc = (await call(server, 'GET', '/api/openapi.json')).body;
    const schema =
      doc.paths['/api/sources/unified-schema'].get.responses['200'].content['application/json'].schema;
    const resolve = (s: any): any => (s?.$ref ? resolve(doc.components.schemas[s.$ref.split('/').pop()]) : s);
    const column = resolve(resolve(resolve(schema).properties.tables).items.properties.columns).items;
    const properties = resolve(column).properties;
    expect(properties.generated.description).toMatch(/generated column's expression/);
    expect(properties.default.description).toMatch(/null for none and for a generated column/);
  });
});

describe.skipIf(unavailable)(`MySQL/MariaDB ${unavailable ? `(skipped: ${unavailable})` : ''}`, () => {
  beforeAll(async () => {
    await my.create();
    await my.sql(`create table order_lines (
      id int not null auto_increment primary key,
      quantity int not null default 1,
      unit_price decimal(10,2) not null,
      total decimal(12,2) as (quantity * unit_price) virtual,
      label varchar(40) as (concat('qty ', quantity)) persistent,
      stored_total decimal(12,2) generated always as (quantity * unit_price) stored,
      created_at datetime not null default current_timestamp,
      note varchar(40) null,
      status varchar(10) not null default 'NULL'
    )`);
    await createWorkspace(server, tenant.admin.token, {
      name: 'gen_my',
      source_config: { type: 'mysql', ...MARIADB, database: my.name, password: '' },
    });
  });

  afterAll(async () => {
    await my.drop();
  });

  it('lists virtual, persistent and stored columns with their expressions as generated', async () => {
    const columns = await columnsOf('gen_my', 'source', 'order_lines');
    expect(columns.total).toEqual({ default: null, generated: '`quantity` * `unit_price`' });
    expect(columns.stored_total).toEqual({ default: null, generated: '`quantity` * `unit_price`' });
    expect(columns.label).toEqual({ default: null, generated: "concat('qty ',`quantity`)" });
    expect(columns.quantity).toEqual({ default: '1', generated: null });
    expect(columns.created_at).toEqual({ default: 'current_timestamp()', generated: null });
    expect(columns.id).toEqual({ default: null, generated: null });
    // MariaDB writes no default of a nullable column as the word NULL; a text default stays quoted.
    expect(columns.note).toEqual({ default: null, generated: null });
    expect(columns.status).toEqual({ default: "'NULL'", generated: null });
  });
});
