import type { PatternShare, ValuePattern } from './value-patterns.ts';
import {
  commonPrefix,
  conceptSimilarity,
  conceptsOf,
  cover,
  ENTITIES,
  isOpaqueName,
  isRecordKeyName,
  otherEntitiesOf,
  qualifiersOf,
  tableConceptsOf,
} from './matcher-names.ts';
import {
  expectationOf,
  patternTerm,
  typeCompatibility,
  type Converts,
  type Expectation,
} from './matcher-values.ts';
import type { CatalogType } from './pg-casts.ts';

export { conceptsOf } from './matcher-names.ts';

/**
 * The offline matcher: deterministic, no network. Each (target field, source column) pair gets
 * three pieces of evidence — name similarity over canonical concepts, type compatibility, and
 * value patterns — combined in log-odds into a confidence in [0, 1]. Suggestions are then assigned
 * greedily, best pair first, so that one source column feeds at most one target field.
 */

interface TargetField {
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

interface SourceColumn {
  name: string;
  /** The source database's type name. */
  type: string;
  /** A domain's base type (introspection's base_type), which decides casts and families; absent, `type`. */
  baseType?: string;
  patterns?: PatternShare[];
  nullRate?: number;
  distinctRatio?: number;
  /** A few sampled values (for the LLM prompt; the offline matcher reads only their patterns). */
  samples?: string[];
  isPrimaryKey?: boolean;
  /** Set when the column is a foreign key to another table of the source. */
  references?: { table: string; column: string } | null;
  /** A user type's facts from the source's catalog (domain base, category, casts); see pg-casts.ts. */
  catalogType?: CatalogType | null;
}

export interface SourceTable {
  name: string;
  columns: SourceColumn[];
}

interface Evidence {
  /** How much the names mean the same, in [0, 1]. */
  name: number;
  /** How well the source type can feed the target type, values considered, in [0, 1]. */
  type: number;
  /** Share of sampled values with the pattern the field expects; negative when they contradict it. */
  pattern: number;
  /** The value pattern that spoke for (or against) the pair, e.g. "email"; null when none did. */
  value_pattern?: ValuePattern | null;
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

interface FieldMatch {
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
  /** Pairs without a cast that the caller converts itself (discovery's cleaning); none when absent. */
  converts?: Converts;
}

// ---------------------------------------------------------------- scoring and assignment

const sigmoid = (z: number) => 1 / (1 + Math.exp(-z));
const round3 = (v: number) => Math.round(v * 1000) / 1000;

interface PreparedColumn {
  table: string;
  column: SourceColumn;
  concepts: string[];
  field: string;
  /** Which one of a kind the name says ("mobile", "billing"): a general field prefers none. */
  qualifiers: string[];
  /** Things other than the customer the name speaks of ("owner" in hubspot_owner_id). */
  otherEntities: string[];
  /** The name says nothing the vocabulary knows: values may speak for it. */
  opaque: boolean;
}

/**
 * A bare "id" takes its meaning from its table: the customer's in "users", the subscription's in
 * "stripe_subscriptions" (an English compound's last word is its head noun). A key column named
 * only "this record's id" (`Id`, `hs_object_id`, `entity_id`) is the key of that same entity.
 */
function withTableContext(concepts: string[], tableConcepts: string[], isKey: boolean): string[] {
  const bare = concepts.every((c) => c === 'id' || c === 'number' || c === 'code' || /^\d+$/.test(c));
  const generic = bare || (isKey && isRecordKeyName(concepts));
  if (!generic || concepts.length === 0) return concepts;
  const own = bare ? concepts : ['id'];
  const entity = tableConcepts.filter((c) => ENTITIES.has(c));
  if (entity.length > 0) return [...entity, ...own];
  const head = tableConcepts[tableConcepts.length - 1];
  return head === undefined ? own : [head, ...own];
}

function prepare(sources: readonly SourceTable[]): PreparedColumn[] {
  return sources.flatMap((table) => {
    const prefix = commonPrefix(table.columns.map((c) => c.name));
    const tableName = table.name.split('.').pop() ?? table.name;
    const tableConcepts = tableConceptsOf(tableName);
    // A table about something else (products, organizations): its "name" is that thing's name.
    const foreignTable = !tableConcepts.some((c) => ENTITIES.has(c)) && otherEntitiesOf(tableName).length > 0;
    return table.columns.map((column) => {
      let concepts = withTableContext(conceptsOf(column.name, prefix), tableConcepts, !!column.isPrimaryKey);
      if (foreignTable && concepts.length === 1 && concepts[0] === 'full_name') concepts = ['name'];
      return {
        table: table.name,
        column,
        concepts,
        field: `${table.name}.${column.name}`,
        qualifiers: qualifiersOf(column.name),
        otherEntities: otherEntitiesOf(column.name),
        opaque: isOpaqueName(conceptsOf(column.name, prefix)),
      };
    });
  });
}

interface PreparedField {
  field: TargetField;
  concepts: string[];
  descriptionConcepts: string[];
  expectation: Expectation | null;
  isKey: boolean;
  qualifiers: string[];
  otherEntities: string[];
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
    qualifiers: qualifiersOf(field.name),
    otherEntities: otherEntitiesOf(field.name),
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

function score(
  f: PreparedField,
  col: PreparedColumn,
  converts: Converts | undefined,
): { logit: number; evidence: Evidence } {
  const key = col.concepts.join(' ');
  let name = f.nameCache.get(key);
  if (name === undefined) {
    name = Math.max(
      conceptSimilarity(col.concepts, f.concepts),
      descriptionSimilarity(col.concepts, f.descriptionConcepts),
    );
    f.nameCache.set(key, name);
  }
  const type = typeCompatibility(col.column, f.field.type, converts);
  const values = patternTerm(col.column, f.expectation, f.field.type, converts);
  // Values lift a name that says nothing ("CC" of ISO country codes) when they are telling.
  const lift = col.opaque && name < 0.2 && (f.expectation?.strength ?? 0) >= 2 && values.term > 0 ? 2 : 1;
  let logit = -4.5 + 7 * name + 3 * (type - 0.7) + lift * values.term;
  if (col.column.nullRate !== undefined && col.column.nullRate >= 0.999) logit -= 1.5;
  // A foreign key repeats another table's identifier; the identifier itself is the better source.
  if (col.column.references && f.concepts.includes('id')) logit -= 1.5;
  // "hubspot_owner_id", "organization_id": the key of another thing, not of the customer.
  if (f.concepts.includes('id') && col.otherEntities.some((e) => !f.otherEntities.includes(e))) logit -= 2.5;
  // Of "phone" and "mobile_phone", a general field takes the general column and a specific one
  // the column its name qualifies the same way.
  const unasked = col.qualifiers.filter((q) => !f.qualifiers.includes(q)).length;
  const asked = f.qualifiers.filter((q) => col.qualifiers.includes(q)).length;
  logit += 0.8 * asked - 0.6 * Math.min(unasked, 1);
  return {
    logit,
    evidence: {
      name: round3(name),
      type: round3(type),
      pattern: round3(values.evidence),
      value_pattern: values.pattern,
    },
  };
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
      const s = score(prepared, col, options.converts);
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
