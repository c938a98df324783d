import type { EntityManager } from '@mikro-orm/postgresql';
import pg from 'pg';
import jStatModule from 'jstat';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  bindCall,
  call,
  createTenant,
  createWorkspace,
  unique,
  until,
  type Tenant,
  type TestUser,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { fakeOpenAi } from './helpers/fake-openai.ts';
import { runStatTest } from '../src/stats/engine.ts';
import type { StatsQuery } from '../src/stats/sql.ts';
import { statSpecOf } from '../src/modules/analytics/analytics-spec.ts';
import { llmManager } from '../src/llm/provider.ts';

const jStat = jStatModule.jStat ?? jStatModule;

/*
 * Analytics over HTTP against a real PostgreSQL warehouse: a scratch database on 127.0.0.1:5432 holding
 * mkt.customers, set as the workspaces' target through the workspaces routes, dropped at the end.
 *
 * The seeded data is built so outcomes are known: spend is 25 higher for plan "pro"; `flat` has exactly
 * the same values in both plans (t = 0, p = 1); region is balanced across plans.
 */
const warehouse = scratchDatabase('an');

const targetConfig = pgConfig(warehouse.name, { schemas: ['mkt'] });

const targetSchema = {
  name: 'marketing',
  version: '1.0.0',
  tables: [
    {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false },
        { name: 'plan', type: 'text' },
        { name: 'region', type: 'text' },
        { name: 'is_mobile', type: 'boolean' },
        { name: 'spend', type: 'numeric' },
        { name: 'converted', type: 'boolean' },
        { name: 'flat', type: 'integer' },
        { name: 'email', type: 'text', pii: true },
      ],
    },
  ],
};

let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let viewer: TestUser;
let otherHypothesisId: string;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/analytics',
);

const SPEND_BY_PLAN = {
  statement: 'Pro customers spend more than basic ones',
  table: 'customers',
  metric: { expression: 'spend' },
  segment: { column: 'plan', groups: ['pro', 'basic'] },
  test: 'welch_t',
  alpha: 0.05,
  minimum_detectable_effect: 0.2,
};

async function createHypothesis(body: Record<string, unknown>, token = tenant.admin.token) {
  const res = await api('POST', '/hypotheses', { token, body });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

/** Starts the test through the route and follows status/{id} until the run is over. */
async function tested(id: string, token = tenant.admin.token, extra: Record<string, unknown> = {}) {
  const started = await api('POST', '/hypotheses/test', { token, body: { hypothesis_id: id, ...extra } });
  expect(started.status, JSON.stringify(started.body)).toBe(200);
  expect(started.body).toMatchObject({ hypothesis_id: id, created: true });
  expect(['queued', 'running']).toContain(started.body.status);
  const status = await until(
    `test ${id}`,
    async () => (await api('GET', `/status/${id}`, { token })).body,
    (s) => s.run?.id === started.body.run_id && ['succeeded', 'failed'].includes(s.run.status),
  );
  return { run_id: started.body.run_id as string, status };
}

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql('create schema mkt');
  await warehouse.sql(`create table mkt.customers (customer_id integer primary key, plan text not null, region text not null,
       is_mobile boolean not null, spend numeric(12,2) not null, converted boolean not null, flat integer not null,
       email text)`);
  await warehouse.sql(`insert into mkt.customers
     select i,
            case when i % 2 = 0 then 'basic' else 'pro' end,
            (array['north', 'south', 'east'])[1 + (i / 2) % 3],
            i % 5 = 0,
            100 + case when i % 2 = 1 then 25 else 0 end + (i * 7919) % 97 - 48,
            (i * 31) % 10 < case when i % 2 = 1 then 4 else 2 end,
            (i / 2) % 17,
            'c' || i || '@example.com'
       from generate_series(0, 599) as i`);
  server = await startTestServer();
  tenant = await createTenant(server);
  other = await createTenant(server);
  viewer = await tenant.addUser(['viewer']);
  const workspace = unique('ws');
  await createWorkspace(server, tenant.admin.token, {
    name: workspace,
    target_config: targetConfig,
    target_schema: targetSchema,
  });
  const select = await call(server, 'POST', '/api/workspaces/select', {
    token: viewer.token,
    body: { workspace_name: workspace },
  });
  expect(select.status, JSON.stringify(select.body)).toBe(200);
  await createWorkspace(server, other.admin.token, {
    target_config: targetConfig,
    target_schema: targetSchema,
  });
  otherHypothesisId = (await createHypothesis(SPEND_BY_PLAN, other.admin.token)).id;
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('POST /api/analytics/execute', () => {
  it('runs one read-only statement on the target warehouse: columns with types, rows, truncated', async () => {
    const res = await api('POST', '/execute', {
      body: {
        sql: 'select plan, count(*)::int as n, avg(spend) as mean from mkt.customers group by plan order by plan',
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.columns).toEqual([
      { name: 'plan', type: 'text' },
      { name: 'n', type: 'integer' },
      { name: 'mean', type: 'numeric' },
    ]);
    expect(res.body.rows.map((r: any) => [r.plan, r.n])).toEqual([
      ['basic', 300],
      ['pro', 300],
    ]);
    expect(res.body.truncated).toBe(false);

    const capped = await api('POST', '/execute', { body: { sql: 'select * from mkt.customers', limit: 10 } });
    expect(capped.status).toBe(200);
    expect(capped.body).toMatchObject({ row_count: 10, truncated: true, limit: 10 });
  });

  it('refuses mutating statements, and they change nothing', async () => {
    const before = await warehouse.sql('select count(*)::int as n, sum(spend)::text as s from mkt.customers');
    for (const statement of [
      'delete from mkt.customers',
      'update mkt.customers set spend = 0',
      'with d as (delete from mkt.customers returning *) select count(*) from d',
      'select 1; drop table mkt.customers',
      'create table mkt.x as select 1',
      'select * from mkt.customers for update',
    ]) {
      const res = await api('POST', '/execute', { body: { sql: statement } });
      expect(res.status, statement).toBe(400);
      expect(res.body.message, statement).toMatch(/read-only|one statement|exactly one/i);
    }
    // Past the parser, the READ ONLY transaction is the second line: a volatile function cannot write either.
    const nextval = await api('POST', '/execute', { body: { sql: "select nextval('nope')" } });
    expect(nextval.status).toBe(400);
    expect(
      await warehouse.sql('select count(*)::int as n, sum(spend)::text as s from mkt.customers'),
    ).toEqual(before);
    const tables = await warehouse.sql("select count(*)::int as n from pg_tables where schemaname = 'mkt'");
    expect(tables[0].n).toBe(1);
  });

  it('answers 400 for bad input, 401 without credentials, 403 without sql.execute', async () => {
    expect((await api('POST', '/execute', { body: {} })).status).toBe(400);
    expect((await api('POST', '/execute', { body: { sql: 'selec 1' } })).status).toBe(400);
    expect((await api('POST', '/execute', { body: { sql: 'select * from mkt.nope' } })).status).toBe(400);
    expect((await api('POST', '/execute', { body: { sql: 'select 1', limit: 10_000_000 } })).status).toBe(
      400,
    );
    expect((await api('POST', '/execute', { token: null, body: { sql: 'select 1' } })).status).toBe(401);
    expect((await api('POST', '/execute', { token: viewer.token, body: { sql: 'select 1' } })).status).toBe(
      403,
    );
  });
});

describe('hypotheses', () => {
  let hypothesisId: string;

  it('creates a hypothesis over real columns; the metric kind and mining candidates come from the table', async () => {
    const h = await createHypothesis(SPEND_BY_PLAN);
    hypothesisId = h.id;
    expect(h).toMatchObject({
      statement: SPEND_BY_PLAN.statement,
      table: 'mkt.customers',
      metric: { expression: 'spend', kind: 'numeric' },
      segment: { column: 'plan', groups: ['pro', 'basic'] },
      test: 'welch_t',
      alpha: 0.05,
      minimum_detectable_effect: 0.2,
      status: 'draft',
      origin: 'manual',
      result: null,
      p_value: null,
    });
    expect(h.mining_columns[0]).toBe('plan');
    expect(h.mining_columns).toEqual(expect.arrayContaining(['region', 'is_mobile', 'converted']));
    expect(h.mining_columns).not.toContain('email');

    const boolean = await createHypothesis({
      statement: 'Pro customers convert more',
      table: 'mkt.customers',
      metric: { expression: 'converted' },
      segment: { condition: "plan = 'pro'" },
      test: 'two_proportion_z',
    });
    expect(boolean.metric.kind).toBe('boolean');
    expect(boolean.alpha).toBe(0.05);
  });

  it("gets a hypothesis; a viewer may read it; another tenant's id answers 404", async () => {
    const res = await api('GET', `/hypotheses/${hypothesisId}`, { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body.id).toBe(hypothesisId);
    expect((await api('GET', `/hypotheses/${otherHypothesisId}`)).status).toBe(404);
    expect((await api('GET', '/hypotheses/00000000-0000-4000-8000-000000000000')).status).toBe(404);
    expect((await api('GET', '/hypotheses/not-an-id')).status).toBe(404);
    expect((await api('GET', `/hypotheses/${hypothesisId}`, { token: null })).status).toBe(401);
  });

  it('refuses hypotheses that name unknown tables or columns, or do not fit their test (400)', async () => {
    const bad = [
      { ...SPEND_BY_PLAN, table: 'nope' },
      { ...SPEND_BY_PLAN, table: 'public.customers' },
      { ...SPEND_BY_PLAN, metric: { expression: 'revenue' } },
      { ...SPEND_BY_PLAN, metric: { expression: 'spend * bogus' } },
      { ...SPEND_BY_PLAN, segment: { column: 'tier' } },
      { ...SPEND_BY_PLAN, segment: { condition: 'plan = (select 1)' } },
      { ...SPEND_BY_PLAN, metric: { expression: 'email' } },
      { ...SPEND_BY_PLAN, test: 'two_proportion_z' },
      { ...SPEND_BY_PLAN, test: 'pearson' },
      { ...SPEND_BY_PLAN, filter: 'spend > 0; drop table mkt.customers' },
      { ...SPEND_BY_PLAN, mining_columns: ['nope'] },
      { ...SPEND_BY_PLAN, segment: { column: 'plan', condition: 'true' } },
      { ...SPEND_BY_PLAN, test: 'anova' },
      { ...SPEND_BY_PLAN, alpha: 1.5 },
      { ...SPEND_BY_PLAN, statement: '' },
    ];
    for (const body of bad) {
      const res = await api('POST', '/hypotheses', { body });
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(res.body.message).toBeTruthy();
    }
  });

  it('answers 401 and 403 (a viewer lacks analytics.run) on create', async () => {
    expect((await api('POST', '/hypotheses', { token: null, body: SPEND_BY_PLAN })).status).toBe(401);
    expect((await api('POST', '/hypotheses', { token: viewer.token, body: SPEND_BY_PLAN })).status).toBe(403);
  });

  it('tests a hypothesis as a job; its p-value matches the engine and a first-principles Welch test', async () => {
    const { status } = await tested(hypothesisId);
    expect(status.run.status, JSON.stringify(status)).toBe('succeeded');
    expect(status).toMatchObject({
      hypothesis_id: hypothesisId,
      status: 'tested',
      significant: true,
      error: null,
    });
    expect(status.result.test).toBe('welch_t');
    expect(status.result.effect_size.name).toBe('cohens_d');
    expect(status.result.sample_sizes).toEqual({
      total: 600,
      groups: [
        { group: 'pro', n: 300 },
        { group: 'basic', n: 300 },
      ],
    });

    // The engine on the same data, straight through a pg client.
    const pool = new pg.Pool({ connectionString: warehouse.url, max: 1 });
    const query: StatsQuery = async (text, params) => (await pool.query(text, params)).rows;
    const stored = (await api('GET', `/hypotheses/${hypothesisId}`)).body;
    const engine = await runStatTest(
      query,
      statSpecOf({
        targetSchema: 'mkt',
        targetTable: 'customers',
        metric: stored.metric,
        segment: stored.segment,
        filter: null,
        test: 'welch_t',
        alpha: 0.05,
      }),
    );
    await pool.end();
    expect(status.p_value).toBeCloseTo(engine.p_value, 12);
    expect(status.result.statistic).toBeCloseTo(engine.statistic, 9);

    // From first principles: sample means and variances, Welch–Satterthwaite df, Student t tail (jStat).
    const rows = await warehouse.sql<{ plan: string; spend: string }>(
      'select plan, spend from mkt.customers',
    );
    const values = (plan: string) => rows.filter((r) => r.plan === plan).map((r) => Number(r.spend));
    const moments = (xs: number[]) => {
      const mean = xs.reduce((s, x) => s + x, 0) / xs.length;
      return { n: xs.length, mean, variance: xs.reduce((s, x) => s + (x - mean) ** 2, 0) / (xs.length - 1) };
    };
    const a = moments(values('pro'));
    const b = moments(values('basic'));
    const t = (a.mean - b.mean) / Math.sqrt(a.variance / a.n + b.variance / b.n);
    const df =
      (a.variance / a.n + b.variance / b.n) ** 2 /
      ((a.variance / a.n) ** 2 / (a.n - 1) + (b.variance / b.n) ** 2 / (b.n - 1));
    const p = 2 * jStat.studentt.cdf(-Math.abs(t), df);
    expect(status.result.statistic).toBeCloseTo(t, 6);
    expect(Math.abs(status.p_value - p)).toBeLessThan(1e-6);
    expect(t).toBeGreaterThan(5);
  });

  it('tests with another algorithm when asked (Mann-Whitney), and records a failure with its reason', async () => {
    const { status } = await tested(hypothesisId, tenant.admin.token, { test: 'mann_whitney_u' });
    expect(status.run.status).toBe('succeeded');
    expect(status.result.test).toBe('mann_whitney_u');
    expect((await api('GET', `/hypotheses/${hypothesisId}`)).body.test).toBe('mann_whitney_u');

    // Three regions with data but a two-group test: the run fails and says why.
    const threeGroups = await createHypothesis({ ...SPEND_BY_PLAN, segment: { column: 'region' } });
    const failed = await tested(threeGroups.id);
    expect(failed.status.run.status).toBe('failed');
    expect(failed.status.status).toBe('failed');
    expect(failed.status.error).toMatch(/exactly 2 groups/);
  });

  it('refuses test requests that are bad (400), foreign (404), unauthenticated (401) or from a viewer (403)', async () => {
    expect((await api('POST', '/hypotheses/test', { body: {} })).status).toBe(400);
    expect(
      (await api('POST', '/hypotheses/test', { body: { hypothesis_id: hypothesisId, test: 'anova' } }))
        .status,
    ).toBe(400);
    expect(
      (await api('POST', '/hypotheses/test', { body: { hypothesis_id: hypothesisId, alpha: 0 } })).status,
    ).toBe(400);
    expect(
      (await api('POST', '/hypotheses/test', { body: { hypothesis_id: otherHypothesisId } })).status,
    ).toBe(404);
    expect(
      (await api('POST', '/hypotheses/test', { token: null, body: { hypothesis_id: hypothesisId } })).status,
    ).toBe(401);
    expect(
      (await api('POST', '/hypotheses/test', { token: viewer.token, body: { hypothesis_id: hypothesisId } }))
        .status,
    ).toBe(403);
  });

  it("status: a viewer may follow it; another tenant's id answers 404", async () => {
    const res = await api('GET', `/status/${hypothesisId}`, { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body.run.status).toBe('succeeded');
    expect((await api('GET', `/status/${otherHypothesisId}`)).status).toBe(404);
    expect((await api('GET', '/status/nope')).status).toBe(404);
    expect((await api('GET', `/status/${hypothesisId}`, { token: null })).status).toBe(401);
  });

  it('status with wait_ms answers once the run has ended, with the result it recorded', async () => {
    const started = await api('POST', '/hypotheses/test', {
      body: { hypothesis_id: hypothesisId, test: 'welch_t' },
    });
    expect(started.status, JSON.stringify(started.body)).toBe(200);
    const waited = await api('GET', `/status/${hypothesisId}`, {
      token: viewer.token,
      query: { wait_ms: 20_000 },
    });
    expect(waited.status).toBe(200);
    expect(waited.body).toMatchObject({
      run: { id: started.body.run_id, status: 'succeeded' },
      status: 'tested',
      significant: true,
    });
    expect(waited.body.result.test).toBe('welch_t');
    // A run that is over: the answer does not wait.
    const before = Date.now();
    const again = await api('GET', `/status/${hypothesisId}`, { query: { wait_ms: 20_000 } });
    expect(again.body.run.id).toBe(started.body.run_id);
    expect(Date.now() - before).toBeLessThan(2000);
    for (const wait_ms of [-1, 25_001, 'soon'])
      expect((await api('GET', `/status/${hypothesisId}`, { query: { wait_ms } })).status).toBe(400);
  });

  it('mines segments by lift and support with GROUPING SETS', async () => {
    const res = await api('GET', `/results/mining/${hypothesisId}`, {
      token: viewer.token,
      query: { min_support: 0.1 },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const [mean] = await warehouse.sql<{ mean: number }>(
      'select avg(spend)::float8 as mean from mkt.customers',
    );
    expect(res.body.total.n).toBe(600);
    expect(res.body.total.mean).toBeCloseTo(mean.mean, 9);
    const top = res.body.segments[0];
    expect(top.segment).toEqual({ plan: 'pro' });
    expect(top.support).toBeCloseTo(0.5, 12);
    expect(top.lift).toBeGreaterThan(1);
    const [pro] = await warehouse.sql<{ mean: number }>(
      "select avg(spend)::float8 as mean from mkt.customers where plan = 'pro'",
    );
    expect(top.lift).toBeCloseTo(pro.mean / mean.mean, 9);
    expect(res.body.segments.every((s: any) => s.support >= 0.1)).toBe(true);

    const pairs = await api('GET', `/results/mining/${hypothesisId}`, {
      query: { depth: 2, min_support: 0.05 },
    });
    expect(pairs.status).toBe(200);
    expect(pairs.body.segments.some((s: any) => Object.keys(s.segment).length === 2)).toBe(true);

    expect((await api('GET', `/results/mining/${hypothesisId}`, { query: { min_support: 2 } })).status).toBe(
      400,
    );
    expect((await api('GET', `/results/mining/${hypothesisId}`, { query: { depth: 3 } })).status).toBe(400);
    expect((await api('GET', `/results/mining/${otherHypothesisId}`)).status).toBe(404);
    expect((await api('GET', `/results/mining/${hypothesisId}`, { token: null })).status).toBe(401);
  });

  it('bounds alpha (400 below 1e-10); a result stored with infinite interval ends still reads', async () => {
    const tooSmall = await api('POST', '/hypotheses', { body: { ...SPEND_BY_PLAN, alpha: 1e-17 } });
    expect(tooSmall.status).toBe(400);
    expect(JSON.stringify(tooSmall.body)).toMatch(/alpha must be at least 1e-10/);
    const h = await createHypothesis({ ...SPEND_BY_PLAN, statement: 'stored before alpha was bounded' });
    const retest = await api('POST', '/hypotheses/test', { body: { hypothesis_id: h.id, alpha: 1e-17 } });
    expect(retest.status).toBe(400);
    expect((await tested(h.id)).status.run.status).toBe('succeeded');

    // What a welch_t test at alpha 1e-17 stored before the bound: a critical value of +∞, so interval
    // ends of ∓∞, kept as null in the JSON result, and level 1.
    const em = server.deps.orm.em.fork() as EntityManager;
    await em.getConnection().execute(
      `update hypotheses set alpha = 1e-17,
         result = jsonb_set(result, '{ci}', result->'ci' || '{"level": 1, "lower": null, "upper": null}')
       where id = ?`,
      [h.id],
    );
    for (const path of [`/hypotheses/${h.id}`, `/status/${h.id}`]) {
      const res = await api('GET', path, { token: viewer.token });
      expect(res.status, `${path} ${JSON.stringify(res.body)}`).toBe(200);
      expect(res.body.result.ci).toEqual({ of: 'mean_difference', level: 1, lower: null, upper: null });
    }
    // Tested again, the stored alpha is refused with the reason, and the hypothesis stays readable.
    const failed = await tested(h.id);
    expect(failed.status.run.status).toBe('failed');
    expect(failed.status.error).toMatch(/alpha must be at least 1e-10/);
    expect((await api('GET', `/hypotheses/${h.id}`)).status).toBe(200);
  });

  it('mining reports no lift against a population mean that is zero within rounding, and skips NaN', async () => {
    // −0.1 for basic, +0.1 for pro: the mean is truly 0, but each value rounds at the scale of 51.7.
    const centred = await createHypothesis({
      ...SPEND_BY_PLAN,
      statement: 'centred metric',
      metric: { expression: '(case when customer_id % 2 = 0 then 51.6 else 51.8 end)::float8 - 51.7' },
    });
    const res = await api('GET', `/results/mining/${centred.id}`, { query: { min_support: 0.1 } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.total.n).toBe(600);
    expect(res.body.total.mean).not.toBe(0);
    expect(Math.abs(res.body.total.mean)).toBeLessThan(1e-12);
    expect(res.body.segments.length).toBeGreaterThan(1);
    expect(res.body.segments.every((s: any) => s.lift === null)).toBe(true);
    const [top] = res.body.segments;
    expect(top.segment).toEqual({ plan: 'pro' });
    expect(top.difference).toBeCloseTo(0.1, 12);

    // One row in ten NaN: left out, so the totals and lifts are those of the other rows.
    const holes = await createHypothesis({
      ...SPEND_BY_PLAN,
      statement: 'spend with NaN holes',
      metric: { expression: "case when customer_id % 10 = 0 then 'NaN'::float8 else spend::float8 end" },
    });
    const mined = await api('GET', `/results/mining/${holes.id}`, { query: { min_support: 0.1 } });
    expect(mined.status, JSON.stringify(mined.body)).toBe(200);
    const [expected] = await warehouse.sql<{ mean: number; pro: number }>(
      `select avg(spend)::float8 as mean, avg(spend) filter (where plan = 'pro')::float8 as pro
         from mkt.customers where customer_id % 10 <> 0`,
    );
    expect(mined.body.total.n).toBe(540);
    expect(mined.body.total.mean).toBeCloseTo(expected.mean, 9);
    const pro = mined.body.segments.find((s: any) => s.segment.plan === 'pro');
    expect(pro.lift).toBeCloseTo(expected.pro / expected.mean, 9);
    expect(pro.difference).toBeCloseTo(expected.pro - expected.mean, 9);
  });
});

describe('hypothesis generation (offline mode)', () => {
  it('proposes hypotheses over real columns, ranked by the variance screen, and saves them', async () => {
    const res = await api('POST', '/hypotheses/generate', {
      body: { business_context: 'We sell subscription plans and want customers to spend more.', count: 3 },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.mode).toBe('offline');
    expect(res.body.fallback).toBeNull();
    expect(res.body.hypotheses).toHaveLength(3);
    const columns = new Set(targetSchema.tables[0].columns.map((c) => c.name));
    for (const h of res.body.hypotheses) {
      expect(h.table).toBe('mkt.customers');
      expect(h.columns.length).toBeGreaterThan(0);
      for (const c of h.columns) expect(columns.has(c), c).toBe(true);
      expect(h.columns).not.toContain('customer_id');
      expect(h.hypothesis_id).toBeTruthy();
    }
    // spend × plan is by far the strongest split in the data.
    const [first] = res.body.hypotheses;
    expect(first).toMatchObject({
      metric: { expression: 'spend', kind: 'numeric' },
      segment: { column: 'plan', groups: ['pro', 'basic'] },
      test: 'welch_t',
    });
    // eta² = between-group / total sum of squares, here over all 600 rows (the sample holds them all).
    const rows = await warehouse.sql<{ plan: string; spend: string }>(
      'select plan, spend from mkt.customers',
    );
    const all = rows.map((r) => Number(r.spend));
    const grand = all.reduce((s, x) => s + x, 0) / all.length;
    const between = ['pro', 'basic']
      .map((plan) => rows.filter((r) => r.plan === plan).map((r) => Number(r.spend)))
      .reduce((s, xs) => s + xs.length * (xs.reduce((a, x) => a + x, 0) / xs.length - grand) ** 2, 0);
    const total = all.reduce((s, x) => s + (x - grand) ** 2, 0);
    expect(first.screen_score).toBeCloseTo(between / total, 9);
    const scores = res.body.hypotheses.map((h: any) => h.screen_score);
    expect(scores[0]).toBeGreaterThanOrEqual(scores[1]);

    const saved = await api('GET', `/hypotheses/${first.hypothesis_id}`);
    expect(saved.status).toBe(200);
    expect(saved.body).toMatchObject({ origin: 'generated', status: 'draft', statement: first.statement });

    const unsaved = await api('POST', '/hypotheses/generate', {
      body: { business_context: 'conversion of mobile users', count: 1, save: false },
    });
    expect(unsaved.status).toBe(200);
    expect(unsaved.body.hypotheses[0].hypothesis_id).toBeNull();
  });

  it('answers 400, 401 and 403 (viewer)', async () => {
    expect((await api('POST', '/hypotheses/generate', { body: { business_context: '' } })).status).toBe(400);
    expect(
      (await api('POST', '/hypotheses/generate', { body: { business_context: 'x', count: 0 } })).status,
    ).toBe(400);
    expect(
      (await api('POST', '/hypotheses/generate', { body: { business_context: 'x', tables: ['nope'] } }))
        .status,
    ).toBe(400);
    expect(
      (await api('POST', '/hypotheses/generate', { token: null, body: { business_context: 'x' } })).status,
    ).toBe(401);
    expect(
      (await api('POST', '/hypotheses/generate', { token: viewer.token, body: { business_context: 'x' } }))
        .status,
    ).toBe(403);
  });
});

describe('hypothesis generation (openai mode, against a local OpenAI-compatible endpoint)', () => {
  let answer: unknown;
  const llm = fakeOpenAi({ model: 'fake-model', whenEmpty: () => ({ content: JSON.stringify(answer) }) });
  let llmUrl: string;
  const KEY = 'sk-test-hypotheses-0123456789';

  /** The organization's LLM parameters, saved as an admin would; the mode is set per process. */
  async function saveParameters(body: Record<string, unknown>) {
    const res = await call(server, 'POST', '/api/admin/llm-parameters', { token: tenant.admin.token, body });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
  }

  beforeAll(async () => {
    llmUrl = await llm.start();
    llmManager.setMode('openai');
  });

  afterAll(async () => {
    llmManager.setMode('offline');
    await llm.close();
  });

  it("uses the organization's endpoint, model, key and budget; keeps proposals over real columns and meters the call", async () => {
    answer = {
      hypotheses: [
        {
          statement: 'Mobile customers convert less',
          table: 'mkt.customers',
          metric: { expression: 'converted', kind: 'boolean' },
          segment: { column: 'is_mobile' },
          test: 'two_proportion_z',
          rationale: 'mobile checkout friction',
        },
        {
          statement: 'Revenue differs by plan',
          table: 'mkt.customers',
          metric: { expression: 'revenue' },
          segment: { column: 'plan' },
          test: 'welch_t',
        },
        {
          statement: 'Orders differ by plan',
          table: 'mkt.orders',
          metric: { expression: 'amount' },
          segment: { column: 'plan' },
          test: 'welch_t',
        },
      ],
    };
    // A budget above the built-in $20 default, a price that makes the call cost $30: only the saved
    // budget lets it through.
    await saveParameters({
      base_url: llmUrl,
      model: 'configured-model',
      api_key: KEY,
      max_tokens: 500,
      temperature: 0.3,
      monthly_budget_usd: 1000,
      price_per_1k_tokens: 20,
    });
    const before = llm.requests.length;
    const res = await api('POST', '/hypotheses/generate', {
      body: { business_context: 'Mobile conversion', count: 5, save: true },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const out = res.body;
    expect(llm.requests.length).toBe(before + 1);
    const sent = llm.requests.at(-1)!;
    expect(sent.headers.authorization).toBe(`Bearer ${KEY}`);
    expect(sent.body).toMatchObject({ model: 'configured-model', max_tokens: 500, temperature: 0.3 });
    expect(out.mode).toBe('openai');
    expect(out.fallback).toBeNull();
    expect(out.hypotheses).toHaveLength(1);
    expect(out.hypotheses[0]).toMatchObject({
      statement: 'Mobile customers convert less',
      metric: { expression: 'converted', kind: 'boolean' },
      columns: expect.arrayContaining(['converted', 'is_mobile']),
      test: 'two_proportion_z',
    });
    expect(out.rejected.map((r: { statement: string }) => r.statement)).toEqual([
      'Revenue differs by plan',
      'Orders differ by plan',
    ]);
    expect(out.rejected[0].reason).toMatch(/revenue/);
    expect(out.usage).toMatchObject({
      model: 'fake-model',
      prompt_tokens: 1200,
      completion_tokens: 300,
      cost_usd: 30,
    });
    const em = server.deps.orm.em.fork() as EntityManager;
    const [usage] = await em
      .getConnection()
      .execute(
        `select count(*)::int as n, sum(total_tokens)::int as tokens from llm_usage where organization_id = ? and purpose = 'hypotheses'`,
        [tenant.organization.id],
      );
    expect(usage).toMatchObject({ n: 1, tokens: 1500 });
    const saved = await api('GET', `/hypotheses/${out.hypotheses[0].hypothesis_id}`);
    expect(saved.body).toMatchObject({ origin: 'generated', test: 'two_proportion_z' });
  });

  it('refuses the call, without sending it, when its worst case (prompt + max_tokens) would cross the budget', async () => {
    // $30 spent of $1000; at $20 per 1k tokens a 60k-token allowance could cost $1200.
    await saveParameters({ max_tokens: 60_000 });
    const before = llm.requests.length;
    const res = await api('POST', '/hypotheses/generate', {
      body: { business_context: 'spend', count: 1, save: false },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.mode).toBe('offline');
    expect(res.body.fallback.reason).toBe('budget_exceeded');
    expect(res.body.fallback.message).toMatch(/could cost up to \$1[23]\d\d\.\d+ .*max_tokens/);
    expect(llm.requests.length).toBe(before);
  });

  it('falls back to the offline rules when the answer is unusable or the endpoint fails', async () => {
    answer = { nothing: true };
    await saveParameters({ max_tokens: 500, price_per_1k_tokens: 0.002 });
    const unusable = await api('POST', '/hypotheses/generate', {
      body: { business_context: 'spend', count: 2, save: false },
    });
    expect(unusable.body.mode).toBe('offline');
    expect(unusable.body.fallback?.reason).toBe('invalid_answer');
    expect(unusable.body.hypotheses).toHaveLength(2);

    const before = llm.requests.length;
    await saveParameters({ base_url: 'http://127.0.0.1:9/v1' });
    const failing = await api('POST', '/hypotheses/generate', {
      body: { business_context: 'spend', count: 1, save: false },
    });
    expect(failing.body.mode).toBe('offline');
    expect(failing.body.fallback?.reason).toBe('llm_error');
    expect(failing.body.hypotheses).toHaveLength(1);
    expect(llm.requests.length).toBe(before);
  });

  it("sends the organization's business_context when a request gives none; with neither, 400", async () => {
    answer = { hypotheses: [] };
    await saveParameters({ base_url: llmUrl });
    let res = await api('POST', '/hypotheses/generate', { body: { count: 1, save: false } });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/business_context is required.*global-settings/);
    const saved = await call(server, 'PUT', '/api/workspaces/global-settings', {
      token: tenant.admin.token,
      body: { business_context: 'We rent cargo bikes to bakeries.' },
    });
    expect(saved.status).toBe(200);
    const before = llm.requests.length;
    res = await api('POST', '/hypotheses/generate', { body: { count: 1, save: false } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(llm.requests.length).toBe(before + 1);
    expect(JSON.stringify(llm.requests.at(-1)!.body)).toContain('We rent cargo bikes to bakeries.');
    // The request's own context wins over the saved one.
    res = await api('POST', '/hypotheses/generate', {
      body: { business_context: 'Churn of yearly plans', count: 1, save: false },
    });
    expect(res.status).toBe(200);
    const last = JSON.stringify(llm.requests.at(-1)!.body);
    expect(last).toContain('Churn of yearly plans');
    expect(last).not.toContain('cargo bikes');
  });

  it('llm_hypotheses: off for the organization or for a user (while overrides are allowed), nothing is sent', async () => {
    const features = (body: unknown) =>
      call(server, 'POST', '/api/admin/feature-settings', { token: tenant.admin.token, body });
    const generate = (context: string, token = tenant.admin.token) =>
      api('POST', '/hypotheses/generate', {
        token,
        body: { business_context: context, count: 1, save: false },
      });
    answer = {
      hypotheses: [
        {
          statement: 'Mobile customers convert less',
          table: 'mkt.customers',
          metric: { expression: 'converted', kind: 'boolean' },
          segment: { column: 'is_mobile' },
          test: 'two_proportion_z',
        },
      ],
    };
    const editor = await tenant.addUser(['editor']);
    const current = await call(server, 'GET', '/api/workspaces/current', { token: tenant.admin.token });
    await call(server, 'POST', '/api/workspaces/select', {
      token: editor.token,
      body: { workspace_name: current.body.name },
    });
    let before = llm.requests.length;
    expect((await features({ features: { llm_hypotheses: false } })).status).toBe(200);
    let res = await generate('Feature off: loyalty');
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ mode: 'offline', fallback: { reason: 'feature_disabled' } });
    expect(llm.requests.length).toBe(before);

    await features({ features: { llm_hypotheses: null } });
    const override = await call(server, 'POST', '/api/admin/user-feature-overrides', {
      token: tenant.admin.token,
      body: { user_id: editor.id, overrides: { llm_hypotheses: false } },
    });
    expect(override.status, JSON.stringify(override.body)).toBe(200);
    res = await generate('Override: regions', editor.token);
    expect(res.body.fallback?.reason).toBe('feature_disabled');
    expect(llm.requests.length).toBe(before);
    res = await generate('Override: regions, as the admin');
    expect(res.body.fallback).toBeNull();
    expect(llm.requests.length).toBe(before + 1);

    // allow_user_overrides off: the organization's value (on) holds for everyone.
    before = llm.requests.length;
    expect((await features({ allow_user_overrides: false })).status).toBe(200);
    res = await generate('Overrides disallowed: regions', editor.token);
    expect(res.body.fallback).toBeNull();
    expect(llm.requests.length).toBe(before + 1);
    await features({ allow_user_overrides: true });
  });
});

describe('insights', () => {
  let significantId: string;
  let insightId: string;
  let otherInsightId: string;

  beforeAll(async () => {
    significantId = (await createHypothesis(SPEND_BY_PLAN)).id;
    const { status } = await tested(significantId);
    expect(status.significant).toBe(true);
    const otherTested = await tested(otherHypothesisId, other.admin.token);
    expect(otherTested.status.significant).toBe(true);
    const created = await api('POST', '/insights', {
      token: other.admin.token,
      body: { hypothesis_id: otherHypothesisId },
    });
    expect(created.status).toBe(200);
    otherInsightId = created.body.id;
  });

  it('refuses an insight from a non-significant result (409, with the reason) and from an untested hypothesis', async () => {
    const flat = await createHypothesis({
      ...SPEND_BY_PLAN,
      statement: 'flat differs by plan',
      metric: { expression: 'flat' },
    });
    const untested = await api('POST', '/insights', { body: { hypothesis_id: flat.id } });
    expect(untested.status).toBe(409);
    expect(untested.body.message).toMatch(/test it first/);

    const { status } = await tested(flat.id);
    expect(status.run.status).toBe('succeeded');
    expect(status.significant).toBe(false);
    expect(status.p_value).toBeCloseTo(1, 12);
    const refused = await api('POST', '/insights', { body: { hypothesis_id: flat.id } });
    expect(refused.status).toBe(409);
    expect(refused.body.message).toMatch(/not significant/);
    expect(refused.body.message).toMatch(/alpha = 0.05/);
  });

  it('creates an insight from a significant result with confidence 1 − p', async () => {
    const hypothesis = (await api('GET', `/hypotheses/${significantId}`)).body;
    const res = await api('POST', '/insights', {
      body: { hypothesis_id: significantId, title: 'Pro spends more', description: 'Upsell basic customers' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({
      hypothesis_id: significantId,
      title: 'Pro spends more',
      test: 'welch_t',
      effect_size: hypothesis.result.effect_size,
      performance: null,
    });
    expect(res.body.p_value).toBe(hypothesis.p_value);
    expect(res.body.confidence).toBeCloseTo(1 - hypothesis.p_value, 6);
    insightId = res.body.id;

    expect((await api('POST', '/insights', { body: {} })).status).toBe(400);
    expect((await api('POST', '/insights', { body: { hypothesis_id: otherHypothesisId } })).status).toBe(404);
    expect(
      (await api('POST', '/insights', { token: null, body: { hypothesis_id: significantId } })).status,
    ).toBe(401);
    expect(
      (await api('POST', '/insights', { token: viewer.token, body: { hypothesis_id: significantId } }))
        .status,
    ).toBe(403);
  });

  it('updates performance metrics from audience results', async () => {
    const res = await api('PUT', `/insights/${insightId}/performance`, {
      body: { metrics: { ctr: 0.031, roas: 2.4, audience_id: 'a1' } },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.performance).toEqual({ ctr: 0.031, roas: 2.4, audience_id: 'a1' });
    expect(typeof res.body.performance_updated_at).toBe('string');

    expect((await api('PUT', `/insights/${insightId}/performance`, { body: {} })).status).toBe(400);
    expect((await api('PUT', `/insights/${insightId}/performance`, { body: { metrics: [1] } })).status).toBe(
      400,
    );
    expect(
      (await api('PUT', `/insights/${otherInsightId}/performance`, { body: { metrics: {} } })).status,
    ).toBe(404);
    expect(
      (await api('PUT', `/insights/${insightId}/performance`, { token: null, body: { metrics: {} } })).status,
    ).toBe(401);
    expect(
      (await api('PUT', `/insights/${insightId}/performance`, { token: viewer.token, body: { metrics: {} } }))
        .status,
    ).toBe(403);
  });

  it('lists high performers at or above min_confidence, within [0, 1]', async () => {
    const res = await api('GET', '/insights/performance', {
      token: viewer.token,
      query: { min_confidence: 0.99 },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.min_confidence).toBe(0.99);
    expect(res.body.insights.map((i: any) => i.id)).toEqual([insightId]);
    expect(res.body.insights[0].performance.roas).toBe(2.4);
    // The other tenant's insight is never listed.
    expect(res.body.total).toBe(1);

    for (const bad of ['1.5', '-0.1', 'high'])
      expect(
        (await api('GET', '/insights/performance', { query: { min_confidence: bad } })).status,
        bad,
      ).toBe(400);
    expect((await api('GET', '/insights/performance', { token: null })).status).toBe(401);
  });
});

describe('NaN and ±Infinity in float columns read as categories', () => {
  // mkt.ratings: stars and tier are float8 with NaN and ±Infinity holes. As a chi-square category or a
  // segment's groups they are missing, like NULL, as they are in metrics: a NaN "category" reported an
  // association with missingness, and a NaN group made a two-group test fail.
  beforeAll(async () => {
    await warehouse.sql(`create table mkt.ratings as
      select i as id, case when i % 2 = 0 then 'basic' else 'pro' end as plan,
             case when i % 13 = 0 then 'NaN'::float8 when i % 17 = 0 then 'Infinity'::float8
                  when i % 19 = 0 then '-Infinity'::float8
                  when i % 2 = 1 and i % 5 < 2 then 3 else 1 + (i * 7) % 3 end as stars,
             case when i % 11 = 0 then 'NaN'::float8 when i % 3 = 0 then 1 else 2 end as tier,
             (i * 7919) % 97 + case when i % 3 = 0 then 10 else 0 end as spend
        from generate_series(0, 299) as i`);
  });
  // The offline generation screens every table of mkt: gone before anything else could see it.
  afterAll(async () => {
    await warehouse.sql('drop table mkt.ratings');
  });

  const finite = (v: string) => !['NaN', 'Infinity', '-Infinity'].includes(v);

  it('chi-square counts only finite stars, and matches SciPy and the formula', async () => {
    const h = await createHypothesis({
      statement: 'Pro customers rate differently',
      table: 'mkt.ratings',
      metric: { expression: 'stars' },
      segment: { column: 'plan' },
      test: 'chi_square',
    });
    const { status } = await tested(h.id);
    expect(status.run.status, JSON.stringify(status)).toBe('succeeded');

    // The contingency table counted here from the rows, NaN and ±Infinity left out.
    const rows = await warehouse.sql<{ plan: string; stars: string }>(
      'select plan, stars::text as stars from mkt.ratings',
    );
    const kept = rows.filter((r) => finite(r.stars));
    const plans = ['basic', 'pro'];
    const stars = ['1', '2', '3'];
    const observed = plans.map((p) =>
      stars.map((s) => kept.filter((r) => r.plan === p && r.stars === s).length),
    );
    expect(observed).toEqual([
      [42, 41, 40],
      [25, 23, 75],
    ]);
    const rowTotals = observed.map((r) => r[0] + r[1] + r[2]);
    const colTotals = stars.map((_, j) => observed[0][j] + observed[1][j]);
    let chi2 = 0;
    observed.forEach((r, i) =>
      r.forEach((o, j) => {
        const e = (rowTotals[i] * colTotals[j]) / kept.length;
        chi2 += (o - e) ** 2 / e;
      }),
    );

    const { result } = status;
    expect(result.details.categories).toEqual(stars);
    expect(result.details.observed).toEqual(observed);
    expect(result.sample_sizes).toEqual({
      total: 246,
      groups: [
        { group: 'basic', n: 123 },
        { group: 'pro', n: 123 },
      ],
    });
    expect(kept.length).toBe(246);
    expect(result.statistic).toBeCloseTo(chi2, 9);
    expect(status.p_value).toBeCloseTo(1 - jStat.chisquare.cdf(chi2, 2), 12);
    // scipy.stats.chi2_contingency([[42,41,40],[25,23,75]], correction=False) and
    // contingency.association(…), SciPy 1.17.1
    expect(result.statistic).toBeCloseTo(20.028106748864374, 9);
    expect(status.p_value).toBeCloseTo(4.47663698051563e-5, 12);
    expect(result.effect_size.value).toBeCloseTo(0.2853332579367756, 9);
  });

  it('a float segment column: Welch compares its two finite tiers, and mining shows NaN as missing', async () => {
    const h = await createHypothesis({
      statement: 'Tier 1 spends more',
      table: 'mkt.ratings',
      metric: { expression: 'spend' },
      segment: { column: 'tier' },
      test: 'welch_t',
      mining_columns: ['tier'],
    });
    const { status } = await tested(h.id);
    expect(status.run.status, JSON.stringify(status)).toBe('succeeded');
    expect(status.result.sample_sizes).toEqual({
      total: 272,
      groups: [
        { group: '1', n: 90 },
        { group: '2', n: 182 },
      ],
    });
    // scipy.stats.ttest_ind(tier 1 spends, tier 2 spends, equal_var=False), SciPy 1.17.1
    expect(status.result.statistic).toBeCloseTo(2.91911426429176, 9);
    expect(status.p_value).toBeCloseTo(0.003973687637274816, 12);

    const mined = await api('GET', `/results/mining/${h.id}`, { query: { min_support: 0 } });
    expect(mined.status, JSON.stringify(mined.body)).toBe(200);
    expect(Object.fromEntries(mined.body.segments.map((s: any) => [String(s.segment.tier), s.n]))).toEqual({
      '1': 90,
      '2': 182,
      null: 28,
    });
  });
});
