import jStatModule from 'jstat';

const jStat = jStatModule.jStat ?? jStatModule;

/*
 * Every p-value is an upper tail computed as such, never as 1 − CDF: a difference from 1 cannot be
 * smaller than 1.1e-16, and jStat builds its tails that way (its erfc is 1 − erf, its chi-square tail
 * 1 − P) on a log-gamma good to ~2e-10 only. Here the normal and chi-square tails are the regularized
 * upper incomplete gamma function Q, the Student t tail the regularized incomplete beta function I,
 * each by the series or continued fraction that converges without cancellation on its side (Numerical
 * Recipes §6.2, §6.4; for t on many degrees of freedom an asymptotic expansion, see betaLargeA), with a
 * log-gamma good to a few units of 1e-16. Checked against SciPy 1.17.1 over wide grids (test/stats.test.ts
 * keeps a sample): relative error at most 5e-12, mostly ~1e-14, down to the smallest normal double
 * (~2e-308); below it the values fade into subnormals and 0 as the true ones do.
 */

const EPS = Number.EPSILON;
/** A continued fraction that has not converged by then is as close as double arithmetic gets. */
const MAX_ITERATIONS = 100_000;
/** Lentz's guard against a zero denominator. */
const TINY = 1e-300;
const LN_SQRT_2PI = 0.5 * Math.log(2 * Math.PI);

/**
 * Stirling's remainder δ(x) = ln Γ(x) − [(x − ½)·ln x − x + ½·ln 2π], for x ≥ 10, by its asymptotic
 * series Σ B₂ₖ / (2k(2k − 1)·x^(2k−1)). At x = 10 the last term kept is below 1e-17 of δ.
 */
function stirlingRemainder(x: number): number {
  const x2 = 1 / (x * x);
  const series = [1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156, -3617 / 122400];
  let sum = 0;
  for (let k = series.length - 1; k >= 0; k--) sum = sum * x2 + series[k];
  return sum / x;
}

/**
 * ln Γ(x) for x > 0: Stirling's formula with its remainder from 10 up; below, the argument is shifted
 * there by Γ(x) = Γ(x + n) / (x(x + 1)…(x + n − 1)). Absolute error a few units of 1e-16 times |ln Γ|.
 */
function logGamma(x: number): number {
  let shift = 1;
  let y = x;
  while (y < 10) shift *= y++;
  return (y - 0.5) * Math.log(y) - y + LN_SQRT_2PI + stirlingRemainder(y) - Math.log(shift);
}

/**
 * ln B(a, b). When an argument is large, ln Γ of each is large and their difference would cancel: the
 * Stirling parts are combined first, leaving only the remainders δ (R's lbeta does the same).
 */
function logBeta(a: number, b: number): number {
  const p = Math.min(a, b);
  const q = Math.max(a, b);
  const share = p / (p + q);
  if (p >= 10) {
    const corr = stirlingRemainder(p) + stirlingRemainder(q) - stirlingRemainder(p + q);
    return -0.5 * Math.log(q) + LN_SQRT_2PI + corr + (p - 0.5) * Math.log(share) + q * Math.log1p(-share);
  }
  if (q >= 10) {
    const corr = stirlingRemainder(q) - stirlingRemainder(p + q);
    return logGamma(p) + corr + p - p * Math.log(p + q) + (q - 0.5) * Math.log1p(-share);
  }
  return logGamma(p) + logGamma(q) - logGamma(p + q);
}

/**
 * ln(xᵃ·e⁻ˣ / Γ(a)), the factor in front of both expansions of the incomplete gamma function. For a ≥ 10
 * the terms a·ln x, x and ln Γ(a) are each ~a·ln a while their sum is small: writing ln Γ(a) by Stirling
 * lets a·ln a cancel exactly on paper instead of in floating point.
 */
function logGammaPrefactor(a: number, x: number): number {
  if (a < 10) return a * Math.log(x) - x - logGamma(a);
  return a * Math.log(x / a) - (x - a) + 0.5 * Math.log(a / (2 * Math.PI)) - stirlingRemainder(a);
}

/** Γ(a, x)·eˣ·x⁻ᵃ (Q(a, x) without its prefactor) for x > a + 1, by its continued fraction (Lentz). */
function upperGammaFraction(a: number, x: number): number {
  let b = x + 1 - a;
  let c = 1 / TINY;
  let d = 1 / b;
  let h = d;
  for (let i = 1; i < MAX_ITERATIONS; i++) {
    const an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (Math.abs(d) < TINY) d = TINY;
    c = b + an / c;
    if (Math.abs(c) < TINY) c = TINY;
    d = 1 / d;
    const delta = d * c;
    h *= delta;
    if (Math.abs(delta - 1) <= EPS) break;
  }
  return h;
}

/** The regularized upper incomplete gamma function Q(a, x) = Γ(a, x) / Γ(a), a > 0. */
function upperRegularizedGamma(a: number, x: number): number {
  if (!(x > 0)) return 1;
  if (x === Infinity) return 0;
  if (x >= a + 1) return Math.exp(logGammaPrefactor(a, x)) * upperGammaFraction(a, x);
  // P(a, x) by its series; below a + 1, P is at most ~0.9 (Q is not small), so 1 − P loses little.
  let term = 1 / a;
  let sum = term;
  for (let n = 1; n < MAX_ITERATIONS && Math.abs(term) > Math.abs(sum) * EPS; n++) {
    term *= x / (a + n);
    sum += term;
  }
  return 1 - sum * Math.exp(logGammaPrefactor(a, x));
}

/** The continued fraction of the incomplete beta function (modified Lentz). */
function betaFraction(x: number, a: number, b: number): number {
  let c = 1;
  let d = 1 - ((a + b) * x) / (a + 1);
  if (Math.abs(d) < TINY) d = TINY;
  d = 1 / d;
  let h = d;
  for (let m = 1; m < MAX_ITERATIONS; m++) {
    const m2 = 2 * m;
    let an = (m * (b - m) * x) / ((a + m2 - 1) * (a + m2));
    d = 1 + an * d;
    if (Math.abs(d) < TINY) d = TINY;
    c = 1 + an / c;
    if (Math.abs(c) < TINY) c = TINY;
    d = 1 / d;
    h *= d * c;
    an = (-(a + m) * (a + b + m) * x) / ((a + m2) * (a + m2 + 1));
    d = 1 + an * d;
    if (Math.abs(d) < TINY) d = TINY;
    c = 1 + an / c;
    if (Math.abs(c) < TINY) c = TINY;
    d = 1 / d;
    const delta = d * c;
    h *= delta;
    if (Math.abs(delta - 1) <= EPS) break;
  }
  return h;
}

/**
 * The regularized incomplete beta function I_x(a, b). Takes y = 1 − x and both logarithms as well:
 * callers can often form them without the cancellation of 1 − x or the rounding of x next to 1, which
 * a large a would multiply (x = df / (df + t²) when t² ≪ df: ln x = −log1p(t²/df)).
 */
function regularizedBeta(a: number, b: number, x: number, y: number, lnX: number, lnY: number): number {
  if (!(x > 0)) return 0;
  if (!(y > 0)) return 1;
  const logFront = a * lnX + b * lnY - logBeta(a, b);
  // The fraction converges fast below the mean (a + 1) / (a + b + 2); above it, by I_x(a, b) = 1 − I_y(b, a).
  if (x < (a + 1) / (a + b + 2)) return (Math.exp(logFront) * betaFraction(x, a, b)) / a;
  return 1 - (Math.exp(logFront) * betaFraction(y, b, a)) / b;
}

/** (2k + 1)! for k = 0…30, the denominators of BGRAT's coefficients. */
const ODD_FACTORIALS = Array.from({ length: 31 }, (_, k) => {
  let f = 1;
  for (let i = 2; i <= 2 * k + 1; i++) f *= i;
  return f;
});

/**
 * I_x(a, b) for a large and b ≤ 1 by DiDonato and Morris' asymptotic expansion in incomplete gamma
 * functions (BGRAT, ACM TOMS 708 §9, as in Boost's beta_small_b_large_a_series). It needs only ln x,
 * which the caller forms exactly, while the continued fraction works on x itself and multiplies its
 * rounding next to 1.
 */
function betaLargeA(a: number, b: number, lnX: number): number {
  const T = a + (b - 1) / 2;
  const u = -T * lnX;
  // prefix·J₀ is the leading term Q(b, u)·Γ(a + b) / (Γ(a)·Tᵇ).
  const prefix = Math.exp(b * Math.log(u / T) - u - logBeta(a, b));
  if (prefix === 0) return 0;
  let j =
    u >= b + 1 ? upperGammaFraction(b, u) : upperRegularizedGamma(b, u) / Math.exp(logGammaPrefactor(b, u));
  let sum = prefix * j;
  const p = [1];
  const lx2 = (lnX / 2) ** 2;
  const t4 = 4 * T * T;
  let lxp = 1;
  let b2n = b;
  for (let n = 1; n < ODD_FACTORIALS.length; n++) {
    let pn = 0;
    for (let m = 1; m < n; m++) pn += ((m * b - n) * p[n - m]) / ODD_FACTORIALS[m];
    p[n] = pn / n + (b - 1) / ODD_FACTORIALS[n];
    j = (b2n * (b2n + 1) * j + (u + b2n + 1) * lxp) / t4;
    lxp *= lx2;
    b2n += 2;
    const r = prefix * p[n] * j;
    sum += r;
    if (Math.abs(r) <= EPS * Math.abs(sum)) break;
  }
  return sum;
}

/**
 * Two-sided p-value of a Student t statistic (df need not be an integer: Welch): I_x(df/2, ½) with
 * x = df/(df + t²). Where x is within 1 % of 1 and df ≥ 30 the continued fraction would lose about
 * 1e-16/(1 − x) (4e-10 at df = 1e7, t = 2) and BGRAT takes over, accurate there to ~1e-14.
 */
export function studentTTwoSided(t: number, df: number): number {
  const t2 = t * t;
  if (t2 === 0) return 1;
  const lnX = -Math.log1p(t2 / df);
  const y = t2 / (df + t2);
  if (df >= 30 && y < 0.01) return Math.min(1, betaLargeA(df / 2, 0.5, lnX));
  return Math.min(1, regularizedBeta(df / 2, 0.5, df / (df + t2), y, lnX, Math.log(y)));
}

/** Two-sided p-value of a standard normal statistic: 2·Φ(−|z|) = erfc(|z|/√2) = Q(½, z²/2). */
export function normalTwoSided(z: number): number {
  return upperRegularizedGamma(0.5, (z * z) / 2);
}

/** Upper tail of the chi-square distribution: Q(k/2, x/2). */
export function chiSquareUpper(x: number, df: number): number {
  return upperRegularizedGamma(df / 2, x / 2);
}

/**
 * The q > 0 whose upper tail is `tail` (< ½), by Newton's method on ln tail(q) from jStat's estimate:
 * the estimate is good to ~1e-8 at best (its tails are the inaccurate ones above), the logarithm keeps
 * the steps well scaled from the centre to the far tail, and each step roughly squares the error.
 */
function upperQuantile(
  tail: number,
  estimate: number,
  upper: (q: number) => number,
  density: (q: number) => number,
): number {
  let q = estimate;
  for (let i = 0; i < 50; i++) {
    const u = upper(q);
    const step = ((Math.log(u) - Math.log(tail)) * u) / density(q);
    q += step;
    if (!(Math.abs(step) > 1e-12 * q)) break;
  }
  return q;
}

/**
 * The z with P(Z > z) = tail. Callers pass alpha/2 rather than asking for the quantile of 1 − alpha/2:
 * that difference loses digits of alpha as alpha shrinks, and rounds to 1 (the quantile to infinity)
 * once alpha/2 is below 5.6e-17.
 */
export function normalUpperQuantile(tail: number): number {
  return upperQuantile(
    tail,
    -jStat.normal.inv(tail, 0, 1),
    (q) => normalTwoSided(q) / 2,
    (q) => Math.exp((-q * q) / 2) / Math.sqrt(2 * Math.PI),
  );
}

/** The t with P(T > t) = tail on df degrees of freedom (see normalUpperQuantile for why the tail). */
export function studentTUpperQuantile(tail: number, df: number): number {
  const logNorm = -logBeta(df / 2, 0.5) - 0.5 * Math.log(df);
  return upperQuantile(
    tail,
    -jStat.studentt.inv(tail, df),
    (q) => studentTTwoSided(q, df) / 2,
    (q) => Math.exp(logNorm - ((df + 1) / 2) * Math.log1p((q * q) / df)),
  );
}
