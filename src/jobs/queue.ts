import { randomUUID } from 'node:crypto';
import PgBoss from 'pg-boss';
import type { PGlite } from '@electric-sql/pglite';
import type { MikroORM } from '@mikro-orm/postgresql';
import { AppError } from '../app-error.ts';
import { createEmbeddedPool } from '../db/embedded.ts';
import type { Logger } from '../logger.ts';
import type { JobRunStatus } from './job-run.entity.ts';

/**
 * The job queue of long work (materialize, export, hypothesis test, monitoring run).
 *
 * pg-boss schedules, retries (with exponential backoff) and hands jobs to workers in any API
 * process; the `job_runs` table is the record routes read: tenant, status, progress, result, error,
 * retry count, times. A run's id is also its pg-boss job id and the job's data is only that id, so
 * the row is the single source of truth and survives restarts and pg-boss's retention.
 *
 * Singleton keys: at most one queued-or-running run per (organization, kind, singleton key), enforced
 * by a partial unique index, so it holds across processes. Enqueueing while one is active returns
 * that run with `created: false` (idempotent: a double-clicked "materialize" shows the run already
 * under way) instead of an error; a route that wants 409 can turn `created: false` into one.
 *
 * Dead workers: pg-boss (v11) only notices a worker that died mid-run when the attempt's expiry
 * (timeoutSeconds, hours for a materialization) has passed. So a running attempt beats on its row
 * (`updated_at`) every quarter of `heartbeatTimeoutSeconds`, and every process sweeps for running
 * rows that missed their beats for longer: it claims the row back to queued (or failed on the last
 * attempt) and fails the pg-boss job, which pg-boss then retries. Every write of an attempt names
 * its retry count, so an attempt that was taken over (or cancelled) can no longer write its row;
 * its next beat finds that and aborts it: a run completes once.
 *
 * Embedded database: pg-boss runs on the same PGlite instance through a `db` adapter that takes the
 * same mutex as MikroORM, so its polling never interleaves with an open transaction. It follows that
 * a job handler (or any code) holding a transaction on the embedded database must not call
 * `enqueue`/`progress` before the transaction ends: both wait for the mutex the transaction holds.
 */

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

export interface EnqueueResult {
  run: JobRunView;
  /** false when an active run with the same singleton key was returned instead. */
  created: boolean;
}

export interface ListRunsOptions {
  workspaceId?: string;
  kind?: string;
  status?: JobRunStatus;
  limit?: number;
  offset?: number;
}

export interface JobQueue {
  register<P extends Record<string, unknown>>(
    kind: string,
    handler: JobHandler<P>,
    options?: JobKindOptions,
  ): Promise<void>;
  enqueue(kind: string, payload: Record<string, unknown>, options: EnqueueOptions): Promise<EnqueueResult>;
  /** The run if it belongs to the organization; null otherwise (answer 404 either way). */
  getRun(id: string, organizationId: string): Promise<JobRunView | null>;
  listRuns(organizationId: string, options?: ListRunsOptions): Promise<JobRunView[]>;
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

export class JobCancelledError extends Error {
  constructor(runId: string) {
    super(`Run ${runId} was cancelled`);
    this.name = 'JobCancelledError';
  }
}

export type JobQueueConnection = { embedded: PGlite } | { connectionString: string };

export interface JobQueueDeps {
  orm: MikroORM;
  logger: Logger;
  connection: JobQueueConnection;
  /** How often idle workers look for work (≥ 0.5); local enqueues wake local workers at once. */
  pollingIntervalSeconds?: number;
  /** How long stop() lets running handlers finish before failing them over to a retry. */
  stopTimeoutMs?: number;
  /** A running attempt whose row has not been beaten on for this long has lost its worker (≥ 2). */
  heartbeatTimeoutSeconds?: number;
}

const KIND_DEFAULTS: Required<JobKindOptions> = {
  retryLimit: 2,
  retryDelaySeconds: 5,
  retryBackoff: true,
  retryDelayMaxSeconds: 300,
  timeoutSeconds: 3600,
  concurrency: 1,
};

const MAX_ERROR_LENGTH = 4000;
const DEFAULT_HEARTBEAT_TIMEOUT_SECONDS = 60;
const MAX_LIST = 500;

const asDate = (v: unknown) => (v == null ? null : v instanceof Date ? v : new Date(v as string));

function toView(row: Record<string, any>): JobRunView {
  const startedAt = asDate(row.started_at);
  const finishedAt = asDate(row.finished_at);
  return {
    id: row.id,
    organization_id: row.organization_id,
    workspace_id: row.workspace_id ?? null,
    kind: row.kind,
    status: row.status,
    singleton_key: row.singleton_key ?? null,
    payload: row.payload ?? {},
    progress: row.progress ?? {},
    result: row.result ?? null,
    error: row.error ?? null,
    retry_count: Number(row.retry_count),
    started_at: startedAt,
    finished_at: finishedAt,
    created_at: asDate(row.created_at)!,
    updated_at: asDate(row.updated_at)!,
    duration_ms: startedAt && finishedAt ? finishedAt.getTime() - startedAt.getTime() : null,
  };
}

function errorMessage(error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  return message.length > MAX_ERROR_LENGTH ? `${message.slice(0, MAX_ERROR_LENGTH)}…` : message;
}

/** pg-boss's `db` adapter over the embedded database: one statement at a time, MikroORM's mutex. */
function embeddedBossDb(pg: PGlite) {
  const pool = createEmbeddedPool(pg);
  return {
    async executeSql(text: string, values?: unknown[]): Promise<{ rows: any[] }> {
      const client = await pool.connect();
      try {
        return (await client.query(text, values ?? [])) as { rows: any[] };
      } finally {
        client.release();
      }
    },
  };
}

interface Registration {
  handler: JobHandler<any>;
  options: Required<JobKindOptions>;
  workerIds: string[];
}

interface InFlight {
  controller: AbortController;
  final: boolean;
}

export function createJobQueue(deps: JobQueueDeps): JobQueue {
  const { orm, logger } = deps;
  const boss = new PgBoss({
    ...('embedded' in deps.connection
      ? { db: embeddedBossDb(deps.connection.embedded) }
      : { connectionString: deps.connection.connectionString, max: 4 }),
    application_name: 'dimas-jobs',
    // No cron schedules yet; pg-boss's supervisor still expires stuck jobs and purges old ones.
    schedule: false,
    supervise: true,
  });
  boss.on('error', (error) => logger.error({ err: error }, 'job queue error'));

  const registrations = new Map<string, Registration>();
  const inFlight = new Map<string, InFlight>();
  let state: 'created' | 'started' | 'stopped' = 'created';
  const pollingIntervalSeconds = Math.max(0.5, deps.pollingIntervalSeconds ?? 1);
  const heartbeatTimeoutSeconds = Math.max(
    2,
    deps.heartbeatTimeoutSeconds ?? DEFAULT_HEARTBEAT_TIMEOUT_SECONDS,
  );
  let sweepTimer: NodeJS.Timeout | undefined;
  let sweeping: Promise<void> | undefined;

  const sql = async (query: string, params: unknown[] = []): Promise<Record<string, any>[]> =>
    orm.em.fork().getConnection().execute(query, params);

  async function runAttempt(kind: string, job: PgBoss.JobWithMetadata<{ runId: string }>): Promise<unknown> {
    const registration = registrations.get(kind)!;
    const runId = job.data.runId;
    const [row] = await sql(
      `update job_runs set status = 'running', started_at = coalesce(started_at, now()), retry_count = ?,
              updated_at = now()
       where id = ? and status in ('queued', 'running') returning *`,
      [job.retryCount, runId],
    );
    // Cancelled (or deleted with its organization) while it waited: nothing to do.
    if (!row) return null;
    const attempt = job.retryCount;
    const flight: InFlight = { controller: new AbortController(), final: attempt >= job.retryLimit };
    inFlight.set(runId, flight);
    const heartbeat = setInterval(
      () => {
        sql(
          `update job_runs set updated_at = now() where id = ? and status = 'running' and retry_count = ? returning id`,
          [runId, attempt],
        ).then(
          (beaten) => {
            if (beaten.length === 0) flight.controller.abort();
          },
          // The database is unreachable: the attempt's own statements fail too; the next beat retries.
          (error) => logger.debug({ err: error, runId }, 'job run heartbeat failed'),
        );
      },
      (heartbeatTimeoutSeconds * 1000) / 4,
    );
    const context: JobContext = {
      runId,
      organizationId: row.organization_id,
      workspaceId: row.workspace_id ?? null,
      attempt: job.retryCount + 1,
      signal: flight.controller.signal,
      async progress(progress) {
        const updated = await sql(
          `update job_runs set progress = ?::jsonb, updated_at = now()
           where id = ? and status = 'running' and retry_count = ? returning id`,
          [JSON.stringify(progress), runId, attempt],
        );
        if (updated.length === 0) {
          flight.controller.abort();
          throw new JobCancelledError(runId);
        }
      },
    };
    logger.info({ runId, kind, attempt: context.attempt }, 'job run started');
    try {
      const result = await registration.handler(row.payload ?? {}, context);
      await sql(
        `update job_runs set status = 'succeeded', result = ?::jsonb, error = null, finished_at = now(), updated_at = now()
         where id = ? and status = 'running' and retry_count = ?`,
        [result ? JSON.stringify(result) : null, runId, attempt],
      );
      logger.info({ runId, kind }, 'job run succeeded');
      return null;
    } catch (error) {
      if (error instanceof JobCancelledError) return null;
      const message = errorMessage(error);
      // A failure that would repeat (bad SQL, a duplicate key) ends the run now: no retry.
      const permanent = error instanceof PermanentJobError;
      const final = flight.final || permanent;
      // With retries left the run waits for the next attempt (still active: the singleton holds).
      await sql(
        `update job_runs set status = ?, error = ?, finished_at = case when ? then now() end, updated_at = now()
         where id = ? and status = 'running' and retry_count = ?`,
        [final ? 'failed' : 'queued', message, final, runId, attempt],
      );
      logger.warn({ runId, kind, attempt: context.attempt, err: error }, 'job run attempt failed');
      // Completing the pg-boss job (instead of failing it) is what stops its retries.
      if (permanent) return null;
      throw error;
    } finally {
      clearInterval(heartbeat);
      inFlight.delete(runId);
    }
  }

  /**
   * Running rows whose worker stopped beating (killed, or cut off from the database for longer than
   * the timeout): the row goes back to queued (failed after the last attempt) in one conditional
   * update, so one process claims it, and the pg-boss job is failed so that pg-boss retries it.
   */
  async function sweepDeadAttempts(): Promise<void> {
    const stale = await sql(
      `select id, kind, retry_count from job_runs
       where status = 'running' and updated_at < now() - ? * interval '1 second'`,
      [heartbeatTimeoutSeconds],
    );
    for (const row of stale) {
      const registration = registrations.get(row.kind);
      if (!registration || inFlight.has(row.id)) continue;
      const final = Number(row.retry_count) >= registration.options.retryLimit;
      const message = `Interrupted: its worker stopped responding for more than ${heartbeatTimeoutSeconds} s`;
      const [claimed] = await sql(
        `update job_runs set status = ?, error = ?, finished_at = case when ? then now() end, updated_at = now()
         where id = ? and status = 'running' and retry_count = ?
           and updated_at < now() - ? * interval '1 second'
         returning id`,
        [final ? 'failed' : 'queued', message, final, row.id, row.retry_count, heartbeatTimeoutSeconds],
      );
      if (!claimed) continue;
      logger.warn({ runId: row.id, kind: row.kind, final }, 'job run lost its worker');
      const job = await boss.getJobById(row.kind, row.id);
      if (job?.state === 'active') await boss.fail(row.kind, row.id, { message });
      else if (!job || ['completed', 'cancelled', 'failed'].includes(job.state))
        // pg-boss will not hand the job out again: the row must not wait for it.
        await sql(
          `update job_runs set status = 'failed', finished_at = now(), updated_at = now()
           where id = ? and status = 'queued'`,
          [row.id],
        );
    }
  }

  function scheduleSweeps(): void {
    const sweep = () => {
      sweeping = sweepDeadAttempts()
        .catch((error) => logger.warn({ err: error }, 'sweeping for dead job runs failed'))
        .finally(() => {
          if (state === 'started')
            sweepTimer = setTimeout(sweep, (heartbeatTimeoutSeconds * 1000) / 2).unref();
        });
    };
    sweep();
  }

  async function setUpKind(kind: string, registration: Registration): Promise<void> {
    const { options } = registration;
    const queueOptions = {
      retryLimit: options.retryLimit,
      retryDelay: options.retryDelaySeconds,
      retryBackoff: options.retryBackoff,
      ...(options.retryBackoff ? { retryDelayMax: options.retryDelayMaxSeconds } : {}),
      expireInSeconds: options.timeoutSeconds,
    };
    await boss.createQueue(kind, { policy: 'standard', ...queueOptions });
    // createQueue keeps an existing queue as it is; options changed in code apply through update.
    await boss.updateQueue(kind, queueOptions);
    for (let i = 0; i < options.concurrency; i++) {
      const workerId = await boss.work<{ runId: string }>(
        kind,
        { includeMetadata: true, batchSize: 1, pollingIntervalSeconds },
        async ([job]) => runAttempt(kind, job),
      );
      registration.workerIds.push(workerId);
    }
  }

  function assertStarted(): void {
    if (state !== 'started') throw new AppError('SERVICE_UNAVAILABLE', 'The job queue is not running');
  }

  return {
    async register(kind, handler, options = {}) {
      if (registrations.has(kind)) throw new Error(`Job kind ${kind} is already registered`);
      if (!/^[\w.-]+$/.test(kind)) throw new Error(`Job kind ${kind} must use letters, digits, _, . and -`);
      const registration: Registration = {
        handler: handler as JobHandler<any>,
        options: { ...KIND_DEFAULTS, ...options },
        workerIds: [],
      };
      registrations.set(kind, registration);
      if (state === 'started') await setUpKind(kind, registration);
    },

    async enqueue(kind, payload, options) {
      assertStarted();
      const registration = registrations.get(kind);
      if (!registration) throw new Error(`Job kind ${kind} is not registered`);
      const singletonKey = options.singletonKey ?? null;
      let run: JobRunView | undefined;
      // The active run may finish between the refused insert and the look-up: then insert again.
      for (let attempt = 0; attempt < 3 && !run; attempt++) {
        const [inserted] = await sql(
          `insert into job_runs (id, organization_id, workspace_id, kind, status, singleton_key, payload, progress,
                                 retry_count, created_at, updated_at)
           values (?, ?, ?, ?, 'queued', ?, ?::jsonb, '{}'::jsonb, 0, now(), now())
           on conflict (organization_id, kind, singleton_key)
             where status in ('queued', 'running') and singleton_key is not null
           do nothing
           returning *`,
          [
            randomUUID(),
            options.organizationId,
            options.workspaceId ?? null,
            kind,
            singletonKey,
            JSON.stringify(payload),
          ],
        );
        if (inserted) {
          run = toView(inserted);
          break;
        }
        const [active] = await sql(
          `select * from job_runs where organization_id = ? and kind = ? and singleton_key = ?
             and status in ('queued', 'running')`,
          [options.organizationId, kind, singletonKey],
        );
        if (active) return { run: toView(active), created: false };
      }
      if (!run)
        throw new AppError('CONFLICT', `A run of ${kind} for ${singletonKey} is changing state; try again`);
      try {
        await boss.send(kind, { runId: run.id }, { id: run.id });
      } catch (error) {
        await sql(
          `update job_runs set status = 'failed', error = ?, finished_at = now(), updated_at = now() where id = ?`,
          [`The run could not be queued: ${errorMessage(error)}`, run.id],
        );
        throw error;
      }
      for (const workerId of registration.workerIds) boss.notifyWorker(workerId);
      return { run, created: true };
    },

    async getRun(id, organizationId) {
      if (!/^[0-9a-f-]{36}$/i.test(id)) return null;
      const [row] = await sql(`select * from job_runs where id = ? and organization_id = ?`, [
        id,
        organizationId,
      ]);
      return row ? toView(row) : null;
    },

    async listRuns(organizationId, options = {}) {
      const where = ['organization_id = ?'];
      const params: unknown[] = [organizationId];
      const filters: [string, unknown][] = [
        ['workspace_id', options.workspaceId],
        ['kind', options.kind],
        ['status', options.status],
      ];
      for (const [column, value] of filters) {
        if (value === undefined) continue;
        where.push(`${column} = ?`);
        params.push(value);
      }
      params.push(Math.min(options.limit ?? 100, MAX_LIST), options.offset ?? 0);
      const rows = await sql(
        `select * from job_runs where ${where.join(' and ')} order by created_at desc, id limit ? offset ?`,
        params,
      );
      return rows.map(toView);
    },

    async cancel(id, organizationId) {
      if (!/^[0-9a-f-]{36}$/i.test(id)) return null;
      const [row] = await sql(
        `update job_runs set status = 'cancelled', finished_at = now(), updated_at = now()
         where id = ? and organization_id = ? and status in ('queued', 'running') returning *`,
        [id, organizationId],
      );
      if (!row) {
        const [existing] = await sql(`select * from job_runs where id = ? and organization_id = ?`, [
          id,
          organizationId,
        ]);
        return existing ? toView(existing) : null;
      }
      inFlight.get(id)?.controller.abort();
      if (state === 'started') {
        // A job another process is working on stays active there until its handler notices.
        await boss
          .cancel(row.kind, id)
          .catch((error) => logger.warn({ err: error, runId: id }, 'pg-boss cancel'));
      }
      return toView(row);
    },

    async start() {
      if (state !== 'created') return;
      await boss.start();
      state = 'started';
      for (const [kind, registration] of registrations) await setUpKind(kind, registration);
      scheduleSweeps();
    },

    async stop() {
      if (state !== 'started') {
        state = 'stopped';
        return;
      }
      state = 'stopped';
      clearTimeout(sweepTimer);
      await sweeping;
      await boss.stop({ graceful: true, timeout: deps.stopTimeoutMs ?? 10_000, close: true });
      // Handlers that outlived the grace period: pg-boss failed their jobs over to a retry (or to
      // failed on the last attempt); the rows say the same, and the handlers are asked to stop.
      for (const [runId, flight] of inFlight) {
        flight.controller.abort();
        await sql(
          `update job_runs set status = ?, error = 'Interrupted: the server shut down during the run',
                  finished_at = case when ? then now() end, updated_at = now()
           where id = ? and status = 'running'`,
          [flight.final ? 'failed' : 'queued', flight.final, runId],
        ).catch((error) => logger.warn({ err: error, runId }, 'could not record an interrupted run'));
      }
      inFlight.clear();
    },
  };
}
