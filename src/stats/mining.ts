import { AppError } from '../app-error.ts';
import {
  assertExpression,
  assertSource,
  num,
  numericMetricSql,
  qualifiedTable,
  quoteIdent,
  whereClause,
  type MetricSpec,
  type StatsQuery,
  type StatsSource,
} from './sql.ts';

export interface MiningInput {
  source: StatsSource;
  /** Averaged per segment; for a boolean metric the average is the rate of true. */
  metric: MetricSpec;
  /** Candidate segment columns. */
  columns: string[];
  /** 1: one column per segment; 2: also every pair of columns. */
  depth?: 1 | 2;
  /** Smallest share of the population (0–1) a segment must hold to be reported. */
  minSupport?: number;
  /** `high`: segments where the metric is highest relative to everyone; `low`: lowest. */
  direction?: 'high' | 'low';
  limit?: number;
}

interface MinedSegment {
  /** The segment's defining values, column → value (as text; null when the value is NULL). */
  segment: Record<string, string | null>;
  n: number;
  support: number;
  mean: number;
  lift: number | null;
}

export interface MiningResult {
  total: { n: number; mean: number };
  segments: MinedSegment[];
}

const MAX_MINING_COLUMNS = 12;

function groupingSets(count: number, depth: 1 | 2): number[][] {
  const sets: number[][] = [[]];
  for (let i = 0; i < count; i++) sets.push([i]);
  if (depth === 2) for (let i = 0; i < count; i++) for (let j = i + 1; j < count; j++) sets.push([i, j]);
  return sets;
}

/**
 * One scan: GROUPING SETS gives the whole population (the empty set, the baseline of lift) and every
 * candidate segment. GROUPING(c0, …) is a bit mask with a bit set for each column NOT in the row's set,
 * which tells a segment "c = NULL" apart from "c not part of this segment". Support filtering, lift and
 * ranking stay in SQL so only the reported segments leave the warehouse.
 */
function buildMiningSql(input: MiningInput) {
  const { columns } = input;
  const k = columns.length;
  const aliases = columns.map((_, i) => `c${i}`);
  const totalMask = 2 ** k - 1;
  const sets = groupingSets(k, input.depth ?? 1)
    .map((set) => `(${set.map((i) => aliases[i]).join(', ')})`)
    .join(', ');
  const params: unknown[] = [input.minSupport ?? 0.01, Math.min(input.limit ?? 50, 1000)];
  const order = input.direction === 'low' ? 'ASC' : 'DESC';
  const sql =
    `WITH s AS (SELECT ${numericMetricSql(input.metric)} AS m, ` +
    `${columns.map((c, i) => `${quoteIdent(c)} AS ${aliases[i]}`).join(', ')} ` +
    `FROM ${qualifiedTable(input.source)} ${whereClause(input.source)}), ` +
    `g AS (SELECT GROUPING(${aliases.join(', ')}) AS gid, ` +
    `${aliases.map((a) => `${a}::text AS ${a}`).join(', ')}, count(*)::float8 AS n, avg(s.m) AS mean ` +
    `FROM s WHERE s.m IS NOT NULL GROUP BY GROUPING SETS (${sets})), ` +
    `t AS (SELECT n, mean FROM g WHERE gid = ${totalMask}) ` +
    `SELECT g.*, g.n / t.n AS support, g.mean / NULLIF(t.mean, 0) AS lift, t.n AS total_n, t.mean AS total_mean ` +
    `FROM g CROSS JOIN t WHERE g.gid <> ${totalMask} AND g.n >= $1::float8 * t.n ` +
    `ORDER BY lift ${order} NULLS LAST, support DESC, g.gid DESC, ${aliases.map((a) => `g.${a}`).join(', ')} ` +
    `LIMIT $2::int`;
  return { sql, params };
}

function shapeMiningRows(input: MiningInput, rows: Record<string, unknown>[]): MinedSegment[] {
  const k = input.columns.length;
  return rows.map((row) => {
    const gid = num(row.gid);
    const segment: Record<string, string | null> = {};
    input.columns.forEach((column, i) => {
      // The first argument of GROUPING() is the most significant bit.
      const inSet = (gid & (1 << (k - 1 - i))) === 0;
      if (inSet) segment[column] = row[`c${i}`] === null ? null : String(row[`c${i}`]);
    });
    return {
      segment,
      n: num(row.n),
      support: num(row.support),
      mean: num(row.mean),
      lift: row.lift === null ? null : num(row.lift),
    };
  });
}

export async function runMining(query: StatsQuery, input: MiningInput): Promise<MiningResult> {
  const { columns } = input;
  if (columns.length < 1 || columns.length > MAX_MINING_COLUMNS) {
    throw new AppError('BAD_REQUEST', `mining takes 1 to ${MAX_MINING_COLUMNS} candidate columns`);
  }
  if (new Set(columns).size !== columns.length) throw new AppError('BAD_REQUEST', 'candidate columns repeat');
  const minSupport = input.minSupport ?? 0.01;
  if (!(minSupport >= 0 && minSupport <= 1))
    throw new AppError('BAD_REQUEST', 'min_support must be within [0, 1]');
  await Promise.all([assertSource(input.source), assertExpression(input.metric.sql, 'metric')]);
  const { sql, params } = buildMiningSql(input);
  const rows = await query(sql, params);
  // With no segment above the support threshold no row carries the totals; ask for them alone.
  let total = rows.length ? { n: num(rows[0].total_n), mean: num(rows[0].total_mean) } : undefined;
  if (!total) {
    const [row] = await query(
      `SELECT count(*)::float8 AS n, avg(m) AS mean FROM (SELECT ${numericMetricSql(input.metric)} AS m ` +
        `FROM ${qualifiedTable(input.source)} ${whereClause(input.source)}) s WHERE s.m IS NOT NULL`,
      [],
    );
    total = { n: num(row.n), mean: num(row.mean) };
  }
  return { total, segments: shapeMiningRows(input, rows) };
}
