import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { mariadbUnavailable, MARIADB, scratchMysql } from './helpers/mariadb.ts';

/*
 * Sample values are a preview: a column of 200 KB texts answers each value cut at value_max_length
 * characters with '…', counted as its whole value, on PostgreSQL (tables and CTEs) and MySQL/MariaDB.
 */
const MAX = 1000;
const pg = scratchDatabase('cap');
const unavailable = await mariadbUnavailable();
const my = scratchMysql('cap');

let server: TestServer;
let tenant: Tenant;

interface Sample {
  status: number;
  bytes: number;
  body: {
    value_max_length: number;
    truncated_values: number;
    values: { value: string; count: number }[];
  };
}

async function sample(workspace: string, path: string): Promise<Sample> {
  const selected = await call(server, 'POST', '/api/workspaces/select', {
    token: tenant.admin.token,
    body: { workspace_name: workspace },
  });
  expect(selected.status, JSON.stringify(selected.body)).toBe(200);
  const res = await call(server, 'GET', `/api/sources/sample-values/${path}`, {
    token: tenant.admin.token,
    query: { limit: 50 },
  });
  expect(res.status, JSON.stringify(res.body).slice(0, 500)).toBe(200);
  return { status: res.status, bytes: JSON.stringify(res.body).length, body: res.body };
}

const counted = (s: Sample) => s.body.values.map((v) => [v.value, v.count]);
const sorted = (pairs: unknown[][]) => pairs.map((p) => JSON.stringify(p)).sort();

beforeAll(async () => {
  await pg.create();
  await pg.sql(`create table public.docs (body text, payload bytea)`);
  // Two distinct 200 KB texts with the same first 199,999 characters: counted apart, shown alike.
  await pg.sql(`insert into public.docs (body, payload) values
    (repeat('x', 200000), decode(repeat('ab', 100000), 'hex')),
    (repeat('x', 200000), decode('deadbeef', 'hex')),
    (repeat('x', 199999) || 'y', null),
    ('short', null),
    (repeat('b', ${MAX}), null),
    (repeat('c', ${MAX + 1}), null),
    (repeat('é', 1500), null)`);
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: 'cap_pg',
    source_config: pgConfig(pg.name, {
      password: 'not-needed-with-trust',
      schemas: ['public'],
      ctes: [{ name: 'long_docs', sql: 'select body as text_body from public.docs' }],
    }),
  });
});

afterAll(async () => {
  await server?.close();
  await pg.drop();
});

describe('PostgreSQL source', () => {
  it('cuts 200 KB texts at value_max_length with …, counts whole values, leaves short values alone', async () => {
    const res = await sample('cap_pg', 'public.docs/body');
    expect(res.body.value_max_length).toBe(MAX);
    expect(res.body.truncated_values).toBe(4);
    expect(sorted(counted(res))).toEqual(
      sorted([
        ['x'.repeat(MAX) + '…', 2],
        ['x'.repeat(MAX) + '…', 1],
        ['short', 1],
        ['b'.repeat(MAX), 1],
        ['c'.repeat(MAX) + '…', 1],
        // Characters, not bytes.
        ['é'.repeat(MAX) + '…', 1],
      ]),
    );
    // Most frequent first, on the whole values.
    expect(res.body.values[0]).toEqual({ value: 'x'.repeat(MAX) + '…', count: 2 });
    // 600 KB of texts in the table; the answer is a preview.
    expect(res.bytes).toBeLessThan(8 * 1024);
  });

  it('cuts the hex of large bytes the same way and keeps small ones whole', async () => {
    const res = await sample('cap_pg', 'public.docs/payload');
    expect(res.body.truncated_values).toBe(1);
    expect(sorted(counted(res))).toEqual(
      sorted([
        ['\\x' + 'ab'.repeat((MAX - 2) / 2) + '…', 1],
        ['\\xdeadbeef', 1],
      ]),
    );
  });

  it('cuts the values of a CTE of the source config too', async () => {
    const res = await sample('cap_pg', 'long_docs/text_body');
    expect(res.body.truncated_values).toBe(4);
    expect(res.body.values[0]).toEqual({ value: 'x'.repeat(MAX) + '…', count: 2 });
    expect(res.body.values.find((v) => v.value === 'short')).toEqual({ value: 'short', count: 1 });
    expect(Math.max(...res.body.values.map((v) => [...v.value].length))).toBe(MAX + 1);
  });
});

describe.skipIf(unavailable)(`MySQL/MariaDB source ${unavailable ? `(skipped: ${unavailable})` : ''}`, () => {
  beforeAll(async () => {
    await my.create();
    await my.sql(`create table docs (body longtext, payload longblob)`);
    await my.sql(`insert into docs (body, payload) values
      (repeat('x', 200000), unhex(repeat('ab', 100000))),
      (repeat('x', 200000), x'DEADBEEF'),
      (concat(repeat('x', 199999), 'y'), null),
      ('short', null),
      (repeat('b', ${MAX}), null),
      (repeat('é', 1500), null)`);
    await createWorkspace(server, tenant.admin.token, {
      name: 'cap_my',
      source_config: { type: 'mysql', ...MARIADB, database: my.name, password: '' },
    });
  });

  afterAll(async () => {
    await my.drop();
  });

  it('cuts 200 KB texts at value_max_length with …, counts whole values, leaves short values alone', async () => {
    const res = await sample('cap_my', 'docs/body');
    expect(res.body.value_max_length).toBe(MAX);
    expect(res.body.truncated_values).toBe(3);
    expect(sorted(counted(res))).toEqual(
      sorted([
        ['x'.repeat(MAX) + '…', 2],
        ['x'.repeat(MAX) + '…', 1],
        ['short', 1],
        ['b'.repeat(MAX), 1],
        ['é'.repeat(MAX) + '…', 1],
      ]),
    );
    expect(res.body.values[0]).toEqual({ value: 'x'.repeat(MAX) + '…', count: 2 });
    expect(res.bytes).toBeLessThan(8 * 1024);
  });

  it('cuts the hex of a large blob and keeps small ones whole', async () => {
    const res = await sample('cap_my', 'docs/payload');
    expect(res.body.truncated_values).toBe(1);
    expect(sorted(counted(res))).toEqual(
      sorted([
        ['\\x' + 'ab'.repeat((MAX - 2) / 2) + '…', 1],
        ['\\xdeadbeef', 1],
      ]),
    );
  });
});
