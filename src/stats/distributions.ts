import jStatModule from 'jstat';

const jStat = jStatModule.jStat ?? jStatModule;

// Tails are taken from the lower CDF at -|x| rather than as 1 - CDF(|x|): that keeps small p-values
// from being swallowed by cancellation.

/** Two-sided p-value of a Student t statistic (df need not be an integer: Welch). */
export function studentTTwoSided(t: number, df: number): number {
  return Math.min(1, 2 * jStat.studentt.cdf(-Math.abs(t), df));
}

export function studentTQuantile(p: number, df: number): number {
  return jStat.studentt.inv(p, df);
}

export function normalTwoSided(z: number): number {
  return Math.min(1, 2 * jStat.normal.cdf(-Math.abs(z), 0, 1));
}

export function normalQuantile(p: number): number {
  return jStat.normal.inv(p, 0, 1);
}

export function chiSquareUpper(x: number, df: number): number {
  if (x <= 0) return 1;
  return Math.max(0, 1 - jStat.chisquare.cdf(x, df));
}
