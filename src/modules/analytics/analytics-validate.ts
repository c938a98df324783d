import { AppError } from '../../app-error.ts';
import { assertExpression } from '../../stats/sql.ts';
import type { ConnectionConfig } from '../../warehouse/config.ts';
import { qualified, quoteIdent } from '../../warehouse/postgres.ts';
import { parseSqlExpression } from '../../warehouse/sql-guard.ts';
import type { IntrospectedTable, Warehouse } from '../../warehouse/warehouse.ts';
import type { StoredSegment } from './analytics.entity.ts';
import type { HypothesisShape } from './analytics-spec.ts';

/*
 * Everything a hypothesis reads is checked against the real target table before it is stored or
 * proposed: each column reference must exist, each expression must be one row-level expression (the
 * engine's rule), and a LIMIT 0 query must plan, which also tells the metric's type.
 */

const NUMERIC_TYPE = /^(smallint|integer|bigint|numeric|decimal|real|double precision)\b/;
/** Types whose few distinct values can split a population; floats and free text rarely do. */
const SEGMENT_TYPE = /^(text|character varying|character|boolean|smallint|integer|bigint|date)\b/;

export const isNumericType = (type: string) => NUMERIC_TYPE.test(type);

/**
 * The tables with each column's type replaced by its base type (introspection's base_type), so that
 * every check of a column's type here (numeric, a segment type, boolean) judges a domain as the type
 * it holds; its own name is nothing a list of type names can know.
 */
export function withBaseTypes(tables: IntrospectedTable[]): IntrospectedTable[] {
  return tables.map((table) => ({
    ...table,
    columns: table.columns.map((c) => (c.type === c.base_type ? c : { ...c, type: c.base_type })),
  }));
}

/** `schema.table`, or a bare name looked up in the target schemas in order; only the configured schemas count. */
export async function resolveTargetTable(
  warehouse: Warehouse,
  config: ConnectionConfig,
  name: string,
): Promise<IntrospectedTable> {
  const dot = name.indexOf('.');
  const schemaName = dot > 0 ? name.slice(0, dot) : null;
  const tableName = dot > 0 ? name.slice(dot + 1) : name;
  const notThere = () =>
    new AppError(
      'BAD_REQUEST',
      `table ${name} does not exist in the target warehouse (schemas ${config.schemas.join(', ')})`,
    );
  if (schemaName && !config.schemas.includes(schemaName)) throw notThere();
  const schema = await warehouse.introspect({ tables: [schemaName ? name : tableName] });
  const found = schemaName
    ? schema.tables.find((t) => t.schema === schemaName && t.name === tableName)
    : config.schemas
        .map((s) => schema.tables.find((t) => t.schema === s && t.name === tableName))
        .find(Boolean);
  if (!found) throw notThere();
  return withBaseTypes([found])[0];
}

/** The columns an expression reads, each of which must be a column of `table`. */
async function columnsOf(expression: string, table: IntrospectedTable, what: string): Promise<string[]> {
  await assertExpression(expression, what);
  const { columns } = await parseSqlExpression(expression);
  const known = new Set(table.columns.map((c) => c.name));
  for (const ref of columns) {
    const qualifier = ref.table;
    if (qualifier && qualifier !== table.name && qualifier !== `${table.schema}.${table.name}`)
      throw new AppError(
        'BAD_REQUEST',
        `${what} reads ${ref.ref}, which is not a column of ${table.schema}.${table.name}`,
      );
    if (!known.has(ref.column))
      throw new AppError(
        'BAD_REQUEST',
        `${what} reads ${ref.ref}, which is not a column of ${table.schema}.${table.name}`,
      );
  }
  return columns.map((c) => c.column);
}

function columnOf(table: IntrospectedTable, name: string, what: string) {
  const column = table.columns.find((c) => c.name === name);
  if (!column)
    throw new AppError('BAD_REQUEST', `${what} ${name} is not a column of ${table.schema}.${table.name}`);
  return column;
}

export interface ValidationInput {
  metric: { expression: string; kind?: 'numeric' | 'boolean' };
  segment: StoredSegment;
  filter?: string | null;
  test: HypothesisShape['test'];
  miningColumns?: string[];
}

export interface ValidatedHypothesis {
  metricKind: 'numeric' | 'boolean';
  /** Every real column the hypothesis reads. */
  columns: string[];
}

const TWO_GROUP_TESTS: readonly string[] = ['welch_t', 'mann_whitney_u', 'two_proportion_z'];

/** What the engine would refuse at every run, or silently not read, refused before anything is stored. */
function checkGroups(groups: string[] | undefined, test: HypothesisShape['test']) {
  if (!groups?.length) return;
  const repeated = groups.find((g, i) => groups.indexOf(g) !== i);
  if (repeated !== undefined)
    throw new AppError('BAD_REQUEST', `segment groups repeat: ${JSON.stringify(repeated)} is given twice`);
  if (TWO_GROUP_TESTS.includes(test) && groups.length !== 2)
    throw new AppError(
      'BAD_REQUEST',
      `${test} compares exactly 2 segment groups; ${groups.length} are given (chi_square compares more)`,
    );
  // A correlation reads the segment column as its second variable over every row.
  if (test === 'pearson' || test === 'spearman')
    throw new AppError(
      'BAD_REQUEST',
      `${test} correlates the metric with the segment over all rows and takes no segment groups: leave groups out, or restrict the rows with filter`,
    );
}

export async function validateHypothesis(
  warehouse: Warehouse,
  table: IntrospectedTable,
  input: ValidationInput,
): Promise<ValidatedHypothesis> {
  checkGroups(input.segment.groups, input.test);
  const read = new Set(await columnsOf(input.metric.expression, table, 'metric'));
  if (input.filter) for (const c of await columnsOf(input.filter, table, 'filter')) read.add(c);
  let segmentType: string | null = null;
  if (input.segment.column) {
    segmentType = columnOf(table, input.segment.column, 'segment column').type;
    read.add(input.segment.column);
  } else if (input.segment.condition) {
    for (const c of await columnsOf(input.segment.condition, table, 'segment condition')) read.add(c);
    segmentType = 'boolean';
  } else throw new AppError('BAD_REQUEST', 'the segment needs a column or a condition');
  for (const c of input.miningColumns ?? []) columnOf(table, c, 'mining column');

  const segmentSql = input.segment.column
    ? quoteIdent(input.segment.column)
    : `(${input.segment.condition}\n)::boolean`;
  const probe = await warehouse.readOnlyQuery(
    `SELECT (${input.metric.expression}\n) AS m, ${segmentSql} AS g FROM ${qualified(table)}` +
      (input.filter ? ` WHERE (${input.filter}\n)::boolean` : '') +
      ' LIMIT 0',
    { limit: 1 },
  );
  // A domain's base type already: PostgreSQL describes a result column of a domain type by its base
  // type and modifier (the row description a query's columns come with).
  const metricType = probe.columns[0]?.type ?? 'unknown';
  if (input.metric.kind === 'boolean' && metricType !== 'boolean')
    // The tests read such a metric as `(expression)::boolean`: a type without that cast (a float, a
    // date) was stored and failed every run.
    await warehouse
      .readOnlyQuery(`SELECT (${input.metric.expression}\n)::boolean AS m FROM ${qualified(table)} LIMIT 0`, {
        limit: 1,
      })
      .catch((error: unknown) => {
        if (error instanceof AppError && error.code === 'BAD_REQUEST')
          throw new AppError(
            'BAD_REQUEST',
            `metric kind boolean reads the metric as true or false, which a ${metricType} cannot be: give kind numeric or a boolean expression (e.g. "${input.metric.expression} > 0")`,
          );
        throw error;
      });
  const metricKind: 'numeric' | 'boolean' =
    metricType === 'boolean' ? 'boolean' : (input.metric.kind ?? 'numeric');

  const numericOrBoolean = (type: string) => isNumericType(type) || type === 'boolean';
  switch (input.test) {
    case 'two_proportion_z':
      if (metricKind !== 'boolean')
        throw new AppError(
          'BAD_REQUEST',
          `two_proportion_z needs a boolean metric; the metric is ${metricType}`,
        );
      break;
    case 'chi_square':
      break;
    case 'pearson':
    case 'spearman':
      if (!segmentType || !numericOrBoolean(segmentType))
        throw new AppError(
          'BAD_REQUEST',
          `${input.test} correlates the metric with the segment: the segment column must be numeric (it is ${segmentType})`,
        );
    // falls through: the metric must be a number too
    default:
      if (metricKind === 'numeric' && !isNumericType(metricType))
        throw new AppError(
          'BAD_REQUEST',
          `${input.test} needs a numeric or boolean metric; the metric is ${metricType}`,
        );
  }
  return { metricKind, columns: [...read] };
}

export interface ColumnProfile {
  name: string;
  type: string;
  distinct: number;
}

export const PROFILE_SAMPLE_ROWS = 10_000;
/**
 * The most distinct values a mining column may hold (in the sample): each value is a segment, and at
 * depth 2 each pair of values of two columns; past a few dozen the segments are too many to read and
 * too small to mean anything, and the GROUPING SETS query grows with them.
 */
const MAX_SEGMENT_VALUES = 20;

/** Columns that can split a population: the segment-friendly types, minus keys and identifiers. */
export function segmentCandidates(table: IntrospectedTable): { name: string; type: string }[] {
  const keys = new Set([...table.primary_key, ...table.foreign_keys.flatMap((fk) => fk.columns)]);
  return table.columns.filter(
    (c) => SEGMENT_TYPE.test(c.type) && !keys.has(c.name) && !/(^id$|_id$|^uuid$|email|phone)/i.test(c.name),
  );
}

/**
 * Distinct counts of the columns over a bounded sample (the first rows the scan meets): a cheap
 * screen, not an exact census. At most 40 columns are counted.
 */
async function distinctCounts(
  warehouse: Warehouse,
  table: IntrospectedTable,
  columns: { name: string; type: string }[],
): Promise<ColumnProfile[]> {
  const list = columns.slice(0, 40);
  if (!list.length) return [];
  // Generated from quoted identifiers only: no user text, so no SQL guard parse of a wide statement.
  const [row = {}] = await warehouse.aggregate(
    `SELECT count(*)::float8 AS n, ${list.map((c, i) => `count(DISTINCT ${quoteIdent(c.name)})::float8 AS d${i}`).join(', ')} ` +
      `FROM (SELECT ${list.map((c) => quoteIdent(c.name)).join(', ')} FROM ${qualified(table)} LIMIT ${PROFILE_SAMPLE_ROWS}) s`,
  );
  return list.map((c, i) => ({ name: c.name, type: c.type, distinct: Number(row[`d${i}`] ?? 0) }));
}

/** The candidate columns with 2 … MAX_SEGMENT_VALUES distinct values in the sample (distinctCounts). */
export async function lowCardinalityColumns(
  warehouse: Warehouse,
  table: IntrospectedTable,
  candidates: { name: string; type: string }[],
): Promise<ColumnProfile[]> {
  return (await distinctCounts(warehouse, table, candidates)).filter(
    (c) => c.distinct >= 2 && c.distinct <= MAX_SEGMENT_VALUES,
  );
}

/**
 * A hypothesis' mining columns: the ones given, each refused (400, naming it and its count) when it
 * holds more distinct values than a default candidate may; without any, the defaults: the segment
 * column first, then the table's low-cardinality columns the hypothesis does not read, at most 12.
 * The segment column too is left out of the defaults past that bound (a correlation's numeric column,
 * a column of many values of which two groups are compared).
 */
export async function miningColumnsOf(
  warehouse: Warehouse,
  table: IntrospectedTable,
  input: { given?: string[]; segmentColumn?: string; read: string[] },
): Promise<string[]> {
  if (input.given) {
    const counted = await distinctCounts(
      warehouse,
      table,
      input.given.map((name) => columnOf(table, name, 'mining column')),
    );
    const tooMany = counted.filter((c) => c.distinct > MAX_SEGMENT_VALUES);
    if (tooMany.length)
      throw new AppError(
        'BAD_REQUEST',
        `a mining column may hold at most ${MAX_SEGMENT_VALUES} distinct values (each is a segment); ` +
          tooMany.map((c) => `${c.name} has ${c.distinct}`).join(', ') +
          ` in the first ${PROFILE_SAMPLE_ROWS.toLocaleString('en-US')} rows of ${table.schema}.${table.name}`,
        {
          reason: 'MINING_COLUMN_CARDINALITY',
          issues: tooMany.map((c) => ({
            path: ['mining_columns', input.given!.indexOf(c.name)],
            message: `${c.name} has ${c.distinct} distinct values`,
          })),
        },
      );
    return input.given;
  }
  const segment = input.segmentColumn ? columnOf(table, input.segmentColumn, 'segment column') : undefined;
  const candidates = segmentCandidates(table).filter(
    (c) => !input.read.includes(c.name) && c.name !== segment?.name,
  );
  const counted = await distinctCounts(warehouse, table, [...(segment ? [segment] : []), ...candidates]);
  // The segment column is kept with fewer than 2 values in the sample (it splits the population by
  // definition, or the table is still empty); the others are only candidates.
  return counted
    .filter((c) => c.distinct <= MAX_SEGMENT_VALUES && (c.name === segment?.name || c.distinct >= 2))
    .map((c) => c.name)
    .slice(0, 12);
}
