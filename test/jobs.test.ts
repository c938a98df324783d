import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { createTenant, unique, until, type Tenant } from './helpers/api.ts';
import type { EntityManager } from '@mikro-orm/postgresql';
import { createJobQueue, type JobContext, type JobQueue, type JobRunView } from '../src/jobs/queue.ts';
import { JobRun } from '../src/jobs/job-run.entity.ts';
import { jobQueueConnection } from '../src/server.ts';

let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let jobs: JobQueue;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
  other = await createTenant(server);
  jobs = server.deps.jobs;
});
afterAll(async () => server?.close());

const org = () => ({ organizationId: tenant.organization.id });

const waitFor = (queue: JobQueue, id: string, done: (run: JobRunView) => boolean) =>
  until(
    `run ${id}`,
    () => queue.getRun(id, tenant.organization.id),
    (run) => !!run && done(run),
  ) as Promise<JobRunView>;

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

describe('job queue', () => {
  it('runs an enqueued job and records progress, result and times', async () => {
    const kind = unique('ok-');
    const seen: unknown[] = [];
    await jobs.register<{ rows: number }>(kind, async (payload, context) => {
      seen.push({ payload, attempt: context.attempt, organizationId: context.organizationId });
      await context.progress({ rows_written: payload.rows / 2 });
      await context.progress({ rows_written: payload.rows });
      return { rows: payload.rows };
    });
    const { run, created } = await jobs.enqueue(kind, { rows: 10 }, org());
    expect(created).toBe(true);
    expect(run).toMatchObject({ kind, status: 'queued', retry_count: 0, payload: { rows: 10 } });
    const done = await waitFor(jobs, run.id, (r) => r.status === 'succeeded');
    expect(done).toMatchObject({
      progress: { rows_written: 10 },
      result: { rows: 10 },
      error: null,
      retry_count: 0,
      organization_id: tenant.organization.id,
      workspace_id: null,
    });
    expect(done.started_at).toBeInstanceOf(Date);
    expect(done.finished_at!.getTime()).toBeGreaterThanOrEqual(done.started_at!.getTime());
    expect(done.duration_ms).toBeGreaterThanOrEqual(0);
    expect(seen).toEqual([{ payload: { rows: 10 }, attempt: 1, organizationId: tenant.organization.id }]);
    // Another organization's id reads like a missing one.
    expect(await jobs.getRun(run.id, other.organization.id)).toBeNull();
    expect(await jobs.getRun('not-a-uuid', tenant.organization.id)).toBeNull();
    const listed = await jobs.listRuns(tenant.organization.id, { kind });
    expect(listed.map((r) => r.id)).toEqual([run.id]);
    expect(await jobs.listRuns(other.organization.id, { kind })).toEqual([]);
  });

  it('retries a failing handler with backoff, then records the failure', async () => {
    const kind = unique('fail-');
    const attempts: { attempt: number; at: number }[] = [];
    await jobs.register(
      kind,
      async (_payload, context) => {
        attempts.push({ attempt: context.attempt, at: Date.now() });
        await context.progress({ attempt: context.attempt });
        throw new Error(`target unreachable (attempt ${context.attempt})`);
      },
      { retryLimit: 2, retryDelaySeconds: 0, retryBackoff: true },
    );
    const { run } = await jobs.enqueue(kind, {}, org());
    const waiting = await waitFor(jobs, run.id, (r) => r.error !== null);
    // Between attempts the run stays active, with the last error visible.
    expect(['queued', 'running', 'failed']).toContain(waiting.status);
    const failed = await waitFor(jobs, run.id, (r) => r.status === 'failed');
    expect(failed).toMatchObject({
      error: 'target unreachable (attempt 3)',
      retry_count: 2,
      progress: { attempt: 3 },
      result: null,
    });
    expect(failed.finished_at).toBeInstanceOf(Date);
    expect(attempts.map((a) => a.attempt)).toEqual([1, 2, 3]);
    // Backoff: pg-boss waits about 2^attempt seconds (with jitter) before each retry.
    expect(attempts[1].at - attempts[0].at).toBeGreaterThanOrEqual(900);
    expect(attempts[2].at - attempts[1].at).toBeGreaterThanOrEqual(1900);
  });

  it('keeps one active run per singleton key and returns it to a second enqueue', async () => {
    const kind = unique('single-');
    const release = gate();
    const started = gate();
    let runs = 0;
    await jobs.register(kind, async () => {
      runs++;
      started.open();
      await release.opened;
      return { done: true };
    });
    const first = await jobs.enqueue(
      kind,
      { table: 'customers' },
      { ...org(), singletonKey: 'ws1:customers' },
    );
    await started.opened;
    const second = await jobs.enqueue(
      kind,
      { table: 'customers' },
      { ...org(), singletonKey: 'ws1:customers' },
    );
    expect(second.created).toBe(false);
    expect(second.run.id).toBe(first.run.id);
    expect(second.run.status).toBe('running');
    // Other keys and other organizations are independent.
    const otherKey = await jobs.enqueue(kind, {}, { ...org(), singletonKey: 'ws1:orders' });
    expect(otherKey.created).toBe(true);
    const otherOrg = await jobs.enqueue(
      kind,
      {},
      { organizationId: other.organization.id, singletonKey: 'ws1:customers' },
    );
    expect(otherOrg.created).toBe(true);
    release.open();
    await waitFor(jobs, first.run.id, (r) => r.status === 'succeeded');
    await waitFor(jobs, otherKey.run.id, (r) => r.status === 'succeeded');
    // Once finished, the key is free again.
    const third = await jobs.enqueue(kind, {}, { ...org(), singletonKey: 'ws1:customers' });
    expect(third.created).toBe(true);
    expect(third.run.id).not.toBe(first.run.id);
    await waitFor(jobs, third.run.id, (r) => r.status === 'succeeded');
    expect(runs).toBe(4);
  });

  it('cancels a running run; the handler sees it at its next progress report', async () => {
    const kind = unique('cancel-');
    const started = gate();
    const release = gate();
    let outcome = '';
    await jobs.register(kind, async (_payload, context) => {
      started.open();
      await release.opened;
      try {
        await context.progress({ step: 2 });
        outcome = 'continued';
      } catch (error) {
        outcome = `${(error as Error).name} aborted=${context.signal.aborted}`;
        throw error;
      }
    });
    const { run } = await jobs.enqueue(kind, {}, { ...org(), singletonKey: 'k' });
    await started.opened;
    expect(await jobs.cancel(run.id, other.organization.id)).toBeNull();
    const cancelled = await jobs.cancel(run.id, tenant.organization.id);
    expect(cancelled?.status).toBe('cancelled');
    release.open();
    await expect.poll(() => outcome).toBe('JobCancelledError aborted=true');
    expect((await jobs.getRun(run.id, tenant.organization.id))?.status).toBe('cancelled');
    // A cancelled run frees its singleton key.
    expect((await jobs.enqueue(kind, {}, { ...org(), singletonKey: 'k' })).created).toBe(true);
  });

  it('a run past its point of no return (succeed) is not cancelled; one cancelled first cannot pass it', async () => {
    const kind = unique('commit-');
    const committed = gate();
    const release = gate();
    const cancelled = gate();
    const outcomes: string[] = [];
    await jobs.register<{ cancelFirst: boolean }>(kind, async (payload, context) => {
      if (payload.cancelFirst) await cancelled.opened;
      try {
        await context.succeed();
      } catch (error) {
        outcomes.push((error as Error).name);
        throw error;
      }
      committed.open();
      if (!payload.cancelFirst) await release.opened;
      // Still able to report after it: the run is its own until the handler returns.
      await context.progress({ step: 'visible' });
      outcomes.push('finished');
      return { files: 1 };
    });
    const late = (await jobs.enqueue(kind, { cancelFirst: false }, org())).run;
    await committed.opened;
    // The cancel comes after the point of no return: it changes nothing.
    expect((await jobs.cancel(late.id, tenant.organization.id))?.status).toBe('succeeded');
    release.open();
    const done = await waitFor(jobs, late.id, () => outcomes.includes('finished'));
    await expect
      .poll(async () => (await jobs.getRun(late.id, tenant.organization.id))?.result)
      .toEqual({ files: 1 });
    expect(done.status).toBe('succeeded');
    expect((await jobs.getRun(late.id, tenant.organization.id))?.progress).toEqual({ step: 'visible' });

    const early = (await jobs.enqueue(kind, { cancelFirst: true }, org())).run;
    await waitFor(jobs, early.id, (r) => r.status === 'running');
    expect((await jobs.cancel(early.id, tenant.organization.id))?.status).toBe('cancelled');
    cancelled.open();
    await expect.poll(() => outcomes).toContain('JobCancelledError');
    expect((await jobs.getRun(early.id, tenant.organization.id))?.status).toBe('cancelled');
  });

  it("records a failing or cancelled attempt's last progress, never over a later attempt's row", async () => {
    const kind = unique('last-');
    const contexts: JobContext[] = [];
    const cancelled = gate();
    const seen: { second?: unknown; stale?: boolean; afterCancel?: boolean } = {};
    await jobs.register<{ cancel: boolean }>(
      kind,
      async (payload, context) => {
        contexts.push(context);
        // What the failing first attempt left, before this one reports.
        if (context.attempt === 2)
          seen.second = (await jobs.getRun(context.runId, context.organizationId))?.progress;
        await context.progress({ rows: 10 });
        if (payload.cancel) {
          await cancelled.opened;
          // progress refuses a cancelled run; the attempt's last word is still recorded.
          await context.progress({ rows: 20 }).catch(() => undefined);
          seen.afterCancel = await context.recordLastProgress({ rows: 0, why: 'rolled back' });
          throw new Error('cancelled');
        }
        if (context.attempt === 1) {
          expect(await context.recordLastProgress({ rows: 0, attempt: 1 })).toBe(true);
          throw new Error('first attempt fails');
        }
        // The first attempt's context, after this attempt claimed the row: it must not write over it.
        seen.stale = await contexts[0].recordLastProgress({ rows: 0, attempt: 'stale' });
        await context.progress({ rows: 10, attempt: 2 });
      },
      { retryLimit: 1, retryDelaySeconds: 1, retryBackoff: false },
    );
    const retried = (await jobs.enqueue(kind, { cancel: false }, org())).run;
    const done = await waitFor(jobs, retried.id, (r) => r.status === 'succeeded');
    expect(seen.second).toEqual({ rows: 0, attempt: 1 });
    expect(seen.stale).toBe(false);
    expect(done.progress).toEqual({ rows: 10, attempt: 2 });

    const paused = (await jobs.enqueue(kind, { cancel: true }, org())).run;
    await waitFor(jobs, paused.id, (r) => r.progress.rows === 10);
    expect((await jobs.cancel(paused.id, tenant.organization.id))?.status).toBe('cancelled');
    cancelled.open();
    await expect.poll(() => seen.afterCancel).toBe(true);
    const ended = await jobs.getRun(paused.id, tenant.organization.id);
    expect(ended).toMatchObject({ status: 'cancelled', progress: { rows: 0, why: 'rolled back' } });
  });

  it("ends a run whose worker died with the progress its kind's onAbandoned gives, committed with what the hook writes", async () => {
    const kind = unique('dead-');
    const marks = unique('abandoned_marks_');
    const em = server.deps.orm.em.fork() as EntityManager;
    await em.execute(`create table ${marks} (run_id uuid primary key)`);
    const calls: { runId: string; progress: unknown; error: string }[] = [];
    const connection = jobQueueConnection(server.db);
    // Two processes sweep for the same dead workers.
    const queues = [0, 1].map(() =>
      createJobQueue({
        orm: server.deps.orm,
        logger: server.deps.logger,
        connection,
        heartbeatTimeoutSeconds: 2,
      }),
    );
    try {
      for (const queue of queues) {
        await queue.register<{ hook: string }>(
          kind,
          async () => {
            throw new Error('no worker takes these runs: they have no pg-boss job');
          },
          {
            retryLimit: 1,
            async onAbandoned(run, tx) {
              calls.push({ runId: run.runId, progress: run.progress, error: run.error });
              await tx.execute(`insert into ${marks} (run_id) values (?)`, [run.runId]);
              if (run.payload.hook === 'throws') throw new Error('the area could not record it');
              if (run.payload.hook === 'keeps') return;
              return { rows: 0, why: 'rolled back with its connection' };
            },
          },
        );
        await queue.start();
      }
      /** A run whose worker died an hour ago at `attempt` (0-based) after reporting 10 rows. */
      const dead = async (hook: string, attempt: number) =>
        (
          await em.execute<{ id: string }[]>(
            `insert into job_runs (id, organization_id, kind, status, payload, progress, retry_count,
               started_at, created_at, updated_at)
             values (gen_random_uuid(), ?, ?, 'running', ?, '{"rows": 10}', ?, now() - interval '1 hour',
               now() - interval '1 hour', now() - interval '1 hour')
             returning id`,
            [tenant.organization.id, kind, JSON.stringify({ hook }), attempt],
          )
        )[0].id;
      const last = await dead('returns', 1);
      // Not its last attempt, but pg-boss holds no job to hand out again: it ends here too.
      const orphan = await dead('returns', 0);
      const keeps = await dead('keeps', 1);
      const throws = await dead('throws', 1);
      const ended = async (id: string) =>
        waitFor(jobs, id, (r) => r.status !== 'running' && r.status !== 'queued');
      const interrupted = expect.stringMatching(
        /^Interrupted: its worker stopped responding for more than 2 s$/,
      );
      for (const id of [last, orphan])
        expect(await ended(id)).toMatchObject({
          status: 'failed',
          error: interrupted,
          progress: { rows: 0, why: 'rolled back with its connection' },
        });
      expect(await ended(keeps)).toMatchObject({ status: 'failed', progress: { rows: 10 } });
      // A hook that fails leaves no write of its own; the run still ends, its progress as it was.
      expect(await ended(throws)).toMatchObject({
        status: 'failed',
        error: interrupted,
        progress: { rows: 10 },
      });
      const marked = await em.execute<{ run_id: string }[]>(`select run_id from ${marks}`);
      expect(marked.map((r) => r.run_id).sort()).toEqual([last, orphan, keeps].sort());
      // Both processes swept again since: each run that ended was recorded once, as its attempt left it.
      await new Promise((resolve) => setTimeout(resolve, 2500));
      for (const id of [last, orphan, keeps])
        expect(calls.filter((c) => c.runId === id)).toEqual([
          { runId: id, progress: { rows: 10 }, error: interrupted },
        ]);
    } finally {
      for (const queue of queues) await queue.stop();
      await em.execute(`drop table ${marks}`);
    }
  });

  it('lets an attempt the queue ended failed under it record what it leaves', async () => {
    const kind = unique('ended-');
    const queue = createJobQueue({
      orm: server.deps.orm,
      logger: server.deps.logger,
      connection: jobQueueConnection(server.db),
      heartbeatTimeoutSeconds: 2,
    });
    const seen: { written?: boolean } = {};
    await queue.register(
      kind,
      async (_payload, context) => {
        await context.progress({ rows: 10 });
        // Its next beat finds the row no longer running and aborts the attempt.
        await new Promise((resolve) => context.signal.addEventListener('abort', resolve));
        seen.written = await context.recordLastProgress({ rows: 0, why: 'rolled back' });
        throw new Error('aborted');
      },
      { retryLimit: 0 },
    );
    await queue.start();
    try {
      const { run } = await queue.enqueue(kind, {}, org());
      await waitFor(queue, run.id, (r) => r.progress.rows === 10);
      // What a sweep that took the worker for dead on its last attempt, or a stop past its grace
      // period, leaves while the handler is still at work.
      await server.deps.orm.em
        .fork()
        .nativeUpdate(
          JobRun,
          { id: run.id },
          { status: 'failed', error: 'Interrupted', finishedAt: new Date() },
        );
      await expect.poll(() => seen.written, { timeout: 10_000 }).toBe(true);
      expect(await queue.getRun(run.id, tenant.organization.id)).toMatchObject({
        status: 'failed',
        error: 'Interrupted',
        progress: { rows: 0, why: 'rolled back' },
      });
    } finally {
      await queue.stop();
    }
  });

  it("ends a last attempt that outlives the stop's grace period with its kind's onAbandoned", async () => {
    const kind = unique('stopped-');
    const queue = createJobQueue({
      orm: server.deps.orm,
      logger: server.deps.logger,
      connection: jobQueueConnection(server.db),
      stopTimeoutMs: 500,
    });
    const calls: { runId: string; progress: unknown; error: string }[] = [];
    let finish!: () => void;
    const finished = new Promise<void>((resolve) => (finish = resolve));
    await queue.register(
      kind,
      async (_payload, context) => {
        await context.progress({ rows: 10 });
        // Deaf to the abort, as a handler stuck in a long statement is.
        await finished;
        return { rows: 10 };
      },
      {
        retryLimit: 0,
        async onAbandoned(run) {
          calls.push({ runId: run.runId, progress: run.progress, error: run.error });
          return { rows: 0, why: 'rolled back' };
        },
      },
    );
    await queue.start();
    const { run } = await queue.enqueue(kind, {}, org());
    try {
      await waitFor(queue, run.id, (r) => r.progress.rows === 10);
      await queue.stop();
      const error = 'Interrupted: the server shut down during the run';
      expect(calls).toEqual([{ runId: run.id, progress: { rows: 10 }, error }]);
      // The handler ending late changes nothing: the run is no longer its attempt's.
      finish();
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(await jobs.getRun(run.id, tenant.organization.id)).toMatchObject({
        status: 'failed',
        error,
        progress: { rows: 0, why: 'rolled back' },
        result: null,
      });
    } finally {
      finish();
      await queue.stop();
    }
  });

  it('keeps a run across a queue restart: the next process finishes it', async () => {
    const kind = unique('restart-');
    const connection = jobQueueConnection(server.db);
    const first = createJobQueue({ orm: server.deps.orm, logger: server.deps.logger, connection });
    await first.start();
    await first.register(
      kind,
      async () => {
        throw new Error('first process fails');
      },
      { retryLimit: 1, retryDelaySeconds: 2, retryBackoff: false },
    );
    const { run } = await first.enqueue(kind, { n: 1 }, org());
    await waitFor(first, run.id, (r) => r.error === 'first process fails');
    await first.stop();

    const second = createJobQueue({ orm: server.deps.orm, logger: server.deps.logger, connection });
    let payloadSeen: unknown;
    await second.register(
      kind,
      async (payload, context) => {
        payloadSeen = { payload, attempt: context.attempt };
        return { ok: true };
      },
      { retryLimit: 1, retryDelaySeconds: 2, retryBackoff: false },
    );
    await second.start();
    try {
      const done = await waitFor(second, run.id, (r) => r.status === 'succeeded');
      expect(done).toMatchObject({ retry_count: 1, result: { ok: true }, error: null });
      expect(payloadSeen).toEqual({ payload: { n: 1 }, attempt: 2 });
    } finally {
      await second.stop();
    }
  });

  it('refuses to enqueue an unknown kind or on a stopped queue', async () => {
    await expect(jobs.enqueue(unique('nope-'), {}, org())).rejects.toThrow(/not registered/);
    const stopped = createJobQueue({
      orm: server.deps.orm,
      logger: server.deps.logger,
      connection: jobQueueConnection(server.db),
    });
    await expect(stopped.enqueue('x', {}, org())).rejects.toMatchObject({ code: 'SERVICE_UNAVAILABLE' });
  });

  it('writes a run and its queued job together: a failed enqueue leaves no run row', async () => {
    const kind = unique('atomic-');
    let handled = 0;
    await jobs.register(kind, async () => {
      handled++;
    });
    const em = server.deps.orm.em.fork() as EntityManager;
    // pg-boss refuses this kind's job, as a full disk or a lost connection would at that moment.
    const refuse = `refuse_${kind.replace(/\W/g, '_')}`;
    await em.execute(
      `create function pgboss.${refuse}() returns trigger language plpgsql as $$
         begin raise exception 'the queue refused the job'; end $$`,
    );
    await em.execute(
      `create trigger ${refuse} before insert on pgboss.job_common for each row
         when (new.name = '${kind}') execute function pgboss.${refuse}()`,
    );
    try {
      await expect(jobs.enqueue(kind, { n: 1 }, { ...org(), singletonKey: 'only-one' })).rejects.toThrow(
        /the queue refused the job/,
      );
      expect(await jobs.listRuns(tenant.organization.id, { kind })).toEqual([]);
      const [{ n }] = await em.execute(`select count(*)::int as n from job_runs where kind = ?`, [kind]);
      expect(n).toBe(0);
    } finally {
      await em.execute(`drop trigger ${refuse} on pgboss.job_common`);
      await em.execute(`drop function pgboss.${refuse}()`);
    }
    // Nothing half-written holds the singleton key: the next enqueue runs.
    const { run, created } = await jobs.enqueue(kind, { n: 2 }, { ...org(), singletonKey: 'only-one' });
    expect(created).toBe(true);
    await waitFor(jobs, run.id, (r) => r.status === 'succeeded');
    expect(handled).toBe(1);
  });

  it("reads runs on the caller's entity manager, inside its transaction", async () => {
    const kind = unique('read-');
    const em = server.deps.orm.em.fork() as EntityManager;
    let committedElsewhere: JobRunView | null | undefined;
    const seen = await em.transactional(async (tx) => {
      const row = tx.create(JobRun, {
        organizationId: tenant.organization.id,
        kind,
        payload: { in: 'transaction' },
        progress: {},
      });
      await tx.flush();
      // Another connection cannot see the uncommitted row (on the embedded database's single
      // connection it would wait for this transaction to end: that is why reads take `em`).
      if (server.db.kind !== 'embedded')
        committedElsewhere = await jobs.getRun(row.id, tenant.organization.id);
      return {
        run: await jobs.getRun(row.id, tenant.organization.id, tx),
        otherOrg: await jobs.getRun(row.id, other.organization.id, tx),
        list: await jobs.listRuns(tenant.organization.id, { kind }, tx),
      };
    });
    expect(seen.run).toMatchObject({ kind, status: 'queued', payload: { in: 'transaction' } });
    expect(seen.otherOrg).toBeNull();
    expect(seen.list.map((r) => r.id)).toEqual([seen.run!.id]);
    if (server.db.kind !== 'embedded') expect(committedElsewhere).toBeNull();
    // Committed now: a read of its own sees it too.
    expect((await jobs.getRun(seen.run!.id, tenant.organization.id))?.kind).toBe(kind);
  });

  it('runs periodic work once per cron tick however many processes keep the schedule', async () => {
    const name = unique('tick-');
    const connection = jobQueueConnection(server.db);
    // Both processes look for due ticks every second, so each would send one per second on its own.
    const processes = ['a', 'b'].map((id) => ({
      id,
      queue: createJobQueue({
        orm: server.deps.orm,
        logger: server.deps.logger,
        connection,
        cronCheckSeconds: 1,
      }),
    }));
    const ticks: { process: string; minute: number }[] = [];
    // A tick near the end of a minute could be followed by the next at once: start early in one.
    const second = new Date().getUTCSeconds();
    if (second > 40) await new Promise((resolve) => setTimeout(resolve, (61 - second) * 1000));
    for (const { id, queue } of processes) {
      await queue.schedule(name, '* * * * *', async () => {
        ticks.push({ process: id, minute: Math.floor(Date.now() / 60_000) });
      });
      await queue.start();
    }
    try {
      // Every minute's tick is due at once (pg-boss sends a tick whose time is under a minute old).
      await expect.poll(() => ticks.length, { timeout: 30_000 }).toBe(1);
      await new Promise((resolve) => setTimeout(resolve, 5000));
      expect(ticks).toHaveLength(1);
      // The next minute: one more tick, not one per process.
      await expect.poll(() => ticks.length, { timeout: 90_000, interval: 500 }).toBe(2);
      await new Promise((resolve) => setTimeout(resolve, 5000));
      expect(ticks).toHaveLength(2);
      expect(ticks[1].minute).toBe(ticks[0].minute + 1);
    } finally {
      for (const { queue } of processes) await queue.stop();
      // The schedule lives in the database, kept by any process that registers it: this one is over.
      await server.deps.orm.em.fork().execute(`delete from pgboss.schedule where name = ?`, [name]);
    }
  }, 150_000);
});
