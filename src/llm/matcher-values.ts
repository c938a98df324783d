import { castable, type CatalogType } from './pg-casts.ts';
import { shareOf, type PatternShare, type ValuePattern } from './value-patterns.ts';

/**
 * Types and values for the offline matcher: how well a source column's declared type can feed a
 * target type, and what its sampled values say for or against a field.
 */

/** What the value evidence reads of a source column. */
export interface ColumnValues {
  /** The source database's type name. */
  type: string;
  /**
   * The type of the values when it is not `type`: a domain's base type (introspection's base_type), by
   * which the column casts and is judged; absent, `type`.
   */
  baseType?: string;
  patterns?: PatternShare[];
  /** Sampled values, when the profile kept them: their absence of a pattern is evidence too. */
  samples?: string[];
  /** What the source's catalog says of a type the built-in cast table does not know (user types). */
  catalogType?: CatalogType | null;
}

/**
 * Whether the caller turns a column into the field's type by an expression of its own, where
 * PostgreSQL has no cast (discovery's cleaning: epoch numbers into a timestamptz, 0/1 integers into a
 * boolean). The generated SQL then casts that expression, not the column.
 */
export type Converts = (source: ColumnValues, targetType: string) => boolean;

type Family =
  | 'text'
  | 'integer'
  | 'numeric'
  | 'boolean'
  | 'date'
  | 'timestamp'
  | 'json'
  | 'uuid'
  | 'structured'
  | 'other';

const FAMILY_OF = new Map<string, Family>();

function typeFamily(type: string): Family {
  let family = FAMILY_OF.get(type);
  if (family === undefined) {
    family = familyOf(type);
    FAMILY_OF.set(type, family);
  }
  return family;
}

/**
 * A type whose values are structures of other values: arrays (`text[]`, `integer[]`; `ARRAY` in
 * information_schema), ranges and multiranges, geometric types, hstore, tsvector. PostgreSQL casts
 * them to text only (by their output function; not to jsonb, not to their element's type), and the
 * Python export reads them as that text, so the element's name at the start of `text[]` says nothing.
 */
export function isStructuredType(type: string): boolean {
  const t = type.toLowerCase().trim();
  return (
    /(\[\d*\]|\barray)$/.test(t) ||
    /range$/.test(t) ||
    /^(point|line|lseg|box|path|polygon|circle|hstore|tsvector|tsquery)$/.test(t)
  );
}

function familyOf(type: string): Family {
  const t = type.toLowerCase().trim();
  if (isStructuredType(t)) return 'structured';
  if (/^(timestamp|datetime)/.test(t)) return 'timestamp';
  if (t === 'date') return 'date';
  if (/^(bool)/.test(t)) return 'boolean';
  if (/^(smallint|integer|int|int2|int4|int8|bigint|serial|bigserial|smallserial)\b/.test(t))
    return 'integer';
  // numeric(8,0) is how legacy systems store whole numbers (keys, YYYYMMDD dates).
  if (/^(numeric|decimal)\s*\(\s*\d+\s*,\s*0\s*\)/.test(t)) return 'integer';
  if (/^(numeric|decimal|real|double|float|money)/.test(t)) return 'numeric';
  if (/^(uuid)/.test(t)) return 'uuid';
  if (/^(json|jsonb)/.test(t)) return 'json';
  if (/^(text|varchar|character|char|bpchar|citext|name|string|nvarchar|nchar)/.test(t)) return 'text';
  return 'other';
}

const TO_TEXT: Record<Family, number> = {
  text: 1,
  uuid: 0.9,
  integer: 0.8,
  numeric: 0.55,
  date: 0.5,
  timestamp: 0.5,
  boolean: 0.4,
  json: 0.3,
  structured: 0.3,
  other: 0.4,
};

/** The type a source column's values are of: a domain is judged as the type it is over. */
const valuesType = (source: ColumnValues) => source.baseType ?? source.type;

/** How well the families of two types go together, values considered; 0 only for a structure into a scalar. */
function familyScore(source: ColumnValues, targetType: string): number {
  const s = typeFamily(valuesType(source));
  const t = typeFamily(targetType);
  const p = (pattern: ValuePattern) => shareOf(source.patterns, pattern);
  if (s === t) return 1;
  if (s === 'structured' && t !== 'text') return 0;
  switch (t) {
    case 'text':
      return TO_TEXT[s];
    case 'integer':
      if (s === 'numeric') return 0.75;
      if (s === 'text') return p('integer') >= 0.9 ? 0.85 : 0.35;
      return 0.1;
    case 'numeric':
      if (s === 'integer') return 0.9;
      if (s === 'text') return Math.max(p('decimal'), p('integer'), p('currency')) >= 0.9 ? 0.8 : 0.35;
      return 0.1;
    case 'boolean':
      if (s === 'text' || s === 'integer') return p('boolean') >= 0.9 ? 0.9 : 0.3;
      return 0.1;
    case 'date':
      if (s === 'timestamp') return 0.85;
      if (s === 'text' || s === 'integer' || s === 'numeric')
        return p('date') >= 0.8 ? 0.9 : p('timestamp') >= 0.8 ? 0.8 : 0.25;
      return 0.1;
    case 'timestamp':
      if (s === 'date') return 0.8;
      if (s === 'text' || s === 'integer' || s === 'numeric')
        return p('timestamp') >= 0.8 ? 0.9 : p('date') >= 0.8 ? 0.8 : 0.25;
      return 0.1;
    case 'uuid':
      return s === 'text' && p('uuid') >= 0.9 ? 0.9 : 0.2;
    case 'json':
      return s === 'text' ? 0.5 : 0.1;
    default:
      return 0.5;
  }
}

/**
 * Whether a source column can feed a target type at all: PostgreSQL casts the column's type to the
 * field's (see pg-casts.ts; the generated SQL writes `CAST(column AS type)`), or the caller converts
 * it first (`converts`). The offline matcher never proposes any other pair, and the model's
 * proposals are held to the same rule. A type neither the built-in table nor the source's catalog
 * knows keeps the family rule: only a structure into a scalar is refused.
 */
export function canFeed(source: ColumnValues, targetType: string, converts?: Converts): boolean {
  const cast = castable(valuesType(source), targetType, source.catalogType);
  if (cast === null) return familyScore(source, targetType) > 0;
  return cast || (converts?.(source, targetType) ?? false);
}

/** How well a source column can feed a target type, values considered, in [0, 1]; 0 when it cannot at all. */
export function typeCompatibility(source: ColumnValues, targetType: string, converts?: Converts): number {
  if (!canFeed(source, targetType, converts)) return 0;
  // A cast the family rule did not foresee (an extension's hstore into jsonb) still ranks last.
  return Math.max(familyScore(source, targetType), 0.1);
}

export interface Expectation {
  patterns: ValuePattern[];
  /** How telling the pattern is: an e-mail column is unmistakable, a state code less so. */
  strength: number;
  /** Whether missing the pattern counts against a column. */
  required: boolean;
  /** The pattern is what the target's type already says (dates for a date field). */
  restatesType?: boolean;
}

export function expectationOf(concepts: readonly string[], targetType: string): Expectation | null {
  const has = (c: string) => concepts.includes(c);
  const family = typeFamily(targetType);
  if (family === 'boolean')
    return { patterns: ['boolean'], strength: 1.5, required: false, restatesType: true };
  if (family === 'date' || family === 'timestamp')
    return { patterns: ['date', 'timestamp'], strength: 1, required: false, restatesType: true };
  if (has('email')) return { patterns: ['email'], strength: 4, required: true };
  if (has('phone') || has('fax')) return { patterns: ['phone'], strength: 2.5, required: true };
  if (has('country')) return { patterns: ['country_code'], strength: 2, required: false };
  if (has('language')) return { patterns: ['language_code'], strength: 2, required: false };
  if (has('currency')) return { patterns: ['currency_code'], strength: 2, required: false };
  if (has('gender')) return { patterns: ['gender'], strength: 2, required: false };
  if (has('state')) return { patterns: ['state_code'], strength: 1, required: false };
  if (family === 'numeric' || family === 'integer')
    return { patterns: ['currency', 'decimal', 'integer'], strength: 1, required: false, restatesType: true };
  return null;
}

/** Patterns that say what a column is so clearly that a field expecting something else should not get it. */
const TELLING: ValuePattern[] = ['email', 'phone', 'url', 'timestamp', 'date'];

const filled = (samples: readonly string[] | undefined) =>
  (samples ?? []).filter((v) => v.trim() !== '').length;

/** Value evidence in [-1, 1] times its strength, as a log-odds term. */
export function patternTerm(
  source: ColumnValues,
  expectation: Expectation | null,
  targetType: string,
  converts?: Converts,
): { term: number; evidence: number; pattern: ValuePattern | null } {
  const patterns = source.patterns ?? [];
  const sourceFamily = typeFamily(valuesType(source));
  // No name or value evidence lifts a pair back that PostgreSQL would refuse to cast.
  if (!canFeed(source, targetType, converts))
    return { term: Number.NEGATIVE_INFINITY, evidence: -1, pattern: null };
  // Values that only restate the declared type ("an integer column holds integers") add nothing.
  if (expectation?.restatesType && sourceFamily !== 'text' && sourceFamily !== 'other') {
    const same = typeFamily(targetType) === sourceFamily;
    const dateLike = (f: string) => f === 'date' || f === 'timestamp';
    if (same || (dateLike(sourceFamily) && dateLike(typeFamily(targetType))))
      return { term: 0, evidence: 0, pattern: null };
  }
  if (expectation) {
    const [best, share] = expectation.patterns
      .map((p) => [p, shareOf(patterns, p)] as const)
      .reduce((a, b) => (b[1] > a[1] ? b : a));
    if (share > 0) return { term: share * expectation.strength, evidence: share, pattern: best };
    const other = patterns.find((p) => TELLING.includes(p.pattern) && p.share >= 0.6);
    // Values that are clearly something else overrule the name of a field that has a shape.
    if (other)
      return {
        term: -other.share * (expectation.required ? 4.5 : expectation.strength),
        evidence: -other.share,
        pattern: other.pattern,
      };
    if (expectation.required && patterns.length > 0) return { term: -1, evidence: -0.5, pattern: null };
    // Text that never reads as a date ("04/12", a birthday without its year) cannot feed a date.
    const dateLike = (f: string) => f === 'date' || f === 'timestamp';
    if (dateLike(typeFamily(targetType)) && sourceFamily === 'text' && filled(source.samples) >= 3)
      return { term: -2.5, evidence: -1, pattern: null };
    return { term: 0, evidence: 0, pattern: null };
  }
  const telling = patterns.find((p) => TELLING.includes(p.pattern) && p.share >= 0.6);
  if (telling) return { term: -2 * telling.share, evidence: -telling.share, pattern: telling.pattern };
  return { term: 0, evidence: 0, pattern: null };
}
