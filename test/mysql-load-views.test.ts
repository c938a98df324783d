import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  call,
  createTenant,
  createWorkspace,
  materializeMapping,
  until,
  type Tenant,
} from './helpers/api.ts';
import { mariadbUnavailable, MARIADB, scratchMysql } from './helpers/mariadb.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

/*
 * Views of a MariaDB source: listed in the source schema, loaded into the raw schema like keyless
 * tables (incremental by a configured integer cursor, in full with a date cursor), mapped and
 * materialized; a view that cannot be selected on the source is refused by name while the rest loads.
 */
const unavailable = await mariadbUnavailable();
const source = scratchMysql('views');
const target = scratchDatabase('viewtgt');
const LONG_VIEW = `v_${'x'.repeat(62)}`; // 64 bytes: PostgreSQL would truncate it

let server: TestServer;
let tenant: Tenant;

const api = async (method: string, path: string, body?: unknown) => {
  const res = await call(server, method, path, { token: tenant.admin.token, body });
  expect(res.status, `${method} ${path}: ${JSON.stringify(res.body)}`).toBe(200);
  return res.body;
};

async function load(mode: 'full' | 'incremental') {
  const started = await api('POST', '/api/schemas/workspace/sync', { load_source: { mode } });
  return (
    await until(
      'the load',
      () => api('GET', '/api/schemas/workspace/sync/status'),
      (s) =>
        ['succeeded', 'failed'].includes(s.source_load?.status) &&
        s.source_load.run_id === started.source_load.run_id,
    )
  ).source_load;
}

const raw = (sql: string) => target.sql(sql.replaceAll('RAW', `"raw_${source.name}"`));
const byTable = (run: { result: { tables: { table: string }[] } }) =>
  Object.fromEntries(run.result.tables.map((t) => [t.table, t as Record<string, unknown>]));

describe.skipIf(unavailable)(`MySQL source views ${unavailable ? `(skipped: ${unavailable})` : ''}`, () => {
  beforeAll(async () => {
    await source.create();
    await target.create();
    for (const statement of [
      `create table orders (id int not null auto_increment primary key, customer varchar(20) not null,
         amount decimal(10,2) not null, status enum('open','paid') not null, updated_at datetime not null)`,
      `insert into orders values (1, 'ann', 10.50, 'paid', '2024-01-01 10:00:00'),
         (2, 'bob', 3.00, 'open', '2024-01-01 11:00:00'), (3, 'ann', 7.25, 'paid', '2024-01-02 09:00:00')`,
      // Named to sort before the tables: a view refused on the way must not cost the ones after it.
      'create table gone (a int)',
      'create view a_dangling as select a from gone',
      'drop table gone',
      `create function boom() returns int deterministic begin signal sqlstate '45000' set message_text = 'boom from the view'; return 1; end`,
      'create view a_failing as select id, boom() as x from orders',
      `create view paid_orders as select id, customer, amount, updated_at from orders where status = 'paid'`,
      'create view order_log as select id as seq, customer from orders',
      'create view totals as select customer, sum(amount) as total, count(*) as n from orders group by customer',
      `create view \`${LONG_VIEW}\` as select id from orders`,
    ])
      await source.sql(statement);
    server = await startTestServer();
    tenant = await createTenant(server);
    await createWorkspace(server, tenant.admin.token, {
      name: 'legacy',
      select: true,
      source_config: {
        type: 'mysql',
        ...MARIADB,
        database: source.name,
        // order_log's seq is the auto-increment key behind the view, which the view does not carry.
        // A column totals does not have, and a table the source does not have: both said, not ignored.
        cursor_columns: { order_log: 'seq', totals: 'nope', ghost: 'id' },
      },
      target_config: pgConfig(target.name, { schemas: ['analytics'] }),
    });
    await api('POST', '/api/schemas/workspace', {
      schema: {
        name: 'legacy',
        version: '1',
        tables: [
          {
            name: 'customer_totals',
            primary_key: ['customer'],
            columns: [
              { name: 'customer', type: 'text', nullable: false },
              { name: 'total', type: 'numeric', nullable: false },
              { name: 'orders', type: 'bigint', nullable: false },
            ],
          },
        ],
      },
    });
  });

  afterAll(async () => {
    await server?.close();
    await source.drop();
    await target.drop();
  });

  it('lists views in the source schema with their columns as they will be loaded', async () => {
    const schema = await api('GET', '/api/sources/unified-schema');
    const view = (name: string) => schema.tables.find((t: { name: string }) => t.name === name);
    expect(view('paid_orders')).toMatchObject({ kind: 'view', description: null, primary_key: [] });
    expect(view('totals').columns.map((c: { name: string; type: string }) => [c.name, c.type])).toEqual([
      ['customer', 'character varying(20)'],
      ['total', 'numeric(32,2)'],
      ['n', 'bigint'],
    ]);
  });

  it('loads views like keyless tables; a view the source cannot select is refused by name', async () => {
    const run = await load('full');
    expect(run.status, run.error).toBe('succeeded');
    const loaded = byTable(run);
    expect(Object.keys(loaded).sort()).toEqual(['order_log', 'orders', 'paid_orders', 'totals']);
    expect(loaded.paid_orders).toMatchObject({ mode: 'full', rows: 2, cursor_column: 'updated_at' });
    expect(loaded.order_log).toMatchObject({ rows: 3, cursor_column: 'seq', cursor_value: '3' });
    const refused = Object.fromEntries(
      run.result.refused.map((r: { table: string; reason: string }) => [r.table, r.reason]),
    );
    expect(Object.keys(refused).sort()).toEqual(['a_dangling', 'a_failing', LONG_VIEW].sort());
    expect(refused.a_dangling).toMatch(
      new RegExp(
        `^view ${source.name}\\.a_dangling cannot be selected on the source: View '${source.name}\\.a_dangling' references invalid table`,
      ),
    );
    expect(refused.a_failing).toMatch(
      /^view .*a_failing cannot be selected on the source: boom from the view/,
    );
    expect(refused[LONG_VIEW]).toMatch(/view name is 64 bytes long.*truncates names to 63 bytes/);
    expect(run.progress).toMatchObject({ tables_done: 7, tables_total: 7, rows_loaded: 10 });

    expect(
      await raw('select id, customer, amount::text, updated_at::text from RAW.paid_orders order by id'),
    ).toEqual([
      { id: 1, customer: 'ann', amount: '10.50', updated_at: '2024-01-01 10:00:00' },
      { id: 3, customer: 'ann', amount: '7.25', updated_at: '2024-01-02 09:00:00' },
    ]);
    expect(await raw('select customer, total::text, n::text from RAW.totals order by customer')).toEqual([
      { customer: 'ann', total: '17.75', n: '2' },
      { customer: 'bob', total: '3.00', n: '1' },
    ]);
    // The raw copy of a view is a table of its own, with the view's column types and no key.
    expect(
      await target.sql(
        `select c.relkind as kind, (select count(*)::int from pg_index where indrelid = c.oid) as indexes,
                obj_description(c.oid, 'pg_class') as comment
           from pg_class c where c.oid = to_regclass($1)`,
        [`"raw_${source.name}".totals`],
      ),
    ).toEqual([
      { kind: 'r', indexes: 0, comment: `Raw copy of MySQL view ${source.name}.totals, loaded by dimas` },
    ]);
    expect(await raw(`select to_regclass('RAW.a_failing') as t`)).toEqual([{ t: null }]);
  });

  it('loads a view incrementally past an integer cursor; a date cursor reloads it in full', async () => {
    await source.sql(`insert into orders values (4, 'cy', 1.00, 'paid', '2024-02-01 00:00:00')`);
    await source.sql(`update orders set status = 'paid', updated_at = '2024-02-02 00:00:00' where id = 2`);
    const run = await load('incremental');
    expect(run.status, run.error).toBe('succeeded');
    const loaded = byTable(run);
    expect(loaded.order_log).toMatchObject({ mode: 'incremental', rows: 1, cursor_value: '4' });
    expect(loaded.paid_orders).toMatchObject({
      mode: 'full',
      full_because: 'a view has no primary key to replace changed rows by',
      rows: 4,
    });
    expect(loaded.totals).toMatchObject({
      mode: 'full',
      full_because: 'cursor_columns names nope, which view totals does not have',
    });
    expect(run.result.unknown_cursor_tables).toEqual(['ghost']);
    expect((await raw('select seq from RAW.order_log order by seq')).map((r) => r.seq)).toEqual([1, 2, 3, 4]);
    expect((await raw('select id from RAW.paid_orders order by id')).map((r) => r.id)).toEqual([1, 2, 3, 4]);
    expect(run.result.refused.map((r: { table: string }) => r.table).sort()).toEqual(
      ['a_dangling', 'a_failing', LONG_VIEW].sort(),
    );
  });

  it('maps a view and materializes its rows', async () => {
    await api('POST', '/api/schemas/workspace/sync', {});
    await api('POST', '/api/mappings/customer_totals/tables', {
      source_table: 'totals',
      relationship: 'primary',
    });
    for (const [source_field, target_field] of [
      ['totals.customer', 'customer'],
      ['totals.total', 'total'],
      ['totals.n', 'orders'],
    ])
      await api('POST', '/api/mappings/customer_totals/connection', {
        connection: { source_field, target_field },
      });
    await api('POST', '/api/mappings/customer_totals/commit-transformation', { message: 'from the view' });
    const { run } = await materializeMapping(server, tenant.admin.token, 'customer_totals');
    expect(run.status, run.error).toBe('succeeded');
    expect(
      await target.sql(
        'select customer, total::text, orders::text from analytics.customer_totals order by customer',
      ),
    ).toEqual([
      { customer: 'ann', total: '17.75', orders: '2' },
      { customer: 'bob', total: '3.00', orders: '1' },
      { customer: 'cy', total: '1.00', orders: '1' },
    ]);
  });
});
