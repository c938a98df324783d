import { StandardSchemaV1Error, TRPCError } from '@trpc/server';
import { getHTTPStatusCodeFromError } from '@trpc/server/http';
import { z } from 'zod';
import {
  ConnectionException,
  NotFoundError,
  UniqueConstraintViolationException,
  ForeignKeyConstraintViolationException,
  OptimisticLockError,
} from '@mikro-orm/core';
import { AppError, type AppErrorCode } from '../app-error.ts';

/** The one table from outcome to HTTP status; the REST adapter, plain routes and tRPC all follow it. */
export const HTTP_STATUS: Record<AppErrorCode, number> = {
  BAD_REQUEST: 400,
  UNAUTHORIZED: 401,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  CONFLICT: 409,
  PAYLOAD_TOO_LARGE: 413,
  UNSUPPORTED_MEDIA_TYPE: 415,
  UNPROCESSABLE_CONTENT: 422,
  TOO_MANY_REQUESTS: 429,
  SERVICE_UNAVAILABLE: 503,
  INTERNAL_SERVER_ERROR: 500,
};

const GENERIC_INTERNAL_MESSAGE = 'Internal server error';

const CONNECTION_ERROR_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  '57P01',
  '57P03',
]);

/**
 * PostgreSQL data exceptions caused by a value from the request (an id that is not a UUID, a number
 * beyond the column's range, an impossible date, a NUL character in text or JSON): the request is
 * wrong, not the server. The embedded database reports some NUL-laden text parameters as a protocol
 * violation (08P01) instead of 22021; statements are parameterized, so only a value can cause it.
 */
const BAD_VALUE_CODES = new Set(['22P02', '22003', '22007', '22008', '22021', '22P05', '08P01']);

function isDatabaseUnavailable(error: unknown): boolean {
  if (error instanceof ConnectionException) return true;
  const code = (error as { code?: string } | null)?.code;
  if (code && CONNECTION_ERROR_CODES.has(code)) return true;
  const message = (error as Error | null)?.message ?? '';
  return /Connection terminated|connect ECONNREFUSED|timeout exceeded when trying to connect|not queryable/i.test(
    message,
  );
}

/** Turns anything a service or the ORM threw into an AppError; unknown errors stay internal. */
export function toAppError(error: unknown): AppError {
  if (error instanceof AppError) return error;
  if (error instanceof NotFoundError) return new AppError('NOT_FOUND', 'Not found');
  if (error instanceof UniqueConstraintViolationException)
    return new AppError('CONFLICT', 'A record with the same unique values already exists');
  if (error instanceof ForeignKeyConstraintViolationException)
    return new AppError(
      'CONFLICT',
      'The record is referenced by, or refers to, records that prevent this change',
    );
  // A write based on a read that another request's write has since replaced (src/db/concurrent-edit.ts).
  if (error instanceof OptimisticLockError)
    return new AppError(
      'CONFLICT',
      'Another request changed this while it was being edited: read it again and retry',
      {
        reason: 'CONCURRENT_EDIT',
      },
    );
  if (BAD_VALUE_CODES.has((error as { code?: string } | null)?.code ?? ''))
    return new AppError('BAD_REQUEST', 'A value in the request has the wrong format or is out of range');
  if (isDatabaseUnavailable(error)) return new AppError('SERVICE_UNAVAILABLE', 'The database is unavailable');
  // The body says nothing of it; the log line of the 500 does, through the cause.
  const internal = new AppError('INTERNAL_SERVER_ERROR', GENERIC_INTERNAL_MESSAGE);
  internal.cause = error;
  return internal;
}

export function toTRPCError(error: unknown): TRPCError {
  const cause = error instanceof TRPCError && error.cause ? error.cause : error;
  if (error instanceof TRPCError && !(cause instanceof Error && cause !== error)) return error;
  if (error instanceof TRPCError && error.code !== 'INTERNAL_SERVER_ERROR' && !(cause instanceof AppError))
    return error;
  const appError = toAppError(cause);
  return new TRPCError({ code: appError.code, message: appError.message, cause: appError });
}

/** Problems found by an input schema: zod's own error, or the standard-schema error tRPC raises. */
function schemaIssuesOf(cause: unknown): unknown[] | undefined {
  if (cause instanceof z.ZodError || cause instanceof StandardSchemaV1Error) return cause.issues as unknown[];
  return undefined;
}

/** The error body of DESIGN §4: `{ message, code, issues?, reason?, retry_after? }`. */
interface ErrorBody {
  message: string;
  code: string;
  issues?: unknown[];
  reason?: string;
  retry_after?: number;
}

export interface ErrorAnswer {
  status: number;
  body: ErrorBody;
  /** Headers the answer carries besides the body's content type (`retry-after`), lowercase names. */
  headers: Record<string, string>;
  /** A 500: the body says nothing of it, so whoever answers logs `cause`. */
  internal: boolean;
  cause: unknown;
}

/**
 * The one translation from anything thrown to a status and body: the tRPC error formatter, the REST
 * adapter, the streamed and file routes and express's error handler all answer through it.
 */
export function errorAnswer(error: unknown): ErrorAnswer {
  const trpcError = toTRPCError(error);
  const status = HTTP_STATUS[trpcError.code as AppErrorCode] ?? getHTTPStatusCodeFromError(trpcError);
  const internal = status >= 500 && trpcError.code === 'INTERNAL_SERVER_ERROR';
  const schemaIssues = schemaIssuesOf(trpcError.cause);
  const appError = trpcError.cause instanceof AppError ? trpcError.cause : undefined;
  const body: ErrorBody = {
    message: internal
      ? GENERIC_INTERNAL_MESSAGE
      : schemaIssues
        ? 'Input validation failed'
        : trpcError.message,
    code: trpcError.code,
  };
  const issues = schemaIssues ?? appError?.details.issues;
  if (issues) body.issues = issues;
  if (appError?.details.reason) body.reason = appError.details.reason;
  const headers: Record<string, string> = {};
  const retryAfter = appError?.details.retryAfter;
  if (retryAfter !== undefined) {
    body.retry_after = retryAfter;
    // HTTP clients and proxies read the header, not the body. RFC 9110 allows whole seconds only:
    // rounded up, so that a client that waits exactly that long is not refused again.
    if (Number.isFinite(retryAfter)) headers['retry-after'] = String(Math.max(0, Math.ceil(retryAfter)));
  }
  return { status, body, headers, internal, cause: trpcError.cause ?? trpcError };
}

/**
 * tRPC's `responseMeta` for /trpc: the headers of `errorAnswer` there too (tRPC writes the status and
 * body itself). A batch whose calls failed with several delays asks for the longest.
 */
export function errorResponseMeta({ errors }: { errors: readonly unknown[] }): {
  headers?: Record<string, string>;
} {
  let retryAfter: number | undefined;
  for (const error of errors) {
    const header = errorAnswer(error).headers['retry-after'];
    if (header !== undefined) retryAfter = Math.max(retryAfter ?? 0, Number(header));
  }
  return retryAfter === undefined ? {} : { headers: { 'retry-after': String(retryAfter) } };
}
