import { EventEmitter } from 'node:events';
import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../../deps.ts';
import { runStatTest } from '../../stats/engine.ts';
import type { StatTestResult } from '../../stats/result.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import { requiredConnectionConfig } from '../workspaces/workspaces.service.ts';
import type { JobContext } from '../../jobs/queue.ts';
import { Hypothesis, type StoredTestResult } from './analytics.entity.ts';
import { powerAt } from './analytics-power.ts';
import { statSpecOf, warehouseStatsQuery } from './analytics-spec.ts';

export const HYPOTHESIS_TEST_KIND = 'hypothesis-test';

/**
 * Emits a run's id when its handler has returned in this process (the queue records the run's end a
 * moment later), so that a status request waiting for the run looks at once instead of at its next
 * check. Runs handled by another process are seen by those checks alone.
 */
export const handlerReturned = new EventEmitter<Record<string, []>>().setMaxListeners(0);

interface HypothesisTestPayload extends Record<string, unknown> {
  hypothesis_id: string;
}

/** A test is one aggregate query, but on a large table it may take minutes: far past the interactive timeout. */
const TEST_STATEMENT_TIMEOUT_MS = 30 * 60_000;

/** JSON has no Infinity (|r| = 1 gives t = ±∞): such figures are stored as null rather than lost as a string. */
function jsonSafe(result: StatTestResult): StatTestResult {
  return JSON.parse(
    JSON.stringify(result, (_, v) => (typeof v === 'number' && !Number.isFinite(v) ? null : v)),
  );
}

/**
 * Records the outcome only while this run is still the hypothesis' latest: a stale run (the hypothesis
 * was re-tested or deleted meanwhile) changes nothing. One conditional UPDATE, not a read and a flush.
 * With `settings`, only while the hypothesis still has the test and alpha the run used; whether it
 * wrote is returned.
 */
async function record(
  em: EntityManager,
  context: JobContext,
  id: string,
  set: string,
  params: unknown[],
  settings?: { test: string; alpha: number },
): Promise<boolean> {
  const rows: unknown[] = await em.execute(
    `update hypotheses set ${set}, updated_at = now()
      where id = ? and organization_id = ? and (last_run_id is null or last_run_id = ?)` +
      (settings ? ' and test = ? and alpha = ?' : '') +
      ' returning id',
    [
      ...params,
      id,
      context.organizationId,
      context.runId,
      ...(settings ? [settings.test, settings.alpha] : []),
    ],
  );
  return rows.length > 0;
}

/**
 * Runs the hypothesis' test on its workspace's target warehouse: the engine pushes the sufficient
 * statistics down as one read-only query; only their few rows come back.
 */
async function runHypothesisTest(deps: AppDeps, payload: HypothesisTestPayload, context: JobContext) {
  const em = deps.orm.em.fork() as EntityManager;
  const hypothesis = await em.findOne(
    Hypothesis,
    { id: payload.hypothesis_id, organization: context.organizationId },
    { populate: ['workspace'] },
  );
  if (!hypothesis) return { skipped: 'the hypothesis was deleted' };
  // One active run per hypothesis (singleton key): a run that starts is the latest, so it claims the row.
  hypothesis.status = 'running';
  hypothesis.lastRunId = context.runId;
  await em.flush();
  try {
    const config = requiredConnectionConfig({ em, deps }, hypothesis.workspace, 'target');
    const warehouse = await warehouses(deps).open(config, `${hypothesis.workspace.id}:target`);
    await context.progress({ step: 'aggregating', test: hypothesis.test });
    const result = jsonSafe(
      await runStatTest(
        warehouseStatsQuery(warehouse, { timeoutMs: TEST_STATEMENT_TIMEOUT_MS }),
        statSpecOf(hypothesis),
      ),
    );
    const alpha = Number(hypothesis.alpha);
    const significant = result.p_value < alpha;
    const mde = hypothesis.minimumDetectableEffect;
    const stored: StoredTestResult =
      mde == null
        ? result
        : {
            ...result,
            power: { effect_size: Number(mde), alpha, value: powerAt(result, Number(mde), alpha) },
          };
    // The result and its significance hold for the test and alpha read at the start: a hypothesis whose
    // settings changed meanwhile must not show them beside this result (the test route refuses such a
    // change while a run is active; this covers a change that raced past that check).
    const recorded = await record(
      em,
      context,
      hypothesis.id,
      `status = 'tested', result = ?::jsonb, p_value = ?, significant = ?, tested_at = now(), last_error = null`,
      [JSON.stringify(stored), result.p_value, significant],
      { test: hypothesis.test, alpha },
    );
    if (!recorded)
      await record(em, context, hypothesis.id, `status = 'failed', last_error = ?`, [
        `The test or alpha of the hypothesis changed while this run tested ${hypothesis.test} at alpha ${alpha}: test it again`,
      ]);
    return {
      hypothesis_id: hypothesis.id,
      test: result.test,
      p_value: result.p_value,
      significant,
      effect_size: result.effect_size,
      sample_sizes: result.sample_sizes,
    };
  } catch (error) {
    await record(em, context, hypothesis.id, `status = 'failed', last_error = ?`, [
      error instanceof Error ? error.message : String(error),
    ]);
    throw error;
  }
}

/**
 * The analytics area's job kind. No retries: a test fails for a reason a retry does not change (bad
 * expression, wrong group count); the user re-runs it after a fix.
 */
export async function registerAnalyticsJobs(deps: AppDeps): Promise<void> {
  await deps.jobs.register<HypothesisTestPayload>(
    HYPOTHESIS_TEST_KIND,
    (payload, context) =>
      runHypothesisTest(deps, payload, context).finally(() => handlerReturned.emit(context.runId)),
    {
      retryLimit: 0,
      timeoutSeconds: 2 * 3600,
      retain: { namedBy: ['hypotheses'] },
      // Its worker died: the hypothesis must not show that run as running (nor refuse an insight as
      // "still running") until it is tested again.
      async onAbandoned(run, em) {
        await em.nativeUpdate(
          Hypothesis,
          {
            id: String(run.payload.hypothesis_id),
            organization: run.organizationId,
            lastRunId: run.runId,
            status: { $in: ['queued', 'running'] },
          },
          { status: 'failed', lastError: run.error, updatedAt: new Date() },
        );
      },
    },
  );
}
