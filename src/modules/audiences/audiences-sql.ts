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
   * `select count(*) as n`: the rows that match the definition but are left out for lacking an
   * identifier, with the same params.
   */
  withoutIdentifierSql: string;
}

/**
 * Whether a row can be identified downstream: at least one identifier column holds a value (with email
 * and phone as identifiers, either is enough). A row without any cannot be matched or deduplicated by
 * a destination, so it is no member. `is distinct from null` tests the value itself, where `is not null`
 * on a composite value tests each of its fields; on a plain column PostgreSQL plans both as the same
 * null test, which an index answers.
 */
function identified(identifierColumns: string[]): string {
  return `(${identifierColumns.map((c) => `${quoteIdent(c)} is distinct from null`).join(' or ')})`;
}

/**
 * The SELECT of an audience's members: its identifier and attribute columns, nothing else, of the rows
 * that match its definition and carry an identifier. Everything that counts, lists or sends members
 * reads the table materialized from it.
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
  const columns = [...audience.identifierColumns, ...audience.attributeColumns].map(quoteIdent).join(', ');
  const hasIdentifier = identified(audience.identifierColumns);
  if (audience.definitionType === 'sql') {
    const { kind, statement } = await assertReadOnlySql(audience.sql ?? '');
    if (kind !== 'SELECT')
      throw new AppError('BAD_REQUEST', `An audience is defined by a SELECT; got ${kind}`);
    // The statement as parsed (no final semicolon), on lines of its own so a trailing comment ends there.
    const source = `(\n${statement}\n) as audience_source`;
    return {
      sql: `select ${columns} from ${source} where ${hasIdentifier}`,
      params: [],
      withoutIdentifierSql: `select count(*) as n from ${source} where not ${hasIdentifier}`,
    };
  }
  const table = schemaTable(schema, audience.targetTable);
  if (!table)
    throw new AppError('BAD_REQUEST', `Table ${audience.targetTable} is no longer in the target schema`);
  const { where, params } = compileRules(audience.rules, table.columns, { table: table.name });
  const relation = qualifiedName(audience.targetSchema, table.name);
  return {
    sql: `select ${columns} from ${relation} where ${where} and ${hasIdentifier}`,
    params,
    withoutIdentifierSql: `select count(*) as n from ${relation} where ${where} and not ${hasIdentifier}`,
  };
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
