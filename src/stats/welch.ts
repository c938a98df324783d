import { AppError } from '../app-error.ts';
import { studentTTwoSided, studentTUpperQuantile } from './distributions.ts';
import { DEFAULT_ALPHA, resolveAlpha, type StatTestResult } from './result.ts';
import {
  assertExpression,
  assertSegment,
  assertSource,
  groupedRowsSql,
  knownGroups,
  num,
  numericMetricSql,
  orderTwoGroups,
  type MetricSpec,
  type SegmentSpec,
  type StatsQuery,
  type StatsSource,
} from './sql.ts';

export interface TwoGroupInput {
  source: StatsSource;
  metric: MetricSpec;
  segment: SegmentSpec;
  alpha?: number;
}

interface GroupMoments {
  g: string;
  n: number;
  mean: number;
  variance: number;
}

/**
 * n, mean and sample variance per group in one pass. PostgreSQL's float8 avg/var_samp use the
 * Youngs–Cramer update, so no Σx² cancellation. They skip NULL values, so the scan needs no filter.
 */
async function buildWelchSql(query: StatsQuery, input: TwoGroupInput) {
  const params: unknown[] = [];
  const rows = await groupedRowsSql(
    query,
    input.source,
    input.segment,
    { m: numericMetricSql(input.metric) },
    params,
    { skipNulls: false },
  );
  // LIMIT 4: the NULL group (sorted last) and three more tell "exactly two groups" apart.
  const sql =
    `SELECT s.g::text AS g, count(s.m)::float8 AS n, avg(s.m) AS mean, var_samp(s.m) AS variance ` +
    `FROM ${rows} GROUP BY s.g HAVING count(s.m) > 0 ORDER BY s.g LIMIT 4`;
  return { sql, params };
}

/** The interval of the mean difference at level 1 − alpha, from the figures a result keeps. */
export function welchInterval(diff: number, se: number, df: number, alpha: number): StatTestResult['ci'] {
  const margin = studentTUpperQuantile(alpha / 2, df) * se;
  return { of: 'mean_difference', level: 1 - alpha, lower: diff - margin, upper: diff + margin };
}

function welchFromMoments(groups: [GroupMoments, GroupMoments], alpha = DEFAULT_ALPHA): StatTestResult {
  const [a, b] = groups;
  if (a.n < 2 || b.n < 2) {
    throw new AppError('BAD_REQUEST', 'Welch t-test needs at least 2 values in each group');
  }
  const va = a.variance / a.n;
  const vb = b.variance / b.n;
  const se = Math.sqrt(va + vb);
  if (!(se > 0))
    throw new AppError('BAD_REQUEST', 'the metric is constant within both groups; t is undefined');
  const diff = a.mean - b.mean;
  const t = diff / se;
  const df = (va + vb) ** 2 / (va ** 2 / (a.n - 1) + vb ** 2 / (b.n - 1));
  const pooledSd = Math.sqrt(((a.n - 1) * a.variance + (b.n - 1) * b.variance) / (a.n + b.n - 2));
  return {
    test: 'welch_t',
    statistic: t,
    p_value: studentTTwoSided(t, df),
    effect_size: { name: 'cohens_d', value: diff / pooledSd },
    sample_sizes: {
      total: a.n + b.n,
      groups: [
        { group: a.g, n: a.n },
        { group: b.g, n: b.n },
      ],
    },
    ci: welchInterval(diff, se, df, alpha),
    details: {
      df,
      mean_difference: diff,
      standard_error: se,
      pooled_sd: pooledSd,
      groups: groups.map((g) => ({ group: g.g, n: g.n, mean: g.mean, variance: g.variance })),
    },
  };
}

export async function runWelch(query: StatsQuery, input: TwoGroupInput): Promise<StatTestResult> {
  const alpha = resolveAlpha(input.alpha);
  await Promise.all([
    assertSource(input.source),
    assertSegment(input.segment, true),
    assertExpression(input.metric.sql, 'metric'),
  ]);
  const { sql, params } = await buildWelchSql(query, input);
  const rows = knownGroups(
    (await query(sql, params)).map((r) => ({
      g: r.g,
      n: num(r.n),
      mean: num(r.mean),
      variance: num(r.variance),
    })),
  );
  return welchFromMoments(orderTwoGroups(rows, input.segment), alpha);
}
