import { TRPCError } from '@trpc/server';
import {
  ConnectionException,
  NotFoundError,
  UniqueConstraintViolationException,
  ForeignKeyConstraintViolationException,
} from '@mikro-orm/core';
import { AppError, type AppErrorCode, type AppErrorIssue } from '../app-error.ts';

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

export const GENERIC_INTERNAL_MESSAGE = 'Internal server error';

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
  if (BAD_VALUE_CODES.has((error as { code?: string } | null)?.code ?? ''))
    return new AppError('BAD_REQUEST', 'A value in the request has the wrong format or is out of range');
  if (isDatabaseUnavailable(error)) return new AppError('SERVICE_UNAVAILABLE', 'The database is unavailable');
  return new AppError('INTERNAL_SERVER_ERROR', GENERIC_INTERNAL_MESSAGE);
}

/**
 * The REST adapter only copies `issues` from a cause named ZodError, so validation problems found by
 * services travel in that form and reach clients exactly like schema validation errors.
 */
function issuesCause(issues: AppErrorIssue[], original: unknown): Error {
  return Object.assign(new Error('Validation failed'), { name: 'ZodError', issues, original });
}

export function toTRPCError(error: unknown): TRPCError {
  const cause = error instanceof TRPCError && error.cause ? error.cause : error;
  if (error instanceof TRPCError && !(cause instanceof Error && cause !== error)) return error;
  if (error instanceof TRPCError && error.code !== 'INTERNAL_SERVER_ERROR' && !(cause instanceof AppError))
    return error;
  const appError = toAppError(cause);
  return new TRPCError({
    code: appError.code,
    message: appError.message,
    cause: appError.details.issues ? issuesCause(appError.details.issues, appError) : appError,
  });
}

/** Details that ride along in the error body (never a stack or an internal message). */
export function errorExtras(error: TRPCError): Record<string, unknown> {
  const cause = error.cause as (Error & { issues?: unknown; original?: unknown }) | undefined;
  const appError =
    cause instanceof AppError ? cause : cause?.original instanceof AppError ? cause.original : null;
  const extras: Record<string, unknown> = {};
  if (cause?.name === 'ZodError' && cause.issues) extras.issues = cause.issues;
  if (appError?.details.reason) extras.reason = appError.details.reason;
  if (appError?.details.retryAfter !== undefined) extras.retry_after = appError.details.retryAfter;
  return extras;
}
