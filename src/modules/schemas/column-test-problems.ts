import { AppError } from '../../app-error.ts';
import { columnTestConfigSchema } from '../../quality/rules.ts';
import { portableFamily } from '../../warehouse/types.ts';
import type { TargetColumn, TargetSchema } from './schemas.schemas.ts';

/*
 * Whether a column test applies to its column: the one rule of every place a target schema's column
 * tests are written (PUT …/test for one column; every schema.json stored through replaceTargetSchema;
 * the library templates as they load), and what GET …/test tells of a test stored before the rule.
 */

type ColumnTest = ReturnType<typeof columnTestConfigSchema.parse>;

/** A column as far as validation needs it: its name and portable type family. */
export interface ColumnInfo {
  name: string;
  family: string;
}

const NUMERIC = new Set(['integer', 'bigint', 'numeric']);
export const TEMPORAL = new Set(['date', 'timestamp', 'timestamptz']);

export interface Problem {
  path: (string | number)[];
  message: string;
}

const ISO_DATE = /^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}(:?\d{2})?)?$/i;
const DECIMAL = /^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$/;
const INTEGER = /^[+-]?\d+$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const INTEGER_LIMITS: Record<string, [bigint, bigint]> = {
  integer: [-(2n ** 31n), 2n ** 31n - 1n],
  bigint: [-(2n ** 63n), 2n ** 63n - 1n],
};

/** Why a value (an accepted value, a range bound) cannot be one of the family's, or null. */
function unlikeFamily(value: string | number | boolean, family: string): string | null {
  const shown = JSON.stringify(value);
  const text = String(value).trim();
  if (NUMERIC.has(family)) {
    if (typeof value === 'boolean' || !DECIMAL.test(text) || !Number.isFinite(Number(text)))
      return `${shown} is not a number`;
    const limits = INTEGER_LIMITS[family];
    if (!limits) return null;
    if (!INTEGER.test(text)) return `${shown} is not a whole number`;
    const n = BigInt(text);
    return n < limits[0] || n > limits[1] ? `${shown} is out of the range of ${family}` : null;
  }
  if (TEMPORAL.has(family))
    return typeof value === 'string' && ISO_DATE.test(text) && !Number.isNaN(Date.parse(text))
      ? null
      : `${shown} is not an ISO date or timestamp`;
  if (family === 'boolean')
    return typeof value === 'boolean' || /^(true|false)$/i.test(text)
      ? null
      : `${shown} is not true or false`;
  if (family === 'uuid')
    return typeof value === 'string' && UUID.test(text) ? null : `${shown} is not a UUID`;
  if (family === 'text')
    // dbt writes a boolean of the list as 'True', dimas as 'true': they would not agree.
    return typeof value === 'boolean'
      ? `${shown} is a boolean: give it as the text "${shown}" (dbt would compare 'True' or 'False')`
      : null;
  return `a ${family} column is not compared with a list of values`;
}

/**
 * Why a range's bounds cannot bound the column: one rule for column tests (run in SQL) and column
 * monitoring (compared with the measured min and max), by the column's portable type family. Numbers
 * bound numbers; ISO dates or timestamps bound dates and times (a number is none: JavaScript would
 * read 0 as the year 2000, PostgreSQL refuses it); text is bounded by text, since it compares
 * character by character ('10' < '9'); other types have no order.
 */
export function rangeProblems(
  range: { min?: number | string; max?: number | string } | undefined,
  table: string,
  col: ColumnInfo,
): Problem[] {
  if (!range) return [];
  const { min, max } = range;
  if (min === undefined && max === undefined)
    return [{ path: ['range'], message: 'A range needs min, max or both' }];
  const problems: Problem[] = [];
  const notApplicable = (path: (string | number)[], why: string) =>
    problems.push({
      path,
      message: `range does not apply to column ${table}.${col.name} of type ${col.family}: ${why}`,
    });
  if (NUMERIC.has(col.family) || TEMPORAL.has(col.family)) {
    for (const [key, bound] of [
      ['min', min],
      ['max', max],
    ] as const) {
      const why = bound === undefined ? null : unlikeFamily(bound, col.family);
      if (why) notApplicable(['range', key], `${key} ${why}`);
    }
    const order = (b: string | number) => (NUMERIC.has(col.family) ? Number(b) : Date.parse(String(b)));
    if (problems.length === 0 && min !== undefined && max !== undefined && order(min) > order(max))
      problems.push({ path: ['range'], message: 'range: min is greater than max' });
  } else if (col.family === 'text') {
    const numeric = [min, max].find(
      (b) => b !== undefined && (typeof b === 'number' || DECIMAL.test(b.trim())),
    );
    if (numeric !== undefined)
      notApplicable(
        ['range'],
        `${JSON.stringify(numeric)} is a number, and text compares character by character ('10' < '9')`,
      );
  } else notApplicable(['range'], `a ${col.family} column has no order to bound`);
  return problems;
}

/** Values compare only within these groups (PostgreSQL has no integer = text, text = uuid…). */
const comparable = (family: string) =>
  NUMERIC.has(family) ? 'number' : TEMPORAL.has(family) ? 'time' : family;

/**
 * Why each test of a config cannot run on the column, or runs but means nothing there (a number
 * range compared as text), judged by the column's portable type family in the target schema.
 */
export function columnTestProblems(schema: TargetSchema, table: string, col: ColumnInfo, config: ColumnTest) {
  const problems: Problem[] = [];
  const where = `column ${table}.${col.name} of type ${col.family}`;
  const notApplicable = (path: (string | number)[], test: string, why: string) =>
    problems.push({ path, message: `${test} does not apply to ${where}: ${why}` });

  if (config.accepted_values) {
    if (col.family === 'json')
      notApplicable(['accepted_values'], 'accepted_values', 'JSON documents are not compared with a list');
    else {
      // The first value that does not fit is enough to tell why.
      const i = config.accepted_values.findIndex((value) => unlikeFamily(value, col.family));
      if (i >= 0)
        notApplicable(
          ['accepted_values', i],
          'accepted_values',
          unlikeFamily(config.accepted_values[i], col.family)!,
        );
    }
  }
  if (config.relationships) {
    const { to, field } = config.relationships;
    // The project renders it as ref(to): it must name a table of the target schema.
    const referenced = schema.tables.find((t) => t.name === to);
    const target = referenced?.columns.find((c) => c.name === field);
    if (!referenced)
      problems.push({
        path: ['relationships', 'to'],
        message: `relationships.to: ${to} is not a table of the target schema`,
      });
    else if (!target)
      problems.push({
        path: ['relationships', 'field'],
        message: `relationships.field: ${to} has no column ${field}`,
      });
    else {
      const family = portableFamily(target.type);
      if (comparable(family) !== comparable(col.family))
        notApplicable(
          ['relationships', 'field'],
          'relationships',
          `${to}.${field} is ${family}, and ${col.family} values cannot be compared with ${family} ones`,
        );
    }
  }
  problems.push(...rangeProblems(config.range, table, col));
  if (config.regex !== undefined) {
    if (col.family !== 'text') notApplicable(['regex'], 'regex', 'a regular expression matches text');
    try {
      new RegExp(config.regex);
    } catch (error) {
      problems.push({ path: ['regex'], message: `regex does not compile: ${(error as Error).message}` });
    }
  }
  return problems;
}

/** Every problem at once, each at its place in the request. */
export function refuseProblems(problems: Problem[], at: (string | number)[] = ['config']) {
  if (problems.length)
    throw new AppError('BAD_REQUEST', problems.map((p) => p.message).join('; '), {
      issues: problems.map((p) => ({ path: [...at, ...p.path], message: p.message })),
    });
}

type SchemaTable = TargetSchema['tables'][number];

/** The problems of a column's stored tests; none when they do not parse (they run nowhere). */
export function storedTestProblems(schema: TargetSchema, table: SchemaTable, col: TargetColumn): Problem[] {
  const parsed = col.tests === undefined ? null : columnTestConfigSchema.safeParse(col.tests);
  return parsed?.success
    ? columnTestProblems(
        schema,
        table.name,
        { name: col.name, family: portableFamily(col.type) },
        parsed.data,
      )
    : [];
}

/**
 * What PUT …/test would refuse in the column tests of a schema.json about to replace `previous`
 * (paths within the document), so that every write of a target schema (replaceTargetSchema) follows
 * the same rule, wherever the schema comes from. A problem the stored document already had at the
 * same column (a test saved before tests were checked) is not counted: such a document still saves
 * (GET, edit elsewhere, POST back), its test runs as before and GET …/test tells the problem.
 */
export function newTestProblems(next: TargetSchema, previous: TargetSchema | null): Problem[] {
  const problems: Problem[] = [];
  next.tables.forEach((table, t) =>
    table.columns.forEach((col, c) => {
      const now = storedTestProblems(next, table, col);
      if (now.length === 0) return;
      const table0 = previous?.tables.find((x) => x.name === table.name);
      const col0 = table0?.columns.find((x) => x.name === col.name);
      const known = new Set(
        table0 && col0 ? storedTestProblems(previous!, table0, col0).map((p) => p.message) : [],
      );
      for (const p of now)
        if (!known.has(p.message))
          problems.push({ path: ['tables', t, 'columns', c, 'tests', ...p.path], message: p.message });
    }),
  );
  return problems;
}
