import { randomUUID } from 'node:crypto';
import PgBoss from 'pg-boss';
import { CompiledQuery, type Transaction } from 'kysely';
import type { PGlite } from '@electric-sql/pglite';
import { LockMode, raw, UniqueConstraintViolationException, type FilterQuery } from '@mikro-orm/core';
import type { EntityManager, MikroORM } from '@mikro-orm/postgresql';
import { AppError } from '../app-error.ts';
import { createEmbeddedPool } from '../db/embedded.ts';
import type { Logger } from '../logger.ts';
import { JobRun, type JobRunEntity, type JobRunStatus } from './job-run.entity.ts';
import {
  ACTIVE_RUN_STATUSES,
  JobCancelledError,
  PermanentJobError,
  type EnqueueOptions,
  type JobContext,
  type JobHandler,
  type JobKindOptions,
  type JobQueue,
  type JobRunView,
} from './job-types.ts';

export * from './job-types.ts';

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
  /** How often pg-boss looks for due cron ticks (1–45; pg-boss's default 30). Tests shorten it. */
  cronCheckSeconds?: number;
  /**
   * Runs of one kind this process works on at once, for kinds that set no `concurrency` of their own
   * (default 1): one tenant's long export or materialization then leaves workers to the others.
   */
  concurrency?: number;
  /**
   * Finished runs older than this many days are deleted by an hourly sweep, except those still needed
   * (see `deleteExpiredRuns`); 0 or unset keeps every run.
   */
  retentionDays?: number;
}

type KindSettings = Required<Omit<JobKindOptions, 'onAbandoned' | 'retain'>>;

const KIND_DEFAULTS: KindSettings = {
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

/** The queue's own periodic work: deleting expired runs (hourly, off the hour's busy first minute). */
const RETENTION_SCHEDULE = 'job-runs-retention';
const RETENTION_CRON = '17 * * * *';
/** Runs one statement of the sweep looks at: each batch deletes and locks at most these. */
const RETENTION_BATCH = 1000;
/** A sweep stops after this long (its tick times out at 15 minutes); the next tick carries on. */
const RETENTION_BUDGET_MS = 10 * 60_000;
const FINISHED = `status not in (${ACTIVE_RUN_STATUSES.map((s) => `'${s}'`).join(', ')})`;
/**
 * For a kind's `retain.where`: a run of the same organization, kind and singleton key as `run`,
 * created after it, holds `condition` (on `later`).
 */
export function laterRunOfItsKey(condition: string): string {
  return `exists (
  select 1 from job_runs later
   where later.organization_id = run.organization_id and later.kind = run.kind
     and later.singleton_key = run.singleton_key and later.created_at > run.created_at
     and ${condition})`;
}

/**
 * What the queue keeps of every kind: the newest finished run of each singleton key in its
 * organization, which a key's "latest run" shows (a mapping's materialization, a workspace's source
 * load or identity build) and which the monitoring schedule compares against to see what is due.
 */
const NEWEST_OF_ITS_KEY = `(run.singleton_key is not null and not ${laterRunOfItsKey(`later.${FINISHED}`)})`;

/** The SQL condition on `run` under which the sweep keeps a finished run of a kind. */
function retainedWhen(retain: JobKindOptions['retain'] = {}): string {
  const named = (retain.namedBy ?? []).map((table) => {
    if (!/^[a-z_][a-z0-9_]*$/.test(table)) throw new Error(`retain.namedBy: ${table} is not a table name`);
    return `exists (select 1 from "${table}" t where t.last_run_id = run.id and t.organization_id = run.organization_id)`;
  });
  return [NEWEST_OF_ITS_KEY, ...named, ...(retain.where ? [`(${retain.where})`] : [])].join(' or ');
}

/** The database's clock for every time the queue compares (heartbeats against the sweep's now()). */
const now = () => raw('now()');

function toView(run: JobRunEntity): JobRunView {
  const { startedAt, finishedAt } = run;
  return {
    id: run.id,
    organization_id: run.organizationId,
    workspace_id: run.workspaceId ?? null,
    kind: run.kind,
    status: run.status as JobRunStatus,
    singleton_key: run.singletonKey ?? null,
    payload: run.payload ?? {},
    progress: run.progress ?? {},
    result: run.result ?? null,
    error: run.error ?? null,
    retry_count: run.retryCount,
    started_at: startedAt ?? null,
    finished_at: finishedAt ?? null,
    created_at: run.createdAt,
    updated_at: run.updatedAt,
    duration_ms: startedAt && finishedAt ? finishedAt.getTime() - startedAt.getTime() : null,
  };
}

/** pg-boss's `db` adapter over an open MikroORM transaction: its statements join that transaction. */
function transactionBossDb(em: EntityManager) {
  const trx = em.getTransactionContext<Transaction<any>>();
  if (!trx) throw new Error('transactionBossDb needs an entity manager inside a transaction');
  return {
    async executeSql(text: string, values?: unknown[]): Promise<{ rows: any[] }> {
      const result = await trx.executeQuery(CompiledQuery.raw(text, values ?? []));
      return { rows: result.rows as any[] };
    },
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
  options: KindSettings;
  onAbandoned?: JobKindOptions['onAbandoned'];
  /** `retainedWhen` of the kind's `retain`. */
  retainedWhen: string;
  workerIds: string[];
}

interface Schedule {
  cron: string;
  handler: () => Promise<void>;
  timeoutSeconds: number;
}

interface InFlight {
  controller: AbortController;
  final: boolean;
  registration: Registration;
  row: Pick<JobRunEntity, 'id' | 'organizationId' | 'payload'>;
  retryCount: number;
}

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
 * A run and its pg-boss job are written in one transaction (pg-boss's `send` runs its insert on the
 * transaction's connection): a failure or a crash between the two leaves neither, never a queued row
 * that no worker will ever take.
 *
 * Periodic work (`schedule`) goes through pg-boss's cron: every process keeps the schedule, pg-boss
 * lets one of them turn each tick into one job, and one worker in the cluster runs it. Such ticks
 * have no run row: they are the queue's own housekeeping, not a tenant's run.
 *
 * Retention: finished runs older than `retentionDays` (JOB_RUNS_RETENTION_DAYS) are deleted by an
 * hourly sweep, one of the queue's schedules, across organizations, in batches of a bounded size. It
 * keeps what is still read: active runs, the newest finished run of each singleton key, and what each
 * kind says it needs at `register` (`retain`: the tables whose `last_run_id` names its runs, and a
 * condition of its own), so the rule sits beside the code that reads the runs rather than in a list
 * here. Only the kinds registered in the sweeping process are swept: a run of a kind it does not know
 * may be needed by code it does not have.
 *
 * Embedded database: pg-boss runs on the same PGlite instance through a `db` adapter that takes the
 * same mutex as MikroORM, so its polling never interleaves with an open transaction. It follows that
 * a job handler (or any code) holding a transaction on the embedded database must not call
 * `enqueue`/`progress` before the transaction ends: both wait for the mutex the transaction holds.
 * For the same reason `getRun`/`listRuns` take the caller's entity manager: a request that reads a
 * run inside its own transaction reads it on that connection rather than waiting for a second one.
 */
export function createJobQueue(deps: JobQueueDeps): JobQueue {
  const { orm, logger } = deps;
  const boss = new PgBoss({
    ...('embedded' in deps.connection
      ? { db: embeddedBossDb(deps.connection.embedded) }
      : { connectionString: deps.connection.connectionString, max: 4 }),
    application_name: 'dimas-jobs',
    // Cron ticks for `schedule`; the supervisor expires stuck jobs and purges old ones.
    schedule: true,
    supervise: true,
    ...(deps.cronCheckSeconds
      ? {
          cronMonitorIntervalSeconds: deps.cronCheckSeconds,
          cronWorkerIntervalSeconds: deps.cronCheckSeconds,
        }
      : {}),
  });
  boss.on('error', (error) => logger.error({ err: error }, 'job queue error'));

  const registrations = new Map<string, Registration>();
  const schedules = new Map<string, Schedule>();
  const inFlight = new Map<string, InFlight>();
  let state: 'created' | 'started' | 'stopped' = 'created';
  const pollingIntervalSeconds = Math.max(0.5, deps.pollingIntervalSeconds ?? 1);
  const heartbeatTimeoutSeconds = Math.max(
    2,
    deps.heartbeatTimeoutSeconds ?? DEFAULT_HEARTBEAT_TIMEOUT_SECONDS,
  );
  let sweepTimer: NodeJS.Timeout | undefined;
  let sweeping: Promise<void> | undefined;
  const retentionDays = deps.retentionDays ?? 0;
  schedules.set(RETENTION_SCHEDULE, {
    cron: RETENTION_CRON,
    handler: async () => void (await deleteExpiredRuns()),
    timeoutSeconds: 15 * 60,
  });

  const fork = () => orm.em.fork() as EntityManager;
  /** Conditional update of one run; the number of rows it changed (0: the condition no longer held). */
  const updateRun = (where: FilterQuery<JobRunEntity>, data: Record<string, unknown>) =>
    fork().nativeUpdate(JobRun, where, { ...data, updatedAt: now() } as never);
  const findRun = (em: EntityManager, where: FilterQuery<JobRunEntity>) =>
    em.findOne(JobRun, where, { disableIdentityMap: true });

  async function runAttempt(kind: string, job: PgBoss.JobWithMetadata<{ runId: string }>): Promise<unknown> {
    const registration = registrations.get(kind)!;
    const runId = job.data.runId;
    const attempt = job.retryCount;
    const claimed = await updateRun(
      { id: runId, status: { $in: ACTIVE_RUN_STATUSES } },
      { status: 'running', startedAt: raw('coalesce(started_at, now())'), retryCount: attempt },
    );
    // Cancelled (or deleted with its organization) while it waited: nothing to do.
    const row = claimed ? await findRun(fork(), { id: runId }) : null;
    if (!row) return null;
    // The attempt's rows: running, or succeeded once its handler passed the point of no return.
    const own: { id: string; status: 'running' | 'succeeded'; retryCount: number } = {
      id: runId,
      status: 'running',
      retryCount: attempt,
    };
    const flight: InFlight = {
      controller: new AbortController(),
      final: attempt >= job.retryLimit,
      registration,
      row,
      retryCount: attempt,
    };
    inFlight.set(runId, flight);
    const heartbeat = setInterval(
      () => {
        updateRun(own, {}).then(
          (beaten) => {
            if (beaten === 0) flight.controller.abort();
          },
          // The database is unreachable: the attempt's own statements fail too; the next beat retries.
          (error) => logger.debug({ err: error, runId }, 'job run heartbeat failed'),
        );
      },
      (heartbeatTimeoutSeconds * 1000) / 4,
    );
    const context: JobContext = {
      runId,
      organizationId: row.organizationId,
      workspaceId: row.workspaceId ?? null,
      attempt: attempt + 1,
      signal: flight.controller.signal,
      async progress(progress) {
        if ((await updateRun(own, { progress })) === 0) {
          flight.controller.abort();
          throw new JobCancelledError(runId);
        }
      },
      async succeed({ progress, alongside } = {}) {
        if (own.status === 'succeeded') return;
        const claimed = await fork().transactional(async (em) => {
          const changed = await em.nativeUpdate(JobRun, own, {
            status: 'succeeded',
            error: null,
            finishedAt: now(),
            updatedAt: now(),
            ...(progress ? { progress } : {}),
          } as never);
          if (changed === 0) return false;
          await alongside?.(em);
          return true;
        });
        if (!claimed) {
          flight.controller.abort();
          throw new JobCancelledError(runId);
        }
        own.status = 'succeeded';
      },
      async recordLastProgress(progress) {
        // A cancel ends the row's status, not the attempt's claim on it: the retry count still names
        // this attempt until another one claims the row. So does the queue ending it failed under a
        // handler still at work (a sweep that took its worker for dead, a stop past its grace
        // period): what the attempt says it leaves is better known than what the sweep inferred.
        const statuses = [own.status, 'cancelled', 'failed'] as JobRunStatus[];
        return (await updateRun({ ...own, status: { $in: statuses } }, { progress })) > 0;
      },
    };
    logger.info({ runId, kind, attempt: context.attempt }, 'job run started');
    try {
      const result = await registration.handler(row.payload ?? {}, context);
      await updateRun(own, {
        status: 'succeeded',
        result: result ?? null,
        error: null,
        ...(own.status === 'running' ? { finishedAt: now() } : {}),
      });
      logger.info({ runId, kind }, 'job run succeeded');
      return null;
    } catch (error) {
      if (error instanceof JobCancelledError) return null;
      const message = errorMessage(error);
      // A failure that would repeat (bad SQL, a duplicate key) ends the run now: no retry.
      // Past the point of no return the run cannot go back to the queue.
      const permanent = error instanceof PermanentJobError || own.status === 'succeeded';
      const final = flight.final || permanent;
      // With retries left the run waits for the next attempt (still active: the singleton holds).
      await updateRun(own, {
        status: final ? 'failed' : 'queued',
        error: message,
        finishedAt: final ? now() : null,
      });
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
   * update, so one process claims it, and the pg-boss job is failed so that pg-boss retries it. A
   * run ended failed here was never ended by its handler: the kind's `onAbandoned` records it.
   */
  async function sweepDeadAttempts(): Promise<void> {
    const missedBeats = () => ({
      $lt: raw(`now() - ? * interval '1 second'`, [heartbeatTimeoutSeconds]),
    });
    const stale = await fork().find(
      JobRun,
      { status: 'running', updatedAt: missedBeats() },
      { fields: ['id', 'kind', 'retryCount', 'organizationId', 'payload'], disableIdentityMap: true },
    );
    for (const row of stale) {
      const registration = registrations.get(row.kind);
      if (!registration || inFlight.has(row.id)) continue;
      const final = row.retryCount >= registration.options.retryLimit;
      const message = `Interrupted: its worker stopped responding for more than ${heartbeatTimeoutSeconds} s`;
      const attempt = { id: row.id, status: 'running', retryCount: row.retryCount, updatedAt: missedBeats() };
      const claimed = final
        ? await endAbandoned(registration, row, attempt, message)
        : (await updateRun(attempt, { status: 'queued', error: message, finishedAt: null })) > 0;
      if (!claimed) continue;
      logger.warn({ runId: row.id, kind: row.kind, final }, 'job run lost its worker');
      const job = await boss.getJobById(row.kind, row.id);
      if (job?.state === 'active') await boss.fail(row.kind, row.id, { message });
      else if (!final && (!job || ['completed', 'cancelled', 'failed'].includes(job.state)))
        // pg-boss will not hand the job out again: the row must not wait for it. Its progress is
        // still the dead attempt's (queued, no attempt claimed it since).
        await endAbandoned(
          registration,
          row,
          { id: row.id, status: 'queued', retryCount: row.retryCount },
          message,
        );
    }
  }

  /**
   * Ends an abandoned run failed while `where` (its dead attempt's row) holds, with the kind's
   * `onAbandoned` in the same transaction: the row is locked first, the hook records the failure in
   * its area and says what progress the run ends with, and one conditional update ends the run with
   * it. A hook that fails takes its writes with it; the run still ends, with its progress as it was.
   * Whether this call ended the run.
   */
  async function endAbandoned(
    registration: Registration,
    row: Pick<JobRunEntity, 'id' | 'organizationId' | 'payload'>,
    where: FilterQuery<JobRunEntity>,
    message: string,
  ): Promise<boolean> {
    const end = { status: 'failed', error: message, finishedAt: now(), updatedAt: now() };
    const hook = registration.onAbandoned;
    if (hook) {
      try {
        return await fork().transactional(async (em) => {
          const locked = await em.findOne(JobRun, where, {
            lockMode: LockMode.PESSIMISTIC_WRITE,
            disableIdentityMap: true,
          });
          if (!locked) return false;
          const progress = await hook(
            {
              runId: row.id,
              organizationId: row.organizationId,
              payload: row.payload ?? {},
              progress: locked.progress ?? {},
              error: message,
            },
            em,
          );
          const changed = await em.nativeUpdate(JobRun, where, {
            ...end,
            ...(progress ? { progress } : {}),
          } as never);
          return changed > 0;
        });
      } catch (error) {
        logger.warn({ err: error, runId: row.id }, 'recording an abandoned run failed');
      }
    }
    return (await updateRun(where, end)) > 0;
  }

  /**
   * One kind's finished runs that ended before `cutoff`, in batches taken in the order they ended: each
   * batch is one statement that deletes those of the batch the kind does not retain, and the next one
   * starts after the last it looked at, so the runs kept are read once per sweep, not once per batch.
   */
  async function deleteExpiredRunsOf(
    kind: string,
    registration: Registration,
    cutoff: string,
    deadline: number,
  ): Promise<number> {
    const em = fork();
    let after = { at: '-infinity', id: '00000000-0000-0000-0000-000000000000' };
    let deleted = 0;
    while (state !== 'stopped' && Date.now() < deadline) {
      const [batch] = (await em.execute(
        `with batch as (
           select id, finished_at from job_runs
            where kind = ? and ${FINISHED} and finished_at < ?::timestamptz
              and (finished_at, id) > (?::timestamptz, ?::uuid)
            order by finished_at, id limit ?
         ), deleted as (
           delete from job_runs run using batch
            where run.id = batch.id and not (${registration.retainedWhen})
           returning run.id
         )
         select (select count(*) from deleted) as deleted, last.finished_at::text as last_at, last.id as last_id
           from (select finished_at, id from batch order by finished_at desc, id desc limit 1) last`,
        [kind, cutoff, after.at, after.id, RETENTION_BATCH],
      )) as { deleted: string | number; last_at: string; last_id: string }[];
      if (!batch) break;
      deleted += Number(batch.deleted);
      after = { at: batch.last_at, id: batch.last_id };
    }
    return deleted;
  }

  async function deleteExpiredRuns(): Promise<number> {
    if (retentionDays <= 0) return 0;
    const deadline = Date.now() + RETENTION_BUDGET_MS;
    const [{ cutoff }] = (await fork().execute(`select (now() - make_interval(days => ?))::text as cutoff`, [
      retentionDays,
    ])) as { cutoff: string }[];
    let deleted = 0;
    for (const [kind, registration] of registrations)
      deleted += await deleteExpiredRunsOf(kind, registration, cutoff, deadline);
    if (deleted > 0) logger.info({ deleted, retentionDays }, 'deleted expired job runs');
    return deleted;
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
    // Fills pg-boss's cache of the queue now: `send` inside an enqueue's transaction must not look the
    // queue up on a connection of its own (on the embedded database that waits for the transaction).
    await boss.getJobById(kind, randomUUID());
    for (let i = 0; i < options.concurrency; i++) {
      const workerId = await boss.work<{ runId: string }>(
        kind,
        { includeMetadata: true, batchSize: 1, pollingIntervalSeconds },
        async ([job]) => runAttempt(kind, job),
      );
      registration.workerIds.push(workerId);
    }
  }

  async function setUpSchedule(name: string, schedule: Schedule): Promise<void> {
    // Stately: at most one tick waiting and one running; ticks that pile up behind a slow one merge.
    const queueOptions = { retryLimit: 0, expireInSeconds: schedule.timeoutSeconds };
    await boss.createQueue(name, { policy: 'stately', ...queueOptions });
    await boss.updateQueue(name, queueOptions);
    await boss.schedule(name, schedule.cron, {}, { tz: 'UTC' });
    await boss.work(name, { batchSize: 1, pollingIntervalSeconds }, async () => {
      try {
        await schedule.handler();
      } catch (error) {
        logger.warn({ err: error, schedule: name }, 'scheduled work failed');
        throw error;
      }
    });
  }

  function assertStarted(): void {
    if (state !== 'started') throw new AppError('SERVICE_UNAVAILABLE', 'The job queue is not running');
  }

  const assertName = (name: string) => {
    if (registrations.has(name) || schedules.has(name))
      throw new Error(`Job kind ${name} is already registered`);
    if (!/^[\w.-]+$/.test(name)) throw new Error(`Job kind ${name} must use letters, digits, _, . and -`);
  };

  /** Inserts the run and its pg-boss job in one transaction; null when the singleton key is taken. */
  async function insertRun(
    kind: string,
    payload: Record<string, unknown>,
    options: EnqueueOptions,
  ): Promise<JobRunEntity | null> {
    try {
      return await fork().transactional(async (tx) => {
        const run = tx.create(JobRun, {
          organizationId: options.organizationId,
          workspaceId: options.workspaceId ?? null,
          kind,
          status: 'queued',
          singletonKey: options.singletonKey ?? null,
          payload,
          progress: {},
          retryCount: 0,
        });
        await tx.flush();
        // Fair order between tenants: a run waits behind every other tenant's runs of its kind that
        // have as many of their tenant's runs ahead of them (pg-boss hands out higher priorities
        // first, then older jobs). Without it one tenant's hundred due exports would hold another
        // tenant's one behind all of them.
        const ahead = await tx.count(JobRun, {
          organizationId: options.organizationId,
          kind,
          status: { $in: ACTIVE_RUN_STATUSES },
          id: { $ne: run.id },
        });
        const jobId = await boss.send(
          kind,
          { runId: run.id },
          { id: run.id, priority: -ahead, db: transactionBossDb(tx) },
        );
        // pg-boss answers null when it kept no job: the row must not stay without one.
        if (!jobId) throw new Error(`The job queue did not accept the run of ${kind}`);
        return run;
      });
    } catch (error) {
      // Another enqueue holds the key (the partial unique index over active runs).
      if (error instanceof UniqueConstraintViolationException && options.singletonKey) return null;
      throw error;
    }
  }

  return {
    async register(kind, handler, options = {}) {
      assertName(kind);
      const { onAbandoned, retain, ...kindOptions } = options;
      const registration: Registration = {
        handler: handler as JobHandler<any>,
        options: { ...KIND_DEFAULTS, concurrency: deps.concurrency ?? 1, ...kindOptions },
        onAbandoned,
        retainedWhen: retainedWhen(retain),
        workerIds: [],
      };
      registrations.set(kind, registration);
      if (state === 'started') await setUpKind(kind, registration);
    },

    async schedule(name, cron, handler, options = {}) {
      assertName(name);
      const schedule: Schedule = { cron, handler, timeoutSeconds: options.timeoutSeconds ?? 15 * 60 };
      schedules.set(name, schedule);
      if (state === 'started') await setUpSchedule(name, schedule);
    },

    async enqueue(kind, payload, options) {
      assertStarted();
      const registration = registrations.get(kind);
      if (!registration) throw new Error(`Job kind ${kind} is not registered`);
      const singletonKey = options.singletonKey ?? null;
      // The active run may finish between the refused insert and the look-up: then insert again.
      for (let attempt = 0; attempt < 3; attempt++) {
        if (singletonKey !== null) {
          const active = await findRun(fork(), {
            organizationId: options.organizationId,
            kind,
            singletonKey,
            status: { $in: ACTIVE_RUN_STATUSES },
          });
          if (active) return { run: toView(active), created: false };
        }
        const run = await insertRun(kind, payload, options);
        if (run) {
          for (const workerId of registration.workerIds) boss.notifyWorker(workerId);
          return { run: toView(run), created: true };
        }
      }
      throw new AppError('CONFLICT', `A run of ${kind} for ${singletonKey} is changing state; try again`);
    },

    async getRun(id, organizationId, em) {
      if (!/^[0-9a-f-]{36}$/i.test(id)) return null;
      const run = await findRun(em ?? fork(), { id, organizationId });
      return run ? toView(run) : null;
    },

    async listRuns(organizationId, options = {}, em) {
      const where: FilterQuery<JobRunEntity> = { organizationId };
      if (options.workspaceId !== undefined) where.workspaceId = options.workspaceId;
      if (options.kind !== undefined) where.kind = options.kind;
      if (options.status !== undefined) where.status = options.status;
      const runs = await (em ?? fork()).find(JobRun, where, {
        orderBy: { createdAt: 'desc', id: 'asc' },
        limit: Math.min(options.limit ?? 100, MAX_LIST),
        offset: options.offset ?? 0,
        disableIdentityMap: true,
      });
      return runs.map(toView);
    },

    async cancel(id, organizationId) {
      if (!/^[0-9a-f-]{36}$/i.test(id)) return null;
      const em = fork();
      const cancelled = await updateRun(
        { id, organizationId, status: { $in: ACTIVE_RUN_STATUSES } },
        { status: 'cancelled', finishedAt: now() },
      );
      const row = await findRun(em, { id, organizationId });
      if (!row || !cancelled) return row ? toView(row) : null;
      inFlight.get(id)?.controller.abort();
      if (state === 'started') {
        // A job another process is working on stays active there until its handler notices.
        await boss
          .cancel(row.kind, id)
          .catch((error) => logger.warn({ err: error, runId: id }, 'pg-boss cancel'));
      }
      return toView(row);
    },

    deleteExpiredRuns,

    async start() {
      if (state !== 'created') return;
      await boss.start();
      state = 'started';
      for (const [kind, registration] of registrations) await setUpKind(kind, registration);
      for (const [name, schedule] of schedules) await setUpSchedule(name, schedule);
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
      // failed on the last attempt); the rows say the same, and the handlers are asked to stop. A last
      // attempt ends as one whose worker died does, with its kind's `onAbandoned`: its handler may
      // not get to record the failure in its area before the process exits.
      const message = 'Interrupted: the server shut down during the run';
      for (const [runId, flight] of inFlight) {
        flight.controller.abort();
        const attempt = { id: runId, status: 'running', retryCount: flight.retryCount };
        await (
          flight.final
            ? endAbandoned(flight.registration, flight.row, attempt, message)
            : updateRun(attempt, { status: 'queued', error: message, finishedAt: null })
        ).catch((error) => logger.warn({ err: error, runId }, 'could not record an interrupted run'));
      }
      inFlight.clear();
    },
  };
}
