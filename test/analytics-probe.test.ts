import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { AppError } from '../src/app-error.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { Hypothesis } from '../src/modules/analytics/analytics.entity.ts';

/*
 * Analytics edge cases over HTTP against a real PostgreSQL warehouse (a scratch database, dropped at
 * the end): what a hypothesis shows beside a result must be what that result was computed with.
 */
const warehouse = scratchDatabase('anprobe');
const targetConfig = pgConfig(warehouse.name, { schemas: ['mkt'] });

/** Twelve columns of 20 values each, independent of each other (hashes of the row number). */
const WIDE_COLUMNS = Array.from(
  { length: 12 },
  (_, k) => `'v' || (abs(hashtext(i || '-${k + 1}')) % 20) as c${k + 1}`,
).join(', ');

let server: TestServer;
let tenant: Tenant;
const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/analytics',
);

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema mkt;
    create table mkt.orders (id integer primary key, plan text not null, spend float8, huge float8, seats integer);
    insert into mkt.orders
      select i, case when i % 2 = 0 then 'basic' else 'pro' end,
             100 + case when i % 2 = 1 then 3 else 0 end + (i * 7919) % 97 - 48,
             1e300 * (i % 3), i % 4
        from generate_series(1, 400) as i;
    create table mkt.wide as
      select i as id, (i % 13)::float8 as val, ${WIDE_COLUMNS}
        from generate_series(1, 10000) as i;
    create table mkt.trial as select id, plan, spend, 1 as divisor from mkt.orders;
    create domain mkt.region_t as text;
    create domain mkt.tier_t as float8 check (value >= 0);
    create domain mkt.amount_t as numeric(12,2);
    create domain mkt.price_t as mkt.amount_t;
    create table mkt.typed (id integer primary key, region mkt.region_t not null, tier mkt.tier_t,
                            price mkt.price_t, spend float8);
    insert into mkt.typed
      select i, case when i % 2 = 0 then 'north' else 'south' end,
             case when i % 10 = 0 then 'NaN' when i % 10 = 5 then 'Infinity' else (1 + i % 2)::float8 end,
             (i % 50) * 1.5, 50 + (i * 37) % 23 + case when i % 2 = 0 then 4 else 0 end
        from generate_series(1, 400) as i;`);
  // A short statement timeout: mining must answer well within it.
  server = await startTestServer({ WAREHOUSE_STATEMENT_TIMEOUT_MS: '3000' });
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, { target_config: targetConfig });
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

async function create(body: Record<string, unknown>) {
  const res = await api('POST', '/hypotheses', { body: { statement: 'probe', table: 'orders', ...body } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.id as string;
}

describe('changing test or alpha while a test runs', () => {
  it('is refused (409) and changes nothing; the result shows beside the settings it was computed with', async () => {
    const id = await create({
      metric: { expression: 'spend' },
      segment: { column: 'plan', groups: ['pro', 'basic'] },
      test: 'welch_t',
      alpha: 0.05,
    });
    // An exclusive lock holds the run's warehouse query, so the run stays running meanwhile.
    const lock = new pg.Client(pgConfig(warehouse.name));
    await lock.connect();
    let locked = true;
    try {
      await lock.query('begin; lock table mkt.orders in access exclusive mode');
      const started = await api('POST', '/hypotheses/test', { body: { hypothesis_id: id } });
      expect(started.status, JSON.stringify(started.body)).toBe(200);
      await until(
        'the run to start',
        async () => (await api('GET', `/status/${id}`)).body,
        (s) => s.run?.status === 'running',
      );

      for (const change of [{ alpha: 0.5 }, { test: 'mann_whitney_u' }, { test: 'welch_t', alpha: 0.2 }]) {
        const refused = await api('POST', '/hypotheses/test', { body: { hypothesis_id: id, ...change } });
        expect(refused.status, JSON.stringify(refused.body)).toBe(409);
        expect(refused.body.reason).toBe('RUN_IN_PROGRESS');
        expect(refused.body.message).toContain('welch_t at alpha 0.05');
      }
      // The same settings, or none, still answer the run under way.
      const again = await api('POST', '/hypotheses/test', {
        body: { hypothesis_id: id, test: 'welch_t', alpha: 0.05 },
      });
      expect(again.status, JSON.stringify(again.body)).toBe(200);
      expect(again.body).toMatchObject({ run_id: started.body.run_id, created: false });
      expect((await api('GET', `/hypotheses/${id}`)).body).toMatchObject({ test: 'welch_t', alpha: 0.05 });

      await lock.query('commit');
      locked = false;
      const status = await api('GET', `/status/${id}`, { query: { wait_ms: 20_000 } });
      expect(status.body).toMatchObject({ status: 'tested', run: { status: 'succeeded' } });
      const hypothesis = (await api('GET', `/hypotheses/${id}`)).body;
      expect(hypothesis).toMatchObject({ test: 'welch_t', alpha: 0.05, result: { test: 'welch_t' } });
      expect(hypothesis.significant).toBe(hypothesis.p_value < hypothesis.alpha);
    } finally {
      if (locked) await lock.query('rollback').catch(() => {});
      await lock.end();
    }

    // Once the run has ended, another alpha is taken and tested.
    const retest = await api('POST', '/hypotheses/test', { body: { hypothesis_id: id, alpha: 0.5 } });
    expect(retest.status, JSON.stringify(retest.body)).toBe(200);
    expect(retest.body.created).toBe(true);
    const done = await api('GET', `/status/${id}`, { query: { wait_ms: 20_000 } });
    expect(done.body).toMatchObject({ status: 'tested', run: { id: retest.body.run_id } });
    expect((await api('GET', `/hypotheses/${id}`)).body).toMatchObject({ alpha: 0.5 });
  });

  it('a change that raced past the check fails the run instead of showing its result beside other settings', async () => {
    const id = await create({
      metric: { expression: 'spend' },
      segment: { column: 'plan', groups: ['pro', 'basic'] },
      test: 'welch_t',
      alpha: 0.05,
    });
    const lock = new pg.Client(pgConfig(warehouse.name));
    await lock.connect();
    try {
      await lock.query('begin; lock table mkt.orders in access exclusive mode');
      const started = await api('POST', '/hypotheses/test', { body: { hypothesis_id: id } });
      expect(started.status, JSON.stringify(started.body)).toBe(200);
      await until(
        'the run to start',
        async () => (await api('GET', `/status/${id}`)).body,
        (s) => s.run?.status === 'running',
      );
      // Running is not enough: under load the run may not have read the hypothesis yet, and would then
      // test at the new alpha, rightly. Its query waiting for the lock means it read the settings.
      await until(
        "the run's query to wait for the lock",
        async () => {
          // Inside a transaction the backends' status is read once and kept: cleared for each look.
          await lock.query('select pg_stat_clear_snapshot()');
          const { rows } = await lock.query(
            `select count(*)::int as n from pg_stat_activity
              where datname = current_database() and wait_event_type = 'Lock'`,
          );
          return rows[0].n as number;
        },
        (n) => n > 0,
      );
      // What a request that read the run as ended a moment earlier would have stored.
      await server.deps.orm.em.fork().execute(`update hypotheses set alpha = 0.5 where id = ?`, [id]);
      await lock.query('commit');
    } finally {
      await lock.query('rollback').catch(() => {});
      await lock.end();
    }
    const status = await api('GET', `/status/${id}`, { query: { wait_ms: 20_000 } });
    expect(status.body.status).toBe('failed');
    expect(status.body.error).toBe(
      'The test or alpha of the hypothesis changed while this run tested welch_t at alpha 0.05: test it again',
    );
    const hypothesis = (await api('GET', `/hypotheses/${id}`)).body;
    expect(hypothesis).toMatchObject({ alpha: 0.5, result: null, p_value: null, significant: null });
  });
});

describe('hypothesis generation', () => {
  it('leaves out a metric whose variance no double holds instead of failing the whole generation', async () => {
    const res = await api('POST', '/hypotheses/generate', {
      body: { business_context: 'spend by plan', tables: ['orders'], count: 5, save: false },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const metrics = res.body.hypotheses.map((h: { metric: { expression: string } }) => h.metric.expression);
    expect(metrics).toContain('spend');
    expect(metrics).not.toContain('huge');
    for (const h of res.body.hypotheses) expect(Number.isFinite(h.screen_score)).toBe(true);
  });
});

describe('metric kind', () => {
  it('boolean is refused at creation for a metric that cannot be read as true or false', async () => {
    const refused = await api('POST', '/hypotheses', {
      body: {
        statement: 'probe',
        table: 'orders',
        metric: { expression: 'spend', kind: 'boolean' },
        segment: { column: 'plan', groups: ['pro', 'basic'] },
        test: 'two_proportion_z',
      },
    });
    expect(refused.status, JSON.stringify(refused.body)).toBe(400);
    expect(refused.body.message).toBe(
      'metric kind boolean reads the metric as true or false, which a double precision cannot be: give kind numeric or a boolean expression (e.g. "spend > 0")',
    );
    // An integer reads as true when it is not 0: taken, and tested as a proportion.
    const id = await create({
      metric: { expression: 'seats', kind: 'boolean' },
      segment: { column: 'plan', groups: ['pro', 'basic'] },
      test: 'two_proportion_z',
    });
    expect((await api('POST', '/hypotheses/test', { body: { hypothesis_id: id } })).status).toBe(200);
    const status = await api('GET', `/status/${id}`, { query: { wait_ms: 20_000 } });
    expect(status.body, JSON.stringify(status.body)).toMatchObject({
      status: 'tested',
      result: { test: 'two_proportion_z', sample_sizes: { total: 400 } },
    });
  });
});

describe('segment groups', () => {
  it.each([
    [
      'welch_t',
      ['pro', 'basic', 'team'],
      'welch_t compares exactly 2 segment groups; 3 are given (chi_square compares more)',
    ],
    ['chi_square', ['pro', 'pro'], 'segment groups repeat: "pro" is given twice'],
    [
      'pearson',
      ['1', '2'],
      'pearson correlates the metric with the segment over all rows and takes no segment groups: leave groups out, or restrict the rows with filter',
    ],
  ])('%s with groups %j: 400 at creation, nothing stored', async (test, groups, message) => {
    const column = test === 'pearson' ? 'seats' : 'plan';
    const res = await api('POST', '/hypotheses', {
      body: {
        statement: 'probe',
        table: 'orders',
        metric: { expression: 'spend' },
        segment: { column, groups },
        test,
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect(res.body.message).toBe(message);
  });

  it('switching a two-group hypothesis to a correlation is refused and keeps its test', async () => {
    const id = await create({
      metric: { expression: 'spend' },
      segment: { column: 'seats', groups: ['1', '2'] },
      test: 'welch_t',
    });
    const res = await api('POST', '/hypotheses/test', { body: { hypothesis_id: id, test: 'spearman' } });
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect((await api('GET', `/hypotheses/${id}`)).body).toMatchObject({ test: 'welch_t', status: 'draft' });
  });
});

describe('minimum_detectable_effect', () => {
  async function testedResult(body: Record<string, unknown>) {
    const id = await create(body);
    expect((await api('POST', '/hypotheses/test', { body: { hypothesis_id: id } })).status).toBe(200);
    const status = await api('GET', `/status/${id}`, { query: { wait_ms: 20_000 } });
    expect(status.body.status, JSON.stringify(status.body)).toBe('tested');
    return status.body.result;
  }

  it('gives each result its power to detect that effect (SciPy references)', async () => {
    // 200 and 200 rows, d = 0.2, alpha 0.05: norm.sf(z − δ) + norm.sf(z + δ), δ = 0.2·√100.
    const welch = await testedResult({
      metric: { expression: 'spend' },
      segment: { column: 'plan', groups: ['pro', 'basic'] },
      test: 'welch_t',
      minimum_detectable_effect: 0.2,
    });
    expect(welch.sample_sizes.groups.map((g: { n: number }) => g.n)).toEqual([200, 200]);
    expect(welch.power).toMatchObject({ effect_size: 0.2, alpha: 0.05 });
    expect(welch.power.value).toBeCloseTo(0.5160052739761747, 10);

    // 2 plans × 4 seat counts, N = 400, V = 0.2: ncx2.sf(chi2.isf(0.05, 3), 3, 400·1·0.2²).
    const chi = await testedResult({
      metric: { expression: 'seats' },
      segment: { column: 'plan' },
      test: 'chi_square',
      minimum_detectable_effect: 0.2,
    });
    expect(chi.power.value).toBeCloseTo(0.9340886186284172, 10);

    // Without one, no power.
    const plain = await testedResult({
      metric: { expression: 'spend' },
      segment: { column: 'plan', groups: ['pro', 'basic'] },
      test: 'welch_t',
    });
    expect(plain.power).toBeUndefined();
  });
});

describe('hypothesis generation over one table named twice', () => {
  it('proposes and saves each hypothesis once', async () => {
    const res = await api('POST', '/hypotheses/generate', {
      body: { business_context: 'spend by plan', tables: ['orders', 'mkt.orders'], count: 10, save: true },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const statements = res.body.hypotheses.map((h: { statement: string }) => h.statement);
    expect(statements.length).toBeGreaterThan(0);
    expect(new Set(statements).size).toBe(statements.length);
    const ids = res.body.hypotheses.map((h: { hypothesis_id: string }) => h.hypothesis_id);
    expect(new Set(ids).size).toBe(ids.length);
  });
});

describe('mining', () => {
  it('answers at depth 2 over the default candidates (12 columns of 20 values, 26,640 segments) within the statement timeout', async () => {
    const id = (
      await api('POST', '/hypotheses', {
        body: {
          statement: 'probe',
          table: 'wide',
          metric: { expression: 'val' },
          segment: { column: 'c1', groups: ['v1', 'v2'] },
        },
      })
    ).body.id;
    const hypothesis = (await api('GET', `/hypotheses/${id}`)).body;
    expect(hypothesis.mining_columns).toHaveLength(12);
    const mined = await api('GET', `/results/mining/${id}`, {
      query: { depth: 2, min_support: 0, limit: 5 },
    });
    expect(mined.status, JSON.stringify(mined.body)).toBe(200);
    expect(mined.body.total.n).toBe(10_000);
    expect(mined.body.total.mean).toBeCloseTo(59_988 / 10_000, 12);
    expect(mined.body.segments).toHaveLength(5);
  });
});

describe('a result beside settings it was not computed with', () => {
  // Welch on mkt.trial (spend by plan, 200 rows each): p ≈ 0.27, significant at alpha 0.5, not at 0.05.
  const trial = {
    table: 'trial',
    metric: { expression: 'spend / divisor' },
    segment: { column: 'plan', groups: ['pro', 'basic'] },
    test: 'welch_t',
    minimum_detectable_effect: 0.2,
  };

  async function run(id: string, settings: Record<string, unknown> = {}) {
    const started = await api('POST', '/hypotheses/test', { body: { hypothesis_id: id, ...settings } });
    expect(started.status, JSON.stringify(started.body)).toBe(200);
    const status = await api('GET', `/status/${id}`, { query: { wait_ms: 20_000 } });
    expect(status.body.run.id).toBe(started.body.run_id);
    return status.body;
  }

  /**
   * A run that fails on the data alone: one row divides by zero (the settings' checks read no row, so
   * they pass); the hypothesis itself is untouched.
   */
  async function failingRun(id: string, settings: Record<string, unknown>) {
    await warehouse.sql('update mkt.trial set divisor = 0 where id = 1');
    try {
      const status = await run(id, settings);
      expect(status.status, JSON.stringify(status)).toBe('failed');
      expect(status.error).toMatch(/division by zero/);
      return status;
    } finally {
      await warehouse.sql('update mkt.trial set divisor = 1 where id = 1');
    }
  }

  /** What GET and status show of the result must agree. */
  async function shown(id: string) {
    const hypothesis = (await api('GET', `/hypotheses/${id}`)).body;
    const status = (await api('GET', `/status/${id}`)).body;
    for (const key of ['result', 'p_value', 'significant']) expect(status[key], key).toEqual(hypothesis[key]);
    return hypothesis;
  }

  it('a failed re-run at another alpha: significance, interval and power are those at the alpha shown', async () => {
    const id = await create({ ...trial, alpha: 0.5 });
    expect((await run(id)).status).toBe('tested');
    const before = await shown(id);
    expect(before.p_value).toBeGreaterThan(0.05);
    expect(before.p_value).toBeLessThan(0.5);
    expect(before).toMatchObject({ alpha: 0.5, significant: true, result: { ci: { level: 0.5 } } });
    expect(before.result.power).toMatchObject({ effect_size: 0.2, alpha: 0.5 });

    await failingRun(id, { alpha: 0.05 });
    const after = await shown(id);
    expect(after).toMatchObject({
      status: 'failed',
      test: 'welch_t',
      alpha: 0.05,
      p_value: before.p_value,
      significant: false,
      tested_at: before.tested_at,
    });
    expect(after.result.statistic).toBe(before.result.statistic);
    expect(after.result.ci.level).toBe(0.95);
    expect(after.result.ci.upper - after.result.ci.lower).toBeGreaterThan(
      before.result.ci.upper - before.result.ci.lower,
    );
    expect(after.result.power).toMatchObject({ effect_size: 0.2, alpha: 0.05 });
    expect(after.result.power.value).toBeLessThan(before.result.power.value);
    const refused = await api('POST', '/insights', { body: { hypothesis_id: id } });
    expect(refused.status).toBe(409);
    expect(refused.body).toMatchObject({ reason: 'NOT_TESTED' });
    expect(refused.body.message).toMatch(/welch_t at alpha 0.05\) failed/);

    // The same data tested at 0.05 gives what was shown after the failure.
    expect((await run(id)).status).toBe('tested');
    const fresh = await shown(id);
    // (Within rounding: the warehouse may sum the rows in another order.)
    expect(fresh).toMatchObject({ alpha: 0.05, significant: false });
    expect(fresh.p_value).toBeCloseTo(before.p_value, 12);
    expect(fresh.result.ci.level).toBe(0.95);
    expect(after.result.ci.lower).toBeCloseTo(fresh.result.ci.lower, 9);
    expect(after.result.ci.upper).toBeCloseTo(fresh.result.ci.upper, 9);
    expect(after.result.power.value).toBeCloseTo(fresh.result.power.value, 9);
    const notSignificant = await api('POST', '/insights', { body: { hypothesis_id: id } });
    expect(notSignificant.status).toBe(409);
    expect(notSignificant.body.reason).toBe('NOT_SIGNIFICANT');
    expect(notSignificant.body.message).toMatch(/alpha = 0.05;/);

    // A failed re-run with another test: the welch_t result is no result of mann_whitney_u.
    await failingRun(id, { test: 'mann_whitney_u' });
    expect(await shown(id)).toMatchObject({
      test: 'mann_whitney_u',
      status: 'failed',
      result: null,
      p_value: null,
      significant: null,
      tested_at: null,
    });
    // Back to welch_t, that result holds again.
    await failingRun(id, { test: 'welch_t' });
    expect(await shown(id)).toMatchObject({ test: 'welch_t', p_value: fresh.p_value, significant: false });
  });

  it('settings stored without a run (the queue refused it): the view and insight creation read the result at them', async () => {
    const id = await create({ ...trial, alpha: 0.05 });
    expect((await run(id)).status).toBe('tested');
    expect((await shown(id)).significant).toBe(false);
    const jobs = server.deps.jobs;
    const queueDown = () =>
      vi
        .spyOn(jobs, 'enqueue')
        .mockRejectedValueOnce(new AppError('SERVICE_UNAVAILABLE', 'the job queue is not available'));
    try {
      queueDown();
      const refused = await api('POST', '/hypotheses/test', { body: { hypothesis_id: id, alpha: 0.5 } });
      expect(refused.status, JSON.stringify(refused.body)).toBe(503);
      // The new alpha is stored, the run never queued: the last result reads at 0.5.
      const at05 = await shown(id);
      expect(at05).toMatchObject({ status: 'tested', alpha: 0.5, significant: true });
      expect(at05.result.ci.level).toBe(0.5);
      const insight = await api('POST', '/insights', { body: { hypothesis_id: id } });
      expect(insight.status, JSON.stringify(insight.body)).toBe(200);
      expect(insight.body.p_value).toBe(at05.p_value);

      queueDown();
      expect(
        (await api('POST', '/hypotheses/test', { body: { hypothesis_id: id, alpha: 0.01 } })).status,
      ).toBe(503);
      expect(await shown(id)).toMatchObject({ status: 'tested', alpha: 0.01, significant: false });
      const notSignificant = await api('POST', '/insights', { body: { hypothesis_id: id } });
      expect(notSignificant.status).toBe(409);
      expect(notSignificant.body.reason).toBe('NOT_SIGNIFICANT');
      expect(notSignificant.body.message).toMatch(/alpha = 0.01;/);

      queueDown();
      expect(
        (await api('POST', '/hypotheses/test', { body: { hypothesis_id: id, test: 'mann_whitney_u' } }))
          .status,
      ).toBe(503);
      expect(await shown(id)).toMatchObject({ status: 'tested', result: null, significant: null });
      const untested = await api('POST', '/insights', { body: { hypothesis_id: id } });
      expect(untested.status).toBe(409);
      expect(untested.body).toMatchObject({
        reason: 'NOT_TESTED',
        message: 'The hypothesis has no result of its test, mann_whitney_u; test it first',
      });
    } finally {
      vi.restoreAllMocks();
    }
  });
});

describe('domain columns are judged by their base type', () => {
  // mkt.typed: region is a domain over text, tier over float8 (with NaN and Infinity), price a domain
  // over a domain over numeric(12,2).
  it('a float domain as a segment column or a category: NaN and ±Infinity are missing, as in float8', async () => {
    const id = await create({
      table: 'typed',
      metric: { expression: 'spend' },
      segment: { column: 'tier' },
      test: 'welch_t',
      mining_columns: ['tier', 'region'],
    });
    expect((await api('POST', '/hypotheses/test', { body: { hypothesis_id: id } })).status).toBe(200);
    const welch = await api('GET', `/status/${id}`, { query: { wait_ms: 20_000 } });
    expect(welch.body.status, JSON.stringify(welch.body)).toBe('tested');
    const [counts] = await warehouse.sql<{ one: number; two: number }>(
      `select count(*) filter (where tier = 1)::int as one, count(*) filter (where tier = 2)::int as two
         from mkt.typed`,
    );
    expect(welch.body.result.sample_sizes.groups).toEqual([
      { group: '1', n: counts.one },
      { group: '2', n: counts.two },
    ]);

    const mined = await api('GET', `/results/mining/${id}`, { query: { min_support: 0 } });
    expect(mined.status, JSON.stringify(mined.body)).toBe(200);
    const tiers = mined.body.segments
      .filter((s: { segment: Record<string, unknown> }) => 'tier' in s.segment && !('region' in s.segment))
      .map((s: { segment: { tier: string | null } }) => s.segment.tier)
      .sort();
    expect(tiers).toEqual(['1', '2', null]);

    const chi = await create({
      table: 'typed',
      metric: { expression: 'tier' },
      segment: { column: 'region' },
      test: 'chi_square',
    });
    expect((await api('POST', '/hypotheses/test', { body: { hypothesis_id: chi } })).status).toBe(200);
    const chiStatus = await api('GET', `/status/${chi}`, { query: { wait_ms: 20_000 } });
    expect(chiStatus.body.status, JSON.stringify(chiStatus.body)).toBe('tested');
    expect(chiStatus.body.result.details.categories).toEqual(['1', '2']);
  });

  it('a numeric domain is numeric, a text domain a segment candidate, in checks, defaults and generation', async () => {
    // A correlation needs a numeric segment column: a domain over a domain over numeric is one.
    const id = await create({
      table: 'typed',
      metric: { expression: 'spend' },
      segment: { column: 'price' },
      test: 'pearson',
    });
    const hypothesis = (await api('GET', `/hypotheses/${id}`)).body;
    // The text domain with two values is a default mining candidate; price (50 values) is not.
    expect(hypothesis.mining_columns).toEqual(['region']);
    expect((await api('POST', '/hypotheses/test', { body: { hypothesis_id: id } })).status).toBe(200);
    const status = await api('GET', `/status/${id}`, { query: { wait_ms: 20_000 } });
    expect(status.body.status, JSON.stringify(status.body)).toBe('tested');
    expect(status.body.result.sample_sizes.total).toBe(400);

    // A text domain is no number.
    const text = await api('POST', '/hypotheses', {
      body: {
        statement: 'probe',
        table: 'typed',
        metric: { expression: 'spend' },
        segment: { column: 'region' },
        test: 'spearman',
      },
    });
    expect(text.status).toBe(400);
    expect(text.body.message).toMatch(/segment column must be numeric \(it is text\)/);

    const generated = await api('POST', '/hypotheses/generate', {
      body: { business_context: 'price and spend by region', tables: ['typed'], count: 10, save: false },
    });
    expect(generated.status, JSON.stringify(generated.body)).toBe(200);
    const pairs = generated.body.hypotheses.map(
      (h: { metric: { expression: string }; segment: { column?: string } }) =>
        `${h.metric.expression} by ${h.segment.column}`,
    );
    expect(pairs).toEqual(expect.arrayContaining(['price by region', 'spend by region']));
  });
});

describe('mining columns', () => {
  it('refuses a given column of more distinct values than a default candidate may hold (400, naming it)', async () => {
    const [{ distinct }] = await warehouse.sql<{ distinct: number }>(
      'select count(distinct spend)::int as distinct from mkt.orders',
    );
    expect(distinct).toBeGreaterThan(20);
    const res = await api('POST', '/hypotheses', {
      body: {
        statement: 'probe',
        table: 'orders',
        metric: { expression: 'seats' },
        segment: { column: 'plan', groups: ['pro', 'basic'] },
        mining_columns: ['plan', 'spend'],
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect(res.body.reason).toBe('MINING_COLUMN_CARDINALITY');
    expect(res.body.message).toBe(
      `a mining column may hold at most 20 distinct values (each is a segment); spend has ${distinct} in the first 10,000 rows of mkt.orders`,
    );
    expect(res.body.issues).toEqual([
      { path: ['mining_columns', 1], message: `spend has ${distinct} distinct values` },
    ]);

    // Within the bound (plan: 2 values, seats: 4), whatever the column's type, the columns are kept.
    const kept = await create({
      metric: { expression: 'spend' },
      segment: { column: 'plan', groups: ['pro', 'basic'] },
      mining_columns: ['seats', 'plan'],
    });
    expect((await api('GET', `/hypotheses/${kept}`)).body.mining_columns).toEqual(['seats', 'plan']);
    expect((await api('GET', `/results/mining/${kept}`)).status).toBe(200);
  });

  it('refuses a column given more than once (400, naming it at each repetition) and stores nothing', async () => {
    const stored = () =>
      server.deps.orm.em.fork().count(Hypothesis, { organization: tenant.organization.id });
    const before = await stored();
    const attempt = (mining_columns: string[]) =>
      api('POST', '/hypotheses', {
        body: {
          statement: 'probe',
          table: 'orders',
          metric: { expression: 'spend' },
          segment: { column: 'plan', groups: ['pro', 'basic'] },
          mining_columns,
        },
      });
    const once = await attempt(['plan', 'seats', 'plan']);
    expect(once.status, JSON.stringify(once.body)).toBe(400);
    expect(once.body.reason).toBe('MINING_COLUMN_REPEATED');
    expect(once.body.message).toBe(
      'mining_columns repeat plan: give each column once (each is one candidate segment column)',
    );
    expect(once.body.issues).toEqual([
      { path: ['mining_columns', 2], message: 'plan is given already at 0' },
    ]);

    const several = await attempt(['seats', 'plan', 'seats', 'plan', 'seats']);
    expect(several.status, JSON.stringify(several.body)).toBe(400);
    expect(several.body.message).toMatch(/^mining_columns repeat seats, plan: /);
    expect(several.body.issues).toEqual([
      { path: ['mining_columns', 2], message: 'seats is given already at 0' },
      { path: ['mining_columns', 3], message: 'plan is given already at 1' },
      { path: ['mining_columns', 4], message: 'seats is given already at 0' },
    ]);
    expect(await stored()).toBe(before);

    // Each once, the same columns are kept and mined.
    const kept = await attempt(['seats', 'plan']);
    expect(kept.status, JSON.stringify(kept.body)).toBe(200);
    expect(kept.body.mining_columns).toEqual(['seats', 'plan']);
    expect((await api('GET', `/results/mining/${kept.body.id}`)).status).toBe(200);
  });

  it('leaves a segment column of many values out of the default candidates', async () => {
    // A correlation's segment column is a number of many values: no mining column.
    const id = await create({
      metric: { expression: 'seats' },
      segment: { column: 'spend' },
      test: 'pearson',
    });
    expect((await api('GET', `/hypotheses/${id}`)).body.mining_columns).toEqual(['plan']);
  });
});
