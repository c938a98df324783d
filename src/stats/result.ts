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

/**
 * The smallest alpha a test accepts. The critical values are computed from alpha/2 itself and would
 * honour far less, but an interval is reported at level 1 − alpha, a double that keeps only the digits
 * of alpha that fit beside the 1: six at 1e-10, none at 1e-16, and below 5.6e-17 the level is exactly 1.
 */
export const MIN_ALPHA = 1e-10;

export function resolveAlpha(alpha: number | undefined): number {
  if (alpha === undefined) return DEFAULT_ALPHA;
  if (!(alpha >= MIN_ALPHA && alpha < 1)) {
    throw new AppError('BAD_REQUEST', `alpha must be at least ${MIN_ALPHA} and below 1`);
  }
  return alpha;
}
