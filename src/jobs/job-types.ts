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
   * place): the run is recorded succeeded now, with its final `progress` and, in the same
   * transaction, what `alongside` writes (the work's own record: a run read as ended comes with its
   * outcome), so a cancel arriving later finds it finished and changes nothing, instead of a
   * cancelled run beside a delivered file. Throws JobCancelledError when the run was cancelled
   * first. A failure after it fails the run for good; the handler's result is still recorded when it
   * returns.
   */
  succeed(options?: {
    progress?: Record<string, unknown>;
    alongside?: (em: EntityManager) => Promise<unknown>;
  }): Promise<void>;
  /**
   * Replaces the run's progress with what the attempt leaves behind as it ends without succeeding
   * (its handler is failing, or the run was cancelled while it ran, whose progress `progress`
   * refuses, or the queue ended it failed: a stop past its grace period, a sweep that took the
   * worker for dead on its last attempt), e.g. the rows a destination really holds after a rollback.
   * Written only while the row is still this attempt's (no later attempt claimed it); never throws
   * JobCancelledError. Returns whether it was written.
   */
  recordLastProgress(progress: Record<string, unknown>): Promise<boolean>;
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
  /** Runs of this kind one process works on at the same time (default: the queue's `concurrency`). */
  concurrency?: number;
  /**
   * Called when the queue ends a run failed that its handler could not end: its worker stopped
   * responding on the last attempt (or pg-boss would not retry it), or the process stopped while
   * the last attempt's handler outlived the grace period (the handler is still asked to stop and may
   * record the failure too: the hook and it must agree). The area records the failure
   * where it keeps the run's outcome, which the handler would have written, on `em`: it runs inside
   * the transaction that ends the run, while the row is still that attempt's (locked), so what it
   * writes commits with the run's end or not at all, and one process calls it once per run (on the
   * embedded database another connection would wait for this transaction). `run.progress` is the
   * last progress the attempt recorded, a running count; what it returns replaces it in the update
   * that ends the run, e.g. the rows a destination holds once the dead worker's transaction rolled
   * back (nothing: the progress stays). If it throws, the run still ends failed, with its progress
   * as it was and none of the hook's writes.
   */
  onAbandoned?: (run: AbandonedRun, em: EntityManager) => Promise<Record<string, unknown> | void>;
  /**
   * The finished runs of this kind that the retention sweep keeps however old, beyond what the queue
   * keeps of every kind (active runs, and the newest finished run of each singleton key: a key's
   * "latest run" that routes show and schedules compare against).
   */
  retain?: RetainRuns;
}

interface RetainRuns {
  /** Tables whose `last_run_id` names a run of this kind (an area's "last run", which routes show). */
  namedBy?: string[];
  /**
   * A SQL condition on the run, `run` (a row of job_runs), for what the kind reads of its earlier
   * runs, e.g. the latest one that got as far as some step.
   */
  where?: string;
}

interface AbandonedRun {
  runId: string;
  organizationId: string;
  payload: Record<string, unknown>;
  /** The last progress its attempt recorded. */
  progress: Record<string, unknown>;
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
  /**
   * Deletes the runs, of every organization, that finished longer ago than the retention period and
   * that nothing still needs (what the queue's hourly sweep does); how many it deleted.
   */
  deleteExpiredRuns(): Promise<number>;
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
 * MySQL / MariaDB server error numbers (MySQL's SQLSTATE is HY000 for most of them, so the classes
 * above cannot tell): true when every attempt gets the same answer, false when a later one can get past it.
 */
const MYSQL_ERRNO_DETERMINISTIC = new Map<number, boolean>([
  // Missing or changed objects, invalid SQL, values the server refuses, errors a routine signals.
  ...[1046, 1049, 1051, 1052, 1054, 1064, 1109, 1146, 1149, 1222, 1241, 1292, 1305, 1356, 1366, 1644].map(
    (n) => [n, true] as const,
  ),
  // Privileges: access denied to a database, a user, a table, a column, a routine; read-only transaction.
  ...[1044, 1045, 1142, 1143, 1227, 1370, 1792].map((n) => [n, true] as const),
  // Lock wait timeout, deadlock, too many connections (server, user), connection lost or gone away,
  // server shutting down, connection killed, statement timeout (MySQL, MariaDB), out of memory or disk.
  ...[1205, 1213, 1040, 1203, 2013, 2006, 2055, 1053, 1927, 3024, 1969, 1021, 1037, 1038, 1041, 1114].map(
    (n) => [n, false] as const,
  ),
]);

/**
 * Whether a MySQL / MariaDB server error (the driver's, or found along the `cause` chain of the errors
 * that wrap it) is one every attempt would get; undefined when there is none or its number is not classified.
 */
export function mysqlErrorIsDeterministic(error: unknown): boolean | undefined {
  const errno = mysqlServerErrno(error);
  return errno === undefined ? undefined : MYSQL_ERRNO_DETERMINISTIC.get(errno);
}

/** The error number of the MySQL / MariaDB server error that `error` is or wraps (along `cause`). */
export function mysqlServerErrno(error: unknown): number | undefined {
  let e = error as { errno?: unknown; sqlState?: unknown; cause?: unknown } | null | undefined;
  for (let depth = 0; e && depth < 5; depth++, e = e.cause as typeof e) {
    // A server error carries its SQLSTATE; Node's system errors carry (negative) errnos without one.
    if (typeof e.errno === 'number' && typeof e.sqlState === 'string') return e.errno;
  }
  return undefined;
}

/**
 * Whether retrying can help, one rule for every job that runs SQL on a warehouse. Unknown failures are
 * retried (they may be transient); our own refusals (plain errors: no source configured, rows
 * multiplied), the deterministic SQLSTATEs and MySQL error numbers are not.
 */
export function isDeterministicFailure(error: unknown): boolean {
  if (error instanceof PermanentJobError) return true;
  const mysql = mysqlErrorIsDeterministic(error);
  if (mysql !== undefined) return mysql;
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
