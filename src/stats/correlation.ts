import { AppError } from '../app-error.ts';
import { normalUpperQuantile, studentTTwoSided } from './distributions.ts';
import { DEFAULT_ALPHA, resolveAlpha, type StatTestResult } from './result.ts';
import {
  assertExpression,
  assertSource,
  num,
  numericMetricSql,
  qualifiedTable,
  whereClause,
  type MetricSpec,
  type StatsQuery,
  type StatsSource,
} from './sql.ts';

export interface CorrelationInput {
  source: StatsSource;
  x: MetricSpec;
  y: MetricSpec;
  alpha?: number;
}

function pairsSql(input: CorrelationInput): string {
  return (
    `(SELECT ${numericMetricSql(input.x)} AS x, ${numericMetricSql(input.y)} AS y ` +
    `FROM ${qualifiedTable(input.source)} ${whereClause(input.source)}) s WHERE s.x IS NOT NULL AND s.y IS NOT NULL`
  );
}

/**
 * corr() rather than Σx, Σy, Σx², Σy², Σxy: PostgreSQL accumulates it with the Youngs–Cramer update,
 * which does not lose r to cancellation when the values are large and close together.
 */
function buildPearsonSql(input: CorrelationInput) {
  const sql =
    `SELECT count(*)::float8 AS n, corr(s.y, s.x) AS r, avg(s.x) AS mean_x, avg(s.y) AS mean_y, ` +
    `stddev_samp(s.x) AS sd_x, stddev_samp(s.y) AS sd_y FROM ${pairsSql(input)}`;
  return { sql, params: [] as unknown[] };
}

/**
 * Average ranks of x and of y (rank() and count(*) over the same ORDER BY window are the two ends of a
 * tie block), then Pearson's r of the ranks: Spearman's ρ with the standard tie handling.
 */
function buildSpearmanSql(input: CorrelationInput) {
  const sql =
    `WITH r AS (SELECT (rank() OVER wx + count(*) OVER wx)::float8 / 2 AS rx, ` +
    `(rank() OVER wy + count(*) OVER wy)::float8 / 2 AS ry FROM ${pairsSql(input)} ` +
    `WINDOW wx AS (ORDER BY s.x), wy AS (ORDER BY s.y)) ` +
    `SELECT count(*)::float8 AS n, corr(r.ry, r.rx) AS r FROM r`;
  return { sql, params: [] as unknown[] };
}

/** The interval of r (or rho) at level 1 − alpha through Fisher's z; none for n ≤ 3 or |r| = 1. */
export function fisherInterval(n: number, r: number, alpha: number): StatTestResult['ci'] {
  if (!(n > 3 && Math.abs(r) < 1)) return undefined;
  const half = normalUpperQuantile(alpha / 2) / Math.sqrt(n - 3);
  const zr = Math.atanh(r);
  return { of: 'r', level: 1 - alpha, lower: Math.tanh(zr - half), upper: Math.tanh(zr + half) };
}

/**
 * t = r·√((n−2)/(1−r²)) on n−2 df for both coefficients (for Spearman the usual large-sample
 * approximation, as SciPy's spearmanr). The interval of r comes from Fisher's z (SE 1/√(n−3)).
 */
function correlationFromR(
  test: 'pearson' | 'spearman',
  n: number,
  r: number,
  alpha = DEFAULT_ALPHA,
  extra: Record<string, unknown> = {},
): StatTestResult {
  if (n < 3) throw new AppError('BAD_REQUEST', 'a correlation test needs at least 3 pairs of values');
  if (!Number.isFinite(r)) {
    throw new AppError('BAD_REQUEST', 'one of the variables is constant; the correlation is undefined');
  }
  const df = n - 2;
  const t = Math.abs(r) >= 1 ? Math.sign(r) * Infinity : r * Math.sqrt(df / (1 - r * r));
  const pValue = Math.abs(r) >= 1 ? 0 : studentTTwoSided(t, df);
  const ci = fisherInterval(n, r, alpha);
  return {
    test,
    statistic: t,
    p_value: pValue,
    effect_size: { name: test === 'pearson' ? 'r' : 'rho', value: r },
    sample_sizes: { total: n },
    ci,
    details: { df, r_squared: r * r, ...extra },
  };
}

async function assertInput(input: CorrelationInput) {
  await Promise.all([
    assertSource(input.source),
    assertExpression(input.x.sql, 'x'),
    assertExpression(input.y.sql, 'y'),
  ]);
}

export async function runPearson(query: StatsQuery, input: CorrelationInput): Promise<StatTestResult> {
  const alpha = resolveAlpha(input.alpha);
  await assertInput(input);
  const { sql, params } = buildPearsonSql(input);
  const [row] = await query(sql, params);
  return correlationFromR('pearson', num(row.n), num(row.r), alpha, {
    mean_x: num(row.mean_x),
    mean_y: num(row.mean_y),
    sd_x: num(row.sd_x),
    sd_y: num(row.sd_y),
  });
}

export async function runSpearman(query: StatsQuery, input: CorrelationInput): Promise<StatTestResult> {
  const alpha = resolveAlpha(input.alpha);
  await assertInput(input);
  const { sql, params } = buildSpearmanSql(input);
  const [row] = await query(sql, params);
  return correlationFromR('spearman', num(row.n), num(row.r), alpha);
}
