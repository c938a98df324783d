import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import pg from 'pg';
import { AppError } from '../src/app-error.ts';
import type { ConnectionConfig } from '../src/warehouse/config.ts';
import { WarehouseRegistry } from '../src/warehouse/postgres.ts';
import { assertReadOnlySql, parseSqlExpression } from '../src/warehouse/sql-guard.ts';
import { ddlScript, diffSchema, generateDdl, syncSchema, type SchemaDocument } from '../src/warehouse/ddl.ts';
import type { Warehouse } from '../src/warehouse/warehouse.ts';
import { unique } from './helpers/api.ts';
import { pgConfig, ADMIN_URL, runSql, scratchDatabase } from './helpers/scratch-db.ts';

/*
 * The warehouse layer against a real PostgreSQL server: a database of its own on 127.0.0.1:5432
 * (never the control-plane database), created here and dropped at the end, in both test modes.
 */
const scratch = scratchDatabase('wh');

const config = (overrides: Partial<ConnectionConfig> = {}): ConnectionConfig =>
  pgConfig(scratch.name, { schemas: ['small'], ssl: false, ...overrides });

async function expectAppError(promise: Promise<unknown>, code: string, message?: RegExp): Promise<AppError> {
  const error = await promise.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(AppError);
  expect((error as AppError).code).toBe(code);
  if (message) expect((error as AppError).message).toMatch(message);
  return error as AppError;
}

let registry: WarehouseRegistry;
let warehouse: Warehouse;

beforeAll(async () => {
  await scratch.create();
  registry = new WarehouseRegistry({ statementTimeoutMs: 500, rowCap: 50 });
  warehouse = await registry.open(config());
  await warehouse.transaction(async (tx) => {
    await tx.query(`create schema small; create schema big; create schema target`);
    await tx.query(
      `create table small.customers (id integer primary key, email text not null, country text)`,
    );
    await tx.query(`comment on table small.customers is 'People who bought'`);
    await tx.query(`comment on column small.customers.email is 'Login e-mail'`);
    await tx.query(
      `create table small.orders (id bigint primary key, customer_id integer references small.customers (id),
         amount numeric(12,2), placed_at timestamptz default now())`,
    );
    await tx.query(`create view small.big_orders as select * from small.orders where amount > 100`);
    await tx.query(
      `insert into small.customers select i, 'user' || i || '@example.com',
         (array['US','DE','US','FR','US','DE'])[1 + i % 6] from generate_series(1, 300) i`,
    );
    await tx.query(
      `insert into small.orders select i, 1 + i % 300, (i % 250)::numeric, now() from generate_series(1, 1000) i`,
    );
    // 60 tables, each with a key and a foreign key to the previous one.
    for (let i = 1; i <= 60; i++)
      await tx.query(
        `create table big.t${i} (id integer primary key, name text, ${i > 1 ? `prev_id integer references big.t${i - 1} (id),` : ''} created_at date)`,
      );
  });
  await scratch.sql('analyze');
});

afterAll(async () => {
  await registry?.close();
  await scratch.drop();
});

describe('introspection', () => {
  it('reads tables, views, columns, keys and estimated rows', async () => {
    const schema = await warehouse.introspect();
    expect(schema.database).toBe(scratch.name);
    expect(schema.schemas).toEqual(['small']);
    const byName = Object.fromEntries(schema.tables.map((t) => [t.name, t]));
    expect(Object.keys(byName).sort()).toEqual(['big_orders', 'customers', 'orders']);
    expect(byName.big_orders.kind).toBe('view');
    expect(byName.customers).toMatchObject({
      kind: 'table',
      description: 'People who bought',
      primary_key: ['id'],
      estimated_rows: 300,
    });
    expect(byName.customers.columns.map((c) => [c.name, c.type, c.nullable])).toEqual([
      ['id', 'integer', false],
      ['email', 'text', false],
      ['country', 'text', true],
    ]);
    expect(byName.customers.columns[1].description).toBe('Login e-mail');
    expect(byName.orders.columns.find((c) => c.name === 'amount')?.type).toBe('numeric(12,2)');
    expect(byName.orders.columns.find((c) => c.name === 'placed_at')?.default).toBe('now()');
    expect(byName.orders.foreign_keys).toEqual([
      {
        name: expect.any(String),
        columns: ['customer_id'],
        references: { schema: 'small', table: 'customers', columns: ['id'] },
      },
    ]);
  });

  it('uses the same small number of catalog queries for 3 tables and for 60', async () => {
    const spy = vi.spyOn(pg.Client.prototype, 'query');
    try {
      spy.mockClear();
      const small = await warehouse.introspect({ schemas: ['small'] });
      const smallQueries = spy.mock.calls.length;
      spy.mockClear();
      const big = await warehouse.introspect({ schemas: ['big'] });
      const bigQueries = spy.mock.calls.length;
      expect(small.tables).toHaveLength(3);
      expect(big.tables).toHaveLength(60);
      expect(big.tables.find((t) => t.name === 't60')?.foreign_keys[0].references.table).toBe('t59');
      expect(bigQueries).toBe(smallQueries);
      expect(bigQueries).toBeLessThanOrEqual(8);
    } finally {
      spy.mockRestore();
    }
  });

  it('keeps only the selected tables', async () => {
    const schema = await warehouse.introspect({ tables: ['customers', 'small.big_orders'] });
    expect(schema.tables.map((t) => t.name).sort()).toEqual(['big_orders', 'customers']);
  });

  it('lists the databases and schemas the credentials see', async () => {
    const catalogs = await warehouse.catalogs();
    expect(catalogs.databases).toContain(scratch.name);
    expect(catalogs.schemas).toEqual(expect.arrayContaining(['big', 'public', 'small', 'target']));
  });
});

describe('sample values', () => {
  it('returns distinct values, most frequent first', async () => {
    const values = await warehouse.sampleValues({ schema: 'small', name: 'customers' }, 'country');
    expect(values).toEqual([
      { value: 'US', count: 150 },
      { value: 'DE', count: 100 },
      { value: 'FR', count: 50 },
    ]);
    expect(await warehouse.sampleValues({ schema: 'small', name: 'orders' }, 'amount', 5)).toHaveLength(5);
  });

  it('refuses a limit above 1000 and an unknown column', async () => {
    await expectAppError(
      warehouse.sampleValues({ schema: 'small', name: 'customers' }, 'country', 1001),
      'BAD_REQUEST',
    );
    await expectAppError(warehouse.sampleValues({ schema: 'small', name: 'customers' }, 'nope'), 'NOT_FOUND');
  });
});

describe('read-only queries', () => {
  it('returns columns with types, rows and a truncated flag at the cap', async () => {
    const result = await warehouse.readOnlyQuery(
      'select c.id, email, amount, placed_at from small.customers c join small.orders o on o.customer_id = c.id order by o.id',
    );
    expect(result.columns).toEqual([
      { name: 'id', type: 'integer' },
      { name: 'email', type: 'text' },
      { name: 'amount', type: 'numeric' },
      { name: 'placed_at', type: 'timestamp with time zone' },
    ]);
    expect(result.row_count).toBe(50);
    expect(result.truncated).toBe(true);
    const few = await warehouse.readOnlyQuery('values (1, $1::text)', { params: ['a'], limit: 5 });
    expect(few).toMatchObject({ row_count: 1, truncated: false, rows: [{ column1: 1, column2: 'a' }] });
    const plan = await warehouse.readOnlyQuery('explain select * from small.orders');
    expect(plan.columns[0].name).toBe('QUERY PLAN');
  });

  it('refuses mutating statements by kind, and changes nothing', async () => {
    await expectAppError(
      warehouse.readOnlyQuery('delete from small.orders'),
      'BAD_REQUEST',
      /got DeleteStmt/,
    );
    await expectAppError(
      warehouse.readOnlyQuery(
        'with gone as (delete from small.orders returning *) select count(*) from gone',
      ),
      'BAD_REQUEST',
      /DeleteStmt/,
    );
    await expectAppError(
      warehouse.readOnlyQuery('select 1; drop table small.orders'),
      'BAD_REQUEST',
      /exactly one/,
    );
    await expectAppError(warehouse.readOnlyQuery('drop table small.orders'), 'BAD_REQUEST', /DropStmt/);
    await expectAppError(warehouse.readOnlyQuery('select * into x from small.orders'), 'BAD_REQUEST', /INTO/);
    await expectAppError(
      warehouse.readOnlyQuery(`select set_config('statement_timeout', '0', true)`),
      'BAD_REQUEST',
      /set_config/,
    );
    await expectAppError(
      warehouse.readOnlyQuery('explain analyze delete from small.orders'),
      'BAD_REQUEST',
      /DeleteStmt/,
    );
    const count = await warehouse.readOnlyQuery('select count(*)::int as n from small.orders');
    expect(count.rows[0].n).toBe(1000);
  });

  it('answers a syntax error with the parser message and position', async () => {
    const error = await expectAppError(warehouse.readOnlyQuery('select * form small.orders'), 'BAD_REQUEST');
    expect(error.message).toMatch(/syntax error at or near "small".*position|position \d+.*syntax error/);
    // Positions count in the text given, not in the SELECT that caps it (no view check here: the
    // database holds no functions of its own).
    await expectAppError(
      warehouse.readOnlyQuery('select * from small.nope'),
      'BAD_REQUEST',
      /does not exist \(position 15\)$/,
    );
    await expectAppError(
      warehouse.readOnlyQuery('-- ü\nselect * from small.nope'),
      'BAD_REQUEST',
      /does not exist \(position 20\)$/,
    );
  });

  it('cuts off a slow query with the statement timeout', async () => {
    const started = Date.now();
    const error = await expectAppError(
      // Slow without a volatile function (pg_sleep is refused by the catalog rule).
      warehouse.readOnlyQuery(
        'select count(*) from generate_series(1, 100000) a, generate_series(1, 100000) b',
      ),
      'UNPROCESSABLE_CONTENT',
      /statement timeout/,
    );
    expect(error.details.reason).toBe('STATEMENT_TIMEOUT');
    expect(Date.now() - started).toBeLessThan(3000);
    // The pool is still usable afterwards.
    expect((await warehouse.readOnlyQuery('select 1 as one')).rows).toEqual([{ one: 1 }]);
  });

  it('streams a large result in batches', async () => {
    let rows = 0;
    let batches = 0;
    for await (const batch of warehouse.stream('select * from small.orders', { batchSize: 300 })) {
      rows += batch.length;
      batches++;
    }
    expect([rows, batches]).toEqual([1000, 4]);
    // Stopping early releases the connection.
    for await (const batch of warehouse.stream('select * from small.orders', { batchSize: 10 })) {
      expect(batch).toHaveLength(10);
      break;
    }
    expect((await warehouse.readOnlyQuery('select 2 as two')).rows).toEqual([{ two: 2 }]);
  });

  it('streams values JSON cannot carry as PostgreSQL prints them (exports post and write them)', async () => {
    // A webhook export posted NaN as null and a bytea as a serialized Buffer; a PostgreSQL destination
    // wrote that Buffer's JSON into its bytea column.
    const batches: Record<string, unknown>[][] = [];
    for await (const batch of warehouse.stream(
      `select 'NaN'::float8 as nan, '-Infinity'::float4 as low, 2.5::float8 as plain, '\\xdeadbeef'::bytea as raw`,
    ))
      batches.push(batch);
    expect(batches).toEqual([[{ nan: 'NaN', low: '-Infinity', plain: 2.5, raw: '\\xdeadbeef' }]]);
  });
});

describe('generated aggregates', () => {
  it('returns every row, with parameters, beyond the row cap of user SQL', async () => {
    const rows = await warehouse.aggregate(
      'select country, count(*)::int as n from small.customers where id > $1 group by 1 order by 1',
      { params: [0] },
    );
    expect(rows).toEqual([
      { country: 'DE', n: 100 },
      { country: 'FR', n: 50 },
      { country: 'US', n: 150 },
    ]);
    expect(await warehouse.aggregate('select * from small.orders')).toHaveLength(1000);
  });

  it('refuses a write inside (the SQL guard, then READ ONLY) and changes nothing', async () => {
    await expectAppError(
      warehouse.aggregate('with gone as (delete from small.orders returning *) select count(*) from gone'),
      'BAD_REQUEST',
      /read-only/,
    );
    await expectAppError(
      warehouse.aggregate('create table small.written (id integer)'),
      'BAD_REQUEST',
      /read-only|CREATE/i,
    );
    expect(await warehouse.aggregate('select count(*)::int as n from small.orders')).toEqual([{ n: 1000 }]);
  });

  it('cuts off a slow statement with the default or the given timeout', async () => {
    // Calls only immutable functions (pg_sleep is volatile, so the guard refuses it here).
    const endless = 'select count(*) from generate_series(1, 100000) a, generate_series(1, 100000) b';
    let started = Date.now();
    const error = await expectAppError(
      warehouse.aggregate(endless),
      'UNPROCESSABLE_CONTENT',
      /statement timeout/,
    );
    expect(error.details.reason).toBe('STATEMENT_TIMEOUT');
    expect(Date.now() - started).toBeLessThan(3000);
    started = Date.now();
    await expectAppError(
      warehouse.aggregate(endless, { timeoutMs: 100 }),
      'UNPROCESSABLE_CONTENT',
      /statement timeout/,
    );
    expect(Date.now() - started).toBeLessThan(1000);
    // 36 million rows take longer than the default (500 ms here) and finish within the timeout given.
    const long = 'select count(*)::int as n from generate_series(1, 6000) a, generate_series(1, 6000) b';
    await expectAppError(warehouse.aggregate(long), 'UNPROCESSABLE_CONTENT', /statement timeout/);
    expect(await warehouse.aggregate(long, { timeoutMs: 60_000 })).toEqual([{ n: 36_000_000 }]);
  });
});

describe('sql guard', () => {
  it('classifies read-only statements', async () => {
    expect(await assertReadOnlySql('WITH x AS (SELECT 1) SELECT * FROM x -- comment; delete')).toMatchObject({
      kind: 'SELECT',
      statement: 'WITH x AS (SELECT 1) SELECT * FROM x -- comment; delete',
    });
    // The statement without its semicolon (and what follows it), ready to be wrapped in a LIMIT.
    expect(await assertReadOnlySql('values (1);  -- trailing')).toMatchObject({
      kind: 'VALUES',
      statement: 'values (1)',
    });
    await expectAppError(assertReadOnlySql('update t set a = 1'), 'BAD_REQUEST', /got UpdateStmt/);
    await expectAppError(assertReadOnlySql('insert into t values (1)'), 'BAD_REQUEST', /got InsertStmt/);
    await expectAppError(assertReadOnlySql('select 1 for update'), 'BAD_REQUEST', /FOR UPDATE/);
    await expectAppError(assertReadOnlySql('  '), 'BAD_REQUEST', /no statement/);
  });

  it("gives the warehouse the statement as a SELECT a view can hold: an EXPLAIN's query, parameters as NULL", async () => {
    const select = async (sql: string) => (await assertReadOnlySql(sql)).check.select;
    expect(await select('explain (analyze, format json) with a as (select 1) select * from a')).toBe(
      'with a as (select 1) select * from a',
    );
    expect(await select('EXPLAIN ANALYZE VERBOSE (select 1)')).toBe('(select 1)');
    expect(await select('explain analyze table t')).toBe('table t');
    expect(await select(`select $1::int, 'it''s $2', $12 from t where a = any($2)`)).toBe(
      `select null::int, 'it''s $2', null from t where a = any(null)`,
    );
    // Locations count bytes: a multi-byte character before a parameter, and a comment before the statement.
    expect(await select(`/* é */ select 'é' || $1;`)).toBe(`/* é */ select 'é' || null`);
  });

  it('validates a mapping expression and returns the columns it reads', async () => {
    expect(await parseSqlExpression(`lower(trim(c.email)) || '@' || domain`)).toEqual({
      columns: [
        { table: 'c', column: 'email', ref: 'c.email' },
        { table: null, column: 'domain', ref: 'domain' },
      ],
      // What it calls, for the warehouse's catalog to judge.
      calls: {
        functions: [
          { schema: null, name: 'lower' },
          // The parser writes SQL-standard trim() as pg_catalog.btrim.
          { schema: 'pg_catalog', name: 'btrim' },
        ],
        operators: [{ schema: null, name: '||' }],
      },
    });
    expect((await parseSqlExpression(`case when amount > 0 then amount else null end`)).columns).toHaveLength(
      1,
    );
    await expectAppError(parseSqlExpression('a, b'), 'BAD_REQUEST', /single SQL expression/);
    await expectAppError(parseSqlExpression('a from t'), 'BAD_REQUEST', /fromClause/);
    await expectAppError(parseSqlExpression('1; drop table t'), 'BAD_REQUEST');
    await expectAppError(parseSqlExpression('a as b'), 'BAD_REQUEST', /alias/);
    const error = await expectAppError(
      parseSqlExpression('lower(email'),
      'BAD_REQUEST',
      /expression syntax error/,
    );
    expect(error.message).toMatch(/position 12/);
  });
});

describe('connections', () => {
  it('answers 422 with the reason for a refused port, an unknown role, database or host', async () => {
    const reg = new WarehouseRegistry({ statementTimeoutMs: 1000, rowCap: 10 });
    try {
      const refused = await reg.open(config({ port: 1 }));
      await expectAppError(refused.ping(), 'UNPROCESSABLE_CONTENT', /connection refused/);
      const role = await reg.open(config({ user: 'no_such_role', password: 'wrong-password' }));
      await expectAppError(role.introspect(), 'UNPROCESSABLE_CONTENT', /no_such_role/);
      const database = await reg.open(config({ database: 'no_such_database_x' }));
      await expectAppError(database.ping(), 'UNPROCESSABLE_CONTENT', /does not exist/);
      const host = await reg.open(config({ host: 'no-such-host.invalid' }));
      await expectAppError(host.ping(), 'UNPROCESSABLE_CONTENT', /unknown host|could not be resolved/);
    } finally {
      await reg.close();
    }
  });

  it('answers 422 for a password the server refuses', async () => {
    const role = unique('dimas_wh_role_').toLowerCase();
    await runSql(ADMIN_URL, `create role ${role} login password 'right-password'`);
    const reg = new WarehouseRegistry({ statementTimeoutMs: 1000, rowCap: 10 });
    try {
      // Trust authentication (as on CI machines) accepts any password; then the role itself works.
      const wrong = await reg.open(config({ user: role, password: 'wrong-password' }));
      const outcome = await wrong.ping().then(
        () => 'accepted',
        (e: AppError) => e,
      );
      if (outcome !== 'accepted') {
        expect(outcome).toBeInstanceOf(AppError);
        expect((outcome as AppError).code).toBe('UNPROCESSABLE_CONTENT');
        expect((outcome as AppError).message).toMatch(/password authentication failed/);
      }
    } finally {
      await reg.close();
      await runSql(ADMIN_URL, `drop role ${role}`);
    }
  });

  it('never connects to the control-plane database, recognised by the server identity', async () => {
    // This scratch database plays the control plane; spelling its host another way changes nothing.
    const [controlPlane] = await scratch.sql<{ systemIdentifier: string; databaseOid: string }>(
      `select (select system_identifier::text from pg_control_system()) as "systemIdentifier",
              (select oid::text from pg_database where datname = current_database()) as "databaseOid"`,
    );
    const reg = new WarehouseRegistry({ statementTimeoutMs: 1000, rowCap: 10, controlPlane });
    try {
      for (const host of ['127.0.0.1', 'localhost', '::ffff:127.0.0.1']) {
        const error = await expectAppError(
          (await reg.open(config({ host }))).ping(),
          'UNPROCESSABLE_CONTENT',
          /own database/,
        );
        expect(error.details.reason).toBe('CONTROL_PLANE_DATABASE');
      }
      expect((await (await reg.open(config({ database: 'postgres' }))).ping()).database).toBe('postgres');
    } finally {
      await reg.close();
    }
  });

  it('keeps one pool per connection and closes an owner’s pool when its config changes', async () => {
    const reg = new WarehouseRegistry({ statementTimeoutMs: 1000, rowCap: 10 });
    try {
      await (await reg.open(config(), 'ws1:source')).ping();
      await (await reg.open(config({ schemas: ['big'] }), 'ws1:target')).ping();
      expect(reg.size).toBe(1);
      await reg.open(config({ user: 'postgres', password: 'changed' }), 'ws1:source');
      expect(reg.size).toBe(2);
      await reg.open(config({ user: 'postgres', password: 'changed' }), 'ws1:target');
      expect(reg.size).toBe(1);
    } finally {
      await reg.close();
    }
  });

  it('hands a connection back reset after a transaction: settings and advisory locks stay inside', async () => {
    // One connection in the pool, so the next borrower is the same session.
    const reg = new WarehouseRegistry({ statementTimeoutMs: 1000, rowCap: 10, poolMax: 1 });
    try {
      const single = await reg.open(config());
      const inside = await single.transaction(async (tx) => {
        await tx.query(`select set_config('search_path', 'pg_catalog', false), pg_advisory_lock(7)`);
        return (await tx.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0].pid;
      });
      const [after] = await single.aggregate(
        `select pg_backend_pid() as pid, current_setting('search_path') as path,
           (select count(*)::int from pg_locks where locktype = 'advisory' and pid = pg_backend_pid()) as locks`,
      );
      expect(after).toEqual({ pid: inside, path: '"$user", public', locks: 0 });
    } finally {
      await reg.close();
    }
  });

  it('rolls a failed transaction back', async () => {
    await expectAppError(
      warehouse.transaction(async (tx) => {
        await tx.query('create table small.half_done (id int)');
        await tx.query('insert into small.half_done values (1), (1)');
        await tx.query('select no_such_function()');
      }),
      'BAD_REQUEST',
    );
    const tables = await warehouse.introspect();
    expect(tables.tables.map((t) => t.name)).not.toContain('half_done');
  });
});

describe('concurrent work', () => {
  it('answers the transaction that loses a deadlock with SERVICE_UNAVAILABLE, to retry', async () => {
    await warehouse.transaction(async (tx) => {
      await tx.query('create table small.lock_a (id int)');
      await tx.query('create table small.lock_b (id int)');
    });
    // Each transaction locks one table, then, once the other holds its own, asks for the other's.
    let held = 0;
    const bothHeld = async () => {
      held++;
      while (held < 2) await new Promise((resolve) => setTimeout(resolve, 10));
    };
    const crossing = (first: string, second: string) =>
      warehouse.transaction(async (tx) => {
        await tx.query(`lock table small.${first} in access exclusive mode`);
        await bothHeld();
        await tx.query(`lock table small.${second} in access exclusive mode`);
      });
    const outcomes = await Promise.allSettled([crossing('lock_a', 'lock_b'), crossing('lock_b', 'lock_a')]);
    const failed = outcomes.filter((o): o is PromiseRejectedResult => o.status === 'rejected');
    expect(failed).toHaveLength(1);
    expect(failed[0].reason).toBeInstanceOf(AppError);
    expect(failed[0].reason).toMatchObject({ code: 'SERVICE_UNAVAILABLE', details: { reason: '40P01' } });
  });
});

describe('DDL and schema sync', () => {
  const document: SchemaDocument = {
    name: 'crm',
    version: '1.0.0',
    tables: [
      {
        name: 'customer_profile',
        description: "The customer's profile",
        primary_key: ['customer_id'],
        columns: [
          { name: 'customer_id', type: 'uuid', nullable: false, description: 'Key' },
          { name: 'email', type: 'text', nullable: true, description: 'E-mail', pii: true },
          { name: 'Lifetime Value', type: 'numeric', nullable: true },
          { name: 'is_active', type: 'boolean', nullable: false },
          { name: 'birth_date', type: 'date' },
          { name: 'first_seen', type: 'timestamp' },
          { name: 'updated_at', type: 'timestamptz' },
          { name: 'attributes', type: 'json' },
          { name: 'order_count', type: 'integer' },
          { name: 'event_count', type: 'bigint' },
        ],
      },
      {
        name: 'order', // a reserved word: quoting makes it work
        primary_key: ['order_id', 'line'],
        columns: [
          { name: 'order_id', type: 'bigint', nullable: false },
          { name: 'line', type: 'integer', nullable: false },
        ],
      },
    ],
  };

  it('generates DDL that runs on a real database, with grants', async () => {
    const grantee = unique('dimas_reader_').toLowerCase();
    await runSql(ADMIN_URL, `create role ${grantee}`);
    try {
      const statements = generateDdl(document, { targetSchema: 'ddl_test', grantUser: grantee });
      expect(ddlScript(statements)).toContain('create table if not exists "ddl_test"."order"');
      expect(ddlScript(statements)).toContain(
        `grant select, insert, update, delete on "ddl_test"."order" to "${grantee}"`,
      );
      await warehouse.transaction(async (tx) => {
        for (const s of statements) await tx.query(s);
      });
      const schema = await warehouse.introspect({ schemas: ['ddl_test'], tables: [] });
      const profile = schema.tables.find((t) => t.name === 'customer_profile')!;
      expect(profile.primary_key).toEqual(['customer_id']);
      expect(profile.columns.map((c) => c.type)).toEqual([
        'uuid',
        'text',
        'numeric',
        'boolean',
        'date',
        'timestamp without time zone',
        'timestamp with time zone',
        'jsonb',
        'integer',
        'bigint',
      ]);
      expect(profile.columns.find((c) => c.name === 'email')?.description).toBe('E-mail [PII]');
      expect(schema.tables.find((t) => t.name === 'order')?.primary_key).toEqual(['order_id', 'line']);
      expect(diffSchema(document, schema, 'ddl_test').in_sync).toBe(true);
      const granted = await warehouse.readOnlyQuery(
        `select has_table_privilege('${grantee}', 'ddl_test.customer_profile', 'select') as ok`,
      );
      expect(granted.rows[0].ok).toBe(true);
    } finally {
      await warehouse.transaction((tx) => tx.query('drop schema if exists ddl_test cascade'));
      await runSql(ADMIN_URL, `drop role ${grantee}`);
    }
  });

  it('creates missing tables, adds columns, keeps data unless told otherwise', async () => {
    const first = await syncSchema(warehouse, document, { targetSchema: 'target' });
    expect(first.applied).toBe(true);
    expect(first.before.missing_tables).toEqual(['customer_profile', 'order']);
    expect(first.after.in_sync).toBe(true);

    await warehouse.transaction(async (tx) => {
      await tx.query(
        `insert into target.customer_profile (customer_id, is_active, email) values (gen_random_uuid(), true, 'a@b.c')`,
      );
      await tx.query(`alter table target.customer_profile add column legacy_score int`);
      await tx.query(`create table target.unrelated (id int)`);
    });
    const changed: SchemaDocument = structuredClone(document);
    changed.tables[0].columns.push({ name: 'segment', type: 'text' });
    changed.tables[0].columns.find((c) => c.name === 'order_count')!.type = 'bigint';
    changed.tables.push({ name: 'consent', primary_key: [], columns: [{ name: 'channel', type: 'text' }] });

    const dry = await syncSchema(warehouse, changed, { targetSchema: 'target', dryRun: true });
    expect(dry.applied).toBe(false);
    expect(dry.before).toMatchObject({
      missing_tables: ['consent'],
      extra_tables: ['unrelated'],
      missing_columns: [{ table: 'customer_profile', column: 'segment', type: 'text' }],
      extra_columns: [{ table: 'customer_profile', column: 'legacy_score', type: 'integer' }],
      type_mismatches: [
        { table: 'customer_profile', column: 'order_count', expected: 'bigint', actual: 'integer' },
      ],
    });

    const safe = await syncSchema(warehouse, changed, { targetSchema: 'target' });
    expect(safe.skipped).toHaveLength(2);
    expect(safe.after).toMatchObject({ missing_tables: [], missing_columns: [], in_sync: false });
    expect(safe.after.extra_columns).toHaveLength(1);

    const destructive = await syncSchema(warehouse, changed, {
      targetSchema: 'target',
      allowDestructive: true,
    });
    expect(destructive.after.in_sync).toBe(true);
    expect(destructive.after.extra_tables).toEqual(['unrelated']);
    const rows = await warehouse.readOnlyQuery('select email from target.customer_profile');
    expect(rows.rows).toEqual([{ email: 'a@b.c' }]);
  });

  it('rolls the whole sync back when the data refuses a change', async () => {
    const strict: SchemaDocument = structuredClone(document);
    strict.tables[0].columns.find((c) => c.name === 'birth_date')!.nullable = false;
    strict.tables[0].columns.push({ name: 'never_added', type: 'text' });
    await expectAppError(
      syncSchema(warehouse, strict, { targetSchema: 'target' }),
      'CONFLICT',
      /rolled back/,
    );
    const schema = await warehouse.introspect({ schemas: ['target'], tables: [] });
    const profile = schema.tables.find((t) => t.name === 'customer_profile')!;
    expect(profile.columns.map((c) => c.name)).not.toContain('never_added');
  });
});
