import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, until, type Tenant, type TestUser } from './helpers/api.ts';
import { mariadbUnavailable, MARIADB, scratchMysql } from './helpers/mariadb.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

/*
 * Extract–load of a MariaDB source into the raw schema of a PostgreSQL target, queued by
 * POST /api/schemas/workspace/sync { load_source } and followed on GET …/sync/status: every type of
 * the documented mapping, then an incremental load after inserts, updates and deletes, then a full reload.
 */
const unavailable = await mariadbUnavailable();
const source = scratchMysql('load');
const target = scratchDatabase('rawtgt');

let server: TestServer;
let tenant: Tenant;
let viewer: TestUser;

const sync = (load_source: Record<string, unknown>, token = tenant.admin.token) =>
  call(server, 'POST', '/api/schemas/workspace/sync', { token, body: { load_source } });

async function loadAndWait(mode: 'full' | 'incremental') {
  const res = await sync({ mode });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  expect(res.body.source_load).toMatchObject({ created: true, mode, raw_schema: `raw_${source.name}` });
  const status = await until(
    'the load',
    async () =>
      (await call(server, 'GET', '/api/schemas/workspace/sync/status', { token: viewer.token })).body,
    (s) =>
      ['succeeded', 'failed'].includes(s.source_load?.status) &&
      s.source_load.run_id === res.body.source_load.run_id,
  );
  expect(status.source_load.status, status.source_load.error).toBe('succeeded');
  return status.source_load;
}

const raw = (sql: string) => target.sql(sql.replaceAll('RAW', `"raw_${source.name}"`));

describe.skipIf(unavailable)(`MySQL extract-load ${unavailable ? `(skipped: ${unavailable})` : ''}`, () => {
  beforeAll(async () => {
    await source.create();
    await target.create();
    await source.sql(`create table everything (
      id int unsigned not null auto_increment primary key,
      flag tinyint(1), tiny tinyint, tiny_u tinyint unsigned, small_u smallint unsigned, medium mediumint,
      int_u int unsigned, big bigint, big_u bigint unsigned, price decimal(12,3), ratio float, score double,
      bit1 bit(1), bits bit(5), name varchar(40), code char(3), latin varchar(20) character set latin1,
      body text, status enum('new','paid','shipped'), tags set('a','b','c'), doc json,
      born date, seen datetime(3), stamped timestamp null default null, took time, yr year, blob_col blob,
      updated_at datetime not null default current_timestamp
    )`);
    await source.sql(`insert into everything values
      (1, 1, -128, 255, 65535, -8388608, 4294967295, -9223372036854775808, 18446744073709551615, 12345.678, 1.5, 2.25,
       b'1', b'10101', 'Ann\ttab\\\\back\nline', 'abc', 'Café', repeat('x', 3), 'paid', 'a,c', '{"k": [1, "two"]}',
       '2024-02-29', '2024-03-01 12:34:56.789', '2024-03-01 10:00:00', '-12:30:00', 2024, x'00ff10', '2024-01-01 00:00:00'),
      (2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b'0', b'0', '', '', '', '', 'new', '', '[]',
       '0000-00-00', '0000-00-00 00:00:00', null, '00:00:00', 0000, x'', '2024-01-01 00:00:00'),
      (3, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null,
       '2024-05-00', null, null, null, null, null, '2024-01-01 00:00:00')`);
    await source.sql(
      `create table events (seq bigint not null auto_increment primary key, kind varchar(10))`,
    );
    await source.sql(`insert into events (kind) values ('a'), ('b')`);
    server = await startTestServer();
    tenant = await createTenant(server);
    viewer = await tenant.addUser(['viewer']);
    await createWorkspace(server, tenant.admin.token, {
      name: 'shop',
      select: true,
      source_config: { type: 'mysql', ...MARIADB, database: source.name },
      target_config: pgConfig(target.name, { schemas: ['analytics'] }),
    });
    await call(server, 'POST', '/api/workspaces/select', {
      token: viewer.token,
      body: { workspace_name: 'shop' },
    });
    const schema = {
      name: 'shop',
      version: '1',
      tables: [
        { name: 'people', primary_key: ['id'], columns: [{ name: 'id', type: 'bigint', nullable: false }] },
      ],
    };
    const saved = await call(server, 'POST', '/api/schemas/workspace', {
      token: tenant.admin.token,
      body: { schema },
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
  });

  afterAll(async () => {
    await server?.close();
    await source.drop();
    await target.drop();
  });

  it('refuses a viewer and a bad mode', async () => {
    expect((await sync({ mode: 'full' }, viewer.token)).status).toBe(403);
    const bad = await sync({ mode: 'sideways' });
    expect(bad.status).toBe(400);
    expect(JSON.stringify(bad.body.issues)).toMatch(/mode/);
  });

  it('loads every type of the mapping into raw_<database>', async () => {
    const run = await loadAndWait('full');
    expect(run.result).toMatchObject({ raw_schema: `raw_${source.name}`, rows: 5 });
    expect(run.progress).toMatchObject({ tables_done: 2, tables_total: 2, rows_loaded: 5 });
    const types = Object.fromEntries(
      (
        await target.sql<{ column_name: string; type: string }>(
          `select column_name, format_type(atttypid, atttypmod) as type
             from information_schema.columns c join pg_attribute a on a.attrelid = ('"raw_${source.name}".everything')::regclass and a.attname = c.column_name
            where table_schema = $1 and table_name = 'everything'`,
          [`raw_${source.name}`],
        )
      ).map((r) => [r.column_name, r.type]),
    );
    expect(types).toEqual({
      id: 'bigint',
      flag: 'boolean',
      tiny: 'smallint',
      tiny_u: 'smallint',
      small_u: 'integer',
      medium: 'integer',
      int_u: 'bigint',
      big: 'bigint',
      big_u: 'numeric(20,0)',
      price: 'numeric(12,3)',
      ratio: 'real',
      score: 'double precision',
      bit1: 'boolean',
      bits: 'bigint',
      name: 'character varying(40)',
      code: 'character varying(3)',
      latin: 'character varying(20)',
      body: 'text',
      status: 'text',
      tags: 'text[]',
      doc: 'jsonb',
      born: 'date',
      seen: 'timestamp(3) without time zone',
      stamped: 'timestamp with time zone',
      took: 'interval',
      yr: 'smallint',
      blob_col: 'bytea',
      updated_at: 'timestamp without time zone',
    });
    const rows = await raw(
      `select id, flag, tiny, tiny_u, small_u, medium, int_u, big::text, big_u::text, price::text, ratio, score, bit1, bits,
              name, code, latin, body, status, tags, doc, born::text, seen::text, stamped, took::text, yr,
              encode(blob_col, 'hex') as blob_hex from RAW.everything order by id`,
    );
    expect(rows[0]).toEqual({
      id: '1',
      flag: true,
      tiny: -128,
      tiny_u: 255,
      small_u: 65535,
      medium: -8388608,
      int_u: '4294967295',
      big: '-9223372036854775808',
      big_u: '18446744073709551615',
      price: '12345.678',
      ratio: 1.5,
      score: 2.25,
      bit1: true,
      bits: '21',
      name: 'Ann\ttab\\back\nline',
      code: 'abc',
      latin: 'Café',
      body: 'xxx',
      status: 'paid',
      tags: ['a', 'c'],
      doc: { k: [1, 'two'] },
      born: '2024-02-29',
      seen: '2024-03-01 12:34:56.789',
      stamped: new Date('2024-03-01T10:00:00Z'),
      took: '-12:30:00',
      yr: 2024,
      blob_hex: '00ff10',
    });
    // Zero dates become NULL; empty strings, sets and binaries stay empty, false stays false.
    expect(rows[1]).toMatchObject({
      flag: false,
      bit1: false,
      bits: '0',
      name: '',
      tags: [],
      doc: [],
      born: null,
      seen: null,
      took: '00:00:00',
      blob_hex: '',
    });
    expect(rows[2]).toMatchObject({ flag: null, name: null, tags: null, doc: null, born: null });
    const events = await raw('select seq, kind from RAW.events order by seq');
    expect(events).toEqual([
      { seq: '1', kind: 'a' },
      { seq: '2', kind: 'b' },
    ]);
  });

  it('loads only new and changed rows incrementally; deletes stay until a full reload', async () => {
    await source.sql(
      `insert into everything (id, name, updated_at) values (10, 'new row', '2024-06-01 00:00:00')`,
    );
    await source.sql(
      `update everything set name = 'changed', updated_at = '2024-06-02 00:00:00' where id = 1`,
    );
    await source.sql(`delete from everything where id = 3`);
    await source.sql(`insert into events (kind) values ('c')`);
    const run = await loadAndWait('incremental');
    const byTable = Object.fromEntries(run.result.tables.map((t: { table: string }) => [t.table, t]));
    expect(byTable.everything).toMatchObject({
      mode: 'incremental',
      cursor_column: 'updated_at',
      cursor_value: '2024-06-02 00:00:00',
      // Rows 10 and 1 are past the cursor; row 2 sits on the last loaded instant, which is read again.
      rows: 3,
    });
    expect(byTable.events).toMatchObject({
      mode: 'incremental',
      cursor_column: 'seq',
      cursor_value: '3',
      rows: 1,
    });
    expect(await raw('select id, name from RAW.everything order by id')).toEqual([
      { id: '1', name: 'changed' },
      { id: '2', name: '' },
      { id: '3', name: null },
      { id: '10', name: 'new row' },
    ]);
    expect((await raw('select kind from RAW.events order by seq')).map((r) => r.kind)).toEqual([
      'a',
      'b',
      'c',
    ]);

    const full = await loadAndWait('full');
    expect(full.result.tables.map((t: { mode: string }) => t.mode)).toEqual(['full', 'full']);
    expect((await raw('select id from RAW.everything order by id')).map((r) => r.id)).toEqual([
      '1',
      '2',
      '10',
    ]);
  });

  it('maps, commits and materializes from the raw copy, in PostgreSQL SQL', async () => {
    const token = tenant.admin.token;
    // Local on purpose: every setup call here must succeed, so it checks the 200 and answers the body.
    const api = async (method: string, path: string, body?: unknown) => {
      const res = await call(server, method, path, { token, body });
      expect(res.status, `${method} ${path}: ${JSON.stringify(res.body)}`).toBe(200);
      return res.body;
    };
    await api('POST', '/api/schemas/workspace', {
      schema: {
        name: 'shop',
        version: '2',
        tables: [
          {
            name: 'people',
            primary_key: ['id'],
            columns: [
              { name: 'id', type: 'bigint', nullable: false },
              { name: 'name', type: 'text', nullable: true },
              { name: 'vip', type: 'boolean', nullable: false },
            ],
          },
        ],
      },
    });
    await api('POST', '/api/schemas/workspace/sync', {});
    await api('POST', '/api/mappings/people/tables', { source_table: 'everything', relationship: 'primary' });
    await api('POST', '/api/mappings/people/connection', {
      connection: { source_field: 'everything.id', target_field: 'id' },
    });
    await api('POST', '/api/mappings/people/connection', {
      connection: { source_field: 'everything.name', target_field: 'name' },
    });
    // A PostgreSQL expression over the mapped boolean: the raw copy is what the mapping reads.
    await api('POST', '/api/mappings/people/transformation', {
      transformation: { target_field: 'vip', expression: 'coalesce(everything.flag, false)' },
    });
    const committed = await api('POST', '/api/mappings/people/commit-transformation', {
      message: 'raw copy',
    });
    expect(committed.sql).toContain(`raw_${source.name}`);
    const { run_id } = await api('POST', '/api/mappings/people/materialize', {});
    const run = await until(
      'the materialization',
      async () => (await api('GET', '/api/mappings/people')).materialization.last_run,
      (r) => r?.run_id === run_id && ['succeeded', 'failed'].includes(r.status),
    );
    expect(run.status, run.error).toBe('succeeded');
    expect(await target.sql('select id, name, vip from analytics.people order by id')).toEqual([
      { id: '1', name: 'changed', vip: true },
      { id: '2', name: '', vip: false },
      { id: '10', name: 'new row', vip: false },
    ]);
  });
});
