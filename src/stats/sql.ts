import { loadModule, parseSync } from 'libpg-query';
import { AppError } from '../app-error.ts';
import { baseTypeSql } from '../warehouse/introspect.ts';

/**
 * Runs one parameterized statement (`$1`, `$2`, … placeholders) on the warehouse and returns its rows.
 * A function rather than a client type so that a pg Pool, a PGlite instance or the warehouse layer's
 * read-only runner (timeout, READ ONLY transaction) all adapt in one line.
 */
export type StatsQuery = (sql: string, params: unknown[]) => Promise<Record<string, unknown>[]>;

/** The population: a table (optionally schema-qualified) and an optional row filter. */
export interface StatsSource {
  schema?: string;
  table: string;
  /** A boolean SQL condition over the table's columns; rows where it is not true are left out. */
  filter?: string;
}

/**
 * A numeric or boolean SQL expression over one row; booleans count as 1/0 where a number is needed. A
 * value that is NaN or ±Infinity counts as missing, like NULL (see numericMetricSql).
 */
export interface MetricSpec {
  sql: string;
  kind?: 'numeric' | 'boolean';
}

/**
 * What splits the population: a column (its distinct values are the groups) or a boolean condition
 * (groups `true` and `false`). `groups` picks and orders the groups to compare; the first is group 1.
 */
export type SegmentSpec = { column: string; groups?: string[] } | { condition: string; groups?: string[] };

/**
 * Splices a checked expression. The newline before the closing parenthesis matters: a trailing `--`
 * comment would otherwise swallow the rest of the generated line; it is also how assertExpression
 * parses it, so what was checked is what runs.
 */
export function wrap(expr: string): string {
  return `(${expr}\n)`;
}

export function quoteIdent(name: string): string {
  if (!name || name.includes('\0')) throw new AppError('BAD_REQUEST', `invalid identifier "${name}"`);
  return `"${name.replaceAll('"', '""')}"`;
}

export function qualifiedTable(source: StatsSource): string {
  return source.schema
    ? `${quoteIdent(source.schema)}.${quoteIdent(source.table)}`
    : quoteIdent(source.table);
}

let parserReady: Promise<void> | undefined;

/**
 * Metric, segment and filter expressions are spliced into the generated SQL, so each must be exactly one
 * row-level expression: `SELECT (<expr>)` has to parse as a single plain SELECT with one target. Anything
 * that closes the parenthesis to add clauses or statements fails that shape. Subqueries are refused too:
 * they would read outside the hypothesis' table. Read-only enforcement stays with the query runner.
 */
export async function assertExpression(expr: string, what: string): Promise<void> {
  parserReady ??= loadModule();
  await parserReady;
  let tree: any;
  try {
    tree = parseSync(`SELECT ${wrap(expr)}`);
  } catch (error) {
    throw new AppError('BAD_REQUEST', `${what} is not a valid SQL expression: ${(error as Error).message}`);
  }
  const select = tree.stmts?.length === 1 ? tree.stmts[0].stmt?.SelectStmt : undefined;
  const plain =
    select &&
    select.op === 'SETOP_NONE' &&
    select.targetList?.length === 1 &&
    Object.keys(select).every((key) => ['targetList', 'limitOption', 'op'].includes(key));
  if (!plain) throw new AppError('BAD_REQUEST', `${what} must be a single SQL expression`);
  const json = JSON.stringify(select);
  if (json.includes('"SubLink"')) throw new AppError('BAD_REQUEST', `${what} must not contain a subquery`);
  // $n would read the engine's own parameters (group labels, thresholds).
  if (json.includes('"ParamRef"')) throw new AppError('BAD_REQUEST', `${what} must not contain parameters`);
}

export async function assertSource(source: StatsSource): Promise<void> {
  if (source.filter !== undefined) await assertExpression(source.filter, 'filter');
}

export async function assertSegment(segment: SegmentSpec, twoGroups = false): Promise<void> {
  if (segment.groups && new Set(segment.groups).size !== segment.groups.length) {
    throw new AppError('BAD_REQUEST', 'segment groups repeat');
  }
  if (twoGroups && segment.groups && segment.groups.length !== 2) {
    throw new AppError('BAD_REQUEST', 'this test compares exactly 2 segment groups');
  }
  if ('condition' in segment) await assertExpression(segment.condition, 'segment condition');
  else quoteIdent(segment.column);
}

/**
 * The metric as float8 (booleans as 1/0), for averages, variances, ranks and mining. NaN and ±Infinity
 * become NULL, so every test leaves them out as it leaves out missing values: they are no measurement
 * (NaN is how pandas and many loaders write a missing float), a single one turns a mean or variance
 * into NaN or makes a test report a constant metric, and PostgreSQL sorts NaN above every number, which
 * would rank it as the largest value. The tests' sample sizes count the values actually used. Chi-square
 * reads the metric as categories, through categoriesSql, which leaves them out alike. (PostgreSQL's
 * float8 equality holds for NaN = NaN, so nullif finds it.)
 */
export function numericMetricSql(metric: MetricSpec): string {
  return metric.kind === 'boolean'
    ? `(${wrap(metric.sql)}::boolean)::int::float8`
    : `nullif(nullif(nullif(${wrap(metric.sql)}::float8, 'NaN'), 'Infinity'), '-Infinity')`;
}

/**
 * `expr` read as a category (a segment's group, a chi-square category, a mining segment) when its base
 * type (baseTypeSql) is `type`: NaN and ±Infinity become NULL in the types that hold them, so they count
 * as missing there too, as in numericMetricSql, instead of forming a group "NaN" of their own (a NaN
 * column next to real groups made a two-group test fail, or a chi-square test report an association with
 * missingness). Other types keep every value: a text column's 'NaN' is a value its writer chose. numeric
 * is compared as text: its 'Infinity' literal does not parse before PostgreSQL 14.
 */
function categoryOfType(expr: string, type: string): string {
  if (type === 'double precision' || type === 'real')
    return `nullif(nullif(nullif(${expr}, 'NaN'), 'Infinity'), '-Infinity')`;
  if (type === 'numeric')
    return `CASE WHEN ${expr}::text IN ('NaN', 'Infinity', '-Infinity') THEN NULL ELSE ${expr} END`;
  return expr;
}

/**
 * `exprs` (over the source's rows) read as categories, see categoryOfType. Their types come from one
 * query that reads no row (a scalar subquery with LIMIT 0 is a NULL of the expression's type), so the
 * category keeps its own type inside the test's query and a column of another type costs nothing.
 */
export async function categoriesSql(
  query: StatsQuery,
  source: StatsSource,
  exprs: string[],
): Promise<string[]> {
  if (!exprs.length) return [];
  const types = exprs.map(
    (expr, i) =>
      `${baseTypeSql(`pg_typeof((SELECT ${expr} FROM ${qualifiedTable(source)} LIMIT 0))`)} AS t${i}`,
  );
  const [row] = await query(`SELECT ${types.join(', ')}`, []);
  return exprs.map((expr, i) => categoryOfType(expr, String(row[`t${i}`])));
}

export function whereClause(source: StatsSource): string {
  return source.filter ? `WHERE ${wrap(source.filter)}` : '';
}

/**
 * The rows of the groups to compare, as `s(g, …)`; when the caller named groups, only those (`params`
 * receives the labels). The group key stays in its own type inside the query (grouping on a boolean or
 * an integer is cheaper than on text, and orders naturally); it is turned into a text label only in the
 * output. A column's key and the `categories` (aliases of `columns`) are read as categories: NaN and
 * ±Infinity are missing (categoriesSql). With `skipNulls` rows with a NULL key or value are dropped
 * here; tests whose aggregates ignore NULLs anyway pass false, keeping the scan free of a per-row
 * filter, and drop the NULL group from the few result rows instead (see knownGroups).
 */
export async function groupedRowsSql(
  query: StatsQuery,
  source: StatsSource,
  segment: SegmentSpec,
  columns: Record<string, string>,
  params: unknown[],
  options: { skipNulls?: boolean; categories?: string[] } = {},
): Promise<string> {
  const skipNulls = options.skipNulls ?? true;
  const categories = options.categories ?? [];
  // A condition's key is boolean, which has no NaN: no need to ask its type.
  const byColumn = 'column' in segment;
  const read = await categoriesSql(query, source, [
    ...(byColumn ? [quoteIdent(segment.column)] : []),
    ...categories.map((alias) => columns[alias]),
  ]);
  const key = byColumn ? read.shift()! : `${wrap(segment.condition)}::boolean`;
  const select = Object.entries(columns)
    .map(
      ([alias, expr]) => `${categories.includes(alias) ? read[categories.indexOf(alias)] : expr} AS ${alias}`,
    )
    .join(', ');
  const conditions = skipNulls
    ? ['s.g IS NOT NULL', ...Object.keys(columns).map((alias) => `s.${alias} IS NOT NULL`)]
    : [];
  if (segment.groups?.length) {
    const placeholders = segment.groups.map((label) => {
      params.push(label);
      return `$${params.length}::text`;
    });
    conditions.push(`s.g::text IN (${placeholders.join(', ')})`);
  }
  return (
    `(SELECT ${key} AS g, ${select} FROM ${qualifiedTable(source)} ${whereClause(source)}) s` +
    (conditions.length ? ` WHERE ${conditions.join(' AND ')}` : '')
  );
}

/** Result rows of groups that have a key and at least one value. */
export function knownGroups<T extends { g: unknown; n: number }>(rows: T[]): (T & { g: string })[] {
  return rows
    .filter((r) => r.g !== null && r.g !== undefined && r.n > 0)
    .map((r) => ({ ...r, g: String(r.g) }));
}

/**
 * Puts the groups a two-group test received in the order of the comparison: the named order when given,
 * `true` before `false` for a condition (the condition names the group of interest), else the natural
 * order of the key. Refuses anything but exactly two groups.
 */
export function orderTwoGroups<T extends { g: string }>(rows: T[], segment: SegmentSpec): [T, T] {
  if (rows.length !== 2) {
    const found =
      rows.length > 2 ? 'more than 2 groups' : `${rows.length} group${rows.length === 1 ? '' : 's'}`;
    throw new AppError(
      'BAD_REQUEST',
      `the segment must split the population into exactly 2 groups with data, found ${found}` +
        (rows.length > 2 ? '; name the two groups to compare' : ''),
    );
  }
  const order = segment.groups?.length
    ? segment.groups
    : 'condition' in segment
      ? ['true', 'false']
      : undefined;
  if (!order) return [rows[0], rows[1]];
  const sorted = [...rows].sort((a, b) => order.indexOf(a.g) - order.indexOf(b.g));
  return [sorted[0], sorted[1]];
}

export function num(value: unknown): number {
  if (value === null || value === undefined) return NaN;
  return typeof value === 'number' ? value : Number(value);
}
