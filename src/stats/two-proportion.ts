import { AppError } from '../app-error.ts';
import { normalTwoSided, normalUpperQuantile } from './distributions.ts';
import { DEFAULT_ALPHA, resolveAlpha, type StatTestResult } from './result.ts';
import {
  assertExpression,
  assertSegment,
  assertSource,
  groupedRowsSql,
  knownGroups,
  num,
  orderTwoGroups,
  wrap,
} from './sql.ts';
import type { StatsQuery } from './sql.ts';
import type { TwoGroupInput } from './welch.ts';

interface GroupCounts {
  g: string;
  n: number;
  successes: number;
}

/** n and successes per group; the metric is read as a boolean (true = success). */
async function buildTwoProportionSql(query: StatsQuery, input: TwoGroupInput) {
  const params: unknown[] = [];
  const rows = await groupedRowsSql(
    query,
    input.source,
    input.segment,
    { m: `${wrap(input.metric.sql)}::boolean` },
    params,
    { skipNulls: false },
  );
  const sql =
    `SELECT s.g::text AS g, count(s.m)::float8 AS n, count(*) FILTER (WHERE s.m)::float8 AS successes ` +
    `FROM ${rows} GROUP BY s.g HAVING count(s.m) > 0 ORDER BY s.g LIMIT 4`;
  return { sql, params };
}

/** The Wald interval of the difference of proportions at level 1 − alpha (unpooled standard error `se`). */
export function waldInterval(diff: number, se: number, alpha: number): StatTestResult['ci'] {
  const margin = normalUpperQuantile(alpha / 2) * se;
  return { of: 'difference_of_proportions', level: 1 - alpha, lower: diff - margin, upper: diff + margin };
}

/**
 * z uses the pooled proportion (the null hypothesis says both are equal); the interval of the
 * difference uses the unpooled (Wald) standard error, since it describes the difference as observed.
 */
function twoProportionFromCounts(groups: [GroupCounts, GroupCounts], alpha = DEFAULT_ALPHA): StatTestResult {
  const [a, b] = groups;
  if (a.n < 1 || b.n < 1) throw new AppError('BAD_REQUEST', 'each group needs at least one value');
  const pa = a.successes / a.n;
  const pb = b.successes / b.n;
  const pooled = (a.successes + b.successes) / (a.n + b.n);
  const se0 = Math.sqrt(pooled * (1 - pooled) * (1 / a.n + 1 / b.n));
  if (!(se0 > 0)) {
    throw new AppError('BAD_REQUEST', 'every value is a success (or none is) in both groups; z is undefined');
  }
  const diff = pa - pb;
  const z = diff / se0;
  const se = Math.sqrt((pa * (1 - pa)) / a.n + (pb * (1 - pb)) / b.n);
  return {
    test: 'two_proportion_z',
    statistic: z,
    p_value: normalTwoSided(z),
    effect_size: { name: 'difference_of_proportions', value: diff },
    sample_sizes: {
      total: a.n + b.n,
      groups: [
        { group: a.g, n: a.n },
        { group: b.g, n: b.n },
      ],
    },
    ci: waldInterval(diff, se, alpha),
    details: {
      pooled_proportion: pooled,
      standard_error_pooled: se0,
      standard_error_unpooled: se,
      cohens_h: 2 * Math.asin(Math.sqrt(pa)) - 2 * Math.asin(Math.sqrt(pb)),
      relative_lift: pb > 0 ? pa / pb : null,
      groups: groups.map((g) => ({
        group: g.g,
        n: g.n,
        successes: g.successes,
        proportion: g.successes / g.n,
      })),
    },
  };
}

export async function runTwoProportion(query: StatsQuery, input: TwoGroupInput): Promise<StatTestResult> {
  const alpha = resolveAlpha(input.alpha);
  await Promise.all([
    assertSource(input.source),
    assertSegment(input.segment, true),
    assertExpression(input.metric.sql, 'metric'),
  ]);
  const { sql, params } = await buildTwoProportionSql(query, input);
  const rows = knownGroups(
    (await query(sql, params)).map((r) => ({ g: r.g, n: num(r.n), successes: num(r.successes) })),
  );
  return twoProportionFromCounts(orderTwoGroups(rows, input.segment), alpha);
}
