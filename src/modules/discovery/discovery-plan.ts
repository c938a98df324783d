import type { TableMatch } from '../../llm/offline-matcher.ts';
import type { IntrospectedTable } from '../../warehouse/warehouse.ts';
import type { MappingTable } from '../../transform/mapping.ts';
import type { Ambiguity } from '../mappings/mappings.entity.ts';
import { quoteIdent } from '../../warehouse/postgres.ts';

/**
 * From a table's match to what discovery writes into its mapping: the primary table, a join for
 * every other source table a suggestion comes from (proposed from foreign keys, else from shared
 * identifier columns), and the suggestions whose table cannot be joined turned into ambiguities,
 * so the mapping never names a column of a table it does not contain.
 */

export const tableKey = (t: Pick<IntrospectedTable, 'schema' | 'name'>) => `${t.schema}.${t.name}`;

// Always quoted: a bare name that is a keyword (`select`, `order`) is no identifier to PostgreSQL.
const columnRef = (table: Pick<IntrospectedTable, 'schema' | 'name'>, column: string) =>
  `${quoteIdent(table.schema)}.${quoteIdent(table.name)}.${quoteIdent(column)}`;

/** Words of an identifier: `customerId`, `CUSTOMER_ID` and `customer-id` all give [customer, id]. */
const words = (name: string) =>
  name
    .replace(/([a-z0-9])([A-Z])/g, '$1_$2')
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter(Boolean);

const ID_WORDS = new Set(['id', 'key', 'code', 'number', 'no', 'num', 'nr', 'uuid', 'guid', 'ref']);

/** A column that identifies something other than its own row: `customer_id`, `accountKey`; not bare `id`. */
function isIdentifier(name: string): boolean {
  const w = words(name);
  return w.length >= 2 && ID_WORDS.has(w[w.length - 1]);
}

/**
 * The ON expression joining `other` to `primary`, or null when nothing relates them safely. A join
 * is proposed only when it matches at most one row of `other` per primary row (its columns on the
 * other side are that table's primary key): a one-to-many join would repeat the primary rows and
 * break the target's key, so such tables are left for the user to aggregate or join explicitly.
 */
export function proposeJoin(primary: IntrospectedTable, other: IntrospectedTable): string | null {
  const on = (pairs: [string, string][]) =>
    pairs.map(([p, o]) => `${columnRef(primary, p)} = ${columnRef(other, o)}`).join(' and ');
  const refersTo = (fk: IntrospectedTable['foreign_keys'][number], t: IntrospectedTable) =>
    fk.references.schema === t.schema && fk.references.table === t.name;
  const keyOfOther = (columns: string[]) =>
    other.primary_key.length > 0 &&
    columns.length === other.primary_key.length &&
    other.primary_key.every((k) => columns.includes(k));

  const fromPrimary = primary.foreign_keys.find((fk) => refersTo(fk, other));
  if (fromPrimary && keyOfOther(fromPrimary.references.columns))
    return on(fromPrimary.columns.map((p, i) => [p, fromPrimary.references.columns[i]]));
  const fromOther = other.foreign_keys.find((fk) => refersTo(fk, primary));
  if (fromOther && keyOfOther(fromOther.columns))
    return on(fromOther.references.columns.map((p, i) => [p, fromOther.columns[i]]));

  // `loyalty.customer_id` (its key) names `customers.id`: an extension table of the primary one.
  if (primary.primary_key.length === 1) {
    const stem = words(primary.name);
    const last = stem[stem.length - 1] ?? '';
    const singular = last.endsWith('ies') ? `${last.slice(0, -3)}y` : last.replace(/s$/, '');
    const wanted = new Set([stem, [...stem.slice(0, -1), singular]].map((w) => [...w, 'id'].join('_')));
    const column = other.columns.find((c) => wanted.has(words(c.name).join('_')) && keyOfOther([c.name]));
    if (column) return on([[primary.primary_key[0], column.name]]);
  }

  // A shared identifier column that is the other table's whole key: one-to-one (or many-to-one).
  const otherByWords = new Map(other.columns.map((c) => [words(c.name).join('_'), c.name]));
  const shared = primary.columns
    .filter((c) => isIdentifier(c.name) && otherByWords.has(words(c.name).join('_')))
    .map((c) => [c.name, otherByWords.get(words(c.name).join('_'))!] as [string, string])
    .filter(([, o]) => keyOfOther([o]));
  if (shared.length) return on([shared[0]]);
  return null;
}

export interface PlannedMapping {
  tables: Record<string, MappingTable>;
  connections: { source_field: string; target_field: string; confidence: number }[];
  ambiguities: Ambiguity[];
}

/** `shop.orders.total` → `shop.orders` (the column is the part after the last dot). */
const tableOf = (sourceField: string) => sourceField.slice(0, sourceField.lastIndexOf('.'));

/**
 * `existing` are the tables the mapping already has (the user's choices win: a primary table and
 * joins already there are kept, and suggestions are planned around them).
 */
export function planMapping(
  match: TableMatch,
  sources: ReadonlyMap<string, IntrospectedTable>,
  existing: Readonly<Record<string, MappingTable>> = {},
): PlannedMapping {
  const tables: Record<string, MappingTable> = {};
  const existingPrimary = Object.entries(existing).find(([, t]) => t.relationship === 'primary')?.[0];
  const primaryKey = existingPrimary ?? match.primary_table;
  const primary = primaryKey ? sources.get(primaryKey) : undefined;
  if (primaryKey && !existingPrimary) tables[primaryKey] = { relationship: 'primary' };

  const connections: PlannedMapping['connections'] = [];
  const ambiguities: Ambiguity[] = match.ambiguities.map((a) => ({
    target_field: a.target_field,
    candidates: a.candidates.map((c) => ({ source_field: c.source_field, confidence: c.confidence })),
    reason: a.reason,
  }));
  const unjoinable = new Map<string, string>();
  for (const field of match.fields) {
    const s = field.suggestion;
    if (!s) continue;
    const key = tableOf(s.source_field);
    if (key !== primaryKey && !existing[key] && !tables[key] && !unjoinable.has(key)) {
      const other = sources.get(key);
      const joinOn = primary && other ? proposeJoin(primary, other) : null;
      if (joinOn) tables[key] = { relationship: 'join', join_type: 'left', join_on: joinOn };
      else
        unjoinable.set(
          key,
          `${key} has no one-to-one relation (a foreign key to its primary key, or a shared key column) with the primary table ${primaryKey}; join it yourself (aggregated first, if one ${primaryKey} row has several) to use this column`,
        );
    }
    const reason = unjoinable.get(key);
    if (reason) {
      if (!ambiguities.some((a) => a.target_field === field.target_field))
        ambiguities.push({
          target_field: field.target_field,
          candidates: [{ source_field: s.source_field, confidence: s.confidence }],
          reason,
        });
      continue;
    }
    connections.push({
      source_field: s.source_field,
      target_field: field.target_field,
      confidence: s.confidence,
    });
  }
  // Close candidates where exactly one is a column of the primary table: that column describes the
  // primary row itself, so it becomes the suggestion (still only suggested, for review).
  for (const ambiguity of [...ambiguities]) {
    if (connections.some((c) => c.target_field === ambiguity.target_field)) continue;
    const best = Math.max(...ambiguity.candidates.map((c) => c.confidence ?? 0));
    const own = ambiguity.candidates.filter(
      (c) => tableOf(c.source_field) === primaryKey && (c.confidence ?? 0) >= best - 0.02,
    );
    if (own.length !== 1) continue;
    connections.push({
      source_field: own[0].source_field,
      target_field: ambiguity.target_field,
      confidence: own[0].confidence ?? 0,
    });
    ambiguities.splice(ambiguities.indexOf(ambiguity), 1);
  }
  return { tables, connections, ambiguities };
}
