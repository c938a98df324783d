import { createHash, randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
import { MATERIALIZE_MAPPING_KIND } from '../src/modules/mappings/mappings.service.ts';

/*
 * A materialization loads into a staging table named after its run (`customers__stg_<8 hex digits of
 * the run id's SHA-256>`). A run whose worker died never drops it; the next materialization of the same
 * target table does, and only the staging tables of that table's ended runs: a user's table that only
 * looks like one stays, and so does another table's leftover until that table's next run. The dead
 * worker is a run row left running with an old heartbeat on its last attempt; the server sweeps it.
 */
const warehouse = scratchDatabase('leftovers');
let server: TestServer;
let tenant: Tenant;
let workspaceId: string;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

const stagingName = (table: string, runId: string) =>
  `${table}__stg_${createHash('sha256').update(runId).digest('hex').slice(0, 8)}`;

/** The tables of the target schema, in code point order (as `sort()` orders the expectations). */
const tablesOf = async () =>
  (
    await warehouse.sql<{ name: string }>(
      `select table_name as name from information_schema.tables where table_schema = 'dw'`,
    )
  )
    .map((r) => r.name)
    .sort();

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema shop; create schema dw;
    create table shop.customers (id integer primary key, email text);
    create table shop.orders (id integer primary key, customer_id integer, amount numeric(10, 2));
    insert into shop.customers values (1, 'ann@x.com'), (2, 'bob@x.com');
    insert into shop.orders values (10, 1, 12.50), (11, 2, 3.00);`);
  server = await startTestServer({
    JOB_HEARTBEAT_TIMEOUT_SECONDS: '2',
    LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'silent',
  });
  tenant = await createTenant(server);
  const name = unique('leftovers');
  await createWorkspace(server, tenant.admin.token, {
    name,
    source_config: pgConfig(warehouse.name, { schemas: ['shop'] }),
    target_config: pgConfig(warehouse.name, { schemas: ['dw'] }),
    target_schema: {
      name: 'dw',
      tables: [
        {
          name: 'customers',
          primary_key: ['customer_id'],
          columns: [
            { name: 'customer_id', type: 'integer', nullable: false },
            { name: 'email', type: 'text' },
          ],
        },
        {
          name: 'orders',
          primary_key: ['order_id'],
          columns: [
            { name: 'order_id', type: 'integer', nullable: false },
            { name: 'customer_id', type: 'integer' },
            { name: 'amount', type: 'numeric' },
          ],
        },
      ],
    },
  });
  const [row] = await server.deps.orm.em
    .fork()
    .execute<{ id: string }[]>('select id from workspaces where organization_id = ? and name = ?', [
      tenant.organization.id,
      name,
    ]);
  workspaceId = row.id;
  const mapped: Record<string, [string, string][]> = {
    customers: [
      ['shop.customers.id', 'customer_id'],
      ['shop.customers.email', 'email'],
    ],
    orders: [
      ['shop.orders.id', 'order_id'],
      ['shop.orders.customer_id', 'customer_id'],
      ['shop.orders.amount', 'amount'],
    ],
  };
  for (const [table, connections] of Object.entries(mapped)) {
    for (const [source_field, target_field] of connections) {
      const res = await api('POST', `/api/mappings/${table}/connection`, {
        body: { connection: { source_field, target_field, status: 'confirmed' } },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
    }
    const commit = await api('POST', `/api/mappings/${table}/commit-transformation`, {
      body: { message: table },
    });
    expect(commit.status, JSON.stringify(commit.body)).toBe(200);
    expect((await materialized(table)).result).not.toHaveProperty('removed_leftovers');
  }
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

/** Materializes the table through the API; its run, which must have succeeded. */
async function materialized(table: string) {
  const { run } = await materializeMapping(server, tenant.admin.token, table);
  expect(run.status, run.error).toBe('succeeded');
  return run;
}

/**
 * A run of the table's materialization whose worker died while loading, on its last attempt (a
 * materialization retries once); its id once the queue ended it failed.
 */
async function deadRun(table: string) {
  const em = server.deps.orm.em.fork();
  const [row] = await em.execute<{ id: string }[]>(
    `insert into job_runs (id, organization_id, workspace_id, kind, status, singleton_key, payload, progress,
       retry_count, started_at, created_at, updated_at)
     values (?, ?, ?, ?, 'running', ?, ?, ?, 1, now(), now(), now() - interval '1 hour')
     returning id`,
    [
      randomUUID(),
      tenant.organization.id,
      workspaceId,
      MATERIALIZE_MAPPING_KIND,
      `${workspaceId}:${table}`,
      JSON.stringify({ workspace_id: workspaceId, table_name: table, commit_id: randomUUID(), version: 1 }),
      JSON.stringify({ phase: 'loading', mode: 'insert_select', rows_written: 0 }),
    ],
  );
  await until(
    'the queue to end the dead run',
    () => server.deps.jobs.getRun(row.id, tenant.organization.id),
    (run) => run?.status === 'failed',
  );
  return row.id;
}

/** What a run whose worker died while loading leaves: its staging table, shaped like the target, half full. */
async function leftStagingTable(table: string, runId: string) {
  const name = stagingName(table, runId);
  await warehouse.sql(`create table dw."${name}" (like dw.${table} including all)`);
  await warehouse.sql(`insert into dw."${name}" select * from dw.${table} limit 1`);
  return name;
}

describe('a staging table a materialization left behind', () => {
  it("is dropped by the table's next materialization, and nothing that only looks like one", async () => {
    const deadCustomers = await deadRun('customers');
    const deadOrders = await deadRun('orders');
    const customersLeftover = await leftStagingTable('customers', deadCustomers);
    const ordersLeftover = await leftStagingTable('orders', deadOrders);
    // A user's own tables named like staging tables: not the staging table of any ended run of customers
    // (the last is the name a run of customers with the id of the dead run of orders would have had).
    const lookalikes = [
      'customers__stg_manual',
      'customers__stg_deadbeef',
      stagingName('customers', deadOrders),
    ];
    for (const name of lookalikes) await warehouse.sql(`create table dw."${name}" (note text)`);
    await warehouse.sql(`insert into shop.customers values (3, 'cy@x.com')`);

    const customers = await materialized('customers');
    expect(customers.result).toMatchObject({ rows_written: 3, removed_leftovers: [customersLeftover] });
    expect(await warehouse.sql('select customer_id, email from dw.customers order by 1')).toEqual([
      { customer_id: 1, email: 'ann@x.com' },
      { customer_id: 2, email: 'bob@x.com' },
      { customer_id: 3, email: 'cy@x.com' },
    ]);
    expect(await tablesOf()).toEqual(['customers', ...lookalikes, 'orders', ordersLeftover].sort());

    // The leftover of orders goes with the next materialization of orders; the look-alikes still stay.
    const orders = await materialized('orders');
    expect(orders.result).toMatchObject({ rows_written: 2, removed_leftovers: [ordersLeftover] });
    expect(await tablesOf()).toEqual(['customers', ...lookalikes, 'orders'].sort());
    for (const name of lookalikes) await warehouse.sql(`drop table dw."${name}"`);
  });

  it('is left to a later run while a run that was taken for dead still holds it', async () => {
    const dead = await deadRun('customers');
    const leftover = await leftStagingTable('customers', dead);
    // That run's worker was only cut off from the job queue: it is still loading into its table.
    const released = await withClient(warehouse.url, async (client) => {
      await client.query('begin');
      await client.query(`lock table dw."${leftover}" in row exclusive mode`);
      const run = await materialized('customers');
      await client.query('rollback');
      return run;
    });
    expect(released.result).not.toHaveProperty('removed_leftovers');
    expect(await tablesOf()).toEqual(['customers', leftover, 'orders'].sort());

    expect((await materialized('customers')).result).toMatchObject({ removed_leftovers: [leftover] });
    expect(await tablesOf()).toEqual(['customers', 'orders']);
  });
});
