import { AppError } from '../app-error.ts';
import { normalTwoSided } from './distributions.ts';
import type { StatTestResult } from './result.ts';
import {
  assertExpression,
  assertSegment,
  assertSource,
  groupedRowsSql,
  num,
  numericMetricSql,
  orderTwoGroups,
} from './sql.ts';
import type { StatsQuery } from './sql.ts';
import type { TwoGroupInput } from './welch.ts';

export interface MannWhitneyInput extends TwoGroupInput {
  /**
   * Continuity correction of the normal approximation (|U − μ| − ½). On by default, as in R's
   * wilcox.test(correct = TRUE) and SciPy's mannwhitneyu(use_continuity = True), so results match them.
   */
  continuity?: boolean;
}

interface GroupRanks {
  g: string;
  n: number;
  rank_sum: number;
  /** Σ over the group's rows of (t² − 1), t = size of the row's tie block; summed over groups = Σ(t³ − t). */
  tie_term: number;
}

/**
 * Ranks over the pooled values of the two groups in one window (a single sort): rank() is the lowest
 * rank of a tie block and count(*) over the default RANGE frame (… CURRENT ROW, peers included) its
 * highest, so their mean is the average rank and count − rank + 1 the block size t. Rank sums and the
 * tie term are summed in numeric, exact for any table size.
 */
async function buildMannWhitneySql(query: StatsQuery, input: TwoGroupInput) {
  const params: unknown[] = [];
  const rows = await groupedRowsSql(
    query,
    input.source,
    input.segment,
    { m: numericMetricSql(input.metric) },
    params,
  );
  const sql =
    `WITH r AS (SELECT s.g, rank() OVER w AS lo, count(*) OVER w AS hi FROM ${rows} WINDOW w AS (ORDER BY s.m)) ` +
    `SELECT r.g::text AS g, count(*)::float8 AS n, (sum(r.lo + r.hi) / 2)::float8 AS rank_sum, ` +
    `sum((r.hi - r.lo + 1) * (r.hi - r.lo + 1) - 1)::float8 AS tie_term ` +
    `FROM r GROUP BY r.g ORDER BY r.g LIMIT 3`;
  return { sql, params };
}

function mannWhitneyFromRanks(groups: [GroupRanks, GroupRanks], continuity = true): StatTestResult {
  const [a, b] = groups;
  if (a.n < 1 || b.n < 1) throw new AppError('BAD_REQUEST', 'each group needs at least one value');
  const n = a.n + b.n;
  const tieSum = a.tie_term + b.tie_term;
  const u1 = a.rank_sum - (a.n * (a.n + 1)) / 2;
  const u2 = a.n * b.n - u1;
  const mu = (a.n * b.n) / 2;
  const sigma = Math.sqrt(((a.n * b.n) / 12) * (n + 1 - tieSum / (n * (n - 1))));
  if (!(sigma > 0))
    throw new AppError('BAD_REQUEST', 'every value is tied; the Mann-Whitney test is undefined');
  const deviation = u1 - mu;
  const corrected = continuity ? Math.max(0, Math.abs(deviation) - 0.5) : Math.abs(deviation);
  const z = (Math.sign(deviation) * corrected) / sigma;
  return {
    test: 'mann_whitney_u',
    statistic: u1,
    p_value: normalTwoSided(z),
    effect_size: { name: 'r', value: z / Math.sqrt(n) },
    sample_sizes: {
      total: n,
      groups: [
        { group: a.g, n: a.n },
        { group: b.g, n: b.n },
      ],
    },
    details: {
      u1,
      u2,
      z,
      mean_u: mu,
      sd_u: sigma,
      tie_correction: tieSum,
      continuity_correction: continuity,
      // P(X > Y) + ½P(X = Y) for a value X of group 1 and Y of group 2.
      common_language_effect: u1 / (a.n * b.n),
      rank_sums: groups.map((g) => ({ group: g.g, rank_sum: g.rank_sum })),
    },
  };
}

export async function runMannWhitney(query: StatsQuery, input: MannWhitneyInput): Promise<StatTestResult> {
  await Promise.all([
    assertSource(input.source),
    assertSegment(input.segment, true),
    assertExpression(input.metric.sql, 'metric'),
  ]);
  const { sql, params } = await buildMannWhitneySql(query, input);
  const rows = (await query(sql, params)).map((r) => ({
    g: String(r.g),
    n: num(r.n),
    rank_sum: num(r.rank_sum),
    tie_term: num(r.tie_term),
  }));
  return mannWhitneyFromRanks(orderTwoGroups(rows, input.segment), input.continuity ?? true);
}
