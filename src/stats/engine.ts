import { runChiSquare, type ChiSquareInput } from './chi-square.ts';
import { fisherInterval, runPearson, runSpearman, type CorrelationInput } from './correlation.ts';
import { runMannWhitney, type MannWhitneyInput } from './mann-whitney.ts';
import type { StatTestResult } from './result.ts';
import type { StatsQuery } from './sql.ts';
import { runTwoProportion, waldInterval } from './two-proportion.ts';
import { runWelch, welchInterval, type TwoGroupInput } from './welch.ts';

/** One statistical test, as a hypothesis names it; the shape the analytics job hands to the engine. */
export type StatTestSpec =
  | ({ test: 'welch_t' } & TwoGroupInput)
  | ({ test: 'two_proportion_z' } & TwoGroupInput)
  | ({ test: 'mann_whitney_u' } & MannWhitneyInput)
  | ({ test: 'chi_square' } & ChiSquareInput)
  | ({ test: 'pearson' | 'spearman' } & CorrelationInput);

/** Runs one test: a single aggregate query in the warehouse, then the arithmetic on its few rows. */
export function runStatTest(query: StatsQuery, spec: StatTestSpec): Promise<StatTestResult> {
  switch (spec.test) {
    case 'welch_t':
      return runWelch(query, spec);
    case 'two_proportion_z':
      return runTwoProportion(query, spec);
    case 'mann_whitney_u':
      return runMannWhitney(query, spec);
    case 'chi_square':
      return runChiSquare(query, spec);
    case 'pearson':
      return runPearson(query, spec);
    case 'spearman':
      return runSpearman(query, spec);
  }
}

/**
 * A result's interval at another alpha, from the figures the result keeps: alpha decides only the
 * interval's level (and whether p is below it), never the statistic, the p-value or the effect, so a
 * result read at another alpha needs no new query. Undefined when the test reports no interval
 * (chi-square, Mann-Whitney, a correlation of n ≤ 3 or |r| = 1) or the result lacks the figures.
 */
export function intervalAt(result: StatTestResult, alpha: number): StatTestResult['ci'] {
  const figure = (value: unknown) => (typeof value === 'number' && Number.isFinite(value) ? value : NaN);
  let ci: StatTestResult['ci'];
  switch (result.test) {
    case 'welch_t':
      ci = welchInterval(
        figure(result.details.mean_difference),
        figure(result.details.standard_error),
        figure(result.details.df),
        alpha,
      );
      break;
    case 'two_proportion_z':
      ci = waldInterval(
        figure(result.effect_size.value),
        figure(result.details.standard_error_unpooled),
        alpha,
      );
      break;
    case 'pearson':
    case 'spearman':
      ci = fisherInterval(figure(result.sample_sizes.total), figure(result.effect_size.value), alpha);
      break;
    default:
      return undefined;
  }
  return ci && Number.isFinite(ci.lower) && Number.isFinite(ci.upper) ? ci : undefined;
}
