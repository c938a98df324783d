import { z } from 'zod';
import { parseTableName, qualified, quoteIdent, toNumber, type SqlRunner, type TableRef } from './sql.ts';
import type { TableMetrics } from './metrics.ts';
import type { IdentityGraphStats } from './identity-schema.ts';

export const severitySchema = z.enum(['info', 'warning', 'error', 'critical']);
export type Severity = z.infer<typeof severitySchema>;

const bound = z.union([z.number(), z.string().min(1).max(64)]);

/** Column tests (the dbt `data_tests` of the transformation project), each a count of failing rows. */
export const columnTestConfigSchema = z.object({
  not_null: z.boolean().optional(),
  unique: z.boolean().optional(),
  accepted_values: z
    .array(z.union([z.string(), z.number(), z.boolean()]))
    .min(1)
    .max(1000)
    .optional(),
  relationships: z
    .object({
      to: z.string().min(1).max(255).describe('Referenced table, schema-qualified'),
      field: z.string().min(1),
    })
    .optional(),
  range: z.object({ min: bound.optional(), max: bound.optional() }).optional(),
  regex: z
    .string()
    .min(1)
    .max(1000)
    .optional()
    .describe('POSIX regular expression every non-null value matches'),
  severity: severitySchema.default('error'),
});
export type ColumnTestConfig = z.input<typeof columnTestConfigSchema>;

export const columnMonitoringConfigSchema = z.object({
  null_rate: z.object({ max: z.number().min(0).max(1), severity: severitySchema.optional() }).optional(),
  distinct: z
    .object({
      min: z.number().int().min(0).optional(),
      max: z.number().int().min(0).optional(),
      severity: severitySchema.optional(),
    })
    .optional(),
  range: z
    .object({ min: bound.optional(), max: bound.optional(), severity: severitySchema.optional() })
    .optional(),
  severity: severitySchema.default('warning'),
});
export type ColumnMonitoringConfig = z.input<typeof columnMonitoringConfigSchema>;

export const tableMonitoringConfigSchema = z.object({
  freshness: z
    .object({
      max_age_seconds: z.number().positive(),
      column: z.string().min(1).optional(),
      severity: severitySchema.optional(),
    })
    .optional(),
  volume: z
    .object({
      min_rows: z.number().int().min(0).optional(),
      max_rows: z.number().int().min(0).optional(),
      /** Largest allowed relative change of the row count against the previous measurement. */
      max_change_ratio: z.number().positive().optional(),
      severity: severitySchema.optional(),
    })
    .optional(),
  severity: severitySchema.default('warning'),
});
export type TableMonitoringConfig = z.input<typeof tableMonitoringConfigSchema>;

export interface CheckResult {
  /** Stable across runs for the same check, so an open alert is updated instead of duplicated. */
  check_key: string;
  kind: 'test' | 'monitor' | 'identity';
  check: string;
  table: string;
  column: string | null;
  status: 'pass' | 'fail';
  measured: number | string | null;
  threshold: number | string | Record<string, unknown> | null;
  severity: Severity;
  message: string;
}

export function checkKey(
  kind: CheckResult['kind'],
  table: string,
  column: string | null,
  check: string,
): string {
  return [kind, table, column ?? '', check].join(':');
}

function tableLabel(table: TableRef) {
  return `${table.schema}.${table.name}`;
}

// ---------------------------------------------------------------------------------------------
// Column tests: one statement per table, one `count(*) filter (...)` per test (unique: a grouped
// count joined in).

export interface ColumnTests {
  column: string;
  config: ColumnTestConfig;
}

/** A key of several columns: unique as a combination (src/quality/table-tests.ts). */
export interface KeyTest {
  columns: string[];
  severity: Severity;
}

interface TestPlanItem {
  /** null for the key's combination, a test of the table. */
  column: string | null;
  check: string;
  threshold: CheckResult['threshold'];
  severity: Severity;
  /** unique and accepted_values count values, as dbt does; the rows holding them are told beside. */
  counts?: 'repeat' | 'are not accepted';
  /** What the message names: the column, or the key's columns. */
  label: string;
}

interface ColumnTestsQuery {
  sql: string;
  params: unknown[];
  table: TableRef;
  plan: TestPlanItem[];
}

/*
 * What fails, for each test, is what dbt's test of the generated project (src/transform/dbt.ts)
 * returns, so that monitoring and `dbt test` report the same count on the same data:
 *   - not_null: the rows holding null;
 *   - unique: the values (not null) that more than one row holds (`group by having count(*) > 1`);
 *   - accepted_values: the values (not null) outside the list, compared in the column's own type
 *     (dbt writes `col not in ('a', 'b')`: 1.50 is the accepted 1.5);
 *   - relationships: the rows (not null) whose value the referenced column does not hold.
 * range and regex are not in the project: the rows (not null) outside the bounds, not matching.
 * A composite key (the project's singular test tests/<table>_primary_key.sql) counts the repeated
 * combinations, nulls included, as its `group by … having count(*) > 1` returns them.
 */
function buildColumnTestsQuery(
  table: TableRef,
  tests: ColumnTests[],
  key: KeyTest | null,
): ColumnTestsQuery | null {
  const params: unknown[] = [];
  const param = (value: unknown) => {
    params.push(value);
    return `$${params.length}`;
  };
  const ctes: string[] = [];
  const select: string[] = [];
  const plan: TestPlanItem[] = [];
  const add = (item: TestPlanItem, expression: string, rows?: string) => {
    select.push(`${expression} as t${plan.length}`);
    if (rows) select.push(`${rows} as r${plan.length}`);
    plan.push(item);
  };
  for (const { column, config: raw } of tests) {
    const config = columnTestConfigSchema.parse(raw);
    const c = quoteIdent(column);
    const base = { column, label: column, severity: config.severity };
    if (config.not_null)
      add({ ...base, check: 'not_null', threshold: 0 }, `count(*) filter (where ${c} is null)`);
    if (config.unique) {
      // dbt's unique query, counted in a CTE cross-joined to the table's counts (one row each).
      const i = plan.length;
      ctes.push(
        `select count(*) as t${i}, coalesce(sum(n), 0) as r${i} from (select count(*) as n` +
          ` from ${qualified(table)} where ${c} is not null group by ${c} having count(*) > 1) as repeated`,
      );
      plan.push({ ...base, check: 'unique', threshold: 0, counts: 'repeat' });
    }
    if (config.accepted_values) {
      // Untyped parameters take the column's type, as dbt's quoted literals do.
      const outside = `${c} not in (${config.accepted_values.map((v) => param(String(v))).join(', ')})`;
      add(
        {
          ...base,
          check: 'accepted_values',
          threshold: { values: config.accepted_values },
          counts: 'are not accepted',
        },
        `count(distinct ${c}) filter (where ${outside})`,
        `count(*) filter (where ${outside})`,
      );
    }
    if (config.relationships) {
      const ref = parseTableName(config.relationships.to, table.schema);
      // Uncorrelated, so the planner hashes the referenced keys once instead of probing per row.
      add(
        {
          ...base,
          check: 'relationships',
          threshold: { to: tableLabel(ref), field: config.relationships.field },
        },
        `count(*) filter (where ${c} is not null and not (${c} = any (select ${quoteIdent(config.relationships.field)}` +
          ` from ${qualified(ref)} where ${quoteIdent(config.relationships.field)} is not null)))`,
      );
    }
    if (config.range && (config.range.min !== undefined || config.range.max !== undefined)) {
      const outside: string[] = [];
      if (config.range.min !== undefined) outside.push(`${c} < ${param(config.range.min)}`);
      if (config.range.max !== undefined) outside.push(`${c} > ${param(config.range.max)}`);
      add(
        {
          ...base,
          check: 'range',
          threshold: { min: config.range.min ?? null, max: config.range.max ?? null },
        },
        `count(*) filter (where ${outside.join(' or ')})`,
      );
    }
    if (config.regex)
      add(
        { ...base, check: 'regex', threshold: { pattern: config.regex } },
        `count(*) filter (where ${c} is not null and ${c}::text !~ ${param(config.regex)})`,
      );
  }
  if (key) {
    const i = plan.length;
    const columns = key.columns.map(quoteIdent).join(', ');
    ctes.push(
      `select count(*) as t${i}, coalesce(sum(n), 0) as r${i} from (select count(*) as n` +
        ` from ${qualified(table)} group by ${columns} having count(*) > 1) as repeated`,
    );
    plan.push({
      column: null,
      label: `(${key.columns.join(', ')})`,
      check: 'primary_key',
      threshold: 0,
      severity: key.severity,
      counts: 'repeat',
    });
  }
  if (plan.length === 0) return null;
  const counts = `select ${['count(*) as total', ...select].join(',\n  ')}\nfrom ${qualified(table)}`;
  const sql = ctes.length
    ? `with ${ctes.map((cte, k) => `c${k} as (${cte})`).join(',\n')}\nselect * from (${counts}) as counts` +
      ctes.map((_, k) => ` cross join c${k}`).join('')
    : counts;
  return { sql, params, table, plan };
}

function parseColumnTestsRow(query: ColumnTestsQuery, row: Record<string, unknown>): CheckResult[] {
  const table = tableLabel(query.table);
  return query.plan.map((item, i) => {
    const failing = toNumber(row[`t${i}`]) ?? 0;
    const held = toNumber(row[`r${i}`]) ?? 0;
    return {
      check_key: checkKey('test', table, item.column, item.check),
      kind: 'test',
      check: item.check,
      table,
      column: item.column,
      status: failing === 0 ? 'pass' : 'fail',
      measured: failing,
      threshold: item.threshold,
      severity: item.severity,
      message:
        failing === 0
          ? `${item.check} holds on ${table}.${item.label}`
          : item.counts
            ? `${failing} value(s) of ${table}.${item.label} ${item.counts}: ${item.check} fails (${held} row(s) hold them)`
            : `${failing} row(s) of ${table} fail ${item.check} on ${item.label}`,
    };
  });
}

export async function runColumnTests(
  runner: SqlRunner,
  table: TableRef,
  tests: ColumnTests[],
  key: KeyTest | null = null,
): Promise<CheckResult[]> {
  const query = buildColumnTestsQuery(table, tests, key);
  if (!query) return [];
  const { rows } = await runner.query(query.sql, query.params);
  return parseColumnTestsRow(query, rows[0]);
}

// ---------------------------------------------------------------------------------------------
// Monitoring thresholds against computed metrics (pure).

/** Numbers compare as numbers, ISO dates as instants, anything else as text. */
function compare(a: number | string, b: number | string): number {
  if (typeof a === 'number' && typeof b === 'number') return a - b;
  const na = Number(a);
  const nb = Number(b);
  if (a !== '' && b !== '' && !Number.isNaN(na) && !Number.isNaN(nb)) return na - nb;
  const da = Date.parse(String(a));
  const db = Date.parse(String(b));
  if (!Number.isNaN(da) && !Number.isNaN(db)) return da - db;
  return String(a) < String(b) ? -1 : String(a) > String(b) ? 1 : 0;
}

function result(
  kind: CheckResult['kind'],
  table: string,
  column: string | null,
  check: string,
  failed: boolean,
  measured: CheckResult['measured'],
  threshold: CheckResult['threshold'],
  severity: Severity,
  message: string,
): CheckResult {
  return {
    check_key: checkKey(kind, table, column, check),
    kind,
    check,
    table,
    column,
    status: failed ? 'fail' : 'pass',
    measured,
    threshold,
    severity,
    message,
  };
}

export function evaluateColumnMonitoring(
  metrics: TableMetrics,
  column: string,
  raw: ColumnMonitoringConfig,
): CheckResult[] {
  const config = columnMonitoringConfigSchema.parse(raw);
  const m = metrics.columns.find((c) => c.name === column);
  const table = metrics.table;
  const out: CheckResult[] = [];
  if (!m) {
    out.push(
      result(
        'monitor',
        table,
        column,
        'column_present',
        true,
        null,
        null,
        config.severity,
        `Column ${column} is missing`,
      ),
    );
    return out;
  }
  if (config.null_rate) {
    const rate = m.null_rate;
    const failed = rate !== null && rate > config.null_rate.max;
    out.push(
      result(
        'monitor',
        table,
        column,
        'null_rate',
        failed,
        rate,
        config.null_rate.max,
        config.null_rate.severity ?? config.severity,
        rate === null
          ? `${table} is empty`
          : `null rate of ${column} is ${(rate * 100).toFixed(2)}% (max ${(config.null_rate.max * 100).toFixed(2)}%)`,
      ),
    );
  }
  if (config.distinct && (config.distinct.min !== undefined || config.distinct.max !== undefined)) {
    const { min, max } = config.distinct;
    const d = m.distinct_count;
    const failed = d === null || (min !== undefined && d < min) || (max !== undefined && d > max);
    out.push(
      result(
        'monitor',
        table,
        column,
        'distinct',
        failed,
        d,
        { min: min ?? null, max: max ?? null, exact: m.distinct_exact },
        config.distinct.severity ?? config.severity,
        `${m.distinct_exact ? '' : '~'}${d ?? 'unknown'} distinct values in ${column}`,
      ),
    );
  }
  if (config.range && (config.range.min !== undefined || config.range.max !== undefined)) {
    const { min, max } = config.range;
    const below = min !== undefined && m.min !== null && compare(m.min, min) < 0;
    const above = max !== undefined && m.max !== null && compare(m.max, max) > 0;
    const unknown = m.min === null && m.max === null && m.null_count < metrics.row_count;
    out.push(
      result(
        'monitor',
        table,
        column,
        'range',
        below || above || unknown,
        below ? m.min : above ? m.max : (m.max ?? m.min),
        { min: min ?? null, max: max ?? null },
        config.range.severity ?? config.severity,
        unknown ? `${column} has no measurable range` : `${column} spans ${m.min ?? '∅'} .. ${m.max ?? '∅'}`,
      ),
    );
  }
  return out;
}

export function evaluateTableMonitoring(
  metrics: TableMetrics,
  raw: TableMonitoringConfig,
  previous?: Pick<TableMetrics, 'row_count'> | null,
): CheckResult[] {
  const config = tableMonitoringConfigSchema.parse(raw);
  const table = metrics.table;
  const out: CheckResult[] = [];
  if (config.freshness) {
    const f = metrics.freshness;
    const severity = config.freshness.severity ?? config.severity;
    const max = config.freshness.max_age_seconds;
    const column = config.freshness.column ?? f?.column ?? null;
    if (!f || (config.freshness.column && f.column !== config.freshness.column))
      out.push(
        result(
          'monitor',
          table,
          column,
          'freshness',
          true,
          null,
          max,
          severity,
          `${table} has no timestamp column measured`,
        ),
      );
    else {
      const age = f.age_seconds;
      out.push(
        result(
          'monitor',
          table,
          f.column,
          'freshness',
          age === null || age > max,
          age,
          max,
          severity,
          age === null
            ? `${table}.${f.column} has no values`
            : `newest ${f.column} is ${Math.round(age)} s old (max ${max} s)`,
        ),
      );
    }
  }
  if (config.volume) {
    const { min_rows: minRows, max_rows: maxRows, max_change_ratio: ratio } = config.volume;
    const severity = config.volume.severity ?? config.severity;
    const rows = metrics.row_count;
    if (minRows !== undefined || maxRows !== undefined)
      out.push(
        result(
          'monitor',
          table,
          null,
          'volume',
          (minRows !== undefined && rows < minRows) || (maxRows !== undefined && rows > maxRows),
          rows,
          { min_rows: minRows ?? null, max_rows: maxRows ?? null },
          severity,
          `${table} has ${rows} rows`,
        ),
      );
    if (ratio !== undefined && previous) {
      const base = previous.row_count;
      const change = base === 0 ? (rows === 0 ? 0 : Infinity) : Math.abs(rows - base) / base;
      out.push(
        result(
          'monitor',
          table,
          null,
          'volume_change',
          change > ratio,
          Number.isFinite(change) ? change : null,
          ratio,
          severity,
          `${table} went from ${base} to ${rows} rows`,
        ),
      );
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Identity-graph health.

export interface IdentityHealthOptions {
  /** Largest allowed relative growth of merged identifiers (identifiers − clusters) between two builds. */
  maxMergeJumpRatio?: number;
  severity?: Severity;
  /** The unified profiles built after the graph: their records in no profile, by source table. */
  profiles?: { schema: string; table: string; recordsWithoutProfileBySource: Record<string, number> };
}

export function evaluateIdentityHealth(
  schema: string,
  stats: IdentityGraphStats,
  options: IdentityHealthOptions = {},
): CheckResult[] {
  const [last, previous] = stats.recent_runs;
  if (!last) return [];
  const severity = options.severity ?? 'warning';
  const table = `${schema}.identity_clusters`;
  const out = [
    result(
      'identity',
      table,
      null,
      'cluster_size_limit',
      last.oversized_components > 0,
      last.oversized_components,
      last.max_cluster_size,
      severity,
      last.oversized_components > 0
        ? `${last.oversized_components} component(s) exceeded ${last.max_cluster_size} identifiers and were not merged`
        : `largest cluster has ${last.largest_cluster} identifiers`,
    ),
  ];
  // Under the degree guard an identifier links every record it is on: one shared by many people
  // (a support line, a placeholder e-mail) merges them all until it crosses the limit.
  const near = stats.identifiers_near_max_degree;
  const from = stats.near_max_degree_from;
  if (from !== null)
    out.push(
      result(
        'identity',
        `${schema}.identity_nodes`,
        null,
        'degree_near_limit',
        near > 0,
        near,
        from,
        severity,
        near > 0
          ? `${near} unflagged identifier(s) have ${from} or more neighbours, near max_degree ${last.max_degree}: ` +
              `they still link the records they are on, until they pass ${last.max_degree} and are flagged`
          : `no unflagged identifier has ${from} or more neighbours (max_degree ${last.max_degree})`,
      ),
    );
  if (previous) {
    const ratio = options.maxMergeJumpRatio ?? 0.5;
    const base = previous.merged_identifiers;
    const growth =
      base === 0 ? (last.merged_identifiers === 0 ? 0 : Infinity) : (last.merged_identifiers - base) / base;
    out.push(
      result(
        'identity',
        table,
        null,
        'merge_jump',
        growth > ratio,
        Number.isFinite(growth) ? growth : null,
        ratio,
        severity,
        `merged identifiers went from ${base} to ${last.merged_identifiers}`,
      ),
    );
  }
  if (options.profiles) {
    const bySource = Object.entries(options.profiles.recordsWithoutProfileBySource);
    const without = bySource.reduce((sum, [, n]) => sum + n, 0);
    out.push(
      result(
        'identity',
        `${options.profiles.schema}.${options.profiles.table}`,
        null,
        'records_without_profile',
        without > 0,
        without,
        0,
        severity,
        without > 0
          ? `${without} record(s) are in no unified profile: every identifier they carry is flagged by the ` +
              `runaway-merge guards (${bySource.map(([table, n]) => `${table}: ${n}`).join(', ')})`
          : 'every record of the graph is in a unified profile',
      ),
    );
  }
  return out;
}
