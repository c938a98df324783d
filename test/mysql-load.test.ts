import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, until, type Tenant, type TestUser } from './helpers/api.ts';
import { mariadbUnavailable, MARIADB, scratchMysql, type ScratchMysql } from './helpers/mariadb.ts';
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

  /*
   * Real-world data that once failed the load or lost rows: each test loads a source database of its
   * own (through a workspace of its own, selected by the admin) and checks what lands in PostgreSQL.
   */
  describe('real-world MariaDB data', () => {
    const owned: ScratchMysql[] = [];
    afterAll(async () => {
      for (const db of owned) await db.drop();
    });

    /** A new source database with `statements` run in it, and a workspace that loads it. */
    async function ownSource(
      purpose: string,
      statements: string[],
      sourceConfig: (database: string) => Record<string, unknown> = () => ({}),
    ) {
      const db = scratchMysql(purpose);
      owned.push(db);
      await db.create();
      for (const statement of statements) await db.sql(statement);
      const token = tenant.admin.token;
      const workspace = await createWorkspace(server, token, {
        select: true,
        source_config: { type: 'mysql', ...MARIADB, database: db.name, ...sourceConfig(db.name) },
        target_config: pgConfig(target.name, { schemas: ['odd'] }),
      });
      const saved = await call(server, 'POST', '/api/schemas/workspace', {
        token,
        body: {
          schema: {
            name: 'odd',
            version: '1',
            tables: [
              {
                name: 'unused',
                primary_key: ['id'],
                columns: [{ name: 'id', type: 'bigint', nullable: false }],
              },
            ],
          },
        },
      });
      expect(saved.status, JSON.stringify(saved.body)).toBe(200);
      /** A load of the workspace, waited for until it succeeded or failed for good. */
      const load = async (mode: 'full' | 'incremental' = 'full') => {
        await call(server, 'POST', '/api/workspaces/select', { token, body: { workspace_name: workspace } });
        const res = await sync({ mode });
        expect(res.status, JSON.stringify(res.body)).toBe(200);
        return (
          await until(
            'the load',
            async () => (await call(server, 'GET', '/api/schemas/workspace/sync/status', { token })).body,
            (s) =>
              ['succeeded', 'failed'].includes(s.source_load?.status) &&
              s.source_load.run_id === res.body.source_load.run_id,
          )
        ).source_load;
      };
      const rawOf = `"raw_${db.name}"`;
      return {
        db,
        load,
        rawSchema: `raw_${db.name}`,
        rows: (sql: string, params?: unknown[]) => target.sql(sql.replaceAll('RAW', rawOf), params),
        primaryKey: async (table: string) =>
          (
            await target.sql<{ name: string }>(
              `select a.attname as name from pg_index i
                 join pg_attribute a on a.attrelid = i.indrelid and a.attnum = any(i.indkey)
                where i.indrelid = to_regclass($1) and i.indisprimary order by array_position(i.indkey, a.attnum)`,
              [`${rawOf}."${table}"`],
            )
          ).map((r) => r.name),
      };
    }

    const succeeded = (run: { status: string; error: string | null }) =>
      expect(run.status, run.error ?? undefined).toBe('succeeded');
    const byTable = (run: { result: { tables: { table: string }[] } }) =>
      Object.fromEntries(run.result.tables.map((t) => [t.table, t as Record<string, unknown>]));

    it('loads zero dates of NOT NULL columns as NULL; a primary key holding one is left off', async () => {
      const src = await ownSource('zero', [
        `create table dates (id int primary key, d date NOT NULL DEFAULT '0000-00-00',
           dt datetime NOT NULL DEFAULT '0000-00-00 00:00:00', ts timestamp NOT NULL DEFAULT '0000-00-00 00:00:00')`,
        `insert into dates values (1, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00'),
           (2, '2020-00-15', '2020-05-00 10:00:00', '2020-05-01 10:00:00'), (3, '2020-01-15', '2020-05-01 10:00:00', '2020-05-01 10:00:00')`,
        `create table daily (day date not null, shop int not null, total int, updated_at datetime not null, primary key (day, shop))`,
        `insert into daily values ('0000-00-00', 1, 5, '2024-01-01'), ('2024-01-01', 1, 7, '2024-01-01')`,
        `create table daily_clean (day date not null, shop int not null, total int, updated_at datetime not null, primary key (day, shop))`,
        `insert into daily_clean values ('2024-01-01', 1, 7, '2024-01-01')`,
      ]);
      const run = await src.load('full');
      succeeded(run);
      expect(await src.rows(`select id, d::text, dt::text, ts from RAW.dates order by id`)).toEqual([
        { id: 1, d: null, dt: null, ts: null },
        { id: 2, d: null, dt: null, ts: new Date('2020-05-01T10:00:00Z') },
        { id: 3, d: '2020-01-15', dt: '2020-05-01 10:00:00', ts: new Date('2020-05-01T10:00:00Z') },
      ]);
      // Date columns of the raw copy accept NULL whatever the source says; the others keep NOT NULL.
      expect(
        await target.sql(
          `select column_name, is_nullable from information_schema.columns
            where table_schema = $1 and table_name = 'dates' order by ordinal_position`,
          [src.rawSchema],
        ),
      ).toEqual([
        { column_name: 'id', is_nullable: 'NO' },
        { column_name: 'd', is_nullable: 'YES' },
        { column_name: 'dt', is_nullable: 'YES' },
        { column_name: 'ts', is_nullable: 'YES' },
      ]);
      expect(await src.primaryKey('dates')).toEqual(['id']);
      // A key that received a NULL cannot be a PostgreSQL primary key: the copy has every row, no key.
      expect(await src.rows(`select day::text, shop, total from RAW.daily order by day nulls first`)).toEqual(
        [
          { day: null, shop: 1, total: 5 },
          { day: '2024-01-01', shop: 1, total: 7 },
        ],
      );
      expect(await src.primaryKey('daily')).toEqual([]);
      expect(await src.primaryKey('daily_clean')).toEqual(['day', 'shop']);
      const first = byTable(run);
      expect(first.daily.without_primary_key).toMatch(
        /primary-key column holds dates PostgreSQL has no value for/,
      );
      expect(first.daily_clean.without_primary_key).toBeNull();

      // Incremental: the keyless copy loads in full; a keyed copy whose new rows bring a NULL key, too.
      await src.db.sql(`update daily set total = 8, updated_at = '2024-02-01' where day = '2024-01-01'`);
      await src.db.sql(`insert into daily_clean values ('0000-00-00', 2, 1, '2024-02-01')`);
      const next = await src.load('incremental');
      succeeded(next);
      const second = byTable(next);
      expect(second.daily).toMatchObject({
        mode: 'full',
        full_because: expect.stringMatching(/no primary key/),
      });
      expect(second.daily_clean).toMatchObject({
        mode: 'full',
        full_because: expect.stringMatching(/^new or changed rows: a primary-key column holds dates/),
        without_primary_key: expect.stringMatching(/primary-key column/),
        rows: 2,
      });
      expect(await src.rows(`select day::text, shop, total from RAW.daily order by day nulls first`)).toEqual(
        [
          { day: null, shop: 1, total: 5 },
          { day: '2024-01-01', shop: 1, total: 8 },
        ],
      );
      expect(await src.rows(`select day::text, shop from RAW.daily_clean order by shop`)).toEqual([
        { day: '2024-01-01', shop: 1 },
        { day: null, shop: 2 },
      ]);
    });

    it('loads dates PostgreSQL has no value for (ALLOW_INVALID_DATES) as NULL, leap days as they are', async () => {
      const src = await ownSource('invalid', [
        'create table invalid_dates (id int primary key, d date, dt datetime(3))',
        `set statement sql_mode = 'ALLOW_INVALID_DATES' for insert into invalid_dates values
           (1, '2021-02-31', '2021-04-31 10:00:00'), (2, '2024-02-29', '2023-02-29 00:00:00'),
           (3, '2000-02-29', '1900-02-29 00:00:00'), (4, '2021-12-31', '2021-06-30 23:59:59.250'),
           (5, '2021-11-31', '2021-09-31 00:00:00'), (6, '0000-01-01', '0000-12-31 00:00:00')`,
      ]);
      // The source holds them as written (not turned into zero dates by the server).
      expect((await src.db.sql<{ d: string }>('select d from invalid_dates where id = 1'))[0].d).toBe(
        '2021-02-31',
      );
      const run = await src.load('full');
      succeeded(run);
      expect(await src.rows('select id, d::text, dt::text from RAW.invalid_dates order by id')).toEqual([
        { id: 1, d: null, dt: null },
        { id: 2, d: '2024-02-29', dt: null },
        { id: 3, d: '2000-02-29', dt: null },
        { id: 4, d: '2021-12-31', dt: '2021-06-30 23:59:59.25' },
        { id: 5, d: null, dt: null },
        { id: 6, d: null, dt: null },
      ]);
    });

    it('loads bit(64) values past 2^63 into numeric(20,0); narrower bits stay bigint', async () => {
      const src = await ownSource('bits', [
        'create table bits (id int primary key, b64 bit(64), b63 bit(63), b8 bit(8))',
        `insert into bits values (1, b'${'1'.repeat(64)}', b'${'1'.repeat(63)}', b'11111111'),
           (2, b'1${'0'.repeat(63)}', b'0', b'0'), (3, null, null, null)`,
      ]);
      const run = await src.load('full');
      succeeded(run);
      expect(
        await target.sql(
          `select attname as name, format_type(atttypid, atttypmod) as type from pg_attribute
            where attrelid = to_regclass($1) and attnum > 0 order by attnum`,
          [`"${src.rawSchema}".bits`],
        ),
      ).toEqual([
        { name: 'id', type: 'integer' },
        { name: 'b64', type: 'numeric(20,0)' },
        { name: 'b63', type: 'bigint' },
        { name: 'b8', type: 'bigint' },
      ]);
      expect(await src.rows('select id, b64::text, b63::text, b8::text from RAW.bits order by id')).toEqual([
        { id: 1, b64: '18446744073709551615', b63: '9223372036854775807', b8: '255' },
        { id: 2, b64: '9223372036854775808', b63: '0', b8: '0' },
        { id: 3, b64: null, b63: null, b8: null },
      ]);
    });

    it('drops \\u0000 from JSON as NUL is dropped from text; an escaped backslash before u0000 stays', async () => {
      const src = await ownSource('json', ['create table docs (id int primary key, doc json, note text)']);
      const docs = [
        String.raw`{"a": "x\u0000y", "b": "back\\u0000slash", "c": ["\u0000", "\\\u0000z"], "\u0000k": 1}`,
        String.raw`"\u0000"`,
        String.raw`{"plain": "tab\there \"quoted\" \\ and \u00e9"}`,
      ];
      for (const [i, doc] of docs.entries())
        await src.db.sql('insert into docs values (?, ?, ?)', [i + 1, doc, `n\u0000ul`]);
      const run = await src.load('full');
      succeeded(run);
      expect(await src.rows('select id, doc, note from RAW.docs order by id')).toEqual([
        { id: 1, doc: { a: 'xy', b: 'back\\u0000slash', c: ['', '\\z'], k: 1 }, note: 'nul' },
        { id: 2, doc: '', note: 'nul' },
        { id: 3, doc: { plain: 'tab\there "quoted" \\ and é' }, note: 'nul' },
      ]);
    });

    it('keeps the keys of tables whose names differ only by case apart', async () => {
      const src = await ownSource('case', [
        'create table `UPPER` (`ID` int primary key, v varchar(5))',
        'create table `upper` (id int primary key, w varchar(5))',
        "insert into `UPPER` values (1, 'big')",
        "insert into `upper` values (2, 'small')",
      ]);
      const run = await src.load('full');
      succeeded(run);
      expect(await src.primaryKey('UPPER')).toEqual(['ID']);
      expect(await src.primaryKey('upper')).toEqual(['id']);
      expect(await src.rows('select * from RAW."UPPER"')).toEqual([{ ID: 1, v: 'big' }]);
      expect(await src.rows('select * from RAW.upper')).toEqual([{ id: 2, w: 'small' }]);
      // Introspection, which the loader and the unified schema share, reports one key column each.
      const schema = await call(server, 'GET', '/api/sources/unified-schema', { token: tenant.admin.token });
      expect(schema.status, JSON.stringify(schema.body)).toBe(200);
      const keys = Object.fromEntries(
        schema.body.tables.map((t: { name: string; primary_key: string[] }) => [t.name, t.primary_key]),
      );
      expect(keys).toEqual({ UPPER: ['ID'], upper: ['id'] });
    });

    it('refuses, by name, tables that PostgreSQL would truncate into one another; loads the rest', async () => {
      const long = 'a'.repeat(63);
      const accents = 'é'.repeat(32); // 32 characters, 64 bytes
      const src = await ownSource('names', [
        `create table \`${long}1\` (id int primary key)`,
        `create table \`${long}2\` (id int primary key)`,
        `insert into \`${long}1\` values (1)`,
        `insert into \`${long}2\` values (2)`,
        `create table \`${accents}\` (id int primary key)`,
        `create table wide (id int primary key, \`${'c'.repeat(64)}\` int, \`${'d'.repeat(63)}\` int)`,
        `create table edge (id int primary key, \`${'e'.repeat(63)}\` int)`,
        `create table \`${'ü'.repeat(31)}x\` (id int primary key)`, // 63 bytes: fits
        `insert into edge values (1, 2)`,
        // The name of the raw schema's load-state table.
        'create table _dimas_loads (id int)',
      ]);
      const run = await src.load('full');
      succeeded(run);
      const refused = Object.fromEntries(
        run.result.refused.map((r: { table: string; reason: string }) => [r.table, r.reason]),
      );
      expect(Object.keys(refused).sort()).toEqual(
        [`${long}1`, `${long}2`, 'wide', accents, '_dimas_loads'].sort(),
      );
      expect(refused._dimas_loads).toMatch(/load-state table/);
      expect(refused[`${long}1`]).toMatch(/table name is 64 bytes long.*truncates names to 63 bytes/);
      expect(refused[accents]).toMatch(/table name is 64 bytes long/);
      expect(refused.wide).toMatch(new RegExp(`column names are longer than 63 bytes: ${'c'.repeat(64)}\\.`));
      expect(run.result.tables.map((t: { table: string }) => t.table).sort()).toEqual([
        'edge',
        `${'ü'.repeat(31)}x`,
      ]);
      // Nothing was truncated into the raw schema.
      expect(
        (
          await target.sql<{ name: string }>(
            `select relname as name from pg_class where relnamespace = to_regnamespace($1) and relkind = 'r' order by 1`,
            [`"${src.rawSchema}"`],
          )
        ).map((r) => r.name),
      ).toEqual(['_dimas_loads', '_dimas_source', 'edge', `${'ü'.repeat(31)}x`]);
      expect(await src.rows(`select * from RAW.edge`)).toEqual([{ id: 1, ['e'.repeat(63)]: 2 }]);
    });

    it('refuses two source databases that would load one table name into the same raw table', async () => {
      const other = scratchMysql('other');
      owned.push(other);
      await other.create();
      await other.sql('create table same (id int primary key)');
      await other.sql('insert into same values (2)');
      const src = await ownSource(
        'same',
        [
          'create table same (id int primary key)',
          'insert into same values (1)',
          'create table own (id int)',
        ],
        (database) => ({ schemas: [database, other.name] }),
      );
      const run = await src.load('full');
      succeeded(run);
      expect(run.result.refused).toEqual([
        expect.objectContaining({ table: 'same', reason: expect.stringMatching(/would all load into/) }),
        expect.objectContaining({ table: 'same', reason: expect.stringMatching(/would all load into/) }),
      ]);
      expect(run.result.tables.map((t: { table: string }) => t.table)).toEqual(['own']);
      expect(await target.sql(`select to_regclass($1) as t`, [`"${src.rawSchema}".same`])).toEqual([
        { t: null },
      ]);
    });

    it('loads FLOAT columns with every digit of their single-precision value', async () => {
      const src = await ownSource('float', [
        'create table floats (id int primary key, f float, fu float unsigned, fd float(7,4), d double)',
        `insert into floats values (1, 1.2345678806, 0.1, 1.23456, 0.1), (2, 3.4028234e38, 16777217, -12.5, 1e308),
           (3, -1.17549435e-38, 1e-45, 0, -2.5), (4, null, null, null, null)`,
      ]);
      const run = await src.load('full');
      succeeded(run);
      // What PostgreSQL makes of the same literals as real: the same single-precision floats.
      expect(
        await src.rows(
          `select id, f = '1.2345678806'::real or f = '3.4028234e38'::real or f = '-1.17549435e-38'::real as same,
                  f::text, fu::text, fd::text, d::text from RAW.floats order by id`,
        ),
      ).toEqual([
        { id: 1, same: true, f: '1.2345679', fu: '0.1', fd: '1.2346', d: '0.1' },
        { id: 2, same: true, f: '3.4028235e+38', fu: '1.6777216e+07', fd: '-12.5', d: '1e+308' },
        { id: 3, same: true, f: '-1.1754944e-38', fu: '1e-45', fd: '0', d: '-2.5' },
        { id: 4, same: null, f: null, fu: null, fd: null, d: null },
      ]);
    });

    it("names the failing table and column in the load's error and progress", async () => {
      const src = await ownSource('fails', [
        'create table a_fine (id int primary key)',
        'insert into a_fine values (1)',
        'create table broken (id int primary key, doc json)',
        `insert into broken values (1, '{"ok": true}')`,
        // Written while the json_valid check was off: PostgreSQL's jsonb refuses it.
        `set statement check_constraint_checks = 0 for insert into broken values (2, '{"cut": ')`,
        'create table z_fine (id int primary key)',
      ]);
      const run = await src.load('full');
      expect(run.status).toBe('failed');
      expect(run.error).toMatch(
        new RegExp(
          `^Loading table ${src.db.name}\\.broken into ${src.rawSchema}\\.broken failed \\(column doc, row 2 of the extract\\): .*invalid input syntax for type json`,
        ),
      );
      expect(run.progress).toMatchObject({ table: 'broken', tables_done: 1, tables_total: 3 });
      // A value PostgreSQL refuses fails the same way on every attempt: not retried (each retry
      // reloaded every table before it).
      const job = await server.deps.jobs.getRun(run.run_id, tenant.organization.id);
      expect(job?.retry_count).toBe(0);
      // Tables before it were loaded (a table per transaction); the failed one is not there half-loaded.
      expect(await src.rows('select id from RAW.a_fine')).toEqual([{ id: 1 }]);
      expect(await target.sql(`select to_regclass($1) as t`, [`"${src.rawSchema}".broken`])).toEqual([
        { t: null },
      ]);
    });
  });
});
