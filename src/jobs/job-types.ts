import { AppError } from '../app-error.ts';
import type { EntityManager } from '@mikro-orm/postgresql';
import type { JobRunStatus } from './job-run.entity.ts';

/** What the areas see of the job queue (queue.ts holds how it works). */

/** A run in one of these may still write its outcome; any other status is final. */
export const ACTIVE_RUN_STATUSES: JobRunStatus[] = ['queued', 'running'];

export const isRunActive = (status: string) => (ACTIVE_RUN_STATUSES as string[]).includes(status);

export interface JobContext {
  runId: string;
  organizationId: string;
  workspaceId: string | null;
  /** 1 for the first attempt, 2 for the first retry, … */
  attempt: number;
  /** Aborted when the run is cancelled or the queue stops; long handlers should pass it on. */
  signal: AbortSignal;
  /** Records progress (e.g. `{ rows_written }`); throws JobCancelledError once the run was cancelled. */
  progress(progress: Record<string, unknown>): Promise<void>;
  /**
   * The point of no return, for a handler whose last step makes its work visible (a file moved into
   * place): the run is recorded succeeded now, so a cancel arriving later finds it finished and
   * changes nothing, instead of a cancelled run beside a delivered file. Throws JobCancelledError
   * when the run was cancelled first. A failure after it fails the run for good; the handler's
   * result is still recorded when it returns.
   */
  succeed(): Promise<void>;
}

export type JobHandler<P extends Record<string, unknown> = Record<string, unknown>> = (
  payload: P,
  context: JobContext,
) => Promise<Record<string, unknown> | void>;

export interface JobKindOptions {
  /** Retries after the first attempt. */
  retryLimit?: number;
  /** Base delay; with backoff pg-boss adds about 2^attempt seconds, with jitter. */
  retryDelaySeconds?: number;
  retryBackoff?: boolean;
  retryDelayMaxSeconds?: number;
  /** An attempt running longer is failed (and retried) by pg-boss. */
  timeoutSeconds?: number;
  /** Runs of this kind one process works on at the same time. */
  concurrency?: number;
  /**
   * Called when the queue ends a run failed that its handler could not end: its worker stopped
   * responding on the last attempt (or pg-boss would not retry it). The area records the failure
   * where it keeps the run's outcome, which the handler would have written.
   */
  onAbandoned?: (run: AbandonedRun) => Promise<void>;
}

interface AbandonedRun {
  runId: string;
  organizationId: string;
  payload: Record<string, unknown>;
  error: string;
}

export interface EnqueueOptions {
  organizationId: string;
  workspaceId?: string | null;
  /** One active run per key within the organization and kind, e.g. `${workspaceId}:${table}`. */
  singletonKey?: string;
}

export interface JobRunView {
  id: string;
  organization_id: string;
  workspace_id: string | null;
  kind: string;
  status: JobRunStatus;
  singleton_key: string | null;
  payload: Record<string, unknown>;
  progress: Record<string, unknown>;
  result: Record<string, unknown> | null;
  error: string | null;
  retry_count: number;
  started_at: Date | null;
  finished_at: Date | null;
  created_at: Date;
  updated_at: Date;
  duration_ms: number | null;
}

interface EnqueueResult {
  run: JobRunView;
  /** false when an active run with the same singleton key was returned instead. */
  created: boolean;
}

interface ListRunsOptions {
  workspaceId?: string;
  kind?: string;
  status?: JobRunStatus;
  limit?: number;
  offset?: number;
}

interface ScheduleOptions {
  /** A tick running longer is failed by pg-boss (the next tick starts afresh). */
  timeoutSeconds?: number;
}

export interface JobQueue {
  register<P extends Record<string, unknown>>(
    kind: string,
    handler: JobHandler<P>,
    options?: JobKindOptions,
  ): Promise<void>;
  /**
   * Periodic work: `handler` runs once per tick of `cron` (UTC, minute resolution) in the whole
   * cluster, in whichever process takes the tick. Registered like a kind, before or after start.
   */
  schedule(
    name: string,
    cron: string,
    handler: () => Promise<void>,
    options?: ScheduleOptions,
  ): Promise<void>;
  enqueue(kind: string, payload: Record<string, unknown>, options: EnqueueOptions): Promise<EnqueueResult>;
  /**
   * The run if it belongs to the organization; null otherwise (answer 404 either way). Read on `em`
   * when given (the caller's connection and transaction), else on a connection of its own.
   */
  getRun(id: string, organizationId: string, em?: EntityManager): Promise<JobRunView | null>;
  listRuns(organizationId: string, options?: ListRunsOptions, em?: EntityManager): Promise<JobRunView[]>;
  /** Cancels a queued or running run; a finished run is returned unchanged. */
  cancel(id: string, organizationId: string): Promise<JobRunView | null>;
  start(): Promise<void>;
  stop(): Promise<void>;
}

/**
 * A failure that would repeat on every attempt (invalid SQL, a duplicate key, a missing table):
 * the run fails at once with this message instead of being retried.
 */
export class PermanentJobError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'PermanentJobError';
  }
}

/** SQLSTATE classes and driver reasons that a later attempt can get past. */
const TRANSIENT_REASON =
  /^(08|40|53|57|58|ECONN|ETIMEDOUT|EPIPE|EHOSTUNREACH|ENETUNREACH|EAI_AGAIN|CONNECTION_|STATEMENT_TIMEOUT)/;
/** SQLSTATE classes that repeat on every attempt: data, integrity, syntax or missing objects, privileges. */
const DETERMINISTIC_REASON = /^(21|22|23|25|2B|2F|42|44|0A|P0)/;

/**
 * Whether retrying can help, one rule for every job that runs SQL on a warehouse. Unknown failures are
 * retried (they may be transient); our own refusals (plain errors: no source configured, rows
 * multiplied) and the deterministic SQLSTATEs are not.
 */
export function isDeterministicFailure(error: unknown): boolean {
  if (error instanceof PermanentJobError) return true;
  const reason =
    error instanceof AppError
      ? String(error.details.reason ?? '')
      : String((error as { code?: unknown } | null)?.code ?? '');
  if (TRANSIENT_REASON.test(reason)) return false;
  if (DETERMINISTIC_REASON.test(reason)) return true;
  if (error instanceof AppError) return error.code === 'BAD_REQUEST';
  return error instanceof Error && !reason;
}

/**
 * A job's `catch`: a failure that would repeat on every attempt fails the run at once (as a
 * PermanentJobError), anything else is thrown as it is, for the queue to retry.
 */
export function failOnceWhenDeterministic(error: unknown): never {
  if (error instanceof PermanentJobError || !isDeterministicFailure(error)) throw error;
  throw new PermanentJobError(error instanceof Error ? error.message : String(error), { cause: error });
}

export class JobCancelledError extends Error {
  constructor(runId: string) {
    super(`Run ${runId} was cancelled`);
    this.name = 'JobCancelledError';
  }
}
