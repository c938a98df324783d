import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/server.ts';
import { call, createTenant, createWorkspace, unique, until, type Tenant } from '../helpers/api.ts';
import { ADMIN_URL, pgConfig, scratchDatabase, withClient } from '../helpers/scratch-db.ts';

/*
 * User SQL is confined by what the warehouse's catalog says of each function it calls (volatile
 * ones may write, run SQL text, signal other backends, change settings, take locks or read files),
 * not by a list of names; and a connection that ran user SQL is reset before it is used again.
 * Shown through ad-hoc SQL (analytics) and source queries on a scratch warehouse.
 */
const warehouse = scratchDatabase('sqlc');
let server: TestServer;
let tenant: Tenant;
const workspaceName = unique('sqlc');

const config = pgConfig(warehouse.name, { schemas: ['app'] });
const reader = unique('sqlc_reader').replaceAll('-', '_');

beforeAll(async () => {
  await warehouse.create();
  await withClient(warehouse.url, async (client) => {
    await client.query(`create schema app;
      create table app.t (id int primary key, name text);
      insert into app.t select g, 'n' || g from generate_series(1, 20) g;
      create function app.bump() returns int language sql volatile as 'select 1';
      create function app.quiet_search_path() returns text language plpgsql stable as
        $$ begin perform set_config('search_path', 'pg_catalog', false); return 'changed'; end $$;
      create sequence app.s;
      -- Volatile functions that the statement runs without naming them; each leaves a large object.
      create function app.noise() returns bool language plpgsql volatile as
        $$ begin perform lo_from_bytea(0, 'x'); return true; end $$;
      -- In public, on the search path, where attribute notation finds it.
      create function public.noted(app.t) returns bool language sql volatile as 'select app.noise()';
      create schema hidden;
      create function hidden.same(int, int) returns bool language sql volatile as 'select app.noise() and $1 = $2';
      create operator hidden.=== (leftarg = int, rightarg = int, function = hidden.same);
      create function app.checked_value(int) returns bool language sql volatile as 'select app.noise()';
      create domain app.checked as int check (app.checked_value(value));
      create view app.noisy_view as select id, app.noise() as noise from app.t;
      create function app.step(int, int) returns int language sql volatile as 'select case when app.noise() then $2 end';
      create aggregate app.last_noisily(int) (sfunc = app.step, stype = int);
      create function app.random() returns double precision language sql volatile as 'select 0.5 where app.noise()';`);
  });
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: workspaceName,
    source_config: config,
    target_config: config,
    target_schema: {
      name: 'app',
      version: '1.0.0',
      tables: [
        {
          name: 't',
          primary_key: ['id'],
          columns: [
            { name: 'id', type: 'integer', nullable: false },
            { name: 'name', type: 'text' },
          ],
        },
      ],
    },
  });
}, 120_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
  // Roles belong to the server, not to the database: dropped once the database that granted it went.
  await withClient(ADMIN_URL, (client) => client.query(`drop role if exists ${reader}`));
});

const routes = ['/api/analytics/execute', '/api/sources/execute-query'];
const run = (route: string, sql: string, token = tenant.admin.token) =>
  call(server, 'POST', route, { token, body: { sql } });

const largeObjects = (url = warehouse.url) =>
  withClient(url, async (client) =>
    Number((await client.query('select count(*) as n from pg_largeobject_metadata')).rows[0].n),
  );

describe('functions are judged by the catalog', () => {
  const refused = [
    // SQL text run by a function: the guard never sees the inner statement.
    `select query_to_xml('select set_config(''search_path'',''evil'',false)', true, false, '')`,
    `select query_to_xml('select pg_terminate_backend(pg_backend_pid())', true, false, '')`,
    // Large objects write inside a READ ONLY transaction.
    `select lo_from_bytea(0, 'x'::bytea)`,
    `select lo_create(0)`,
    `select lo_unlink(12345)`,
    `select lo_put(12345, 0, 'x'::bytea)`,
    // Names nobody listed.
    `select * from ts_stat('select to_tsvector(name) from app.t')`,
    `select pg_advisory_lock(1)`,
    `select pg_catalog.set_config('statement_timeout', '0', false)`,
    `select app.bump()`,
    `select pg_sleep(0)`,
    `select 1 where exists (select nextval('app.s'))`,
    // Functions run without being named: attribute notation, an operator outside the search path
    // (in an expression and against a subquery), a domain's check, a view's column, an aggregate's
    // step, an EXPLAIN ANALYZE of any of them, and a function named like a harmless built-in.
    `select t.noted from app.t t`,
    `select 1 operator(hidden.===) 1`,
    `select id from app.t where id operator(hidden.===) any (select 1)`,
    `select 2::app.checked`,
    `select id from app.noisy_view`,
    `select app.last_noisily(id) from app.t`,
    `explain (analyze, costs off) select t.noted from app.t t`,
    `select app.random()`,
  ];

  for (const route of routes)
    it(`refuses volatile functions through ${route}, and nothing is written`, async () => {
      const before = await largeObjects();
      for (const sql of refused) {
        const res = await run(route, sql);
        expect(res.status, `${sql}: ${JSON.stringify(res.body)}`).toBe(400);
        expect(res.body.reason, sql).toBe('ROUTINE_NOT_ALLOWED');
        expect(res.body.message).toMatch(/not allowed in read-only queries/);
      }
      expect(await largeObjects()).toBe(before);
    });

  it('still runs ordinary SQL: aggregates, windows, clocks, random, string and set functions', async () => {
    const res = await run(
      '/api/analytics/execute',
      `select count(*) over () as n, lower(name) as l, now() is not null as t, random() < 2 as r,
              row_number() over (order by id) as k, (select sum(g) from generate_series(1, 3) g) as s
       from app.t where id <= 3 order by id`,
    );
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.rows[0]).toMatchObject({ n: '3', l: 'n1', t: true, r: true, s: '6' });
  });
});

describe('user SQL that runs inside a write', () => {
  it('refuses an audience whose SQL calls a volatile function when it is materialized', async () => {
    const before = await largeObjects();
    const created = await call(server, 'POST', '/api/api/audiences', {
      token: tenant.admin.token,
      body: {
        name: unique('aud'),
        target_table: 't',
        definition: { type: 'sql', sql: `select id, lo_from_bytea(0, 'x'::bytea)::text as name from app.t` },
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const run = await call(server, 'POST', `/api/api/audiences/${created.body.id}/materialize`, {
      token: tenant.admin.token,
    });
    expect(run.status, JSON.stringify(run.body)).toBe(200);
    const done = await until(
      'audience materialization',
      async () =>
        (await call(server, 'GET', `/api/api/audiences/${created.body.id}`, { token: tenant.admin.token }))
          .body,
      (a) => ['succeeded', 'failed'].includes(a.materialization.status),
    );
    expect(done.materialization.status).toBe('failed');
    expect(done.materialization.error).toMatch(/lo_from_bytea is not allowed/);
    expect(await largeObjects()).toBe(before);
  });

  it('refuses a model test whose mapping expression calls a volatile function', async () => {
    // The transformation project's model carries the expression; a model test runs it on the source
    // into a temporary table, inside a write.
    const as = (method: string, path: string, body?: unknown) =>
      call(server, method, path, { token: tenant.admin.token, body });
    const steps: [string, unknown][] = [
      ['tables', { source_table: 't', relationship: 'primary' }],
      ['connection', { connection: { source_field: 't.id', target_field: 'id' } }],
      [
        'transformation',
        { transformation: { target_field: 'name', expression: 't.name || app.noise()::text' } },
      ],
      ['commit-transformation', { message: 'a name that writes' }],
    ];
    for (const [route, body] of steps) {
      const step = await as('POST', `/api/mappings/t/${route}`, body);
      expect(step.status, `${route}: ${JSON.stringify(step.body)}`).toBe(200);
    }
    expect((await as('POST', '/api/pipelines/generate-project', {})).status).toBe(200);
    const before = await largeObjects();
    const tested = await as('POST', '/api/pipelines/test-model', { table_name: 't' });
    expect(tested.status, JSON.stringify(tested.body)).toBe(400);
    expect(tested.body).toMatchObject({ reason: 'ROUTINE_NOT_ALLOWED' });
    expect(tested.body.message).toContain('noise');
    expect(await largeObjects()).toBe(before);
  });
});

describe("users' expressions inside generated SQL", () => {
  it('refuses a hypothesis metric that calls a volatile function, and nothing is written', async () => {
    const before = await largeObjects();
    const created = await call(server, 'POST', '/api/analytics/hypotheses', {
      token: tenant.admin.token,
      body: {
        statement: 'Even ids have a larger metric',
        table: 't',
        metric: { expression: '(lo_create(0) % 7)::numeric' },
        segment: { column: 'name', groups: ['n1', 'n2'] },
        test: 'welch_t',
        alpha: 0.05,
      },
    });
    // Creation checks the metric on the warehouse: that check is where the rule stops it.
    expect(created.status, JSON.stringify(created.body)).toBe(400);
    expect(created.body).toMatchObject({ reason: 'ROUTINE_NOT_ALLOWED' });
    expect(created.body.message).toContain('lo_create');
    expect(await largeObjects()).toBe(before);
  });
});

describe('a function created between two statements', () => {
  // A database without functions of its own that may not run skips the view; the next statement
  // sees one created since.
  const plain = scratchDatabase('sqlc_plain');
  let plainTenant: Tenant;

  beforeAll(async () => {
    await plain.create();
    await withClient(plain.url, (client) =>
      client.query(`create schema app; create table app.t (id int primary key);
        insert into app.t select generate_series(1, 3)`),
    );
    plainTenant = await createTenant(server);
    const plainConfig = pgConfig(plain.name, { schemas: ['app'] });
    await createWorkspace(server, plainTenant.admin.token, {
      name: unique('sqlc-plain'),
      source_config: plainConfig,
      target_config: plainConfig,
    });
  }, 60_000);

  // Dropped with the server's connections still open (`with (force)`).
  afterAll(() => plain.drop());

  it('is refused however it is called', async () => {
    const asPlain = (sql: string) => run('/api/analytics/execute', sql, plainTenant.admin.token);
    const first = await asPlain('select count(*)::int as n from app.t');
    expect(first.body.rows, JSON.stringify(first.body)).toEqual([{ n: 3 }]);
    await withClient(plain.url, (client) =>
      client.query(`create function public.later(app.t) returns bool language plpgsql volatile as
        $$ begin perform lo_from_bytea(0, 'x'); return true; end $$`),
    );
    const res = await asPlain('select t.later from app.t t');
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect(res.body).toMatchObject({ reason: 'ROUTINE_NOT_ALLOWED' });
    expect(res.body.message).toContain('later(app.t)');
    expect(await largeObjects(plain.url)).toBe(0);
    expect((await asPlain('select count(*)::int as n from app.t')).body.rows).toEqual([{ n: 3 }]);
  });
});

describe('where the warehouse cannot hold a temporary view', () => {
  // A role without TEMPORARY on the database (as on a standby, nothing can be created there): the
  // routines a statement names are still judged by the catalog; only those run unnamed go unseen.
  let readerTenant: Tenant;

  beforeAll(async () => {
    await withClient(warehouse.url, async (client) => {
      await client.query(`create role ${reader} login;
        grant usage on schema app to ${reader};
        grant select on all tables in schema app to ${reader};
        revoke temporary on database ${warehouse.name} from public`);
    });
    readerTenant = await createTenant(server);
    const readerConfig = pgConfig(warehouse.name, { schemas: ['app'], user: reader });
    await createWorkspace(server, readerTenant.admin.token, {
      name: unique('sqlc-reader'),
      source_config: readerConfig,
      target_config: readerConfig,
    });
  }, 60_000);

  it('refuses routines by name and runs ordinary SQL', async () => {
    const asReader = (sql: string) => run('/api/analytics/execute', sql, readerTenant.admin.token);
    const before = await largeObjects();
    for (const sql of [`select lo_from_bytea(0, 'x'::bytea)`, 'select app.noise()', 'select app.random()']) {
      const res = await asReader(sql);
      expect(res.status, `${sql}: ${JSON.stringify(res.body)}`).toBe(400);
      expect(res.body.reason, sql).toBe('ROUTINE_NOT_ALLOWED');
    }
    expect(await largeObjects()).toBe(before);
    const ok = await asReader('select count(*)::int as n, current_user as who from app.t');
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    expect(ok.body.rows).toEqual([{ n: 20, who: reader }]);
  });
});

describe('results are bounded in bytes', () => {
  it('answers 413 for a result over WAREHOUSE_RESULT_BYTE_CAP, and the pool serves the next query', async () => {
    const huge = await run(
      '/api/analytics/execute',
      `select repeat('x', 100000000) as blob from generate_series(1, 12)`,
    );
    expect(huge.status, JSON.stringify(huge.body).slice(0, 300)).toBe(413);
    expect(huge.body).toMatchObject({ code: 'PAYLOAD_TOO_LARGE', reason: 'RESULT_TOO_LARGE' });
    // Many small rows are capped the same way, before the row cap (query_row_limit, 1,000 by
    // default): 1,000 rows of 20 KB are 20 MB, past the 16 MiB cap at about the 840th row.
    const wide = await run(
      '/api/sources/execute-query',
      `select repeat('y', 20000) as r from generate_series(1, 1000)`,
    );
    expect(wide.status, JSON.stringify(wide.body).slice(0, 300)).toBe(413);
    const next = await run('/api/analytics/execute', 'select count(*)::int as n from app.t');
    expect(next.body.rows).toEqual([{ n: 20 }]);
  });
});

describe('connections are reset after user SQL', () => {
  it('does not let a setting changed by one statement reach the next', async () => {
    // A stable function may still change its session's settings: the reset is what undoes it.
    const changed = await run('/api/analytics/execute', 'select app.quiet_search_path() as r');
    expect(changed.status, JSON.stringify(changed.body)).toBe(200);
    for (let i = 0; i < 6; i++) {
      const res = await run('/api/analytics/execute', `select current_setting('search_path') as p`);
      expect(res.body.rows[0].p).toBe('"$user", public');
    }
  });
});
