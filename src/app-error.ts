/**
 * The one error services throw. Its code names the outcome; `trpc/errors.ts` holds the single table
 * that turns codes into HTTP statuses. Services stay free of HTTP and tRPC.
 */
export type AppErrorCode =
  | 'BAD_REQUEST'
  | 'UNAUTHORIZED'
  | 'FORBIDDEN'
  | 'NOT_FOUND'
  | 'CONFLICT'
  | 'PAYLOAD_TOO_LARGE'
  | 'UNSUPPORTED_MEDIA_TYPE'
  | 'UNPROCESSABLE_CONTENT'
  | 'TOO_MANY_REQUESTS'
  | 'SERVICE_UNAVAILABLE'
  | 'INTERNAL_SERVER_ERROR';

export interface AppErrorIssue {
  path: (string | number)[];
  message: string;
}

export interface AppErrorDetails {
  /** Every problem found, for validation errors that are more than one. */
  issues?: AppErrorIssue[];
  /** A finer machine-readable reason, e.g. PASSWORD_CHANGE_REQUIRED. */
  reason?: string;
  retryAfter?: number;
}

export class AppError extends Error {
  readonly code: AppErrorCode;
  readonly details: AppErrorDetails;

  constructor(code: AppErrorCode, message: string, details: AppErrorDetails = {}) {
    super(message);
    this.name = 'AppError';
    this.code = code;
    this.details = details;
  }
}

export const notFound = (what: string) => new AppError('NOT_FOUND', `${what} not found`);
