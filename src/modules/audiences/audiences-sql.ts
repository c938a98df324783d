import { AppError } from '../../app-error.ts';
import { assertReadOnlySql } from '../../warehouse/sql-guard.ts';
import { quoteIdent } from '../../warehouse/postgres.ts';
import type { TargetSchema } from '../schemas/schemas.schemas.ts';
import { compileRules } from './audiences-rules.ts';
import type { AudienceEntity, FieldMappingEntry } from './audiences.entity.ts';

/*
 * The SQL an audience turns into, shared by the service (validation, preview) and the job handlers
 * (materialize, export). Nothing here connects anywhere.
 */

/** Materialized audiences live in a schema of their own in the target warehouse. */
export const MATERIALIZED_SCHEMA = 'dimas_audiences';

const compact = (id: string) => id.replaceAll('-', '');

/** The stable view that always shows the newest materialization of an audience. */
export const audienceViewName = (audienceId: string) => `a_${compact(audienceId)}`;

/** A new versioned table for one run: the definition version plus the run, so retries never collide. */
export const audienceTableName = (audienceId: string, version: number, runId: string) =>
  `a_${compact(audienceId)}_v${version}_${compact(runId).slice(0, 8)}`;

export const qualifiedName = (schema: string, name: string) => `${quoteIdent(schema)}.${quoteIdent(name)}`;

export type SchemaTable = TargetSchema['tables'][number];

export function schemaTable(schema: TargetSchema | null, table: string): SchemaTable | undefined {
  return (
    schema?.tables.find((t) => t.name === table) ??
    schema?.tables.find((t) => t.name.toLowerCase() === table.toLowerCase())
  );
}

export interface MemberSelect {
  sql: string;
  params: unknown[];
  /**
   * One row with the same params: `without_identifier`, the rows that match the definition but are
   * left out for lacking an identifier, and `identified`, those that carry one; those beyond the
   * members were merged into a member sharing their identifier values.
   */
  countsSql: string;
}

const SOURCE = 'audience_source';

/**
 * The one definition of an identifier value being there, for every column type: not NULL and not blank
 * (empty or whitespace only, which a destination cannot match either). The member SELECT and its
 * counts test it; sizes, previews, exports and the conversions' member look-up read the table it
 * filled, where a blank identifier value is NULL.
 */
function identifierPresent(expression: string): string {
  return `coalesce((${expression})::text ~ '[^[:space:]]', false)`;
}

/** An identifier column's value as a member carries it: blank reads as NULL. */
const identifierValue = (column: string) => {
  const source = qualifiedName(SOURCE, column);
  return `case when ${identifierPresent(source)} then ${source} end`;
};

/**
 * The SELECT of an audience's members: its identifier and attribute columns, nothing else, of the rows
 * that match its definition and carry an identifier (with email and phone as identifiers, either is
 * enough; a row with none cannot be matched or deduplicated by a destination, so it is no member).
 * A member is one distinct combination of identifier values, as a model's primary key in Hightouch or
 * Census: rows sharing them (one person's e-mail on two contacts) are one member, the row first in the
 * target table's primary key (then in its selected columns' text) standing for them, so a destination
 * receives each identifier once and the size counts people rather than rows. Everything that counts,
 * lists or sends members reads the table materialized from it.
 */
export async function memberSelect(
  audience: Pick<
    AudienceEntity,
    | 'definitionType'
    | 'rules'
    | 'sql'
    | 'identifierColumns'
    | 'attributeColumns'
    | 'targetSchema'
    | 'targetTable'
  >,
  schema: TargetSchema | null,
): Promise<MemberSelect> {
  const identifiers = audience.identifierColumns;
  const columns = [
    ...identifiers.map((c) => `${identifierValue(c)} as ${quoteIdent(c)}`),
    ...audience.attributeColumns.map((c) => qualifiedName(SOURCE, c)),
  ].join(', ');
  const present = identifiers.map((c) => identifierPresent(qualifiedName(SOURCE, c)));
  const hasIdentifier = `(${present.join(' or ')})`;
  // As text: a json value has no equality to compare by.
  const keys = identifiers.map((c) => `(${identifierValue(c)})::text`);
  const ties = (primaryKey: string[]) =>
    [...new Set([...primaryKey, ...identifiers, ...audience.attributeColumns])].map(
      (c, i) => `${qualifiedName(SOURCE, c)}${i < primaryKey.length ? '' : '::text'}`,
    );
  const select = (source: string, where: string, primaryKey: string[]) => ({
    sql: `select distinct on (${keys.join(', ')}) ${columns} from ${source}
           where ${where} and ${hasIdentifier}
           order by ${[...keys, ...ties(primaryKey)].join(', ')}`,
    countsSql: `select count(*) filter (where not ${hasIdentifier}) as without_identifier,
                       count(*) filter (where ${hasIdentifier}) as identified
                  from ${source} where ${where}`,
  });
  if (audience.definitionType === 'sql') {
    const { kind, statement } = await assertReadOnlySql(audience.sql ?? '');
    if (kind !== 'SELECT')
      throw new AppError('BAD_REQUEST', `An audience is defined by a SELECT; got ${kind}`);
    // The statement as parsed (no final semicolon), on lines of its own so a trailing comment ends there.
    return { ...select(`(\n${statement}\n) as ${SOURCE}`, 'true', []), params: [] };
  }
  const table = schemaTable(schema, audience.targetTable);
  if (!table)
    throw new AppError('BAD_REQUEST', `Table ${audience.targetTable} is no longer in the target schema`);
  const { where, params } = compileRules(audience.rules, table.columns, { table: table.name });
  const relation = `${qualifiedName(audience.targetSchema, table.name)} as ${SOURCE}`;
  return { ...select(relation, where, table.primary_key ?? []), params };
}

/**
 * A member's identifier value as a conversion's customer id is compared with (text, trimmed): the
 * expression the materialization indexes on each identifier column of its table.
 */
export const memberLookup = (column: string) => `btrim((${quoteIdent(column)})::text)`;

/**
 * `select member`: whether `$1` (a customer id) is one of the identifier values of a member of the
 * materialized `relation`. One look-up through the indexes materialization creates.
 */
export function memberExistsSql(relation: { schema: string; name: string }, identifierColumns: string[]) {
  const match = identifierColumns.map((c) => `${memberLookup(c)} = $1`).join(' or ');
  return `select exists (select 1 from ${qualifiedName(relation.schema, relation.name)} where ${match}) as member`;
}

/**
 * What an export reads: the mapped columns under their destination names, in a stable order (the
 * identifier columns), so a preview and a run list the same rows first and webhook batches line up.
 * Rows sharing identifier values (two contacts with one e-mail) are ordered by the mapped columns'
 * text after that: every read of one materialized table cuts the same batches, which a rerun that
 * resumes after the batches a webhook acknowledged relies on. Rows equal in all of them send the same.
 */
export function exportSelect(
  relation: { schema: string; name: string },
  mapping: FieldMappingEntry[],
  orderBy: string[],
  limit?: number,
): string {
  const columns = mapping.map((m) => `${quoteIdent(m.source)} as ${quoteIdent(m.destination)}`).join(', ');
  const ties = [...new Set(mapping.map((m) => m.source))]
    .filter((c) => !orderBy.includes(c))
    // As text: a json column has no ordering of its own.
    .map((c) => `${qualifiedName('audience_rows', c)}::text`);
  const keys = [...orderBy.map((c) => qualifiedName('audience_rows', c)), ...ties];
  const order = orderBy.length ? ` order by ${keys.join(', ')}` : '';
  return `select ${columns} from ${qualifiedName(relation.schema, relation.name)} as audience_rows${order}${limit ? ` limit ${Math.floor(limit)}` : ''}`;
}

/**
 * One CSV cell, as both the preview-to-CSV comparison and the writer spell it. `escapeFormulas`: a text
 * that a spreadsheet would run as a formula (OWASP's CSV injection) gets a leading `'`.
 */
export function csvCell(value: unknown, delimiter = ',', escapeFormulas = false): string {
  if (value === null || value === undefined) return '';
  let text =
    value instanceof Date
      ? value.toISOString()
      : typeof value === 'object'
        ? JSON.stringify(value)
        : String(value);
  if (escapeFormulas && typeof value === 'string' && /^[=+\-@\t\r]/.test(text)) text = `'${text}`;
  return text.includes(delimiter) || /["\r\n]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}

export function csvLine(values: unknown[], delimiter = ',', escapeFormulas = false): string {
  return `${values.map((v) => csvCell(v, delimiter, escapeFormulas)).join(delimiter)}\n`;
}
