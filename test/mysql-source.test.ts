import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import mysql from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, type Tenant } from './helpers/api.ts';
import { mariadbUnavailable, MARIADB, scratchMysql } from './helpers/mariadb.ts';
import { LEXING_SQL_MODE } from '../src/warehouse/mysql-guard.ts';

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
    expect(res.body).toMatchObject({ schemas: [db.name], missing_schemas: [] });
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

  it('answers bits as numbers and bytes as hex, as the PostgreSQL path shows bytes', async () => {
    await db.sql(
      `create table bits (small bit(3), wide bit(64), raw blob, padded binary(2), plain varchar(9))`,
    );
    await db.sql(`insert into bits values (b'101', b'${'1'.repeat(64)}', x'DEADBEEF', 'a', 'text')`);
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: 'select * from bits' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    // They came as {"type":"Buffer","data":[…]}.
    expect(res.body.rows).toEqual([
      { small: 5, wide: '18446744073709551615', raw: '\\xdeadbeef', padded: '\\x6100', plain: 'text' },
    ]);
    // Sample values show them the same way (they read as text in the connection's charset).
    const sample = async (column: string) =>
      (await call(server, 'GET', `/api/sources/sample-values/bits/${column}`, { token: tenant.admin.token }))
        .body.values;
    expect(await sample('small')).toEqual([{ value: '5', count: 1 }]);
    expect(await sample('raw')).toEqual([{ value: '\\xdeadbeef', count: 1 }]);
    expect(await sample('padded')).toEqual([{ value: '\\x6100', count: 1 }]);
    expect(await sample('plain')).toEqual([{ value: 'text', count: 1 }]);
    await db.sql('drop table bits');
  });

  it('reads a comment where MySQL does: a Unicode space after -- hides nothing', async () => {
    // MySQL starts a -- comment only before a space or an ASCII control character; the guard took any
    // Unicode space for one and blanked what MySQL then ran (a file written on the database host).
    for (const space of ['\u00a0', '\u3000', '\ufeff', '\u2028']) {
      const file = join(tmpdir(), `dimas-outfile-${process.pid}-${space.codePointAt(0)}.txt`);
      const hidden = `select 2 --${space} from (select 3 as \`${space}\`) t into outfile '${file}'`;
      const res = await call(server, 'POST', '/api/sources/execute-query', {
        token: tenant.admin.token,
        body: { sql: hidden },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      expect(res.body.message).toMatch(/INTO/);
      expect(existsSync(file)).toBe(false);
    }
    // A comment MySQL does read still runs.
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: 'select 1 as one --\tinto outfile' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.rows).toEqual([{ one: 1 }]);
  });

  it('drops the sql_mode flags that change how the guard must read a statement', async () => {
    // A server whose default mode reads strings without backslash escapes or double quotes as names
    // would end a string where the guard did not; each connection's session is set back first.
    const c = await mysql.createConnection(MARIADB);
    try {
      await c.query("set session sql_mode = 'ANSI,NO_BACKSLASH_ESCAPES,ORACLE,STRICT_TRANS_TABLES'");
      await c.query(LEXING_SQL_MODE);
      const [[{ mode }]] = (await c.query('select @@session.sql_mode as mode')) as unknown as [
        { mode: string }[],
      ];
      const flags = mode.split(',');
      for (const lexing of ['ANSI', 'ANSI_QUOTES', 'NO_BACKSLASH_ESCAPES', 'ORACLE'])
        expect(flags).not.toContain(lexing);
      expect(flags).toEqual(expect.arrayContaining(['STRICT_TRANS_TABLES', 'PIPES_AS_CONCAT']));
    } finally {
      await c.end();
    }
    const res = await call(server, 'POST', '/api/sources/execute-query', {
      token: tenant.admin.token,
      body: { sql: `select 'a\\\\' as s, "b" as t` },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.rows).toEqual([{ s: 'a\\', t: 'b' }]);
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
