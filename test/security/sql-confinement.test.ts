import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../helpers/server.ts';
import { call, createTenant, createWorkspace, unique, until, type Tenant } from '../helpers/api.ts';
import { pgConfig, scratchDatabase, withClient } from '../helpers/scratch-db.ts';

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

beforeAll(async () => {
  await warehouse.create();
  await withClient(warehouse.url, async (client) => {
    await client.query(`create schema app;
      create table app.t (id int primary key, name text);
      insert into app.t select g, 'n' || g from generate_series(1, 20) g;
      create function app.bump() returns int language sql volatile as 'select 1';
      create function app.quiet_search_path() returns text language plpgsql stable as
        $$ begin perform set_config('search_path', 'pg_catalog', false); return 'changed'; end $$;`);
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
});

const routes = ['/api/analytics/execute', '/api/sources/execute-query'];
const run = (route: string, sql: string) =>
  call(server, 'POST', route, { token: tenant.admin.token, body: { sql } });

const largeObjects = () =>
  withClient(warehouse.url, async (client) =>
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
    `select 1 where exists (select nextval('no_such_seq'))`,
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
