import { chiSquareUpper, normalTwoSided, normalUpperQuantile } from '../../stats/distributions.ts';
import type { StatTestResult } from '../../stats/result.ts';

/*
 * The power of a finished test at the hypothesis' minimum detectable effect: the probability that the
 * test, with the sample sizes it had and at the hypothesis' alpha (two-sided), finds an effect of that
 * size significant. It tells a non-significant result that rules out a worthwhile effect (high power)
 * from one that says little (low power). The effect is in the unit of the test's effect size:
 *   - welch_t: Cohen's d, noncentrality d·√(n1·n2/(n1+n2));
 *   - mann_whitney_u: r = z/√N, noncentrality r·√N;
 *   - two_proportion_z: a difference of proportions, over the standard error at the pooled proportion;
 *   - pearson, spearman: r or rho, through Fisher's z, atanh(r)·√(N − 3);
 *   - chi_square: Cramér's V, noncentral chi-square with λ = N·(min(rows, columns) − 1)·V².
 * The first four use the normal approximation (as G*Power's and statsmodels' normal power do); for
 * small samples a t test's exact power is a little lower.
 */

/** P(Z > x) for a standard normal Z. */
const normalUpper = (x: number) => (x >= 0 ? normalTwoSided(x) / 2 : 1 - normalTwoSided(x) / 2);

/** Two-sided power of a z test whose statistic is centred at `delta`. */
function normalPower(delta: number, alpha: number): number {
  const z = normalUpperQuantile(alpha / 2);
  return normalUpper(z - Math.abs(delta)) + normalUpper(z + Math.abs(delta));
}

/** The x whose chi-square upper tail on `df` degrees of freedom is `tail` (bisection; the tail is monotone). */
function chiSquareUpperQuantile(tail: number, df: number): number {
  let low = 0;
  let high = df + 10;
  while (chiSquareUpper(high, df) > tail) high *= 2;
  for (let i = 0; i < 200 && high - low > 1e-12 * high; i++) {
    const mid = (low + high) / 2;
    if (chiSquareUpper(mid, df) > tail) low = mid;
    else high = mid;
  }
  return (low + high) / 2;
}

/**
 * Upper tail of the noncentral chi-square: a Poisson(λ/2) mixture of central chi-square tails on
 * df + 2j degrees of freedom, summed outwards from the mode over ±(10σ + 20) terms, where all but a
 * negligible share of the Poisson mass lies (weights relative to the mode, normalised by their sum).
 */
function noncentralChiSquareUpper(x: number, df: number, lambda: number): number {
  if (!(lambda > 0)) return chiSquareUpper(x, df);
  const mu = lambda / 2;
  // Past this the sum would take millions of terms (an effect given far beyond its scale, V ≫ 1); the
  // distribution is then normal to well within what a power needs: mean df + λ, variance 2(df + 2λ).
  if (mu > 1e5) return normalUpper((x - df - lambda) / Math.sqrt(2 * (df + 2 * lambda)));
  const mode = Math.floor(mu);
  const span = Math.ceil(10 * Math.sqrt(mu) + 20);
  let weights = 0;
  let sum = 0;
  let w = 1;
  for (let j = mode; j <= mode + span; j++) {
    if (j > mode) w *= mu / j;
    weights += w;
    sum += w * chiSquareUpper(x, df + 2 * j);
  }
  w = 1;
  for (let j = mode - 1; j >= Math.max(0, mode - span); j--) {
    w *= (j + 1) / mu;
    weights += w;
    sum += w * chiSquareUpper(x, df + 2 * j);
  }
  return Math.min(1, sum / weights);
}

const sizes = (result: StatTestResult) => (result.sample_sizes.groups ?? []).map((g) => g.n);

/** The power, or null when the result lacks what it needs (a result stored by an older version). */
export function powerAt(result: StatTestResult, effect: number, alpha: number): number | null {
  const total = result.sample_sizes.total;
  const details = result.details;
  let power: number;
  switch (result.test) {
    case 'welch_t': {
      const [a, b] = sizes(result);
      if (!(a > 0 && b > 0)) return null;
      power = normalPower(effect * Math.sqrt((a * b) / (a + b)), alpha);
      break;
    }
    case 'mann_whitney_u':
      power = normalPower(effect * Math.sqrt(total), alpha);
      break;
    case 'two_proportion_z': {
      const [a, b] = sizes(result);
      const pooled = Number(details.pooled_proportion);
      const se = Math.sqrt(pooled * (1 - pooled) * (1 / a + 1 / b));
      if (!(se > 0)) return null;
      power = normalPower(effect / se, alpha);
      break;
    }
    case 'pearson':
    case 'spearman':
      if (!(total > 3)) return null;
      power = normalPower(Math.atanh(Math.min(effect, 1 - 1e-15)) * Math.sqrt(total - 3), alpha);
      break;
    case 'chi_square': {
      const df = Number(details.df);
      const rows = Array.isArray(details.groups) ? details.groups.length : 0;
      const columns = Array.isArray(details.categories) ? details.categories.length : 0;
      const minDim = Math.min(rows, columns) - 1;
      if (!(df > 0 && minDim > 0)) return null;
      power = noncentralChiSquareUpper(
        chiSquareUpperQuantile(alpha, df),
        df,
        total * minDim * effect * effect,
      );
      break;
    }
    default:
      return null;
  }
  return Number.isFinite(power) ? Math.min(1, Math.max(0, power)) : null;
}
