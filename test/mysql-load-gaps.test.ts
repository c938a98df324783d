import mysql from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, until, type Tenant } from './helpers/api.ts';
import { mariadbUnavailable, MARIADB, scratchMysql, type ScratchMysql } from './helpers/mariadb.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { isDeterministicFailure } from '../src/jobs/job-types.ts';
import { translate } from '../src/warehouse/mysql-connection.ts';
import type { ConnectionConfig } from '../src/warehouse/config.ts';

/*
 * Extract–load of MariaDB sources where it went wrong before: MySQL errors a retry cannot get past,
 * a table dropped while the load runs, invalid dates as incremental cursors, two sources sharing one
 * raw schema, and stored functions in source queries.
 */
const unavailable = await mariadbUnavailable();
const target = scratchDatabase('gapstgt');

let server: TestServer;
let tenant: Tenant;
const owned: ScratchMysql[] = [];

const api = async (method: string, path: string, body?: unknown) => {
  const res = await call(server, method, path, { token: tenant.admin.token, body });
  expect(res.status, `${method} ${path}: ${JSON.stringify(res.body)}`).toBe(200);
  return res.body;
};

/** A new source database with `statements` run in it, and a selected workspace that loads it. */
async function ownSource(
  purpose: string,
  statements: string[],
  sourceConfig: (database: string) => Record<string, unknown> = () => ({}),
  db: ScratchMysql = scratchMysql(purpose),
) {
  owned.push(db);
  await db.create();
  for (const statement of statements) await db.sql(statement);
  const workspace = await createWorkspace(server, tenant.admin.token, {
    select: true,
    source_config: { type: 'mysql', ...MARIADB, database: db.name, ...sourceConfig(db.name) },
    target_config: pgConfig(target.name, { schemas: ['odd'] }),
  });
  await api('POST', '/api/schemas/workspace', {
    schema: {
      name: 'odd',
      version: '1',
      tables: [
        { name: 'unused', primary_key: ['id'], columns: [{ name: 'id', type: 'bigint', nullable: false }] },
      ],
    },
  });
  const select = () => api('POST', '/api/workspaces/select', { workspace_name: workspace });
  /** Queues a load of the workspace (selected first): the sync's answer. */
  const start = async (mode: 'full' | 'incremental' = 'full') => {
    await select();
    return call(server, 'POST', '/api/schemas/workspace/sync', {
      token: tenant.admin.token,
      body: { load_source: { mode } },
    });
  };
  const status = async () => (await api('GET', '/api/schemas/workspace/sync/status')).source_load;
  /** A load of the workspace, waited for until it succeeded or failed for good. */
  const load = async (mode: 'full' | 'incremental' = 'full', whileRunning?: () => Promise<void>) => {
    const res = await start(mode);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    await whileRunning?.();
    return until(
      'the load',
      status,
      (s) => ['succeeded', 'failed'].includes(s?.status) && s.run_id === res.body.source_load.run_id,
    );
  };
  return { db, workspace, load, start, status, select, rawSchema: `raw_${db.name.toLowerCase()}` };
}

/** A scratch database of exactly that name (scratchMysql lowercases its names). */
function mysqlNamed(name: string): ScratchMysql {
  const run = async <R>(text: string, database?: string) => {
    const c = await mysql.createConnection({ ...MARIADB, database });
    try {
      return (await c.query(text))[0] as R[];
    } finally {
      await c.end();
    }
  };
  return {
    name,
    create: async () => void (await run(`create database \`${name}\``)),
    sql: (text) => run(text, name),
    drop: async () => void (await run(`drop database if exists \`${name}\``)),
  };
}

const byTable = (run: { result: { tables: { table: string }[] } }) =>
  Object.fromEntries(run.result.tables.map((t) => [t.table, t as Record<string, unknown>]));

describe.skipIf(unavailable)(`MySQL load gaps ${unavailable ? `(skipped: ${unavailable})` : ''}`, () => {
  beforeAll(async () => {
    await target.create();
    server = await startTestServer();
    tenant = await createTenant(server);
  });

  afterAll(async () => {
    await server?.close();
    for (const db of owned) await db.drop();
    await target.drop();
  });

  it('classifies MySQL errors by number: missing objects and bad SQL fail once, lost locks are retried', async () => {
    const db = scratchMysql('errno');
    owned.push(db);
    await db.create();
    const config = { type: 'mysql', ...MARIADB, database: db.name } as unknown as ConnectionConfig;
    const c = await mysql.createConnection({ ...MARIADB, database: db.name });
    const failure = async (sql: string) => {
      try {
        await c.query(sql);
      } catch (error) {
        return error as Error & { errno: number };
      }
      throw new Error(`${sql} succeeded`);
    };
    try {
      await c.query('create table held (id int primary key)');
      await c.query('insert into held values (1)');
      const deterministic = [
        await failure('select * from missing_table'), // 1146
        await failure('select missing_column from held'), // 1054
        await failure('selec 1'), // 1064
      ];
      expect(deterministic.map((e) => e.errno)).toEqual([1146, 1054, 1064]);
      for (const error of deterministic) {
        expect(isDeterministicFailure(error)).toBe(true);
        // As the loader sees them: translated, then wrapped once more with the table's name.
        const translated = translate(error, config, 'internal');
        expect(translated.code).toBe('UNPROCESSABLE_CONTENT');
        expect(isDeterministicFailure(translated)).toBe(true);
        expect(isDeterministicFailure(Object.assign(new Error('Loading …'), { cause: translated }))).toBe(
          true,
        );
      }
      // A real lock wait timeout (1205): another session holds the row.
      const other = await mysql.createConnection({ ...MARIADB, database: db.name });
      try {
        await other.query('start transaction');
        await other.query('select * from held where id = 1 for update');
        await c.query('set session innodb_lock_wait_timeout = 1');
        const lockWait = await failure('select * from held where id = 1 for update');
        expect(lockWait.errno).toBe(1205);
        expect(isDeterministicFailure(translate(lockWait, config, 'internal'))).toBe(false);
      } finally {
        await other.end();
      }
      const serverError = (errno: number) =>
        Object.assign(new Error(`error ${errno}`), {
          errno,
          sqlState: 'HY000',
          sqlMessage: `error ${errno}`,
        });
      for (const errno of [1213, 1040, 2013, 2006, 1927])
        expect(isDeterministicFailure(translate(serverError(errno), config, 'user-sql')), String(errno)).toBe(
          false,
        );
      for (const errno of [1142, 1143, 1044, 1045, 1356])
        expect(isDeterministicFailure(translate(serverError(errno), config, 'internal')), String(errno)).toBe(
          true,
        );
    } finally {
      await c.end();
    }
  });

  it('skips a table dropped while the load runs, says so, and loads the rest in one attempt', async () => {
    const src = await ownSource('dropped', [
      // Loaded first and slowly: the table after it is dropped meanwhile.
      'create view a_wait as select sleep(3) as x',
      'create table b_gone (id int primary key)',
      'insert into b_gone values (1)',
      'create table c_kept (id int primary key)',
      'insert into c_kept values (1), (2)',
    ]);
    const run = await src.load('full', async () => {
      await until('a_wait to load', src.status, (s) => s?.progress?.table === 'a_wait');
      await src.db.sql('drop table b_gone');
    });
    expect(run.status, run.error).toBe('succeeded');
    expect(Object.keys(byTable(run)).sort()).toEqual(['a_wait', 'c_kept']);
    expect(run.result.refused).toEqual([
      {
        schema: src.db.name,
        table: 'b_gone',
        reason: expect.stringMatching(/b_gone was dropped on the source while the load ran/),
      },
    ]);
    expect(await target.sql(`select id from "${src.rawSchema}".c_kept order by id`)).toEqual([
      { id: 1 },
      { id: 2 },
    ]);
  });

  it('takes no zero or invalid date as the cursor: later changes are loaded, invalid ones counted', async () => {
    const src = await ownSource('baddates', [
      'create table orders (id int primary key, name varchar(20), updated_at datetime not null)',
    ]);
    const c = await mysql.createConnection({ ...MARIADB, database: src.db.name, dateStrings: true });
    try {
      // A legacy table written without strict mode: days past the end of the month and zero dates.
      await c.query("set session sql_mode = 'ALLOW_INVALID_DATES'");
      await c.query(`insert into orders values (1, 'a', '2024-01-01 00:00:00'), (2, 'b', '2031-02-30 00:00:00'),
        (3, 'c', '0000-00-00 00:00:00')`);
    } finally {
      await c.end();
    }
    const first = await src.load('full');
    expect(first.status, first.error).toBe('succeeded');
    expect(byTable(first).orders).toMatchObject({
      cursor_column: 'updated_at',
      cursor_value: '2024-01-01 00:00:00',
      invalid_cursor_rows: 2,
      rows: 3,
    });
    await src.db.sql(`update orders set name = 'changed', updated_at = '2024-06-01 00:00:00' where id = 1`);
    const next = await src.load('incremental');
    expect(next.status, next.error).toBe('succeeded');
    // Row 2's invalid date compares past the cursor on the source, so it is read again (and counted).
    expect(byTable(next).orders).toMatchObject({
      mode: 'incremental',
      cursor_value: '2024-06-01 00:00:00',
      invalid_cursor_rows: 1,
      rows: 2,
    });
    expect(
      await target.sql(`select id, name, updated_at::text as at from "${src.rawSchema}".orders order by id`),
    ).toEqual([
      { id: 1, name: 'changed', at: '2024-06-01 00:00:00' },
      { id: 2, name: 'b', at: null },
      { id: 3, name: 'c', at: null },
    ]);
    // A cursor saved by an earlier version as an invalid date is no position: the table loads in full.
    await target.sql(`update "${src.rawSchema}"._dimas_loads set cursor_value = '0000-00-00 00:00:00'`);
    const after = await src.load('incremental');
    expect(byTable(after).orders).toMatchObject({
      mode: 'full',
      full_because: 'the saved cursor value 0000-00-00 00:00:00 is not a valid date',
      cursor_value: '2024-06-01 00:00:00',
      rows: 3,
    });
  });

  it('refuses to load a second source into a raw schema that holds another source, naming both workspaces', async () => {
    const lower = scratchMysql('case').name;
    const upper = lower.replace('case', 'Case');
    const table = (name: string) => [
      'create table t (id int primary key, v varchar(60))',
      `insert into t values (1, '${name}')`,
    ];
    // One after the other: each creates and selects its workspace, then saves that workspace's schema.
    const first = await ownSource('case', table(upper), undefined, mysqlNamed(upper));
    const second = await ownSource('case', table(lower), undefined, mysqlNamed(lower));
    expect(first.rawSchema).toBe(second.rawSchema);
    const loaded = await first.load('full');
    expect(loaded.status, loaded.error).toBe('succeeded');
    expect(loaded.result.raw_schema).toBe(first.rawSchema);

    const refused = await second.start('full');
    expect(refused.status, JSON.stringify(refused.body)).toBe(409);
    expect(refused.body.message).toContain(`Raw schema ${first.rawSchema}`);
    expect(refused.body.message).toContain(`workspace ${first.workspace} (source 127.0.0.1:3306/${upper})`);
    expect(refused.body.message).toContain(
      `workspace ${second.workspace} loads source 127.0.0.1:3306/${lower}`,
    );
    expect(refused.body.message).toMatch(/Set raw_schema in the source config/);
    expect(await target.sql(`select v from "${first.rawSchema}".t`)).toEqual([{ v: upper }]);

    // The same source in another workspace shares the copy; the first workspace loads again as before.
    const same = await ownSource('case', [], undefined, {
      ...mysqlNamed(upper),
      create: async () => {},
      drop: async () => {},
    });
    const shared = await same.load('full');
    expect(shared.status, shared.error).toBe('succeeded');
    expect((await first.load('incremental')).status).toBe('succeeded');

    // A raw schema of its own loads the other source.
    const own = await ownSource('case', [], () => ({ raw_schema: `${second.rawSchema}_lower` }), {
      ...mysqlNamed(lower),
      create: async () => {},
      drop: async () => {},
    });
    const separate = await own.load('full');
    expect(separate.status, separate.error).toBe('succeeded');
    expect(await target.sql(`select v from "${second.rawSchema}_lower".t`)).toEqual([{ v: lower }]);
    expect(await target.sql(`select v from "${first.rawSchema}".t`)).toEqual([{ v: upper }]);
  });

  it('knows a source server by its own word: another spelling of its address loads into the same copy', async () => {
    const first = await ownSource('spelling', [
      'create table t (id int primary key, v varchar(20))',
      "insert into t values (1, 'a')",
    ]);
    const loaded = await first.load('full');
    expect(loaded.status, loaded.error).toBe('succeeded');
    const [claim] = await target.sql<{ source: string; server: string }>(
      `select source, server from "${first.rawSchema}"._dimas_source`,
    );
    expect(claim.source).toBe(`127.0.0.1:3306/${first.db.name}`);
    // MariaDB names itself by server_uid, MySQL by server_uuid.
    expect(claim.server).toMatch(new RegExp(`^server_uu?id \\S+/${first.db.name}$`));

    // The same server written as an IPv4-mapped IPv6 address: the same source, the copy is shared.
    const shared = { ...first.db, create: async () => {}, drop: async () => {} };
    const mapped = await ownSource('spelling', [], () => ({ host: '::ffff:127.0.0.1' }), shared);
    const viaMapped = await mapped.load('full');
    expect(viaMapped.status, viaMapped.error).toBe('succeeded');

    // A record written before servers were identified compares by address until its holder loads again.
    await target.sql(`update "${first.rawSchema}"._dimas_source set server = null`);
    const refused = await mapped.start('full');
    expect(refused.status, JSON.stringify(refused.body)).toBe(409);
    expect(refused.body.message).toContain(`loads source ::ffff:127.0.0.1:3306/${first.db.name}`);
    expect((await first.load('incremental')).status).toBe('succeeded');
    expect((await mapped.load('full')).status).toBe('succeeded');
    expect(await target.sql(`select v from "${first.rawSchema}".t`)).toEqual([{ v: 'a' }]);
  });

  it('refuses source queries that call a stored function, whatever it declares; built-in functions run', async () => {
    const lock = `dimas_gap_${Date.now()}`;
    const src = await ownSource('storedfn', [
      'create table t (id int primary key)',
      'insert into t values (1), (2)',
      // Declared as reading nothing: MySQL does not check, and GET_LOCK is no SQL data access anyway.
      `create function harmless() returns int no sql deterministic return get_lock('${lock}', 0)`,
    ]);
    const query = (sql: string) =>
      call(server, 'POST', '/api/sources/execute-query', { token: tenant.admin.token, body: { sql } });
    for (const sql of [
      'select harmless() as x',
      `select \`${src.db.name}\` . \`HARMLESS\` ( ) as x from t`,
      `select id from t where id in (select ${src.db.name}.harmless())`,
    ]) {
      const res = await query(sql);
      expect(res.status, `${sql}: ${JSON.stringify(res.body)}`).toBe(400);
      expect(res.body.message).toContain(`calls stored function ${src.db.name}.harmless`);
    }
    const [{ held }] = await src.db.sql<{ held: number | null }>(`select is_used_lock('${lock}') as held`);
    expect(held).toBeNull();
    // Built-ins, names that only look like calls, and a stored function's name in a literal still run.
    const ok = await query(
      `select concat('harmless', '()') as s, count(*) as n, coalesce(null, 1) as harmless from t where id in (1, 2)`,
    );
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    expect(ok.body.rows).toEqual([{ s: 'harmless()', n: '2', harmless: 1 }]);
  });
});
