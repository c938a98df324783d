import { runChiSquare, type ChiSquareInput } from './chi-square.ts';
import { runPearson, runSpearman, type CorrelationInput } from './correlation.ts';
import { runMannWhitney, type MannWhitneyInput } from './mann-whitney.ts';
import type { StatTestResult } from './result.ts';
import type { StatsQuery } from './sql.ts';
import { runTwoProportion } from './two-proportion.ts';
import { runWelch, type TwoGroupInput } from './welch.ts';

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
