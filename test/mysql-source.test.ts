import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, type Tenant } from './helpers/api.ts';
import { mariadbUnavailable, MARIADB, scratchMysql } from './helpers/mariadb.ts';

/*
 * A MySQL-family source (the local MariaDB) behind the sources routes: introspection, sample values,
 * read-only queries. Skipped, with the reason, when no server answers on 127.0.0.1:3306.
 */
const unavailable = await mariadbUnavailable();
const db = scratchMysql('my');

let server: TestServer;
let tenant: Tenant;

describe.skipIf(unavailable)(`MySQL source ${unavailable ? `(skipped: ${unavailable})` : ''}`, () => {
  beforeAll(async () => {
    await db.create();
    await db.sql(`create table customers (
      id int unsigned not null auto_increment primary key,
      email varchar(120) not null comment 'Login e-mail',
      country char(2),
      vip tinyint(1) not null default 0,
      updated_at datetime not null default current_timestamp on update current_timestamp
    ) comment 'People who bought'`);
    await db.sql(`create table orders (
      id bigint not null primary key,
      customer_id int unsigned,
      total decimal(10,2),
      constraint orders_customer foreign key (customer_id) references customers (id)
    )`);
    await db.sql(`insert into customers (email, country, vip) values
      ('ann@example.com', 'DE', 1), ('bob@example.com', 'FR', 0), ('cy@example.com', 'DE', 0)`);
    await db.sql(`insert into orders values (1, 1, 10.50), (2, 1, 3.00), (3, 2, 99.99)`);
    await db.sql('create sequence invoice_numbers');
    await db.sql('analyze table customers, orders');
    server = await startTestServer({ WAREHOUSE_ROW_CAP: '2' });
    tenant = await createTenant(server);
    await createWorkspace(server, tenant.admin.token, {
      name: 'shop',
      select: true,
      source_config: { type: 'mysql', ...MARIADB, database: db.name, password: '' },
    });
  });

  afterAll(async () => {
    await server?.close();
    await db.drop();
  });

  it('introspects tables, mapped column types, keys, comments and estimated rows', async () => {
    const res = await call(server, 'GET', '/api/sources/unified-schema', { token: tenant.admin.token });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.schemas).toEqual([db.name]);
    const customers = res.body.tables.find((t: { name: string }) => t.name === 'customers');
    expect(customers).toMatchObject({
      schema: db.name,
      kind: 'table',
      description: 'People who bought',
      primary_key: ['id'],
      estimated_rows: 3,
    });
    const types = Object.fromEntries(
      customers.columns.map((c: { name: string; type: string }) => [c.name, c.type]),
    );
    expect(types).toEqual({
      id: 'bigint',
      email: 'character varying(120)',
      country: 'character varying(2)',
      vip: 'boolean',
      updated_at: 'timestamp without time zone',
    });
    expect(customers.columns[1]).toMatchObject({ description: 'Login e-mail', nullable: false });
    const orders = res.body.tables.find((t: { name: string }) => t.name === 'orders');
    expect(orders.columns.find((c: { name: string }) => c.name === 'customer_id')).toMatchObject({
      references: { schema: db.name, table: 'customers', column: 'id' },
    });
  });

  it('answers sample values, most frequent first, and 404 for an unknown column', async () => {
    const res = await call(server, 'GET', '/api/sources/sample-values/customers/country', {
      token: tenant.admin.token,
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.values).toEqual([
      { value: 'DE', count: 2 },
      { value: 'FR', count: 1 },
    ]);
    const missing = await call(server, 'GET', '/api/sources/sample-values/customers/nope', {
      token: tenant.admin.token,
    });
    expect(missing.status).toBe(404);
  });

  it('runs a read-only query with the row cap', async () => {
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: 'select id, email from customers order by id' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ row_count: 2, truncated: true });
    expect(res.body.rows[0]).toMatchObject({ id: 1, email: 'ann@example.com' });
  });

  it.each([
    ['delete from customers', /DELETE/],
    ['create table evil (a int)', /CREATE/],
    ['select * from customers into outfile "/tmp/x"', /INTO/],
    ['select 1; drop table customers', /one statement/i],
    ['select * from customers for update', /FOR UPDATE/],
    ['/*!50000 drop table customers */ select 1', /Executable comments/],
    // MySQL 8 would obey the hint and lift the statement timeout; refused on every server.
    ['select /*+ MAX_EXECUTION_TIME(100000000) */ * from customers', /Optimizer hints/],
  ])('refuses %s with 400 and changes nothing', async (sql, message) => {
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect(res.body.message).toMatch(message);
    const [{ n }] = await db.sql<{ n: number }>('select count(*) as n from customers');
    expect(Number(n)).toBe(3);
    const tables = await db.sql('show tables');
    expect(tables).toHaveLength(3);
  });

  it('lets the server refuse a write the lexical check cannot see (READ ONLY transaction)', async () => {
    // nextval() is a function call the check lets through; the transaction is what stops it advancing.
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: 'select nextval(invoice_numbers) as n' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect(res.body.message).toMatch(/read-only transaction/i);
    const [{ n }] = await db.sql<{ n: number }>('select nextval(invoice_numbers) as n');
    expect(Number(n)).toBe(1);
  });

  it('refuses a user with SUPER when the operator says so (WAREHOUSE_REFUSE_SUPERUSER)', async () => {
    const strict = await startTestServer({ WAREHOUSE_REFUSE_SUPERUSER: 'true' });
    try {
      const other = await createTenant(strict);
      await createWorkspace(strict, other.admin.token, {
        name: 'shop',
        select: true,
        source_config: { type: 'mysql', ...MARIADB, database: db.name },
      });
      // root holds SUPER on the test server.
      const res = await call(strict, 'POST', '/api/sources/execute-query', {
        token: other.admin.token,
        body: { sql: 'select 1' },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(422);
      expect(res.body.message).toMatch(/SUPER privilege/);
    } finally {
      await strict.close();
    }
  });
});
