import pg from 'pg';
import { AppError } from '../app-error.ts';
import type { ConnectionConfig } from './config.ts';
import { SAMPLE_VALUE_CUT, SAMPLE_VALUE_MAX_LENGTH, type TableRef } from './warehouse.ts';

/** What every PostgreSQL warehouse file shares: identifier quoting, result type parsing, driver errors. */

export const SAMPLE_LIMIT_DEFAULT = 20;
export const SAMPLE_LIMIT_MAX = 1000;

/** Quotes an identifier the way PostgreSQL's quote_ident does (always, so case and keywords survive). */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

export function qualified(table: TableRef): string {
  return `${quoteIdent(table.schema)}.${quoteIdent(table.name)}`;
}

/**
 * Distinct non-null values of `column` of `relation` (a qualified table, or a subquery with its alias),
 * most frequent first, without a limit. Grouped on the whole text form (every type has one, json
 * included), so that long values sharing a beginning keep their own counts; each is shown cut at
 * SAMPLE_VALUE_MAX_LENGTH characters, bytea's \x hex included, with `truncated` saying so.
 */
export function sampleValuesSql(relation: string, column: string): string {
  const max = SAMPLE_VALUE_MAX_LENGTH;
  const col = quoteIdent(column);
  return `select case when length(v) > ${max} then left(v, ${max}) || '${SAMPLE_VALUE_CUT}' else v end as value,
                 length(v) > ${max} as truncated, count(*) as count
            from (select ${col}::text as v from ${relation} where ${col} is not null) as sampled
           group by v order by count(*) desc, v`;
}

// Dates and times stay as PostgreSQL prints them: a `date` must not shift through a JS Date.
const RAW_TEXT_TYPES = new Set([1082, 1083, 1114, 1184, 1186, 1266]);
export const typeParsers = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
    RAW_TEXT_TYPES.has(oid)
      ? (value: string) => value
      : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
};

export type ErrorContext = 'connect' | 'user-sql' | 'internal';

/** How many characters (as PostgreSQL counts them) of `text` come before `part`; null if it is not there. */
export function charsBefore(text: string, part: string): number | null {
  const at = text.indexOf(part);
  return at < 0 ? null : [...text.slice(0, at)].length;
}

/**
 * A database error about `sent`, SQL of dimas's own that holds `part`, which starts after `partAt`
 * characters of what the user wrote: its position (1-based, in characters of `sent`) moved to count
 * in the user's text, or dropped where it falls outside `part` or `part` is not their text as written.
 */
export function positionedIn(error: unknown, sent: string, part: string, partAt: number | null): unknown {
  const e = error as { position?: string };
  const at = Number(e.position);
  if (!e.position || !Number.isInteger(at)) return error;
  const partStart = charsBefore(sent, part);
  const inPart = partStart === null ? 0 : at - partStart;
  if (partAt === null || inPart < 1 || inPart > [...part].length + 1) delete e.position;
  else e.position = String(partAt + inPart);
  return error;
}

const NETWORK_REASONS: Record<string, string> = {
  ENOTFOUND: 'unknown host',
  EAI_AGAIN: 'the host name could not be resolved',
  ECONNREFUSED: 'connection refused',
  ETIMEDOUT: 'connection timed out',
  EHOSTUNREACH: 'host unreachable',
  ENETUNREACH: 'network unreachable',
  ECONNRESET: 'connection reset by the server',
};

/**
 * Driver errors → AppError: anything about reaching or logging into the database is 422 with the
 * driver's reason; SQL the user wrote that the database rejects is 400 with the database's message.
 */
export function translate(error: unknown, config: ConnectionConfig, context: ErrorContext): AppError {
  if (error instanceof AppError) return error;
  const e = error as Error & { code?: string; position?: string };
  const code = e.code ?? '';
  const where = `${config.host}:${config.port}/${config.database}`;
  if (NETWORK_REASONS[code])
    return new AppError(
      'UNPROCESSABLE_CONTENT',
      `Cannot connect to ${where}: ${NETWORK_REASONS[code]} (${e.message})`,
      {
        reason: code,
      },
    );
  const unreachable =
    /^(08|28|3D|53|57P)/.test(code) ||
    (!/^[0-9A-Z]{5}$/.test(code) &&
      (context === 'connect' || /timeout expired|Connection terminated|SSL/i.test(e.message)));
  if (unreachable)
    return new AppError(
      'UNPROCESSABLE_CONTENT',
      `Cannot connect to ${where} as ${config.user}: ${e.message}`,
      {
        reason: code || 'CONNECTION_FAILED',
      },
    );
  if (code === '57014')
    return new AppError(
      'UNPROCESSABLE_CONTENT',
      `The query was cancelled by the statement timeout: ${e.message}`,
      {
        reason: 'STATEMENT_TIMEOUT',
      },
    );
  // Class 40 (serialization failure, deadlock): the statement lost to concurrent work; the same
  // request can succeed when retried, so it is not the query's fault.
  if (code.startsWith('40'))
    return new AppError(
      'SERVICE_UNAVAILABLE',
      `The warehouse aborted the query because of concurrent work; retry: ${e.message}`,
      { reason: code },
    );
  if (context === 'user-sql' && /^[0-9A-Z]{5}$/.test(code)) {
    const at = e.position ? ` (position ${e.position})` : '';
    return new AppError('BAD_REQUEST', `The database rejected the query: ${e.message}${at}`, {
      reason: code,
    });
  }
  return new AppError(
    'UNPROCESSABLE_CONTENT',
    `The warehouse at ${where} failed: ${e.message ?? String(error)}`,
    {
      reason: code || undefined,
    },
  );
}
