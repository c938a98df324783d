import { shareOf, type PatternShare, type ValuePattern } from './value-patterns.ts';
import { PHRASES, QUALIFIERS, RELATED, STOP_WORDS, TOKEN_WEIGHTS, WORD_VARIANTS } from './vocabulary.ts';

/**
 * The offline matcher: deterministic, no network. Each (target field, source column) pair gets
 * three pieces of evidence — name similarity over canonical concepts, type compatibility, and
 * value patterns — combined in log-odds into a confidence in [0, 1]. Suggestions are then assigned
 * greedily, best pair first, so that one source column feeds at most one target field.
 */

export interface TargetField {
  name: string;
  type: string;
  /** Read for synonyms the name lacks ("Identifier ... in a CRM or loyalty program"). */
  description?: string;
}

export interface TargetTable {
  name: string;
  primary_key?: string[];
  columns: TargetField[];
}

export interface SourceColumn {
  name: string;
  /** The source database's type name. */
  type: string;
  patterns?: PatternShare[];
  nullRate?: number;
  distinctRatio?: number;
  /** A few sampled values (for the LLM prompt; the offline matcher reads only their patterns). */
  samples?: string[];
  isPrimaryKey?: boolean;
  /** Set when the column is a foreign key to another table of the source. */
  references?: { table: string; column: string } | null;
}

export interface SourceTable {
  name: string;
  columns: SourceColumn[];
}

export interface Evidence {
  name: number;
  type: number;
  pattern: number;
}

export interface Candidate {
  /** `table.column` of the source. */
  source_field: string;
  confidence: number;
  evidence: Evidence;
}

export interface Ambiguity {
  target_field: string;
  candidates: Candidate[];
  reason: string;
}

export interface FieldMatch {
  target_field: string;
  /** Best first, at most `maxCandidates`. */
  candidates: Candidate[];
  suggestion: Candidate | null;
  ambiguity: Ambiguity | null;
}

export interface TableMatch {
  target_table: string;
  /** The source table most of the suggestions come from. */
  primary_table: string | null;
  fields: FieldMatch[];
  ambiguities: Ambiguity[];
}

export interface MatchOptions {
  /** Least confidence for a suggestion. */
  threshold?: number;
  /** Two candidates closer than this are an ambiguity. */
  ambiguityMargin?: number;
  maxCandidates?: number;
}

// ---------------------------------------------------------------- names → concepts

const PHRASE_OF = new Map<string, string>();
const CONCEPTS = new Set(Object.keys(PHRASES));
const ENTITIES = new Set(['customer', 'account']);
const ADDRESS_PARTS = new Set(['city', 'state', 'postal_code', 'country', 'address_line_2']);
const KNOWN_WORDS = new Set<string>([...STOP_WORDS, ...QUALIFIERS, ...Object.keys(WORD_VARIANTS)]);
/** Words an abbreviation may stand for: canonical words, not other abbreviations or brand names. */
const FULL_WORDS = new Set<string>();
let longestPhrase = 1;

function splitWords(name: string): string[] {
  return name
    .replace(/#/g, ' number ')
    .replace(/([a-z])([A-Z])/g, '$1 $2')
    .replace(/([A-Z]+)([A-Z][a-z])/g, '$1 $2')
    .replace(/([a-zA-Z])(\d)/g, '$1 $2')
    .replace(/(\d)([a-zA-Z])/g, '$1 $2')
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter(Boolean);
}

for (const value of Object.values(WORD_VARIANTS)) for (const w of value.split(' ')) FULL_WORDS.add(w);
for (const phrases of Object.values(PHRASES))
  for (const phrase of phrases) for (const w of phrase.split(' ')) FULL_WORDS.add(w);
for (const w of FULL_WORDS) KNOWN_WORDS.add(w);

const isKnown = (w: string) =>
  KNOWN_WORDS.has(w) ||
  (w.length > 3 && w.endsWith('s') && KNOWN_WORDS.has(w.slice(0, -1))) ||
  (w.length > 4 && w.endsWith('ies') && KNOWN_WORDS.has(`${w.slice(0, -3)}y`));

function singular(w: string): string {
  if (KNOWN_WORDS.has(w)) return w;
  if (w.length > 4 && w.endsWith('ies') && KNOWN_WORDS.has(`${w.slice(0, -3)}y`)) return `${w.slice(0, -3)}y`;
  if (w.length > 3 && w.endsWith('s') && KNOWN_WORDS.has(w.slice(0, -1))) return w.slice(0, -1);
  return w;
}

/** A glued word ("signupdate", "totalorders") split into 2–3 known words, at most one of two letters. */
function wordBreak(w: string): string[] | null {
  const n = w.length;
  const best = (start: number, parts: number, shortUsed: boolean): string[] | null => {
    if (start === n) return [];
    if (parts === 0) return null;
    for (let end = n; end >= start + 2; end--) {
      const piece = w.slice(start, end);
      const short = piece.length === 2;
      if ((short && shortUsed) || !isKnown(piece)) continue;
      const rest = best(end, parts - 1, shortUsed || short);
      if (rest) return [piece, ...rest];
    }
    return null;
  };
  const parts = best(0, 3, false);
  return parts && parts.length > 1 ? parts : null;
}

const VOWELS = /[aeiou]/g;
const isSubsequence = (short: string, long: string) => {
  let i = 0;
  for (const ch of long) if (ch === short[i]) i++;
  return i === short.length;
};

/** A consonant-heavy abbreviation ("cntry", "phn", "addr") read as the known word it abbreviates. */
function expandAbbreviation(w: string): string | null {
  if (w.length < 3 || w.length > 6) return null;
  if (w.length > 4 && (w.match(VOWELS)?.length ?? 0) / w.length > 0.4) return null;
  let best: { word: string; score: number } | null = null;
  for (const word of FULL_WORDS) {
    if (word.length <= w.length || word[0] !== w[0] || !isSubsequence(w, word)) continue;
    let prefix = 0;
    while (prefix < w.length && w[prefix] === word[prefix]) prefix++;
    const score = prefix + w.length / word.length;
    if (!best || score > best.score || (score === best.score && word < best.word)) best = { word, score };
  }
  return best?.word ?? null;
}

/** The vocabulary never changes, so what a word normalizes to is computed once per process. */
const NORMALIZED = new Map<string, string[]>();
const NORMALIZED_MAX = 50_000;

function normalizeWord(w: string, depth = 0): string[] {
  if (depth > 0) return normalizeUncached(w, depth);
  let out = NORMALIZED.get(w);
  if (!out) {
    out = normalizeUncached(w, 0);
    if (NORMALIZED.size >= NORMALIZED_MAX) NORMALIZED.clear();
    NORMALIZED.set(w, out);
  }
  return out;
}

function normalizeUncached(w: string, depth: number): string[] {
  if (/^\d+$/.test(w)) return [String(Number.parseInt(w, 10))];
  const variant = WORD_VARIANTS[w];
  if (variant !== undefined) return variant.split(' ');
  if (KNOWN_WORDS.has(w)) return [w];
  const s = singular(w);
  if (s !== w) return normalizeWord(s, depth);
  if (depth > 0) return [w];
  const parts = wordBreak(w);
  if (parts) return parts.flatMap((p) => normalizeWord(p, depth + 1));
  const expanded = expandAbbreviation(w);
  if (expanded) return normalizeWord(expanded, depth + 1);
  return [w];
}

for (const [concept, phrases] of Object.entries(PHRASES)) {
  for (const phrase of phrases) {
    const normalized = phrase
      .split(' ')
      .flatMap((w) => normalizeWord(w))
      .join(' ');
    // A phrase written out as people write it wins over another phrase's normalized form.
    PHRASE_OF.set(phrase, concept);
    if (!PHRASE_OF.has(normalized)) PHRASE_OF.set(normalized, concept);
    longestPhrase = Math.max(longestPhrase, phrase.split(' ').length, normalized.split(' ').length);
  }
}

const CONCEPTS_OF = new Map<string, readonly string[]>();

/** The concepts a column (or field) name stands for, e.g. "CUST_TEL_NO" → [customer, phone]. */
export function conceptsOf(name: string, stripPrefix = ''): string[] {
  const key = `${stripPrefix}\u0000${name}`;
  let concepts = CONCEPTS_OF.get(key);
  if (!concepts) {
    concepts = Object.freeze(computeConcepts(name, stripPrefix));
    if (CONCEPTS_OF.size >= NORMALIZED_MAX) CONCEPTS_OF.clear();
    CONCEPTS_OF.set(key, concepts);
  }
  return [...concepts];
}

function computeConcepts(name: string, stripPrefix: string): string[] {
  const raw =
    stripPrefix && name.toLowerCase().startsWith(stripPrefix) ? name.slice(stripPrefix.length) : name;
  const words = splitWords(raw);
  const normalized = words.map((w) => normalizeWord(w));
  const out: string[] = [];
  let i = 0;
  while (i < words.length) {
    let matched = false;
    for (let len = Math.min(longestPhrase, words.length - i); len >= 1 && !matched; len--) {
      const rawKey = words.slice(i, i + len).join(' ');
      const normKey = normalized
        .slice(i, i + len)
        .flat()
        .join(' ');
      const concept = PHRASE_OF.get(rawKey) ?? PHRASE_OF.get(normKey);
      if (concept) {
        // "Event Name", "Plan Name": the name of some other thing, not of the person.
        const previous = out[out.length - 1];
        const foreign = previous !== undefined && !CONCEPTS.has(previous) && !QUALIFIERS.has(previous);
        out.push(concept === 'full_name' && rawKey === 'name' && foreign ? 'name' : concept);
        i += len;
        matched = true;
      }
    }
    if (matched) continue;
    // No phrase spans this word: its normalized parts may still form phrases among themselves.
    const parts = normalized[i];
    let j = 0;
    while (j < parts.length) {
      let done = false;
      for (let len = parts.length - j; len >= 1 && !done; len--) {
        const concept = PHRASE_OF.get(parts.slice(j, j + len).join(' '));
        if (concept) {
          out.push(concept);
          j += len;
          done = true;
        }
      }
      if (!done) {
        if (!STOP_WORDS.has(parts[j])) out.push(parts[j]);
        j++;
      }
    }
    i++;
  }
  let concepts = [...new Set(out.filter((t) => !STOP_WORDS.has(t)))];
  // "Address City", "address_zip": the city of the address, not the street line.
  if (concepts.includes('street') && concepts.some((c) => ADDRESS_PARTS.has(c)))
    concepts = concepts.filter((c) => c !== 'street');
  // "num_orders" counts orders; "order_no" identifies one.
  if (concepts.length > 1 && concepts[0] === 'number') concepts[0] = 'count';
  // A column named after the entity alone ("customer", "cust", "attendee #") holds its key.
  if (concepts.length === 1 && ENTITIES.has(concepts[0])) concepts.push('id');
  return concepts;
}

/**
 * Legacy files prefix every field with the file's short code (CMCUST, CMNAME, CMADR1). The prefix
 * is stripped when doing so turns more names into known words.
 */
export function commonPrefix(names: readonly string[]): string {
  if (names.length < 4) return '';
  const lower = names.map((n) => n.toLowerCase());
  let prefix = lower[0];
  for (const n of lower) while (!n.startsWith(prefix)) prefix = prefix.slice(0, -1);
  prefix = /^[a-z]*/.exec(prefix)?.[0] ?? '';
  for (let len = Math.min(4, prefix.length); len >= 2; len--) {
    const p = prefix.slice(0, len);
    if (isKnown(p)) continue;
    const knownBefore = lower.filter((n) => isKnown(splitWords(n)[0] ?? '')).length;
    const knownAfter = lower.filter((n) => {
      const first = splitWords(n.slice(len))[0] ?? '';
      return isKnown(first) || wordBreak(first) !== null || expandAbbreviation(first) !== null;
    }).length;
    if (knownAfter > knownBefore && knownAfter >= lower.length / 2) return p;
  }
  return '';
}

const RELATION = new Map<string, Map<string, number>>();
for (const [a, b, s] of RELATED) {
  for (const [x, y] of [
    [a, b],
    [b, a],
  ]) {
    if (!RELATION.has(x)) RELATION.set(x, new Map());
    RELATION.get(x)!.set(y, s);
  }
}

function tokenSimilarity(a: string, b: string): number {
  if (a === b) return 1;
  const related = RELATION.get(a)?.get(b);
  if (related !== undefined) return related;
  if (/^\d+$/.test(a) || /^\d+$/.test(b)) return 0;
  // Unknown words that share a stem ("reservation"/"reserv") are probably the same word.
  if (CONCEPTS.has(a) || CONCEPTS.has(b)) return 0;
  if (a.length >= 4 && b.length >= 4 && (a.startsWith(b) || b.startsWith(a))) return 0.7;
  return 0;
}

const weightOf = (t: string) => (/^\d+$/.test(t) ? 0.35 : (TOKEN_WEIGHTS[t] ?? 1));

/** The weighted share of `from` that `to` covers. */
function cover(from: readonly string[], to: readonly string[]): number {
  let total = 0;
  let covered = 0;
  for (const a of from) {
    const w = weightOf(a);
    let best = 0;
    for (const b of to) best = Math.max(best, tokenSimilarity(a, b));
    total += w;
    covered += w * best;
  }
  return covered / total;
}

/**
 * How much two concept lists mean the same: the weighted share of each side that the other covers,
 * multiplied; 1 for the same meaning, 0 for nothing in common.
 */
export function conceptSimilarity(source: readonly string[], target: readonly string[]): number {
  if (source.length === 0 || target.length === 0) return 0;
  // A product, not a mean: a name half about something else ("email_verified" for "email") is weak.
  return cover(source, target) * cover(target, source);
}

// ---------------------------------------------------------------- types and values

type Family = 'text' | 'integer' | 'numeric' | 'boolean' | 'date' | 'timestamp' | 'json' | 'uuid' | 'other';

const FAMILY_OF = new Map<string, Family>();

export function typeFamily(type: string): Family {
  let family = FAMILY_OF.get(type);
  if (family === undefined) {
    family = familyOf(type);
    FAMILY_OF.set(type, family);
  }
  return family;
}

function familyOf(type: string): Family {
  const t = type.toLowerCase().trim();
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
  other: 0.4,
};

/** How well a source column can feed a target type, values considered, in [0, 1]. */
export function typeCompatibility(source: SourceColumn, targetType: string): number {
  const s = typeFamily(source.type);
  const t = typeFamily(targetType);
  const p = (pattern: ValuePattern) => shareOf(source.patterns, pattern);
  if (s === t) return 1;
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

interface Expectation {
  patterns: ValuePattern[];
  /** How telling the pattern is: an e-mail column is unmistakable, a state code less so. */
  strength: number;
  /** Whether missing the pattern counts against a column. */
  required: boolean;
  /** The pattern is what the target's type already says (dates for a date field). */
  restatesType?: boolean;
}

function expectationOf(concepts: readonly string[], targetType: string): Expectation | null {
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

/** Value evidence in [-1, 1] times its strength, as a log-odds term. */
function patternTerm(
  source: SourceColumn,
  expectation: Expectation | null,
  targetType: string,
): { term: number; evidence: number } {
  const patterns = source.patterns ?? [];
  // Values that only restate the declared type ("an integer column holds integers") add nothing.
  const sourceFamily = typeFamily(source.type);
  if (expectation?.restatesType && sourceFamily !== 'text' && sourceFamily !== 'other') {
    const same = typeFamily(targetType) === sourceFamily;
    const dateLike = (f: string) => f === 'date' || f === 'timestamp';
    if (same || (dateLike(sourceFamily) && dateLike(typeFamily(targetType)))) return { term: 0, evidence: 0 };
  }
  if (expectation) {
    const share = Math.max(0, ...expectation.patterns.map((p) => shareOf(patterns, p)));
    if (share > 0) return { term: share * expectation.strength, evidence: share };
    const other = patterns.find((p) => TELLING.includes(p.pattern) && p.share >= 0.6);
    // Values that are clearly something else overrule the name of a field that has a shape.
    if (other)
      return {
        term: -other.share * (expectation.required ? 4.5 : expectation.strength),
        evidence: -other.share,
      };
    if (expectation.required && patterns.length > 0) return { term: -1, evidence: -0.5 };
    return { term: 0, evidence: 0 };
  }
  const telling = patterns.find((p) => TELLING.includes(p.pattern) && p.share >= 0.6);
  if (telling) return { term: -2 * telling.share, evidence: -telling.share };
  return { term: 0, evidence: 0 };
}

// ---------------------------------------------------------------- scoring and assignment

const sigmoid = (z: number) => 1 / (1 + Math.exp(-z));
const round3 = (v: number) => Math.round(v * 1000) / 1000;

interface PreparedColumn {
  table: string;
  column: SourceColumn;
  concepts: string[];
  field: string;
}

/**
 * A bare "id" takes its meaning from its table: the customer's in "users", the subscription's in
 * "stripe_subscriptions" (an English compound's last word is its head noun).
 */
function withTableContext(concepts: string[], tableConcepts: string[]): string[] {
  const generic = concepts.every((c) => c === 'id' || c === 'number' || c === 'code' || /^\d+$/.test(c));
  if (!generic || concepts.length === 0) return concepts;
  const entity = tableConcepts.filter((c) => ENTITIES.has(c));
  if (entity.length > 0) return [...entity, ...concepts];
  const head = tableConcepts[tableConcepts.length - 1];
  return head === undefined ? concepts : [head, ...concepts];
}

function prepare(sources: readonly SourceTable[]): PreparedColumn[] {
  return sources.flatMap((table) => {
    const prefix = commonPrefix(table.columns.map((c) => c.name));
    const tableConcepts = conceptsOf(table.name.split('.').pop() ?? table.name);
    return table.columns.map((column) => ({
      table: table.name,
      column,
      concepts: withTableContext(conceptsOf(column.name, prefix), tableConcepts),
      field: `${table.name}.${column.name}`,
    }));
  });
}

interface PreparedField {
  field: TargetField;
  concepts: string[];
  descriptionConcepts: string[];
  expectation: Expectation | null;
  isKey: boolean;
  /** Name similarity per source concept list: real schemas repeat column names a lot. */
  nameCache: Map<string, number>;
}

function prepareField(target: TargetTable, field: TargetField): PreparedField {
  const concepts = conceptsOf(field.name);
  return {
    field,
    concepts,
    descriptionConcepts: field.description ? conceptsOf(field.description) : [],
    expectation: expectationOf(concepts, field.type),
    nameCache: new Map(),
    isKey: target.primary_key?.includes(field.name) ?? false,
  };
}

const GENERIC = new Set(['customer', 'account', 'id', 'number', 'code', 'when', 'total', 'count']);

/**
 * The share of the column's meaning that the field's description speaks of, discounted. Only for
 * compound names with something specific in them: a one-word column ("address") is named after its
 * own field, and descriptions mention many things in passing ("City of the primary address").
 */
function descriptionSimilarity(source: readonly string[], description: readonly string[]): number {
  if (source.length < 2 || description.length === 0) return 0;
  if (!source.some((c) => !GENERIC.has(c) && description.includes(c))) return 0;
  return 0.6 * cover(source, description);
}

function score(f: PreparedField, col: PreparedColumn): { logit: number; evidence: Evidence } {
  const key = col.concepts.join(' ');
  let name = f.nameCache.get(key);
  if (name === undefined) {
    name = Math.max(
      conceptSimilarity(col.concepts, f.concepts),
      descriptionSimilarity(col.concepts, f.descriptionConcepts),
    );
    f.nameCache.set(key, name);
  }
  const type = typeCompatibility(col.column, f.field.type);
  const { term, evidence } = patternTerm(col.column, f.expectation, f.field.type);
  let logit = -4.5 + 7 * name + 3 * (type - 0.7) + term;
  if (col.column.nullRate !== undefined && col.column.nullRate >= 0.999) logit -= 1.5;
  // A foreign key repeats another table's identifier; the identifier itself is the better source.
  if (col.column.references && f.concepts.includes('id')) logit -= 1.5;
  return { logit, evidence: { name: round3(name), type: round3(type), pattern: round3(evidence) } };
}

const MIN_CANDIDATE = 0.05;
const MIN_CANDIDATE_LOGIT = Math.log(MIN_CANDIDATE / (1 - MIN_CANDIDATE));
const KEY_BONUS = 2;
const TABLE_BONUS = 0.2;
const MAX_BONUS = KEY_BONUS + TABLE_BONUS;

/** Candidates (best first) that fit a field about equally well, or null when one stands out. */
export function ambiguityOf(
  targetField: string,
  candidates: readonly Candidate[],
  options: Pick<MatchOptions, 'threshold' | 'ambiguityMargin'> = {},
): Ambiguity | null {
  const threshold = options.threshold ?? 0.5;
  const margin = options.ambiguityMargin ?? 0.1;
  if (candidates.length < 2) return null;
  const close = candidates.filter(
    (c) => c.confidence >= threshold && candidates[0].confidence - c.confidence < margin,
  );
  if (close.length < 2) return null;
  return {
    target_field: targetField,
    candidates: close,
    reason: `${close.length} source columns match ${targetField} within ${margin} confidence`,
  };
}

/** Matches the columns of the source tables to the fields of one target table. */
export function matchTable(
  target: TargetTable,
  sources: readonly SourceTable[],
  options: MatchOptions = {},
): TableMatch {
  const threshold = options.threshold ?? 0.5;
  const margin = options.ambiguityMargin ?? 0.1;
  const maxCandidates = options.maxCandidates ?? 5;
  const columns = prepare(sources);
  const scored = target.columns.map((field) => {
    const prepared = prepareField(target, field);
    const rows: { col: PreparedColumn; logit: number; evidence: Evidence }[] = [];
    for (const col of columns) {
      const s = score(prepared, col);
      // Pairs no bonus can lift to a candidate are dropped here: most of a big source.
      const reach = prepared.isKey && col.column.isPrimaryKey ? MAX_BONUS : TABLE_BONUS;
      if (s.logit + reach >= MIN_CANDIDATE_LOGIT) rows.push({ col, ...s });
    }
    return { field, isKey: prepared.isKey, rows };
  });

  // The table that answers most fields best is the primary one; its columns win close calls.
  const tableScore = new Map<string, number>();
  for (const { rows } of scored) {
    const best = new Map<string, number>();
    for (const r of rows) best.set(r.col.table, Math.max(best.get(r.col.table) ?? 0, sigmoid(r.logit)));
    for (const [t, s] of best) if (s >= threshold) tableScore.set(t, (tableScore.get(t) ?? 0) + s);
  }
  const primary = [...tableScore].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))[0]?.[0] ?? null;

  const bonus = (isKey: boolean, col: PreparedColumn) => {
    if (col.table !== primary) return 0;
    // Key to key: the target's primary key is fed by the primary source table's primary key.
    const key = isKey && col.column.isPrimaryKey ? KEY_BONUS : 0;
    return key + (sources.length > 1 ? TABLE_BONUS : 0);
  };
  const ranked = scored.map(({ field, isKey, rows }) => ({
    field,
    candidates: rows
      .map((r) => ({
        source_field: r.col.field,
        confidence: round3(sigmoid(r.logit + bonus(isKey, r.col))),
        evidence: r.evidence,
      }))
      .filter((c) => c.confidence >= MIN_CANDIDATE)
      .sort((a, b) => b.confidence - a.confidence || a.source_field.localeCompare(b.source_field)),
  }));

  const pairs = ranked
    .flatMap((r) => r.candidates.map((c) => ({ target: r.field.name, candidate: c })))
    .filter((p) => p.candidate.confidence >= threshold)
    .sort(
      (a, b) =>
        b.candidate.confidence - a.candidate.confidence ||
        a.target.localeCompare(b.target) ||
        a.candidate.source_field.localeCompare(b.candidate.source_field),
    );
  const assigned = new Map<string, Candidate>();
  const used = new Set<string>();
  for (const { target: t, candidate } of pairs) {
    if (assigned.has(t) || used.has(candidate.source_field)) continue;
    assigned.set(t, candidate);
    used.add(candidate.source_field);
  }

  const fields: FieldMatch[] = ranked.map(({ field, candidates }) => {
    const top = candidates.slice(0, maxCandidates);
    return {
      target_field: field.name,
      candidates: top,
      suggestion: assigned.get(field.name) ?? null,
      ambiguity: ambiguityOf(field.name, top, { threshold, ambiguityMargin: margin }),
    };
  });
  return {
    target_table: target.name,
    primary_table: primary,
    fields,
    ambiguities: fields.flatMap((f) => (f.ambiguity ? [f.ambiguity] : [])),
  };
}
