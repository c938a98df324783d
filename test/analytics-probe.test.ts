import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

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
        from generate_series(1, 10000) as i;`);
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
