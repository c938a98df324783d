import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { HYPOTHESIS_TEST_KIND, handlerReturned } from './analytics.jobs.ts';
import { isRunActive, type JobRunView } from '../../jobs/queue.ts';
import { runMining } from '../../stats/mining.ts';
import { adHocQuery, workspaceWarehouse } from '../sources/sources.service.ts';
import { UUID, currentWorkspace } from '../workspaces/workspaces.service.ts';
import { intervalAt } from '../../stats/engine.ts';
import {
  Hypothesis,
  Insight,
  type HypothesisEntity,
  type InsightEntity,
  type StoredSegment,
  type StoredTestResult,
} from './analytics.entity.ts';
import { powerAt } from './analytics-power.ts';
import { miningSpecOf, warehouseStatsQuery } from './analytics-spec.ts';
import { miningColumnsOf, resolveTargetTable, validateHypothesis } from './analytics-validate.ts';

// ---- ad-hoc SQL ----

/** One read-only statement on the current workspace's target warehouse (same guard and limits as source queries). */
export const execute = (scope: CallerScope, input: { sql: string; limit?: number }) =>
  adHocQuery(scope, 'target', input);

// ---- hypotheses ----

/**
 * The last result as it holds at the hypothesis' settings now, which may have changed since it was
 * computed: a re-run with another test or alpha stores them as it is asked for, and may then fail,
 * stay queued, or never be queued. A result of another test is no result of this one (null). Of the
 * same test, the p-value stands (alpha does not enter it, nor the statistic or the effect): significance
 * is p < the current alpha, and the interval and the power are those at the current alpha, recomputed
 * from the figures the result keeps. The hypothesis' views and insight creation read it, so a result is
 * never shown, or relied on, beside settings it does not hold for.
 */
function currentResult(h: HypothesisEntity) {
  const stored = h.result;
  if (!stored || stored.test !== h.test || h.pValue == null) return null;
  const alpha = Number(h.alpha);
  const pValue = Number(h.pValue);
  const { ci, power, ...result }: StoredTestResult = stored;
  const atAlpha = ci && ci.level !== 1 - alpha ? intervalAt(stored, alpha) : ci;
  const mde = h.minimumDetectableEffect == null ? null : Number(h.minimumDetectableEffect);
  const powerAtAlpha =
    mde === null
      ? undefined
      : power && power.alpha === alpha && power.effect_size === mde
        ? power
        : { effect_size: mde, alpha, value: powerAt(stored, mde, alpha) };
  return {
    result: {
      ...result,
      ...(atAlpha ? { ci: atAlpha } : {}),
      ...(powerAtAlpha ? { power: powerAtAlpha } : {}),
    } as StoredTestResult,
    pValue,
    significant: pValue < alpha,
  };
}

function hypothesisView(h: HypothesisEntity) {
  const current = currentResult(h);
  const segment: StoredSegment = {};
  if (h.segment.column) segment.column = h.segment.column;
  if (h.segment.condition) segment.condition = h.segment.condition;
  if (h.segment.groups?.length) segment.groups = h.segment.groups;
  return {
    id: h.id,
    statement: h.statement,
    table: `${h.targetSchema}.${h.targetTable}`,
    metric: h.metric,
    segment,
    filter: h.filter ?? null,
    test: h.test,
    alpha: Number(h.alpha),
    minimum_detectable_effect: h.minimumDetectableEffect == null ? null : Number(h.minimumDetectableEffect),
    mining_columns: h.miningColumns,
    origin: h.origin,
    status: h.status,
    last_run_id: h.lastRunId ?? null,
    result: current?.result ?? null,
    p_value: current?.pValue ?? null,
    significant: current?.significant ?? null,
    tested_at: current ? (h.testedAt ?? null) : null,
    error: h.lastError ?? null,
    created_at: h.createdAt,
    updated_at: h.updatedAt,
  };
}

/** A hypothesis of the caller's organization and current workspace; anything else → 404. */
async function findHypothesis(scope: CallerScope, id: string): Promise<HypothesisEntity> {
  const workspace = await currentWorkspace(scope);
  if (!UUID.test(id)) throw notFound('Hypothesis');
  const hypothesis = await scope.em.findOne(Hypothesis, {
    id,
    organization: organizationOf(scope.principal),
    workspace: workspace.id,
  });
  if (!hypothesis) throw notFound('Hypothesis');
  return hypothesis;
}

export interface CreateHypothesisInput {
  statement: string;
  table: string;
  metric: { expression: string; kind?: 'numeric' | 'boolean' };
  segment: StoredSegment;
  filter?: string;
  test: HypothesisEntity['test'];
  alpha: number;
  minimum_detectable_effect?: number | null;
  mining_columns?: string[];
}

/**
 * Mining columns given more than once: the engine refuses them at every mining request, so they are
 * refused before the hypothesis is stored, each repetition at its place. Names are compared exactly,
 * as the warehouse tells quoted columns apart by case.
 */
function refuseRepeatedMiningColumns(given: string[] | undefined) {
  const repeats = (given ?? []).flatMap((name, at) => {
    const first = given!.indexOf(name);
    return first === at ? [] : [{ name, at, first }];
  });
  if (!repeats.length) return;
  const names = [...new Set(repeats.map((r) => r.name))];
  throw new AppError(
    'BAD_REQUEST',
    `mining_columns repeat ${names.join(', ')}: give each column once (each is one candidate segment column)`,
    {
      reason: 'MINING_COLUMN_REPEATED',
      issues: repeats.map((r) => ({
        path: ['mining_columns', r.at],
        message: `${r.name} is given already at ${r.first}`,
      })),
    },
  );
}

export async function createHypothesis(scope: CallerScope, input: CreateHypothesisInput) {
  refuseRepeatedMiningColumns(input.mining_columns);
  const { workspace, config, warehouse } = await workspaceWarehouse(scope, 'target');
  const table = await resolveTargetTable(warehouse, config, input.table);
  const checked = await validateHypothesis(warehouse, table, {
    metric: input.metric,
    segment: input.segment,
    filter: input.filter,
    test: input.test,
    miningColumns: input.mining_columns,
  });
  const miningColumns = await miningColumnsOf(warehouse, table, {
    given: input.mining_columns,
    segmentColumn: input.segment.column,
    read: checked.columns,
  });
  const hypothesis = scope.em.create(Hypothesis, {
    organization: organizationOf(scope.principal),
    workspace,
    statement: input.statement,
    targetSchema: table.schema,
    targetTable: table.name,
    metric: { expression: input.metric.expression, kind: checked.metricKind },
    segment: input.segment,
    filter: input.filter ?? null,
    test: input.test,
    alpha: input.alpha,
    minimumDetectableEffect: input.minimum_detectable_effect ?? null,
    miningColumns,
    origin: 'manual',
    status: 'draft',
    createdById: scope.principal.id,
  });
  await scope.em.flush();
  return hypothesisView(hypothesis);
}

export async function getHypothesis(scope: CallerScope, id: string) {
  return hypothesisView(await findHypothesis(scope, id));
}

/**
 * Queues the hypothesis' test and answers at once. One active run per hypothesis: asking again while
 * one is queued or running returns that run (`created: false`), and asking for another test or alpha
 * then is a 409 that changes nothing.
 */
export async function testHypothesis(
  scope: CallerScope,
  input: { hypothesis_id: string; test?: HypothesisEntity['test']; alpha?: number },
) {
  const hypothesis = await findHypothesis(scope, input.hypothesis_id);
  const test = input.test ?? hypothesis.test;
  const alpha = input.alpha ?? Number(hypothesis.alpha);
  if (test !== hypothesis.test || alpha !== Number(hypothesis.alpha)) {
    // A queued or running test goes on with the settings it has (a run reads them as it starts, and
    // this request would get that run back): storing others now would show them beside its result.
    const latest = hypothesis.lastRunId
      ? await scope.deps.jobs.getRun(hypothesis.lastRunId, organizationOf(scope.principal), scope.em)
      : null;
    if (latest && isRunActive(latest.status))
      throw new AppError(
        'CONFLICT',
        `A test of this hypothesis is ${latest.status} (${hypothesis.test} at alpha ${Number(hypothesis.alpha)}); ` +
          'wait for it to end (GET /api/analytics/status/{hypothesis_id}?wait_ms=…), then test again with the new test or alpha',
        { reason: 'RUN_IN_PROGRESS' },
      );
    if (test !== hypothesis.test) {
      // Another algorithm may need another metric type (two_proportion_z: boolean; correlations: a numeric segment).
      const { config, warehouse } = await workspaceWarehouse(scope, 'target');
      const table = await resolveTargetTable(
        warehouse,
        config,
        `${hypothesis.targetSchema}.${hypothesis.targetTable}`,
      );
      await validateHypothesis(warehouse, table, {
        metric: hypothesis.metric,
        segment: hypothesis.segment,
        filter: hypothesis.filter,
        test,
      });
    }
    hypothesis.test = test;
    hypothesis.alpha = alpha;
    await scope.em.flush();
  }
  const { run, created } = await scope.deps.jobs.enqueue(
    HYPOTHESIS_TEST_KIND,
    { hypothesis_id: hypothesis.id },
    {
      organizationId: organizationOf(scope.principal),
      workspaceId: hypothesis.workspace.id,
      singletonKey: hypothesis.id,
    },
  );
  if (created) {
    // The run may already have claimed the row (it sets last_run_id itself); then it knows better.
    await scope.em.execute(
      `update hypotheses set status = 'queued', last_run_id = ?, updated_at = now()
        where id = ? and last_run_id is distinct from ?`,
      [run.id, hypothesis.id, run.id],
    );
  }
  return { run_id: run.id, status: run.status, hypothesis_id: hypothesis.id, created };
}

/**
 * How often a waiting status request looks at its run when nothing in this process tells it the run
 * ended (the run is handled by another process): a twentieth of the run's age so far, within
 * 50 ms … 1 s, so the end is noticed about 2.5% late on average. Each look is one primary-key read.
 */
const checkIntervalMs = (run: JobRunView) =>
  Math.min(1000, Math.max(50, (Date.now() - run.created_at.getTime()) / 20));

/** Once the handler has returned here, the queue records the run's end within moments. */
const SETTLING_CHECK_MS = 5;

const isActive = (run: JobRunView | null) => run !== null && isRunActive(run.status);

/** The run once it is no longer active, or as it is when `waitMs` has passed. */
async function runAfterWait(scope: CallerScope, first: JobRunView, waitMs: number) {
  const deadline = Date.now() + waitMs;
  let returned = false;
  let wake = () => {};
  const onReturned = () => {
    returned = true;
    wake();
  };
  handlerReturned.once(first.id, onReturned);
  try {
    let run: JobRunView | null = first;
    while (run && isActive(run) && Date.now() < deadline) {
      const pause = Math.min(returned ? SETTLING_CHECK_MS : checkIntervalMs(run), deadline - Date.now());
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, pause);
        wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      run = await scope.deps.jobs.getRun(first.id, first.organization_id);
    }
    return run;
  } finally {
    handlerReturned.off(first.id, onReturned);
  }
}

/**
 * The hypothesis' state and its latest run (progress, error), for polling after `test`. With `waitMs`
 * the answer waits, at most that long, for an active run to end: a client learns the outcome as soon
 * as it is there without polling at a high rate, which would take CPU from the test it waits for.
 */
export async function hypothesisStatus(scope: CallerScope, id: string, waitMs = 0) {
  const found = await findHypothesis(scope, id);
  const first = found.lastRunId
    ? await scope.deps.jobs.getRun(found.lastRunId, organizationOf(scope.principal), scope.em)
    : null;
  const waits = waitMs > 0 && isActive(first);
  const run = waits ? await runAfterWait(scope, first!, waitMs) : first;
  // The run may have recorded its outcome on the hypothesis after it was read (while waiting, or between
  // the two reads): the handler writes the hypothesis before the queue marks the run ended, so an ended
  // run next to a hypothesis still in flight means the hypothesis is to be read again.
  const stale = run && !isActive(run) && (found.status === 'queued' || found.status === 'running');
  const hypothesis = waits || stale ? await scope.em.refresh(found) : found;
  if (!hypothesis) throw notFound('Hypothesis');
  const view = hypothesisView(hypothesis);
  // A run can end without its handler recording it (cancelled, expired by the queue): the run decides then.
  const ended = run && (run.status === 'failed' || run.status === 'cancelled');
  const orphaned = ended && (view.status === 'queued' || view.status === 'running');
  return {
    hypothesis_id: view.id,
    status: orphaned ? ('failed' as const) : view.status,
    run: run
      ? {
          id: run.id,
          status: run.status,
          progress: run.progress,
          error: run.error,
          created_at: run.created_at,
          started_at: run.started_at,
          finished_at: run.finished_at,
          duration_ms: run.duration_ms,
        }
      : null,
    result: view.result,
    p_value: view.p_value,
    significant: view.significant,
    error: orphaned ? (run.error ?? `The run was ${run.status}`) : view.error,
  };
}

/** Segments ranked by lift of the hypothesis' metric (GROUPING SETS over its mining columns, in the warehouse). */
export async function miningResults(
  scope: CallerScope,
  input: {
    hypothesis_id: string;
    min_support: number;
    depth: number;
    direction: 'high' | 'low';
    limit: number;
  },
) {
  const hypothesis = await findHypothesis(scope, input.hypothesis_id);
  if (!hypothesis.miningColumns.length)
    throw new AppError(
      'CONFLICT',
      'This hypothesis has no candidate segment columns to mine (its table has no low-cardinality columns)',
      { reason: 'NO_MINING_COLUMNS' },
    );
  const { warehouse } = await workspaceWarehouse(scope, 'target');
  const mined = await runMining(
    warehouseStatsQuery(warehouse),
    miningSpecOf(hypothesis, {
      minSupport: input.min_support,
      depth: input.depth as 1 | 2,
      direction: input.direction,
      limit: input.limit,
    }),
  );
  const finite = (v: number | null) => (v === null || !Number.isFinite(v) ? null : v);
  return {
    hypothesis_id: hypothesis.id,
    metric: hypothesis.metric.expression,
    columns: hypothesis.miningColumns,
    min_support: input.min_support,
    total: { n: mined.total.n, mean: finite(mined.total.mean) },
    segments: mined.segments.map((s) => ({ ...s, mean: finite(s.mean), lift: finite(s.lift) })),
  };
}

// ---- insights ----

function insightView(insight: InsightEntity) {
  return {
    id: insight.id,
    hypothesis_id: typeof insight.hypothesis === 'string' ? insight.hypothesis : insight.hypothesis.id,
    title: insight.title,
    description: insight.description,
    confidence: Number(insight.confidence),
    p_value: Number(insight.pValue),
    test: insight.test,
    effect_size: insight.effectSize,
    performance: insight.performance ?? null,
    performance_updated_at: insight.performanceUpdatedAt ?? null,
    created_at: insight.createdAt,
    updated_at: insight.updatedAt,
  };
}

/**
 * An insight rests on a tested, significant result; its confidence is 1 − p (the result's strength of
 * evidence against "no effect"), rounded to the micro so lists sort stably.
 */
export async function createInsight(
  scope: CallerScope,
  input: { hypothesis_id: string; title?: string; description: string },
) {
  const hypothesis = await findHypothesis(scope, input.hypothesis_id);
  // The result and its significance as the hypothesis shows them, at its current test and alpha.
  const current = currentResult(hypothesis);
  const status = hypothesis.status;
  if (status !== 'tested' || !current)
    throw new AppError(
      'CONFLICT',
      status === 'queued' || status === 'running'
        ? 'The hypothesis test is still running; create the insight when it has finished'
        : status === 'failed'
          ? `The last test of this hypothesis (${hypothesis.test} at alpha ${Number(hypothesis.alpha)}) failed; an insight needs a successful test: test it again`
          : hypothesis.result
            ? `The hypothesis has no result of its test, ${hypothesis.test}; test it first`
            : 'The hypothesis has no test result; test it first',
      { reason: 'NOT_TESTED' },
    );
  const { result, pValue } = current;
  if (!current.significant)
    throw new AppError(
      'CONFLICT',
      `The result is not significant: p = ${pValue.toPrecision(4)} is not below alpha = ${Number(hypothesis.alpha)}; an insight needs a significant result`,
      { reason: 'NOT_SIGNIFICANT' },
    );
  const insight = scope.em.create(Insight, {
    organization: organizationOf(scope.principal),
    workspace: hypothesis.workspace,
    hypothesis,
    title: input.title ?? hypothesis.statement.slice(0, 300),
    description: input.description,
    confidence: Math.round((1 - pValue) * 1e6) / 1e6,
    pValue,
    test: result.test,
    effectSize: result.effect_size,
    createdById: scope.principal.id,
  });
  await scope.em.flush();
  return insightView(insight);
}

async function findInsight(scope: CallerScope, id: string): Promise<InsightEntity> {
  const workspace = await currentWorkspace(scope);
  if (!UUID.test(id)) throw notFound('Insight');
  const insight = await scope.em.findOne(Insight, {
    id,
    organization: organizationOf(scope.principal),
    workspace: workspace.id,
  });
  if (!insight) throw notFound('Insight');
  return insight;
}

/** Records how audiences built on the insight performed; the metrics replace the previous ones. */
export async function updateInsightPerformance(
  scope: CallerScope,
  input: { insight_id: string; metrics: Record<string, unknown> },
) {
  const insight = await findInsight(scope, input.insight_id);
  insight.performance = input.metrics;
  insight.performanceUpdatedAt = new Date();
  await scope.em.flush();
  return insightView(insight);
}

/** Insights at or above a confidence, strongest first, for closed-loop learning. */
export async function highPerformers(
  scope: CallerScope,
  input: { min_confidence: number; limit: number; offset: number },
) {
  const workspace = await currentWorkspace(scope);
  const [insights, total] = await scope.em.findAndCount(
    Insight,
    {
      organization: organizationOf(scope.principal),
      workspace: workspace.id,
      confidence: { $gte: input.min_confidence },
    },
    {
      orderBy: { confidence: 'desc', createdAt: 'desc', id: 'asc' },
      limit: input.limit,
      offset: input.offset,
    },
  );
  return { min_confidence: input.min_confidence, insights: insights.map(insightView), total };
}
