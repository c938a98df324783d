import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../src/app-error.ts';
import { runChiSquare } from '../src/stats/chi-square.ts';
import { runPearson, runSpearman } from '../src/stats/correlation.ts';
import {
  chiSquareUpper as engineChiSquareUpper,
  normalTwoSided as engineNormalTwoSided,
  normalUpperQuantile,
  studentTTwoSided,
  studentTUpperQuantile,
} from '../src/stats/distributions.ts';
import { runStatTest } from '../src/stats/engine.ts';
import { runMannWhitney } from '../src/stats/mann-whitney.ts';
import { runMining } from '../src/stats/mining.ts';
import type { StatsQuery, StatsSource } from '../src/stats/sql.ts';
import { runTwoProportion } from '../src/stats/two-proportion.ts';
import { runWelch } from '../src/stats/welch.ts';
import { scratchDatabase } from './helpers/scratch-db.ts';

/*
 * The engine computes sufficient statistics in a real PostgreSQL (the server named by TEST_DATABASE_URL,
 * in a scratch database dropped afterwards; else PGlite, the embedded warehouse) and finishes the
 * arithmetic with jstat. Every expected value below is computed here independently: two-pass moments,
 * explicit ranks and tie blocks, an explicit contingency table, and p-values from distribution
 * functions written in this file (Lanczos log-gamma, Simpson integration of the t and normal densities,
 * the series of the incomplete gamma function), never from jstat. One fixed data set is also checked
 * against values printed by SciPy 1.17.1.
 */

// ---------- independent reference mathematics ----------

const LANCZOS = [
  0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
  12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7,
];

function logGamma(x: number): number {
  if (x < 0.5) return Math.log(Math.PI / Math.sin(Math.PI * x)) - logGamma(1 - x);
  const z = x - 1;
  let a = LANCZOS[0];
  const t = z + 7.5;
  for (let i = 1; i < 9; i++) a += LANCZOS[i] / (z + i);
  return 0.5 * Math.log(2 * Math.PI) + (z + 0.5) * Math.log(t) - t + Math.log(a);
}

function simpson(f: (x: number) => number, a: number, b: number, intervals = 4000): number {
  const h = (b - a) / intervals;
  let sum = f(a) + f(b);
  for (let i = 1; i < intervals; i++) sum += f(a + i * h) * (i % 2 ? 4 : 2);
  return (sum * h) / 3;
}

/** P(|T| ≥ |t|) for Student's t with (possibly fractional) df, by integrating its density. */
function tTwoSided(t: number, df: number): number {
  const c = Math.exp(logGamma((df + 1) / 2) - logGamma(df / 2)) / Math.sqrt(df * Math.PI);
  const density = (x: number) => c * Math.pow(1 + (x * x) / df, -(df + 1) / 2);
  return 1 - 2 * simpson(density, 0, Math.abs(t));
}

function normalTwoSided(z: number): number {
  const density = (x: number) => Math.exp((-x * x) / 2) / Math.sqrt(2 * Math.PI);
  return 1 - 2 * simpson(density, 0, Math.abs(z));
}

function bisect(f: (x: number) => number, lo: number, hi: number): number {
  for (let i = 0; i < 80; i++) {
    const mid = (lo + hi) / 2;
    if (f(mid) > 0) hi = mid;
    else lo = mid;
  }
  return (lo + hi) / 2;
}

/** The q with P(|T| ≥ q) = alpha (increasing in q: 1 - alpha - P(|T| < q) changes sign once). */
const tCritical = (alpha: number, df: number) => bisect((q) => alpha - tTwoSided(q, df), 0, 50);
const zCritical = (alpha: number) => bisect((q) => alpha - normalTwoSided(q), 0, 10);

/** Upper tail of chi-square: 1 − P(k/2, x/2), P by its power series. */
function chiSquareUpper(x: number, df: number): number {
  const a = df / 2;
  const y = x / 2;
  let term = 1 / a;
  let sum = term;
  for (let n = 1; n < 10_000 && term > sum * 1e-17; n++) {
    term *= y / (a + n);
    sum += term;
  }
  return 1 - Math.exp(a * Math.log(y) - y - logGamma(a)) * sum;
}

const mean = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;
function variance(xs: number[]): number {
  const m = mean(xs);
  return xs.reduce((s, x) => s + (x - m) ** 2, 0) / (xs.length - 1);
}

/** Average ranks (1-based) of xs, ties sharing the mean of the positions they occupy. */
function averageRanks(xs: number[]): number[] {
  const order = xs.map((x, i) => [x, i] as const).sort((p, q) => p[0] - q[0]);
  const ranks = new Array<number>(xs.length);
  for (let start = 0; start < order.length;) {
    let end = start;
    while (end + 1 < order.length && order[end + 1][0] === order[start][0]) end++;
    for (let k = start; k <= end; k++) ranks[order[k][1]] = (start + end) / 2 + 1;
    start = end + 1;
  }
  return ranks;
}

function tieBlockSizes(xs: number[]): number[] {
  const counts = new Map<number, number>();
  for (const x of xs) counts.set(x, (counts.get(x) ?? 0) + 1);
  return [...counts.values()];
}

function pearsonR(xs: number[], ys: number[]): number {
  const mx = mean(xs);
  const my = mean(ys);
  let sxy = 0;
  let sxx = 0;
  let syy = 0;
  for (let i = 0; i < xs.length; i++) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) ** 2;
    syy += (ys[i] - my) ** 2;
  }
  return sxy / Math.sqrt(sxx * syy);
}

function referenceWelch(a: number[], b: number[], alpha = 0.05) {
  const [ma, mb, va, vb] = [mean(a), mean(b), variance(a), variance(b)];
  const se = Math.sqrt(va / a.length + vb / b.length);
  const t = (ma - mb) / se;
  const df =
    (va / a.length + vb / b.length) ** 2 /
    ((va / a.length) ** 2 / (a.length - 1) + (vb / b.length) ** 2 / (b.length - 1));
  const sp = Math.sqrt(((a.length - 1) * va + (b.length - 1) * vb) / (a.length + b.length - 2));
  const margin = tCritical(alpha, df) * se;
  return { t, df, p: tTwoSided(t, df), d: (ma - mb) / sp, lower: ma - mb - margin, upper: ma - mb + margin };
}

function referenceMannWhitney(a: number[], b: number[]) {
  const pooled = [...a, ...b];
  const ranks = averageRanks(pooled);
  const r1 = ranks.slice(0, a.length).reduce((s, r) => s + r, 0);
  const u1 = r1 - (a.length * (a.length + 1)) / 2;
  const n = pooled.length;
  const ties = tieBlockSizes(pooled).reduce((s, t) => s + t ** 3 - t, 0);
  const sigma = Math.sqrt(((a.length * b.length) / 12) * (n + 1 - ties / (n * (n - 1))));
  const dev = u1 - (a.length * b.length) / 2;
  const z = (Math.sign(dev) * Math.max(0, Math.abs(dev) - 0.5)) / sigma;
  // U counted directly from its definition, without ranks: pairs where group 1 wins, ties as halves.
  let pairs = 0;
  for (const x of a) for (const y of b) pairs += x > y ? 1 : x === y ? 0.5 : 0;
  return { u1, pairs, z, p: normalTwoSided(z), r: z / Math.sqrt(n), ties };
}

function referenceChiSquare(table: number[][]) {
  const rows = table.map((r) => r.reduce((s, v) => s + v, 0));
  const cols = table[0].map((_, j) => table.reduce((s, r) => s + r[j], 0));
  const n = rows.reduce((s, v) => s + v, 0);
  let chi2 = 0;
  table.forEach((r, i) =>
    r.forEach((o, j) => {
      const e = (rows[i] * cols[j]) / n;
      chi2 += (o - e) ** 2 / e;
    }),
  );
  const df = (rows.length - 1) * (cols.length - 1);
  return {
    chi2,
    df,
    p: chiSquareUpper(chi2, df),
    v: Math.sqrt(chi2 / (n * (Math.min(rows.length, cols.length) - 1))),
  };
}

function close(actual: number, expected: number, tolerance = 1e-6) {
  expect(Number.isFinite(actual)).toBe(true);
  expect(Math.abs(actual - expected)).toBeLessThanOrEqual(tolerance * Math.max(1, Math.abs(expected)));
}

/** Relative closeness, for p-values far in the tails where an absolute tolerance says nothing. */
function relativelyClose(actual: number, expected: number, tolerance = 1e-10) {
  expect(expected).toBeGreaterThan(0);
  expect(Math.abs(actual - expected) / expected, `${actual} vs ${expected}`).toBeLessThanOrEqual(tolerance);
}

// ---------- the warehouse ----------

interface Warehouse {
  query: StatsQuery;
  close(): Promise<void>;
}

async function openWarehouse(): Promise<Warehouse> {
  if (!process.env.TEST_DATABASE_URL) {
    const db = new PGlite();
    return {
      query: async (sql, params) => (await db.query<Record<string, unknown>>(sql, params)).rows,
      close: () => db.close(),
    };
  }
  const scratch = scratchDatabase('stats');
  await scratch.create();
  const pool = new pg.Pool({ connectionString: scratch.url, max: 2 });
  // Dropping the database WITH (FORCE) may terminate a connection the pool is still closing.
  pool.on('connect', (client) => client.on('error', () => {}));
  return {
    query: async (sql, params) => (await pool.query(sql, params)).rows,
    close: async () => {
      await pool.end();
      await scratch.drop();
    },
  };
}

/** mulberry32: the same rows on every run. */
function prng(seed: number) {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Row {
  id: number;
  grp: string;
  treated: boolean;
  value: number | null;
  score: number;
  converted: boolean;
  region: string;
  x: number;
  y: number;
}

function generateRows(count: number): Row[] {
  const random = prng(20261122);
  const normal = () => Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
  const rows: Row[] = [];
  for (let id = 1; id <= count; id++) {
    const grp = ['a', 'b', 'c'][id % 3];
    const treated = random() < 0.45;
    const value =
      random() < 0.04
        ? null
        : Math.round((10 + (treated ? 0.9 : 0) + normal() * (treated ? 2 : 3.5)) * 100) / 100;
    const score = 1 + Math.floor(random() * (treated ? 12 : 10));
    const converted = random() < (treated ? 0.36 : 0.26);
    const region = ['north', 'south', 'east', 'west'][Math.floor(random() * (grp === 'a' ? 3 : 4))];
    const x = Math.round(normal() * 50) / 10;
    const y = Math.round((0.4 * x + normal() * 1.5) * 10) / 10;
    rows.push({ id, grp, treated, value, score, converted, region, x, y });
  }
  return rows;
}

async function insertRows(query: StatsQuery, table: string, columns: string[], rows: unknown[][]) {
  for (let start = 0; start < rows.length; start += 200) {
    const chunk = rows.slice(start, start + 200);
    const params: unknown[] = [];
    const tuples = chunk.map(
      (row) => `(${row.map((v) => (params.push(v), `$${params.length}`)).join(', ')})`,
    );
    await query(`INSERT INTO ${table} (${columns.join(', ')}) VALUES ${tuples.join(', ')}`, params);
  }
}

// ---------- the tests ----------

let warehouse: Warehouse;
const rows = generateRows(600);
// Quoted, mixed-case, spaced names: the builders must quote every identifier they emit.
const source: StatsSource = { schema: 'Stats Lab', table: 'Visits' };

beforeAll(async () => {
  warehouse = await openWarehouse();
  const q = warehouse.query;
  await q(`CREATE SCHEMA "Stats Lab"`, []);
  await q(
    `CREATE TABLE "Stats Lab"."Visits" (id int PRIMARY KEY, "Group" text, treated boolean, value float8,
      score int, converted boolean, region text, x float8, y float8)`,
    [],
  );
  await insertRows(
    q,
    `"Stats Lab"."Visits"`,
    ['id', '"Group"', 'treated', 'value', 'score', 'converted', 'region', 'x', 'y'],
    rows.map((r) => [r.id, r.grp, r.treated, r.value, r.score, r.converted, r.region, r.x, r.y]),
  );
  await q(`CREATE TABLE fixed_values (grp text, v float8)`, []);
  await q(`CREATE TABLE fixed_cells (grp text, cat text)`, []);
  await q(`CREATE TABLE fixed_pairs (x float8, y float8)`, []);
  // Rows with no group or no value must not count: the SciPy references below are over A and B only.
  await insertRows(
    q,
    'fixed_values',
    ['grp', 'v'],
    [...FIXED_A.map((v) => ['A', v]), ...FIXED_B.map((v) => ['B', v]), [null, 99], ['A', null], ['B', null]],
  );
  const cells: string[][] = [];
  FIXED_TABLE.forEach((counts, i) =>
    counts.forEach((count, j) => {
      for (let k = 0; k < count; k++) cells.push([['x', 'y'][i], ['p', 'q', 'r'][j]]);
    }),
  );
  await insertRows(q, 'fixed_cells', ['grp', 'cat'], cells);
  await insertRows(
    q,
    'fixed_pairs',
    ['x', 'y'],
    FIXED_X.map((x, i) => [x, FIXED_Y[i]]),
  );
  await q(`CREATE TABLE shop (region text, channel text, converted boolean, amount numeric)`, []);
  await insertRows(q, 'shop', ['region', 'channel', 'converted', 'amount'], SHOP);
});

afterAll(async () => {
  await warehouse?.close();
});

const byTreatment = (
  pick: (r: Row) => number | boolean | null,
  treated: boolean,
  filter = (_: Row) => true,
) => rows.filter((r) => r.treated === treated && filter(r) && pick(r) !== null).map((r) => Number(pick(r)));

describe('Welch t-test', () => {
  it('matches two-pass moments and an integrated t distribution (condition segment)', async () => {
    const result = await runWelch(warehouse.query, {
      source,
      metric: { sql: 'value' },
      segment: { condition: 'treated' },
    });
    const a = byTreatment((r) => r.value, true);
    const b = byTreatment((r) => r.value, false);
    const ref = referenceWelch(a, b);
    expect(result.test).toBe('welch_t');
    expect(result.sample_sizes).toEqual({
      total: a.length + b.length,
      groups: [
        { group: 'true', n: a.length },
        { group: 'false', n: b.length },
      ],
    });
    close(result.statistic, ref.t);
    close(result.details.df as number, ref.df);
    close(result.p_value, ref.p);
    expect(result.effect_size.name).toBe('cohens_d');
    close(result.effect_size.value, ref.d);
    expect(result.ci?.level).toBe(0.95);
    close(result.ci!.lower, ref.lower);
    close(result.ci!.upper, ref.upper);
    // The seeded effect is real: this data set must reject the null at 5 %.
    expect(result.p_value).toBeLessThan(0.05);
  });

  it('compares two named groups of a column, in the named order, with a filter', async () => {
    const result = await runWelch(warehouse.query, {
      source: { ...source, filter: `region <> 'west'` },
      metric: { sql: 'value' },
      segment: { column: 'Group', groups: ['c', 'a'] },
      alpha: 0.1,
    });
    const pick = (g: string) =>
      rows
        .filter((r) => r.grp === g && r.region !== 'west' && r.value !== null)
        .map((r) => r.value as number);
    const ref = referenceWelch(pick('c'), pick('a'), 0.1);
    expect(result.sample_sizes.groups?.map((g) => g.group)).toEqual(['c', 'a']);
    close(result.statistic, ref.t);
    close(result.p_value, ref.p);
    close(result.ci!.lower, ref.lower);
    close(result.ci!.upper, ref.upper);
    expect(result.ci!.level).toBeCloseTo(0.9, 12);
  });

  it('matches SciPy on a fixed data set', async () => {
    const result = await runWelch(warehouse.query, {
      source: { table: 'fixed_values' },
      metric: { sql: 'v' },
      segment: { column: 'grp' },
    });
    // scipy.stats.ttest_ind(A, B, equal_var=False) and .confidence_interval(0.95), SciPy 1.17.1
    expect(result.sample_sizes.groups).toEqual([
      { group: 'A', n: FIXED_A.length },
      { group: 'B', n: FIXED_B.length },
    ]);
    close(result.statistic, 3.7323190302958884);
    close(result.details.df as number, 19.266919429904778);
    close(result.p_value, 0.001384391456411694);
    close(result.ci!.lower, 0.877284413823751);
    close(result.ci!.upper, 3.1127155861762477);
  });

  it('refuses a segment with more than two groups unless two are named', async () => {
    const attempt = runWelch(warehouse.query, {
      source,
      metric: { sql: 'value' },
      segment: { column: 'Group' },
    });
    await expect(attempt).rejects.toThrow(/exactly 2 groups/);
    await expect(attempt).rejects.toBeInstanceOf(AppError);
  });
});

describe('two-proportion z-test', () => {
  it('matches counts, the pooled z and a Wald interval', async () => {
    const result = await runTwoProportion(warehouse.query, {
      source,
      metric: { sql: 'converted', kind: 'boolean' },
      segment: { condition: 'treated' },
    });
    const a = byTreatment((r) => r.converted, true);
    const b = byTreatment((r) => r.converted, false);
    const [x1, x2] = [a.filter((v) => v === 1).length, b.filter((v) => v === 1).length];
    const [p1, p2] = [x1 / a.length, x2 / b.length];
    const pooled = (x1 + x2) / (a.length + b.length);
    const z = (p1 - p2) / Math.sqrt(pooled * (1 - pooled) * (1 / a.length + 1 / b.length));
    const margin = zCritical(0.05) * Math.sqrt((p1 * (1 - p1)) / a.length + (p2 * (1 - p2)) / b.length);
    expect(result.sample_sizes.groups).toEqual([
      { group: 'true', n: a.length },
      { group: 'false', n: b.length },
    ]);
    close(result.statistic, z);
    close(result.p_value, normalTwoSided(z));
    expect(result.effect_size.name).toBe('difference_of_proportions');
    close(result.effect_size.value, p1 - p2);
    close(result.ci!.lower, p1 - p2 - margin);
    close(result.ci!.upper, p1 - p2 + margin);
  });

  it('matches a textbook-sized example computed by hand', async () => {
    // 30/200 vs 20/200 successes: p̂ = 0.125, SE₀ = √(0.125·0.875·(2/200)) = 0.0330719…, z = 0.05/SE₀.
    await warehouse.query(`CREATE TABLE trial (arm text, success boolean)`, []);
    const trial = [
      ...Array.from({ length: 200 }, (_, i) => ['new', i < 30]),
      ...Array.from({ length: 200 }, (_, i) => ['old', i < 20]),
    ];
    await insertRows(warehouse.query, 'trial', ['arm', 'success'], trial);
    const result = await runStatTest(warehouse.query, {
      test: 'two_proportion_z',
      source: { table: 'trial' },
      metric: { sql: 'success', kind: 'boolean' },
      segment: { column: 'arm' },
    });
    close(result.statistic, 0.05 / Math.sqrt(0.125 * 0.875 * 0.01));
    close(result.statistic, 1.5118578920369088);
    close(result.p_value, normalTwoSided(1.5118578920369088));
  });
});

describe('chi-square test of independence', () => {
  it('matches an explicit 3×4 contingency table', async () => {
    const result = await runChiSquare(warehouse.query, {
      source,
      metric: { sql: 'region' },
      segment: { column: 'Group' },
    });
    const groups = ['a', 'b', 'c'];
    const regions = ['east', 'north', 'south', 'west'];
    const table = groups.map((g) =>
      regions.map((reg) => rows.filter((r) => r.grp === g && r.region === reg).length),
    );
    // Group a never has region west: a zero cell GROUP BY does not return, which the engine must restore.
    expect(table[0][3]).toBe(0);
    const ref = referenceChiSquare(table);
    expect(result.details.observed).toEqual(table);
    expect(result.details.df).toBe(6);
    close(result.statistic, ref.chi2);
    close(result.p_value, ref.p);
    expect(result.effect_size.name).toBe('cramers_v');
    close(result.effect_size.value, ref.v);
    expect(result.sample_sizes.total).toBe(rows.length);
  });

  it('applies Yates’ correction to a 2×2 table when asked', async () => {
    const result = await runChiSquare(warehouse.query, {
      source,
      metric: { sql: 'converted', kind: 'boolean' },
      segment: { condition: 'treated' },
      yates: true,
    });
    const table = [false, true].map((t) =>
      [false, true].map((c) => rows.filter((r) => r.treated === t && r.converted === c).length),
    );
    const rowsT = table.map((r) => r[0] + r[1]);
    const colsT = [table[0][0] + table[1][0], table[0][1] + table[1][1]];
    const n = rowsT[0] + rowsT[1];
    let chi2 = 0;
    for (let i = 0; i < 2; i++)
      for (let j = 0; j < 2; j++) {
        const e = (rowsT[i] * colsT[j]) / n;
        chi2 += (Math.abs(table[i][j] - e) - 0.5) ** 2 / e;
      }
    close(result.statistic, chi2);
    close(result.p_value, chiSquareUpper(chi2, 1));
    expect(result.details.yates_correction).toBe(true);
  });

  it('matches SciPy on a fixed table', async () => {
    const result = await runChiSquare(warehouse.query, {
      source: { table: 'fixed_cells' },
      metric: { sql: 'cat' },
      segment: { column: 'grp' },
    });
    // scipy.stats.chi2_contingency([[20,15,25],[30,10,20]], correction=False), contingency.association
    close(result.statistic, 3.5555555555555554);
    close(result.p_value, 0.16901331540606607);
    close(result.effect_size.value, 0.17213259316477408);
  });
});

describe('Mann-Whitney U', () => {
  it('matches explicit average ranks, tie blocks and the pairwise definition of U', async () => {
    const result = await runMannWhitney(warehouse.query, {
      source,
      metric: { sql: 'score' },
      segment: { condition: 'treated' },
    });
    const a = byTreatment((r) => r.score, true);
    const b = byTreatment((r) => r.score, false);
    const ref = referenceMannWhitney(a, b);
    // Scores 1–12 over 600 rows: heavy ties, so the tie correction matters.
    expect(ref.ties).toBeGreaterThan(0);
    expect(ref.u1).toBe(ref.pairs);
    close(result.statistic, ref.u1);
    close(result.details.tie_correction as number, ref.ties);
    close(result.details.z as number, ref.z);
    close(result.p_value, ref.p);
    expect(result.effect_size.name).toBe('r');
    close(result.effect_size.value, ref.r);
  });

  it('matches SciPy on a fixed data set with ties', async () => {
    const result = await runStatTest(warehouse.query, {
      test: 'mann_whitney_u',
      source: { table: 'fixed_values' },
      metric: { sql: 'v' },
      segment: { column: 'grp', groups: ['A', 'B'] },
    });
    // scipy.stats.mannwhitneyu(A, B, use_continuity=True, method='asymptotic'), SciPy 1.17.1
    close(result.statistic, 104);
    close(result.p_value, 0.004021918385903753);
  });
});

describe('correlation', () => {
  it('Pearson matches a two-pass r and an integrated t distribution', async () => {
    const result = await runPearson(warehouse.query, { source, x: { sql: 'x' }, y: { sql: 'y' } });
    const r = pearsonR(
      rows.map((row) => row.x),
      rows.map((row) => row.y),
    );
    const t = r * Math.sqrt((rows.length - 2) / (1 - r * r));
    close(result.effect_size.value, r);
    close(result.statistic, t);
    close(result.p_value, tTwoSided(t, rows.length - 2));
    expect(result.sample_sizes.total).toBe(rows.length);
    const half = zCritical(0.05) / Math.sqrt(rows.length - 3);
    close(result.ci!.lower, Math.tanh(Math.atanh(r) - half));
    close(result.ci!.upper, Math.tanh(Math.atanh(r) + half));
  });

  it('Spearman matches Pearson on explicit average ranks', async () => {
    const result = await runSpearman(warehouse.query, { source, x: { sql: 'x' }, y: { sql: 'y' } });
    const xs = rows.map((row) => row.x);
    const ys = rows.map((row) => row.y);
    expect(tieBlockSizes(ys).some((t) => t > 1)).toBe(true);
    const rho = pearsonR(averageRanks(xs), averageRanks(ys));
    const t = rho * Math.sqrt((rows.length - 2) / (1 - rho * rho));
    close(result.effect_size.value, rho);
    close(result.p_value, tTwoSided(t, rows.length - 2));
  });

  it('matches SciPy on fixed pairs with ties', async () => {
    const input = { source: { table: 'fixed_pairs' }, x: { sql: 'x' }, y: { sql: 'y' } };
    const pearson = await runStatTest(warehouse.query, { test: 'pearson', ...input });
    const spearman = await runStatTest(warehouse.query, { test: 'spearman', ...input });
    // scipy.stats.pearsonr / spearmanr, SciPy 1.17.1
    close(pearson.effect_size.value, 0.33432539901899483);
    close(pearson.p_value, 0.3450710477331118);
    close(spearman.effect_size.value, 0.3914537831560393);
    close(spearman.p_value, 0.2632875529923413);
  });
});

describe('mining', () => {
  it('ranks single-column segments by lift with a minimum support (hand-computed)', async () => {
    // 10 rows, 4 conversions: base rate 0.4.
    //   region north: 4 rows, 3 conv → rate 0.75, lift 1.875, support 0.4
    //   region south: 6 rows, 1 conv → rate 1/6, lift 0.41667, support 0.6
    //   channel web:  5 rows, 3 conv → rate 0.6,  lift 1.5,   support 0.5
    //   channel app:  3 rows, 1 conv → rate 1/3,  lift 0.8333, support 0.3
    //   channel store: 2 rows, 0 conv → rate 0,   lift 0,     support 0.2 (below min support 0.25)
    const result = await runMining(warehouse.query, {
      source: { table: 'shop' },
      metric: { sql: 'converted', kind: 'boolean' },
      columns: ['region', 'channel'],
      minSupport: 0.25,
    });
    expect(result.total).toEqual({ n: 10, mean: 0.4 });
    expect(result.segments.map((s) => s.segment)).toEqual([
      { region: 'north' },
      { channel: 'web' },
      { channel: 'app' },
      { region: 'south' },
    ]);
    const [north, web, app, south] = result.segments;
    close(north.lift!, 1.875);
    close(north.support, 0.4);
    close(web.lift!, 1.5);
    close(app.lift!, 0.8333333333333334);
    close(south.lift!, 0.4166666666666667);
    close(south.support, 0.6);
    expect(north.n).toBe(4);
    close(north.mean, 0.75);
  });

  it('includes pairs of columns at depth 2 and ranks lowest first when asked', async () => {
    //   north×web: 3 rows, 3 conv → lift 2.5, support 0.3   south×web: 2 rows, 0 conv → lift 0 (support 0.2)
    //   south×app: 2 rows, 1 conv → lift 1.25               south×store: 2 rows, 0 conv → lift 0
    //   north×app: 1 row,  0 conv (support 0.1)
    const high = await runMining(warehouse.query, {
      source: { table: 'shop' },
      metric: { sql: 'converted', kind: 'boolean' },
      columns: ['region', 'channel'],
      depth: 2,
      minSupport: 0.2,
      limit: 2,
    });
    expect(high.segments.map((s) => s.segment)).toEqual([
      { region: 'north', channel: 'web' },
      { region: 'north' },
    ]);
    close(high.segments[0].lift!, 2.5);
    close(high.segments[0].support, 0.3);
    const low = await runMining(warehouse.query, {
      source: { table: 'shop' },
      metric: { sql: 'converted', kind: 'boolean' },
      columns: ['region', 'channel'],
      depth: 2,
      minSupport: 0.2,
      direction: 'low',
    });
    // Lift 0 at support 0.2: channel store, south×store and south×web. Then south (1/6 ÷ 0.4).
    expect(low.segments.slice(0, 3).every((s) => s.lift === 0 && s.support === 0.2)).toBe(true);
    expect(low.segments[3].segment).toEqual({ region: 'south' });
    expect(low.segments.some((s) => s.support < 0.2)).toBe(false);
  });

  it('averages a numeric metric and keeps the totals when no segment has enough support', async () => {
    const result = await runMining(warehouse.query, {
      source: { table: 'shop', filter: `channel = 'web'` },
      metric: { sql: 'amount' },
      columns: ['region'],
      minSupport: 0.7,
    });
    // web rows: amounts 10, 20, 30 (north) and 5, 15 (south): mean 16; north has support 0.6 < 0.7.
    expect(result.segments).toEqual([]);
    expect(result.total).toEqual({ n: 5, mean: 16 });
  });

  it('reports no lift against a mean that is zero within rounding, keeps the difference, skips NaN', async () => {
    // val − 51.7 over 51.6 ×3 and 51.8 ×3 is truly 0 on average, but each value rounds at the scale of
    // 51.7: float8 gives a mean of about −3.5e-15, and ratios to it of ±3e13.
    await warehouse.query(`CREATE TABLE drift (k text, val float8)`, []);
    await insertRows(
      warehouse.query,
      'drift',
      ['k', 'val'],
      [
        ...[51.6, 51.6, 51.6].map((v) => ['lo', v]),
        ...[51.8, 51.8, 51.8, 'NaN', 'NaN'].map((v) => ['hi', v]),
      ],
    );
    const result = await runMining(warehouse.query, {
      source: { table: 'drift' },
      metric: { sql: 'val - 51.7' },
      columns: ['k'],
    });
    expect(result.total.n).toBe(6);
    expect(result.total.mean).not.toBe(0);
    expect(Math.abs(result.total.mean)).toBeLessThan(1e-13);
    expect(result.segments.map((s) => [s.segment.k, s.n, s.lift])).toEqual([
      ['hi', 3, null],
      ['lo', 3, null],
    ]);
    close(result.segments[0].mean, 0.1, 1e-12);
    close(result.segments[0].difference, 0.1, 1e-12);
    close(result.segments[1].difference, -0.1, 1e-12);
  });

  it('ranks by the mean, also when the population mean is negative', async () => {
    const result = await runMining(warehouse.query, {
      source: { table: 'shop' },
      metric: { sql: '-amount' },
      columns: ['channel'],
    });
    // Means: web −16, app −100/3, store −50 (total −28): highest first, though lift orders them reversed.
    expect(result.segments.map((s) => s.segment.channel)).toEqual(['web', 'app', 'store']);
    close(result.segments[0].lift!, 16 / 28);
    close(result.segments[0].difference, 12);
  });
});

describe('distribution tails (SciPy 1.17.1)', () => {
  // Every expected value: scipy.stats (norm.sf, chi2.sf, t.sf, norm.isf, t.isf), SciPy 1.17.1. Tails are
  // compared relatively: an upper tail formed as 1 − CDF is 0 beyond ~1e-16 and loses digits long before.
  it('normal two-sided p-values (2·norm.sf(z)) down to the smallest normal double', () => {
    for (const [z, p] of [
      [1.96, 0.04999579029644087],
      [9, 2.2571768119076647e-19],
      [26.8, 3.2312335678044954e-158],
      [37, 1.1451142445047853e-299],
    ]) {
      relativelyClose(engineNormalTwoSided(z), p);
      relativelyClose(engineNormalTwoSided(-z), p);
    }
    // Past ~38.4 the true value is below 2.2e-308: it fades through subnormals to 0, never above.
    expect(engineNormalTwoSided(38)).toBeLessThan(2.3e-308);
    expect(engineNormalTwoSided(40)).toBe(0);
    expect(engineNormalTwoSided(0)).toBe(1);
  });

  it('chi-square upper tails (chi2.sf), small and large df', () => {
    for (const [x, df, p] of [
      [50, 1, 1.537459794428033e-12],
      [80, 1, 3.744097384202887e-19],
      [720, 1, 1.3386258936576022e-158],
      [1300, 1, 1.1303728441493301e-284],
      [1400, 50, 3.152379998819281e-260],
      [1000, 1000, 0.49405285382923964],
      [14998.5, 9999, 6.202520239815738e-208],
    ]) {
      relativelyClose(engineChiSquareUpper(x, df), p);
    }
    expect(engineChiSquareUpper(0, 3)).toBe(1);
  });

  it('Student t two-sided p-values (2·t.sf), fractional and very large df', () => {
    for (const [t, df, p] of [
      [10, 30, 4.575251408229618e-11],
      [40, 100, 2.462107602140071e-63],
      [1e4, 100, 7.958529703915527e-302],
      [2, 1e7, 0.04550029089184296],
      [3.7323190302958884, 19.266919429904778, 0.001384391456411694],
    ]) {
      relativelyClose(studentTTwoSided(t, df), p);
    }
    expect(studentTTwoSided(0, 12)).toBe(1);
  });

  it('quantiles from the upper tail (norm.isf, t.isf), including tails 1 − p cannot express', () => {
    relativelyClose(normalUpperQuantile(0.025), 1.9599639845400545);
    relativelyClose(normalUpperQuantile(5e-11), 6.466951087240516);
    relativelyClose(studentTUpperQuantile(0.025, 19.266919429904778), 2.0910632344581144);
    relativelyClose(studentTUpperQuantile(5e-11, 1.5), 3845737.955305489);
    relativelyClose(studentTUpperQuantile(0.025, 1e7), 1.9599642217672055);
  });
});

describe('p-values far in the tails, end to end', () => {
  beforeAll(async () => {
    const q = warehouse.query;
    await q(`CREATE TABLE lopsided (arm text, success boolean)`, []);
    await q(
      `INSERT INTO lopsided SELECT CASE WHEN i <= 1000 THEN 'a' ELSE 'b' END,
         CASE WHEN i <= 1000 THEN i <= 900 ELSE i <= 1100 END FROM generate_series(1, 2000) i`,
      [],
    );
    await q(`CREATE TABLE apart (grp text, v float8)`, []);
    await q(
      `INSERT INTO apart SELECT 'a', 600 + i FROM generate_series(1, 600) i
       UNION ALL SELECT 'b', i FROM generate_series(1, 600) i`,
      [],
    );
    await q(`CREATE TABLE shifted (grp text, v float8)`, []);
    await q(
      `INSERT INTO shifted SELECT 'a', i % 10 + 5 FROM generate_series(1, 300) i
       UNION ALL SELECT 'b', i % 7 FROM generate_series(1, 300) i`,
      [],
    );
  });

  it('two-proportion z and chi-square of the same 2×2 table agree with SciPy near 1e-280', async () => {
    const input = {
      source: { table: 'lopsided' },
      metric: { sql: 'success', kind: 'boolean' as const },
      segment: { column: 'arm' },
    };
    const z = await runStatTest(warehouse.query, { test: 'two_proportion_z', ...input });
    const chi = await runStatTest(warehouse.query, { test: 'chi_square', ...input });
    // 900/1000 vs 100/1000: z by hand, p = 2·norm.sf(z); chi2_contingency(correction=False), SciPy 1.17.1
    close(z.statistic, 35.77708763999664);
    relativelyClose(z.p_value, 2.509158096763144e-280);
    close(chi.statistic, 1280);
    relativelyClose(chi.p_value, 2.509158096763556e-280);
  });

  it('Mann-Whitney on fully separated groups (z ≈ −30) and Welch with t ≈ 32 agree with SciPy', async () => {
    const mw = await runStatTest(warehouse.query, {
      test: 'mann_whitney_u',
      source: { table: 'apart' },
      metric: { sql: 'v' },
      segment: { column: 'grp' },
    });
    // mannwhitneyu(601..1200, 1..600, method='asymptotic'), SciPy 1.17.1
    close(mw.statistic, 360000);
    relativelyClose(mw.p_value, 1.4315683093563622e-197);
    const welch = await runWelch(warehouse.query, {
      source: { table: 'shifted' },
      metric: { sql: 'v' },
      segment: { column: 'grp' },
    });
    // ttest_ind(i % 10 + 5, i % 7 for i in 1..300, equal_var=False), SciPy 1.17.1
    close(welch.statistic, 32.08556278298488);
    close(welch.details.df as number, 533.1427172720605);
    relativelyClose(welch.p_value, 1.3696251285997379e-126, 1e-9);
  });
});

describe('alpha', () => {
  it('refuses an alpha whose interval level 1 − alpha could not be told from 1', async () => {
    const never: StatsQuery = () => Promise.reject(new Error('the warehouse was queried'));
    const base = { source, metric: { sql: 'value' }, segment: { condition: 'treated' } };
    for (const alpha of [1e-17, 5e-11, 0, 1]) {
      await expect(runWelch(never, { ...base, alpha })).rejects.toThrow(/alpha must be at least 1e-10/);
      await expect(
        runTwoProportion(never, { ...base, metric: { sql: 'converted', kind: 'boolean' }, alpha }),
      ).rejects.toThrow(/alpha must be at least 1e-10/);
    }
  });

  it('at the smallest alpha the interval is finite and matches SciPy', async () => {
    const result = await runWelch(warehouse.query, {
      source: { table: 'fixed_values' },
      metric: { sql: 'v' },
      segment: { column: 'grp' },
      alpha: 1e-10,
    });
    // mean difference ± t.isf(5e-11, df)·SE with ttest_ind(A, B, equal_var=False)'s df, SciPy 1.17.1.
    // Not its confidence_interval(1 - 1e-10): that takes t.ppf(1 - 5e-11), whose rounded argument
    // moves the critical value 12.555651236715265 to 12.55565117654844.
    expect(result.ci!.level).toBe(1 - 1e-10);
    relativelyClose(studentTUpperQuantile(5e-11, result.details.df as number), 12.555651236715265);
    close(result.ci!.lower, -4.7162494976779, 1e-12);
    close(result.ci!.upper, 8.706249497677899, 1e-12);
  });
});

describe('non-finite metric values count as missing, in every test', () => {
  // The same values as fixed_values / fixed_pairs plus NaN and ±Infinity: every figure must be the
  // SciPy one of the finite values alone.
  beforeAll(async () => {
    await warehouse.query(`CREATE TABLE nonfinite_values (grp text, v float8)`, []);
    await insertRows(
      warehouse.query,
      'nonfinite_values',
      ['grp', 'v'],
      [
        ...FIXED_A.map((v) => ['A', v]),
        ...FIXED_B.map((v) => ['B', v]),
        ['A', 'NaN'],
        ['A', '-Infinity'],
        ['B', 'Infinity'],
        ['B', 'NaN'],
      ],
    );
    await warehouse.query(`CREATE TABLE nonfinite_pairs (x float8, y float8)`, []);
    await insertRows(
      warehouse.query,
      'nonfinite_pairs',
      ['x', 'y'],
      [...FIXED_X.map((x, i) => [x, FIXED_Y[i]]), ['NaN', 1], [2, 'Infinity'], ['-Infinity', 'NaN']],
    );
  });

  it('Welch and Mann-Whitney', async () => {
    const input = { source: { table: 'nonfinite_values' }, metric: { sql: 'v' }, segment: { column: 'grp' } };
    const welch = await runWelch(warehouse.query, input);
    expect(welch.sample_sizes.groups).toEqual([
      { group: 'A', n: FIXED_A.length },
      { group: 'B', n: FIXED_B.length },
    ]);
    close(welch.statistic, 3.7323190302958884);
    close(welch.p_value, 0.001384391456411694);
    const mw = await runMannWhitney(warehouse.query, input);
    close(mw.statistic, 104);
    close(mw.p_value, 0.004021918385903753);
  });

  it('Pearson and Spearman', async () => {
    const input = { source: { table: 'nonfinite_pairs' }, x: { sql: 'x' }, y: { sql: 'y' } };
    const pearson = await runPearson(warehouse.query, input);
    expect(pearson.sample_sizes.total).toBe(FIXED_X.length);
    close(pearson.effect_size.value, 0.33432539901899483);
    close(pearson.p_value, 0.3450710477331118);
    const spearman = await runSpearman(warehouse.query, input);
    close(spearman.effect_size.value, 0.3914537831560393);
    close(spearman.p_value, 0.2632875529923413);
  });
});

describe('NaN and ±Infinity are no category and no group', () => {
  // A float or numeric column read as categories (chi-square's metric, a segment column, mining's
  // candidates): NaN and ±Infinity are missing, like NULL, as they are in metrics. Each test gets the
  // figures of the finite rows alone (FIXED_TABLE, FIXED_A, FIXED_B: SciPy 1.17.1 references above).
  const NON_FINITE = ['NaN', 'Infinity', '-Infinity'];

  beforeAll(async () => {
    const q = warehouse.query;
    await q(`CREATE TABLE nonfinite_cells (grp text, cat float8, cat_real real, cat_num numeric)`, []);
    const cells: unknown[][] = [];
    FIXED_TABLE.forEach((counts, i) =>
      counts.forEach((count, j) => {
        for (let k = 0; k < count; k++) cells.push([['x', 'y'][i], j + 1, j + 1, j + 1]);
      }),
    );
    for (const grp of ['x', 'y']) for (const v of NON_FINITE) cells.push([grp, v, v, v]);
    await insertRows(q, 'nonfinite_cells', ['grp', 'cat', 'cat_real', 'cat_num'], cells);
    await q(`CREATE TABLE nonfinite_groups (grp float8, grp_num numeric, v float8)`, []);
    await insertRows(
      q,
      'nonfinite_groups',
      ['grp', 'grp_num', 'v'],
      [
        ...FIXED_A.map((v) => [1, 1, v]),
        ...FIXED_B.map((v) => [2, 2, v]),
        ...NON_FINITE.flatMap((g) => [
          [g, g, 99],
          [g, g, 1],
        ]),
      ],
    );
  });

  it('chi-square leaves a float or numeric category NaN or ±Infinity out; text keeps such words', async () => {
    for (const column of ['cat', 'cat_real', 'cat_num']) {
      const result = await runChiSquare(warehouse.query, {
        source: { table: 'nonfinite_cells' },
        metric: { sql: column },
        segment: { column: 'grp' },
      });
      expect(result.details.categories, column).toEqual(['1', '2', '3']);
      expect(result.details.observed).toEqual(FIXED_TABLE);
      expect(result.sample_sizes).toEqual({
        total: 120,
        groups: [
          { group: 'x', n: 60 },
          { group: 'y', n: 60 },
        ],
      });
      // scipy.stats.chi2_contingency([[20,15,25],[30,10,20]], correction=False), as 'matches SciPy'
      close(result.statistic, 3.5555555555555554);
      close(result.p_value, 0.16901331540606607);
      close(result.effect_size.value, 0.17213259316477408);
    }
    // The same values as text are words someone wrote: categories.
    const asText = await runChiSquare(warehouse.query, {
      source: { table: 'nonfinite_cells' },
      metric: { sql: 'cat::text' },
      segment: { column: 'grp' },
    });
    expect(asText.details.categories).toEqual(['-Infinity', '1', '2', '3', 'Infinity', 'NaN']);
  });

  it('a float or numeric segment column forms no group of NaN or ±Infinity, in every test', async () => {
    for (const column of ['grp', 'grp_num']) {
      const input = { source: { table: 'nonfinite_groups' }, metric: { sql: 'v' }, segment: { column } };
      const welch = await runWelch(warehouse.query, input);
      expect(welch.sample_sizes.groups).toEqual([
        { group: '1', n: FIXED_A.length },
        { group: '2', n: FIXED_B.length },
      ]);
      close(welch.statistic, 3.7323190302958884);
      close(welch.p_value, 0.001384391456411694);
      const mw = await runMannWhitney(warehouse.query, input);
      expect(mw.sample_sizes.total).toBe(FIXED_A.length + FIXED_B.length);
      close(mw.statistic, 104);
      close(mw.p_value, 0.004021918385903753);

      // Successes: values above 13, counted here from the arrays.
      const proportion = await runTwoProportion(warehouse.query, { ...input, metric: { sql: 'v > 13' } });
      const [x1, x2] = [FIXED_A, FIXED_B].map((xs) => xs.filter((v) => v > 13).length);
      const [n1, n2] = [FIXED_A.length, FIXED_B.length];
      const pooled = (x1 + x2) / (n1 + n2);
      const z = (x1 / n1 - x2 / n2) / Math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2));
      expect(proportion.sample_sizes.total).toBe(n1 + n2);
      close(proportion.statistic, z);
      close(proportion.p_value, normalTwoSided(z));

      const mined = await runMining(warehouse.query, {
        source: { table: 'nonfinite_groups' },
        metric: { sql: 'v' },
        columns: [column],
        minSupport: 0,
      });
      const segments = Object.fromEntries(mined.segments.map((s) => [String(s.segment[column]), s.n]));
      expect(segments).toEqual({ '1': FIXED_A.length, '2': FIXED_B.length, null: 2 * NON_FINITE.length });
    }
  });
});

describe('input safety', () => {
  it('refuses expressions that try to leave their parentheses or run a subquery', async () => {
    const base = { source, segment: { condition: 'treated' } };
    for (const sql of [
      `value) FROM "Stats Lab"."Visits"; DROP TABLE shop; SELECT (1`,
      `value) FROM shop UNION SELECT (1`,
      `value + $1`,
      `(SELECT max(amount) FROM shop)`,
    ]) {
      await expect(runWelch(warehouse.query, { ...base, metric: { sql } })).rejects.toBeInstanceOf(AppError);
    }
    // A trailing comment stays inside the expression's own line; balanced text is just an expression.
    const commented = await runWelch(warehouse.query, {
      ...base,
      metric: { sql: 'value -- the visit value' },
    });
    const plain = await runWelch(warehouse.query, { ...base, metric: { sql: 'value' } });
    expect(commented.statistic).toBe(plain.statistic);
    await expect(
      runWelch(warehouse.query, {
        ...base,
        source: { ...source, filter: `true) OR (true` },
        metric: { sql: 'value' },
      }),
    ).resolves.toBeDefined();
    const [{ n }] = await warehouse.query(`SELECT count(*)::int AS n FROM shop`, []);
    expect(n).toBe(10);
  });

  it('refuses bad parameters before touching the warehouse', async () => {
    const base = { source, metric: { sql: 'value' } };
    const never: StatsQuery = () => Promise.reject(new Error('the warehouse was queried'));
    const cases = [
      runWelch(never, { ...base, segment: { condition: 'treated' }, alpha: 1.5 }),
      runWelch(never, { ...base, segment: { column: 'Group', groups: ['a', 'b', 'c'] } }),
      runMannWhitney(never, { ...base, segment: { column: 'Group', groups: ['a', 'a'] } }),
      runMining(never, { source, metric: base.metric, columns: ['region'], minSupport: 2 }),
      runMining(never, { source, metric: base.metric, columns: [] }),
      runWelch(never, { ...base, segment: { condition: 'treated' }, metric: { sql: '1; DROP TABLE shop' } }),
    ];
    for (const attempt of cases) await expect(attempt).rejects.toBeInstanceOf(AppError);
  });

  it('quotes identifiers instead of splicing them', async () => {
    const attempt = runWelch(warehouse.query, {
      source: { table: 'fixed_values"; DROP TABLE shop; --' },
      metric: { sql: 'v' },
      segment: { column: 'grp' },
    });
    await expect(attempt).rejects.toThrow(/does not exist/);
  });
});

const FIXED_A = [12.1, 14.3, 11.8, 15.2, 13.9, 12.1, 16.4, 14.8, 13.3, 12.9, 15.7, 14.0];
const FIXED_B = [11.2, 12.1, 10.9, 13.0, 11.7, 12.1, 10.4, 12.8, 11.1, 13.5];
const FIXED_TABLE = [
  [20, 15, 25],
  [30, 10, 20],
];
const FIXED_X = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
const FIXED_Y = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3];
const SHOP: unknown[][] = [
  ['north', 'web', true, 10],
  ['north', 'web', true, 20],
  ['north', 'web', true, 30],
  ['north', 'app', false, 40],
  ['south', 'web', false, 5],
  ['south', 'web', false, 15],
  ['south', 'app', true, 25],
  ['south', 'app', false, 35],
  ['south', 'store', false, 45],
  ['south', 'store', false, 55],
];
