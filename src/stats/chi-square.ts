import { AppError } from '../app-error.ts';
import { chiSquareUpper } from './distributions.ts';
import type { StatTestResult } from './result.ts';
import {
  assertExpression,
  assertSegment,
  assertSource,
  groupedRowsSql,
  num,
  wrap,
  type MetricSpec,
  type SegmentSpec,
  type StatsQuery,
  type StatsSource,
} from './sql.ts';

export interface ChiSquareInput {
  source: StatsSource;
  /** The categorical variable: its distinct values (as text) are the columns of the table. */
  metric: MetricSpec;
  /** The groups (k ≥ 2) are the rows of the table. */
  segment: SegmentSpec;
  /** Yates' continuity correction, for 2×2 tables only. Off by default: Pearson's statistic as is. */
  yates?: boolean;
  /** The most cells the contingency table may have; past it the metric is not categorical. */
  maxCells?: number;
}

const DEFAULT_MAX_CELLS = 10_000;

interface ContingencyCell {
  g: string;
  c: string;
  n: number;
}

/**
 * The non-empty cells of the contingency table, counted by GROUP BY in the warehouse. Rows whose group
 * or category is missing (NULL, or NaN and ±Infinity of a float or numeric) are left out.
 */
async function buildChiSquareSql(query: StatsQuery, input: ChiSquareInput) {
  const params: unknown[] = [];
  const rows = await groupedRowsSql(
    query,
    input.source,
    input.segment,
    { c: wrap(input.metric.sql) },
    params,
    {
      categories: ['c'],
    },
  );
  params.push((input.maxCells ?? DEFAULT_MAX_CELLS) + 1);
  const sql =
    `SELECT s.g::text AS g, s.c::text AS c, count(*)::float8 AS n FROM ${rows} ` +
    `GROUP BY s.g, s.c ORDER BY s.g, s.c LIMIT $${params.length}`;
  return { sql, params };
}

function chiSquareFromCells(cells: ContingencyCell[], options: { yates?: boolean; maxCells?: number } = {}) {
  if (cells.length > (options.maxCells ?? DEFAULT_MAX_CELLS)) {
    throw new AppError('BAD_REQUEST', 'the metric has too many distinct values for a chi-square test');
  }
  // GROUP BY returns only cells that occur; the others are zeros of the table.
  const rowLabels = [...new Set(cells.map((cell) => cell.g))];
  const colLabels = [...new Set(cells.map((cell) => cell.c))].sort();
  if (rowLabels.length < 2 || colLabels.length < 2) {
    throw new AppError(
      'BAD_REQUEST',
      `chi-square needs at least 2 groups and 2 categories, found ${rowLabels.length} and ${colLabels.length}`,
    );
  }
  const observed = rowLabels.map(() => colLabels.map(() => 0));
  for (const cell of cells) observed[rowLabels.indexOf(cell.g)][colLabels.indexOf(cell.c)] = cell.n;
  const rowTotals = observed.map((row) => row.reduce((s, v) => s + v, 0));
  const colTotals = colLabels.map((_, j) => observed.reduce((s, row) => s + row[j], 0));
  const total = rowTotals.reduce((s, v) => s + v, 0);
  const expected = rowTotals.map((r) => colTotals.map((c) => (r * c) / total));
  const df = (rowLabels.length - 1) * (colLabels.length - 1);
  const yates = !!options.yates && df === 1;
  let chi2 = 0;
  for (let i = 0; i < rowLabels.length; i++) {
    for (let j = 0; j < colLabels.length; j++) {
      const deviation = Math.abs(observed[i][j] - expected[i][j]);
      const d = yates ? Math.max(0, deviation - 0.5) : deviation;
      chi2 += (d * d) / expected[i][j];
    }
  }
  const minDim = Math.min(rowLabels.length, colLabels.length) - 1;
  const smallExpected = expected.flat().filter((e) => e < 5).length;
  return {
    test: 'chi_square',
    statistic: chi2,
    p_value: chiSquareUpper(chi2, df),
    effect_size: { name: 'cramers_v', value: Math.sqrt(chi2 / (total * minDim)) },
    sample_sizes: { total, groups: rowLabels.map((group, i) => ({ group, n: rowTotals[i] })) },
    details: {
      df,
      yates_correction: yates,
      groups: rowLabels,
      categories: colLabels,
      observed,
      expected,
      // The chi-square approximation is doubtful when many expected counts are below 5 (Cochran).
      cells_expected_below_5: smallExpected,
    },
  } satisfies StatTestResult;
}

export async function runChiSquare(query: StatsQuery, input: ChiSquareInput): Promise<StatTestResult> {
  await Promise.all([
    assertSource(input.source),
    assertSegment(input.segment),
    assertExpression(input.metric.sql, 'metric'),
  ]);
  const { sql, params } = await buildChiSquareSql(query, input);
  const cells = (await query(sql, params)).map((r) => ({ g: String(r.g), c: String(r.c), n: num(r.n) }));
  return chiSquareFromCells(cells, input);
}
