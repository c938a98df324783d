import {
  qualified,
  quoteIdent,
  toNumber,
  typeFamily,
  type SqlRunner,
  type TableRef,
  type TypeFamily,
} from './sql.ts';

/** A column as introspection reports it. */
export interface ColumnInput {
  name: string;
  /** The type reported back with the column's metrics (a domain by its own name). */
  type: string;
  /**
   * The type of the values (introspection's base_type: a domain's base type), which decides the
   * aggregates; absent, `type`.
   */
  base_type?: string;
}

/** The family a column is measured as: its base type's, so a domain over float8 is a float. */
const familyOf = (column: ColumnInput): TypeFamily => typeFamily(column.base_type ?? column.type);

export interface MetricsOptions {
  /** Tables estimated above this many rows get approximate distinct counts (default 200,000). */
  exactDistinctMaxRows?: number;
  /**
   * The planner's row estimate (pg_class.reltuples, as introspection reports it). It decides exact
   * vs approximate before the scan, since the statement's shape must be fixed; unknown → exact.
   */
  estimatedRows?: number | null;
  /** Freshness column; undefined → detected from names and types; null → no freshness. */
  timestampColumn?: string | null;
  /** min/max of text columns: off by default (collation-aware comparisons are the costliest part). */
  textMinMax?: boolean;
  /** Rows sampled for the fallback distinct estimate when pg_stats has nothing (default 30,000). */
  sampleRows?: number;
}

type DistinctMethod = 'exact' | 'pg_stats' | 'sample';

/** @public The declarations of `dimas/client` (npm run build:types) name it in a procedure's output. */
export interface ColumnMetrics {
  name: string;
  type: string;
  null_count: number;
  /** null_count / row_count; null for an empty table. */
  null_rate: number | null;
  distinct_count: number | null;
  distinct_exact: boolean;
  distinct_method: DistinctMethod | null;
  /** Numbers as numbers (bigint/numeric beyond 2^53 stay strings); dates and timestamps as ISO-8601 strings. */
  min: number | string | null;
  max: number | string | null;
}

export interface TableMetrics {
  table: string;
  row_count: number;
  columns: ColumnMetrics[];
  freshness: { column: string; max_timestamp: string | null; age_seconds: number | null } | null;
  /**
   * Write activity from pg_stat_user_tables (cumulative counters; a difference between two
   * measurements means the table changed in between) and the newest row timestamp when known.
   */
  last_change: {
    at: string | null;
    total_modifications: number | null;
    modifications_since_analyze: number | null;
    last_analyzed_at: string | null;
  } | null;
  measured_at: Date;
  duration_ms: number;
}

interface ColumnPlan {
  column: ColumnInput;
  family: TypeFamily;
  distinct: 'exact' | 'approximate' | null;
  minMax: 'number' | 'text' | 'json' | null;
}

export interface MetricsQuery {
  sql: string;
  params: unknown[];
  table: TableRef;
  plan: ColumnPlan[];
  timestampColumn: string | null;
  approximate: boolean;
}

const ORDERED_NUMERIC: TypeFamily[] = ['integer', 'float'];
const ORDERED_TEXTUAL: TypeFamily[] = ['bigint', 'numeric'];
const ORDERED_TEMPORAL: TypeFamily[] = ['date', 'timestamp', 'timestamptz', 'time'];
const TIMESTAMP_FAMILIES: TypeFamily[] = ['timestamp', 'timestamptz'];
/** Conventional names of load/update timestamps, best first. */
const FRESHNESS_NAMES = [
  'updated_at',
  'modified_at',
  'last_modified',
  'last_updated',
  '_loaded_at',
  'loaded_at',
  'ingested_at',
  '_synced_at',
  'synced_at',
  'event_time',
  'event_timestamp',
  'occurred_at',
  'timestamp',
  'created_at',
  'inserted_at',
];

/** The freshness column: the named one, else the best-named timestamp column, else the first one. */
export function detectTimestampColumn(columns: ColumnInput[]): string | null {
  const stamps = columns.filter((c) => TIMESTAMP_FAMILIES.includes(familyOf(c)));
  for (const name of FRESHNESS_NAMES) {
    const hit = stamps.find((c) => c.name.toLowerCase() === name);
    if (hit) return hit.name;
  }
  return (stamps.find((c) => /(_at|_time|_ts)$/i.test(c.name)) ?? stamps[0])?.name ?? null;
}

/**
 * One statement that measures the whole table in a single scan: every column's aggregates sit in
 * one select list over the table. Approximate distinct counts read pg_stats (no scan); only a
 * never-analyzed column falls back to a TABLESAMPLE, evaluated lazily through coalesce (an
 * uncorrelated subquery is an initplan, run on first use), so analyzed tables never pay for it.
 */
export function buildMetricsQuery(
  table: TableRef,
  columns: ColumnInput[],
  options: MetricsOptions = {},
): MetricsQuery {
  if (columns.length === 0) throw new Error(`No columns given for ${table.schema}.${table.name}`);
  const threshold = options.exactDistinctMaxRows ?? 200_000;
  const estimated = options.estimatedRows ?? null;
  const approximate = estimated !== null && estimated > threshold;
  const timestampColumn =
    options.timestampColumn === undefined ? detectTimestampColumn(columns) : options.timestampColumn;
  if (timestampColumn !== null) {
    const col = columns.find((c) => c.name === timestampColumn);
    const family = col && familyOf(col);
    if (!family || ![...TIMESTAMP_FAMILIES, 'date'].includes(family))
      throw new Error(`Freshness column ${timestampColumn} is not a date or timestamp column of the table`);
  }

  const params: unknown[] = [];
  const param = (value: unknown) => {
    params.push(value);
    return `$${params.length}`;
  };
  // Postgres refuses a parameter no expression uses, so schema/table become parameters on first use.
  let tableParams: [string, string] | undefined;
  const schemaAndName = () => (tableParams ??= [param(table.schema), param(table.name)]);
  const plan: ColumnPlan[] = columns.map((column) => {
    const family = familyOf(column);
    const minMax = ORDERED_NUMERIC.includes(family)
      ? 'number'
      : ORDERED_TEXTUAL.includes(family) || (family === 'text' && options.textMinMax)
        ? 'text'
        : ORDERED_TEMPORAL.includes(family)
          ? 'json'
          : null;
    return { column, family, distinct: approximate ? 'approximate' : 'exact', minMax };
  });

  const from = qualified(table);
  const select = ['now() as measured_at', 'count(*) as row_count'];
  const sampled: string[] = [];
  plan.forEach((p, i) => {
    const col = quoteIdent(p.column.name);
    // Types without an equality operator (json, geometric) are compared through their text form.
    const distinctExpr = ['json', 'unordered', 'other'].includes(p.family) ? `${col}::text` : col;
    select.push(`count(${col}) as c${i}_nn`);
    if (p.distinct === 'exact') select.push(`count(distinct ${distinctExpr}) as c${i}_d`);
    else {
      sampled.push(`${distinctExpr} as s${i}`);
      const stats =
        `(select array[n_distinct]::float8[] from pg_catalog.pg_stats where schemaname = ${schemaAndName()[0]}` +
        ` and tablename = ${schemaAndName()[1]}` +
        ` and attname = ${param(p.column.name)} order by inherited desc limit 1)`;
      // Haas–Stokes needs the sample's distinct count d, its singletons f1 and its size n.
      const sample =
        `(select array[count(*), count(*) filter (where k = 1), coalesce(sum(k), 0)]::float8[]` +
        ` from (select count(*) as k from sample where s${i} is not null group by s${i}) g)`;
      select.push(`coalesce(${stats}, ${sample}) as c${i}_nd`);
    }
    // PostgreSQL sorts NaN above every number: one NaN was the maximum, hid every value over a
    // range's bound, and failed the metrics' JSON. Ranges are over the numbers.
    const numbers = p.family === 'float' || p.family === 'numeric' ? ` filter (where ${col} <> 'NaN')` : '';
    if (p.minMax === 'number')
      select.push(`min(${col})${numbers} as c${i}_min`, `max(${col})${numbers} as c${i}_max`);
    else if (p.minMax === 'text')
      select.push(`(min(${col})${numbers})::text as c${i}_min`, `(max(${col})${numbers})::text as c${i}_max`);
    else if (p.minMax === 'json')
      // to_json gives ISO-8601 whatever the session's DateStyle.
      select.push(`to_json(min(${col})) #>> '{}' as c${i}_min`, `to_json(max(${col})) #>> '{}' as c${i}_max`);
  });
  if (timestampColumn !== null) {
    // 'infinity' stands for "never" (a row that never expires), not for the newest change, and
    // now() - infinity is an error that cost the table all its metrics.
    const column = quoteIdent(timestampColumn);
    const ts = `(max(${column}) filter (where isfinite(${column})))::timestamptz`;
    select.push(
      `to_json(${ts}) #>> '{}' as fresh_max`,
      `extract(epoch from now() - ${ts})::float8 as fresh_age`,
    );
  }
  select.push(
    `(select json_build_object('total', n_tup_ins + n_tup_upd + n_tup_del, 'since_analyze', n_mod_since_analyze,` +
      ` 'analyzed_at', greatest(last_analyze, last_autoanalyze)) from pg_catalog.pg_stat_user_tables` +
      ` where relid = to_regclass(${param(from)})) as activity`,
  );

  let sql = '';
  if (sampled.length > 0) {
    const percent = Math.min(
      100,
      Math.max(0.0001, (100 * (options.sampleRows ?? 30_000)) / Math.max(1, estimated!)),
    );
    sql += `with sample as materialized (select ${sampled.join(', ')} from ${from} tablesample system (${percent}) repeatable (42))\n`;
  }
  sql += `select ${select.join(',\n  ')}\nfrom ${from}`;
  return { sql, params, table, plan, timestampColumn, approximate };
}

function minMaxValue(value: unknown, kind: ColumnPlan['minMax']): number | string | null {
  if (value === null || value === undefined) return null;
  if (kind === 'number') {
    // ±Infinity as PostgreSQL prints it: JSON has no such number.
    const n = Number(value);
    return Number.isFinite(n) ? n : String(value);
  }
  if (kind === 'text' && typeof value === 'string' && /^-?\d+(\.\d+)?$/.test(value)) {
    const n = Number(value);
    // Keep digits a double cannot hold exactly.
    return Number.isSafeInteger(n) || (value.includes('.') && value.length <= 15) ? n : value;
  }
  return String(value);
}

function estimateDistinct(raw: number[] | null, rowCount: number, nonNull: number): number | null {
  if (!raw || raw.length === 0) return null;
  let estimate: number;
  if (raw.length === 1) {
    // pg_stats: a negative n_distinct is a fraction of the row count (it grows with the table).
    estimate = raw[0] < 0 ? -raw[0] * rowCount : raw[0];
  } else {
    const [d, f1, n] = raw;
    if (n === 0) return 0;
    // Haas–Stokes Duj1, the estimator ANALYZE itself uses, over the non-null population.
    const denominator = n - f1 + (f1 * n) / Math.max(nonNull, 1);
    estimate = denominator > 0 ? (n * d) / denominator : nonNull;
    estimate = Math.max(estimate, d);
  }
  return Math.round(Math.min(Math.max(estimate, nonNull > 0 ? 1 : 0), nonNull));
}

/** Turns the statement's single row into the structured result. */
function parseMetricsRow(query: MetricsQuery, row: Record<string, unknown>, durationMs = 0): TableMetrics {
  const rowCount = toNumber(row.row_count) ?? 0;
  const columns = query.plan.map((p, i): ColumnMetrics => {
    const nonNull = toNumber(row[`c${i}_nn`]) ?? 0;
    const nullCount = rowCount - nonNull;
    let distinct: number | null;
    let method: DistinctMethod | null;
    if (p.distinct === 'exact') {
      distinct = toNumber(row[`c${i}_d`]);
      method = 'exact';
    } else {
      const raw = row[`c${i}_nd`] as unknown[] | null;
      distinct = estimateDistinct(raw ? raw.map(Number) : null, rowCount, nonNull);
      method = raw ? (raw.length === 1 ? 'pg_stats' : 'sample') : null;
    }
    return {
      name: p.column.name,
      type: p.column.type,
      null_count: nullCount,
      null_rate: rowCount > 0 ? nullCount / rowCount : null,
      distinct_count: distinct,
      distinct_exact: method === 'exact',
      distinct_method: method,
      min: p.minMax ? minMaxValue(row[`c${i}_min`], p.minMax) : null,
      max: p.minMax ? minMaxValue(row[`c${i}_max`], p.minMax) : null,
    };
  });
  const freshMax = (row.fresh_max as string | null | undefined) ?? null;
  const activity = row.activity as {
    total: unknown;
    since_analyze: unknown;
    analyzed_at: string | null;
  } | null;
  return {
    table: `${query.table.schema}.${query.table.name}`,
    row_count: rowCount,
    columns,
    freshness:
      query.timestampColumn === null
        ? null
        : { column: query.timestampColumn, max_timestamp: freshMax, age_seconds: toNumber(row.fresh_age) },
    last_change:
      activity || freshMax
        ? {
            at: freshMax,
            total_modifications: toNumber(activity?.total),
            modifications_since_analyze: toNumber(activity?.since_analyze),
            last_analyzed_at: activity?.analyzed_at ?? null,
          }
        : null,
    measured_at: row.measured_at instanceof Date ? row.measured_at : new Date(String(row.measured_at)),
    duration_ms: durationMs,
  };
}

/** Builds, runs (one statement) and parses. */
export async function computeTableMetrics(
  runner: SqlRunner,
  table: TableRef,
  columns: ColumnInput[],
  options: MetricsOptions = {},
): Promise<TableMetrics> {
  const query = buildMetricsQuery(table, columns, options);
  const started = performance.now();
  const result = await runner.query(query.sql, query.params);
  return parseMetricsRow(query, result.rows[0], Math.round(performance.now() - started));
}
