import { AppError } from '../app-error.ts';

/** The outcome of one statistical test, as the analytics area stores and returns it (snake_case JSON). */
export interface StatTestResult {
  test: StatTestName;
  statistic: number;
  p_value: number;
  effect_size: { name: string; value: number };
  sample_sizes: { total: number; groups?: { group: string; n: number }[] };
  /** Confidence interval of the quantity named by `of`, at `level` (1 - alpha). */
  ci?: { of: string; level: number; lower: number; upper: number };
  details: Record<string, unknown>;
}

export type StatTestName =
  'welch_t' | 'two_proportion_z' | 'chi_square' | 'mann_whitney_u' | 'pearson' | 'spearman';

export const DEFAULT_ALPHA = 0.05;

export function resolveAlpha(alpha: number | undefined): number {
  if (alpha === undefined) return DEFAULT_ALPHA;
  if (!(alpha > 0 && alpha < 1)) throw new AppError('BAD_REQUEST', 'alpha must be between 0 and 1');
  return alpha;
}
