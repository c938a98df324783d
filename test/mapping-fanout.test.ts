import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  bindCall,
  createTenant,
  createWorkspace,
  materializeMapping,
  unique,
  type Tenant,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { AppError } from '../src/app-error.ts';
import { isDeterministicFailure } from '../src/jobs/job-types.ts';

/*
 * Joins keep one row per primary row, or say so: validate measures the fan-out on the source,
 * commit refuses it unless accepted, materialize checks a keyless target's row count against the
 * primary table, and a deterministic failure fails once without a retry.
 */
const source = scratchDatabase('fanout');

const config = (schemas: string[]) => pgConfig(source.name, { schemas });

const columns = [
  { name: 'customer_id', type: 'integer', nullable: false },
  { name: 'email', type: 'text' },
  { name: 'full_name', type: 'text' },
];
const schema = {
  name: 'c360',
  tables: [
    { name: 'customers', primary_key: ['customer_id'], columns },
    { name: 'customer_list', columns },
  ],
};

let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  await source.create();
  await source.sql(`create schema shop; create schema dw;
    create table shop.customers (id integer primary key, email text);
    create table shop.crm_contacts (id integer primary key, email text, full_name text);
    insert into shop.customers values (1, 'Ann@x.com'), (2, 'bob@x.com'), (3, ' ann@x.com'), (4, 'cy@x.com');
    insert into shop.crm_contacts values (10, 'ann@x.com', 'Ann'), (11, 'ANN@x.com ', 'Ann B'),
      (12, 'bob@x.com', 'Bob'), (13, 'dan@x.com', 'Dan');`);
  server = await startTestServer({ LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'silent' });
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: unique('fanout'),
    source_config: config(['shop']),
    target_config: config(['dw']),
    target_schema: schema,
  });
});

afterAll(async () => {
  await server?.close();
  await source.drop();
});

const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

async function joinedMapping(table: string, joinOn: string, extra: Record<string, unknown> = {}) {
  for (const [source_field, target_field] of [
    ['shop.customers.id', 'customer_id'],
    ['shop.customers.email', 'email'],
  ]) {
    const res = await api('POST', `/api/mappings/${table}/connection`, {
      body: {
        connection: { source_field, target_field, status: 'confirmed' },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
  }
  const join = await api('POST', `/api/mappings/${table}/tables`, {
    body: {
      source_table: 'shop.crm_contacts',
      relationship: 'join',
      join_on: joinOn,
      ...extra,
    },
  });
  expect(join.status, JSON.stringify(join.body)).toBe(200);
  const name = await api('POST', `/api/mappings/${table}/connection`, {
    body: {
      connection: {
        source_field: 'shop.crm_contacts.full_name',
        target_field: 'full_name',
        status: 'confirmed',
      },
    },
  });
  expect(name.status, JSON.stringify(name.body)).toBe(200);
}

const materializeAndWait = async (table: string) =>
  (await materializeMapping(server, tenant.admin.token, table)).run;

const EMAIL_JOIN = 'lower(trim(customers.email)) = lower(trim(crm_contacts.email))';

describe('a join duplicated on both sides', () => {
  it('is not valid, with the figure measured on the source', async () => {
    await joinedMapping('customers', EMAIL_JOIN);
    const res = await api('POST', '/api/mappings/customers/tables/validate', { body: {} });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.valid).toBe(false);
    // Customers 1 and 3 are both ann@x.com, and two contacts are too: each gets 2 rows.
    expect(res.body.fan_out).toEqual([
      {
        source_table: 'shop.crm_contacts',
        join_on: EMAIL_JOIN,
        primary_rows: 4,
        joined_rows: 6,
        multiplied_rows: 2,
        max_rows_per_primary_row: 2,
        measured: true,
        accepted: false,
      },
    ]);
    expect(res.body.problems).toEqual([
      {
        path: ['tables', 'shop.crm_contacts', 'fan_out'],
        message: expect.stringContaining('2 of 4 primary rows match more than one row (up to 2)'),
      },
    ]);
  });

  it('cannot be committed until a person accepts it', async () => {
    const refused = await api('POST', '/api/mappings/customers/commit-transformation', {
      body: { message: 'join' },
    });
    expect(refused.status).toBe(422);
    expect(refused.body.message).toMatch(/multiplies rows: 2 of 4 primary rows/);
    expect(refused.body.message).toMatch(/6 rows instead of 4/);

    const accept = await api('POST', '/api/mappings/customers/tables', {
      body: {
        source_table: 'shop.crm_contacts',
        relationship: 'join',
        join_on: EMAIL_JOIN,
        accept_fan_out: true,
      },
    });
    expect(accept.status, JSON.stringify(accept.body)).toBe(200);
    expect(
      accept.body.tables.find((t: { source_table: string }) => t.source_table === 'shop.crm_contacts'),
    ).toMatchObject({ accept_fan_out: true });
    const valid = await api('POST', '/api/mappings/customers/tables/validate', { body: {} });
    expect(valid.body).toMatchObject({
      valid: true,
      problems: [],
      fan_out: [{ accepted: true, joined_rows: 6 }],
    });
    const commit = await api('POST', '/api/mappings/customers/commit-transformation', {
      body: { message: 'join' },
    });
    expect(commit.status, JSON.stringify(commit.body)).toBe(200);
  });

  it('fails once on the duplicate key of the target, with the reason, without a retry', async () => {
    const run = await materializeAndWait('customers');
    expect(run.status).toBe('failed');
    expect(run.error).toMatch(/duplicate key/);
    expect(run.retry_count).toBe(0);
  });

  it('refuses accept_fan_out on the primary table (400)', async () => {
    const res = await api('POST', '/api/mappings/customers/tables', {
      body: {
        source_table: 'shop.customers',
        relationship: 'primary',
        accept_fan_out: true,
      },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/accept_fan_out apply to a join/);
  });
});

describe('a target without a primary key', () => {
  it('is checked against the primary table when the data changed after the commit', async () => {
    await joinedMapping('customer_list', 'customers.id = crm_contacts.id - 9');
    const valid = await api('POST', '/api/mappings/customer_list/tables/validate', { body: {} });
    expect(valid.body).toMatchObject({ valid: true, fan_out: [{ joined_rows: 4, multiplied_rows: 0 }] });
    const commit = await api('POST', '/api/mappings/customer_list/commit-transformation', {
      body: {
        message: 'by id',
      },
    });
    expect(commit.status, JSON.stringify(commit.body)).toBe(200);
    const first = await materializeAndWait('customer_list');
    expect(first.status, first.error).toBe('succeeded');

    // A second contact for customer 1 arrives: the same SQL now gives customer 1 two rows.
    await source.sql(`alter table shop.crm_contacts drop constraint crm_contacts_pkey;
      insert into shop.crm_contacts values (10, 'ann2@x.com', 'Ann again');`);
    const run = await materializeAndWait('customer_list');
    expect(run.status).toBe('failed');
    expect(run.retry_count).toBe(0);
    expect(run.error).toMatch(/produced 5 rows from 4 rows of the primary table shop\.customers/);
    // The previous content stays.
    const rows = await source.sql('select count(*)::int as n from dw.customer_list');
    expect(rows[0].n).toBe(4);
  });
});

describe('which failures are retried', () => {
  it('retries lost connections and timeouts, not duplicate keys, bad SQL or missing tables', () => {
    const warehouse = (reason: string) => new AppError('UNPROCESSABLE_CONTENT', 'failed', { reason });
    expect(isDeterministicFailure(warehouse('23505'))).toBe(true);
    expect(isDeterministicFailure(warehouse('42601'))).toBe(true);
    expect(isDeterministicFailure(warehouse('42P01'))).toBe(true);
    expect(isDeterministicFailure(warehouse('ECONNREFUSED'))).toBe(false);
    expect(isDeterministicFailure(warehouse('08006'))).toBe(false);
    expect(isDeterministicFailure(warehouse('STATEMENT_TIMEOUT'))).toBe(false);
    expect(isDeterministicFailure(warehouse('57P01'))).toBe(false);
  });
});
