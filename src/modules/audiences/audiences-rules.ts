import { POSTGRES_TYPES, type PortableType } from '../../warehouse/types.ts';
import { AppError, type AppErrorIssue } from '../../app-error.ts';
import { quoteIdent } from '../../warehouse/postgres.ts';

/*
 * Audience rule trees → a parameterized WHERE clause. Every field is looked up in the target table
 * of schema.json and every operator checked against the column's portable type before any SQL is
 * written; values only ever travel as bind parameters ($1, $2, …), cast to the column's type.
 */

export const RULE_OPS = [
  '=',
  '!=',
  '<',
  '>',
  '<=',
  '>=',
  'between',
  'in',
  'not in',
  'contains',
  'starts with',
  'is null',
  'is not null',
  'within last days',
] as const;

interface RuleCondition {
  field: string;
  op: string;
  value?: unknown;
}
type RuleNode = RuleCondition | RuleGroup;
type RuleGroup = { all: RuleNode[] } | { any: RuleNode[] };

export interface SchemaColumn {
  name: string;
  type: string;
}

const MAX_DEPTH = 8;
const MAX_CONDITIONS = 500;
const MAX_LIST_VALUES = 1000;
const MAX_DAYS = 36_500;

const NULL_OPS = ['is null', 'is not null'];
const EQUALITY = ['=', '!=', 'in', 'not in'];
const ORDERING = ['<', '>', '<=', '>=', 'between'];

/** Which operators fit which portable type (schema.json types, DESIGN §5). */
const OPS_BY_TYPE: Record<string, string[]> = {
  text: [...EQUALITY, 'contains', 'starts with', ...NULL_OPS],
  integer: [...EQUALITY, ...ORDERING, ...NULL_OPS],
  bigint: [...EQUALITY, ...ORDERING, ...NULL_OPS],
  numeric: [...EQUALITY, ...ORDERING, ...NULL_OPS],
  boolean: ['=', '!=', ...NULL_OPS],
  date: [...EQUALITY, ...ORDERING, 'within last days', ...NULL_OPS],
  timestamp: [...EQUALITY, ...ORDERING, 'within last days', ...NULL_OPS],
  timestamptz: [...EQUALITY, ...ORDERING, 'within last days', ...NULL_OPS],
  uuid: [...EQUALITY, ...NULL_OPS],
  json: [...NULL_OPS],
};

/** Spellings people use for the same operator. */
function normalizeOp(op: string): string {
  const o = op.trim().toLowerCase().replaceAll('_', ' ').replace(/\s+/g, ' ');
  if (o === '<>' || o === 'not equals' || o === 'neq') return '!=';
  if (o === '==' || o === 'equals' || o === 'eq') return '=';
  if (o === 'not_in' || o === 'nin') return 'not in';
  if (o === 'startswith' || o === 'starts') return 'starts with';
  if (/^within( the)? last( n)? days$/.test(o) || o === 'in last days') return 'within last days';
  return o;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
/**
 * A day that exists, from year 1 (PostgreSQL has no year 0): `Date.parse` alone rolls 2024-02-30
 * over to March 1st and takes 0000-01-01, so such rules were saved and then failed to materialize.
 */
export function isCalendarDate(text: string): boolean {
  if (!/^\d{4}-\d{2}-\d{2}$/.test(text) || text.startsWith('0000')) return false;
  const day = new Date(`${text}T00:00:00Z`);
  return !Number.isNaN(day.getTime()) && day.toISOString().startsWith(text);
}

/** Checks one value against a portable type; returns what to bind, or an error text. */
function checkValue(type: string, value: unknown): { ok: true; bind: unknown } | { ok: false; why: string } {
  switch (type) {
    case 'text':
      return typeof value === 'string' ? { ok: true, bind: value } : { ok: false, why: 'a string' };
    case 'integer':
      return Number.isSafeInteger(value) && Math.abs(value as number) <= 2_147_483_647
        ? { ok: true, bind: value }
        : { ok: false, why: 'an integer' };
    case 'bigint':
      if (Number.isSafeInteger(value)) return { ok: true, bind: String(value) };
      return typeof value === 'string' && /^-?\d{1,19}$/.test(value)
        ? { ok: true, bind: value }
        : { ok: false, why: 'an integer' };
    case 'numeric':
      if (typeof value === 'number' && Number.isFinite(value)) return { ok: true, bind: String(value) };
      return typeof value === 'string' && /^-?\d+(\.\d+)?$/.test(value)
        ? { ok: true, bind: value }
        : { ok: false, why: 'a number' };
    case 'boolean':
      return typeof value === 'boolean' ? { ok: true, bind: value } : { ok: false, why: 'true or false' };
    case 'date':
      return typeof value === 'string' && isCalendarDate(value)
        ? { ok: true, bind: value }
        : { ok: false, why: 'a date YYYY-MM-DD' };
    case 'timestamp':
    case 'timestamptz':
      return typeof value === 'string' &&
        isCalendarDate(value.slice(0, 10)) &&
        !Number.isNaN(Date.parse(value))
        ? { ok: true, bind: value }
        : { ok: false, why: 'an ISO-8601 date-time' };
    case 'uuid':
      return typeof value === 'string' && UUID.test(value)
        ? { ok: true, bind: value }
        : { ok: false, why: 'a uuid' };
    default:
      return { ok: false, why: `a value of type ${type}` };
  }
}

export interface CompiledRules {
  /** A boolean SQL expression with $1… placeholders, starting at `firstParam`. */
  where: string;
  params: unknown[];
}

const isGroup = (node: unknown): node is Record<string, unknown> =>
  !!node && typeof node === 'object' && !Array.isArray(node) && ('all' in node || 'any' in node);

/**
 * Compiles a rule tree over `columns` (the target table's schema.json columns). Every problem found
 * is reported at once: 400 whose message names the first field or operator at fault.
 */
export function compileRules(
  tree: unknown,
  columns: SchemaColumn[],
  options: { table: string; path?: (string | number)[]; firstParam?: number } = { table: '?' },
): CompiledRules {
  const issues: AppErrorIssue[] = [];
  const params: unknown[] = [];
  const first = options.firstParam ?? 1;
  const base = options.path ?? ['definition', 'rules'];
  const byName = new Map(columns.map((c) => [c.name, c]));
  const byLower = new Map(columns.map((c) => [c.name.toLowerCase(), c]));
  let conditions = 0;
  const bind = (value: unknown, cast?: string) => {
    params.push(value);
    return `$${first + params.length - 1}${cast ? `::${cast}` : ''}`;
  };

  function condition(node: Record<string, unknown>, path: (string | number)[]): string {
    conditions++;
    const { field, op: rawOp, value } = node;
    if (typeof field !== 'string' || !field) {
      issues.push({ path: [...path, 'field'], message: 'field is required (a column of the target table)' });
      return 'false';
    }
    const column = byName.get(field) ?? byLower.get(field.toLowerCase());
    if (!column) {
      issues.push({ path: [...path, 'field'], message: `Unknown field ${field} in table ${options.table}` });
      return 'false';
    }
    if (typeof rawOp !== 'string') {
      issues.push({
        path: [...path, 'op'],
        message: `op is required for field ${field} (one of ${RULE_OPS.join(', ')})`,
      });
      return 'false';
    }
    const op = normalizeOp(rawOp);
    const type = column.type.toLowerCase();
    if (!(RULE_OPS as readonly string[]).includes(op)) {
      issues.push({
        path: [...path, 'op'],
        message: `Unknown operator ${rawOp} for field ${field} (use one of ${RULE_OPS.join(', ')})`,
      });
      return 'false';
    }
    if (!(OPS_BY_TYPE[type] ?? NULL_OPS).includes(op)) {
      issues.push({
        path: [...path, 'op'],
        message: `Operator ${op} does not fit field ${field} of type ${type} (allowed: ${(OPS_BY_TYPE[type] ?? NULL_OPS).join(', ')})`,
      });
      return 'false';
    }
    const col = quoteIdent(column.name);
    const cast = POSTGRES_TYPES[type as PortableType];
    const bad = (why: string) => {
      issues.push({ path: [...path, 'value'], message: `Value of ${field} (${op}) must be ${why}` });
      return 'false';
    };
    const one = (v: unknown) => {
      const checked = checkValue(type, v);
      return checked.ok ? bind(checked.bind, cast) : bad(checked.why);
    };
    switch (op) {
      case 'is null':
        return `${col} is null`;
      case 'is not null':
        return `${col} is not null`;
      case '=':
      case '<':
      case '>':
      case '<=':
      case '>=':
        return `${col} ${op} ${one(value)}`;
      case '!=':
        // "!=" keeps rows whose value is missing: they are not equal to the value either.
        return `${col} is distinct from ${one(value)}`;
      case 'between': {
        if (!Array.isArray(value) || value.length !== 2) return bad('a list [low, high]');
        return `${col} between ${one(value[0])} and ${one(value[1])}`;
      }
      case 'in':
      case 'not in': {
        if (!Array.isArray(value) || value.length === 0 || value.length > MAX_LIST_VALUES)
          return bad(`a non-empty list of at most ${MAX_LIST_VALUES} values`);
        const values: unknown[] = [];
        for (const v of value) {
          const checked = checkValue(type, v);
          if (!checked.ok) return bad(`a list of ${checked.why} values`);
          values.push(checked.bind);
        }
        const list = bind(values, `${cast}[]`);
        return op === 'in' ? `${col} = any(${list})` : `(${col} is null or ${col} <> all(${list}))`;
      }
      case 'contains':
      case 'starts with': {
        if (typeof value !== 'string' || !value) return bad('a non-empty string');
        // Case-insensitive, and no LIKE pattern: % and _ in the value are plain characters.
        const needle = bind(value, 'text');
        return op === 'contains'
          ? `strpos(lower(${col}), lower(${needle})) > 0`
          : `starts_with(lower(${col}), lower(${needle}))`;
      }
      case 'within last days': {
        if (!Number.isInteger(value) || (value as number) < 0 || (value as number) > MAX_DAYS)
          return bad(`a whole number of days between 0 and ${MAX_DAYS}`);
        const days = bind(value, 'integer');
        if (type === 'date') return `${col} between current_date - ${days} and current_date`;
        const now = type === 'timestamp' ? 'localtimestamp' : 'now()';
        return `${col} between ${now} - make_interval(days => ${days}) and ${now}`;
      }
    }
    return bad('valid');
  }

  function group(node: unknown, path: (string | number)[], depth: number): string {
    if (!isGroup(node)) {
      issues.push({ path, message: 'a group must be { "all": [...] } or { "any": [...] }' });
      return 'false';
    }
    const keys = Object.keys(node).filter((k) => k === 'all' || k === 'any');
    if (keys.length !== 1) {
      issues.push({ path, message: 'a group has exactly one of "all" or "any"' });
      return 'false';
    }
    if (depth > MAX_DEPTH) {
      issues.push({ path, message: `rules nest at most ${MAX_DEPTH} groups deep` });
      return 'false';
    }
    const kind = keys[0] as 'all' | 'any';
    const children = node[kind];
    if (!Array.isArray(children)) {
      issues.push({ path: [...path, kind], message: `"${kind}" must be a list of conditions or groups` });
      return 'false';
    }
    if (children.length === 0) return kind === 'all' ? 'true' : 'false';
    const parts = children.map((child, i) => {
      const at = [...path, kind, i];
      if (isGroup(child)) return group(child, at, depth + 1);
      if (!child || typeof child !== 'object' || Array.isArray(child)) {
        issues.push({ path: at, message: 'a condition is { "field", "op", "value" }' });
        return 'false';
      }
      return condition(child as Record<string, unknown>, at);
    });
    return `(${parts.join(kind === 'all' ? ' and ' : ' or ')})`;
  }

  const where = group(tree, base, 1);
  if (conditions > MAX_CONDITIONS)
    issues.push({ path: base, message: `at most ${MAX_CONDITIONS} conditions (got ${conditions})` });
  if (issues.length)
    throw new AppError(
      'BAD_REQUEST',
      issues.length === 1
        ? issues[0].message
        : `${issues[0].message} (and ${issues.length - 1} more problems)`,
      { issues },
    );
  return { where, params };
}
