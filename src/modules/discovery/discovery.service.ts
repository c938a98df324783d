import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError } from '../../app-error.ts';
import type { AppDeps, CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { isFeatureEnabled } from '../../features.ts';
import {
  matchTable,
  type SourceTable,
  type TableMatch,
  type TargetTable,
} from '../../llm/offline-matcher.ts';
import { isBuiltInType } from '../../llm/pg-casts.ts';
import { lookupCatalogTypes } from '../../llm/pg-cast-catalog.ts';
import { profileTable, sourceTableOf, type ColumnProfile, type QueryRunner } from '../../llm/profile.ts';
import { llmManager, matchTableWithProvider, type LlmMode, type MatchOutcome } from '../../llm/provider.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import type { IntrospectedTable } from '../../warehouse/warehouse.ts';
import { toAppError } from '../../trpc/errors.ts';
import { organizationLlm, type OrganizationLlm } from '../admin/llm-settings.service.ts';
import type { KeptDecision } from '../mappings/mappings-merge.ts';
import { systemPromptOf } from '../workspaces/workspaces-config.service.ts';
import { effectiveAdminSettings } from '../workspaces/workspaces-settings.service.ts';
import {
  requiredConnectionConfig,
  currentWorkspace,
  targetSchemaOf,
  type WorkspaceEntity,
} from '../workspaces/workspaces.service.ts';
import { tableKey } from './discovery-plan.ts';
import { evidenceOf } from './discovery-evidence.ts';
import { SampleOverlap } from './discovery-overlap.ts';
import { cleaningOf, writeTable } from './discovery-write.ts';
import { cleaningConverts } from './cleaning.ts';
import { EventLog, outcomesAfterCancel, resumeDiscovery } from './discovery-events.ts';
import type { CompletionResult } from '../../llm/openai.ts';
import { introspectionCache, llmAnswerCache } from '../workspaces/workspaces-cache.ts';
import type { DiscoverInput, DiscoveryEvent } from './discovery.schemas.ts';

/** How often a running discovery proves it is alive (and learns of a cancel from another process). */
const HEARTBEAT_MS = 15_000;
/** A running row without a heartbeat for this long belongs to a process that died: it is taken over. */
const STALE_AFTER_SECONDS = 60;
/** Least time between two reads of the run row at step boundaries (cancel latency on quick steps). */
const CHECK_MS = 250;
/** Source tables offered to the model per target table: those the offline candidates come from. */
const PROMPT_TABLES = 8;

type Event = DiscoveryEvent;
/** An event before it is numbered. */
type Draft = Event extends infer E ? (E extends Event ? Omit<E, 'seq'> : never) : never;

// ---- the run row: lock, heartbeat, cancel ----

async function acquireRun(scope: CallerScope, workspace: WorkspaceEntity, mode: LlmMode): Promise<string> {
  await scope.em.execute(
    `update discovery_runs
        set status = case when cancel_requested_at is null then 'failed' else 'cancelled' end,
            reason = 'the process running it stopped responding', finished_at = now()
      where workspace_id = ? and status = 'running' and heartbeat_at < now() - make_interval(secs => ?)`,
    [workspace.id, STALE_AFTER_SECONDS],
  );
  const [row] = await scope.em.execute(
    `insert into discovery_runs (id, organization_id, workspace_id, started_by, status, mode, started_at, heartbeat_at)
     values (gen_random_uuid(), ?, ?, ?, 'running', ?, now(), now())
     on conflict (workspace_id) where status = 'running' do nothing
     returning id`,
    [workspace.organization.id, workspace.id, scope.principal.id, mode],
  );
  if (row) return row.id as string;
  const [running] = await scope.em.execute(
    `select id, started_at from discovery_runs where workspace_id = ? and status = 'running'`,
    [workspace.id],
  );
  throw new AppError(
    'CONFLICT',
    `A discovery is already running for workspace ${workspace.name}` +
      (running ? ` (run ${running.id}, started ${new Date(running.started_at).toISOString()})` : '') +
      '; wait for it to finish or cancel it (POST /api/workspaces/discover/cancel)',
    { reason: 'DISCOVERY_RUNNING' },
  );
}

/**
 * The run's liveness and stop conditions: a heartbeat timer (its own unit of work, so it never waits on
 * the generator's), the client's signal, and a cancel requested from any process.
 */
class RunControl {
  readonly #cancel = new AbortController();
  readonly #timer: NodeJS.Timeout;
  readonly signal: AbortSignal;

  private readonly deps: AppDeps;
  private readonly runId: string;
  private readonly clientSignal: AbortSignal | undefined;

  constructor(deps: AppDeps, runId: string, clientSignal?: AbortSignal) {
    this.deps = deps;
    this.runId = runId;
    this.clientSignal = clientSignal;
    this.signal = clientSignal ? AbortSignal.any([clientSignal, this.#cancel.signal]) : this.#cancel.signal;
    this.#timer = setInterval(() => void this.#beat().catch(() => {}), HEARTBEAT_MS).unref();
  }

  async #beat(em: EntityManager = this.deps.orm.em.fork() as EntityManager): Promise<void> {
    const [row] = await em.execute(
      `update discovery_runs set heartbeat_at = now() where id = ? returning cancel_requested_at`,
      [this.runId],
    );
    if (row?.cancel_requested_at) this.#cancel.abort();
  }

  #checkedAt = 0;

  /**
   * At each step: null to go on, or why to stop. The run row is read at most every CHECK_MS, so that
   * hundreds of quick steps do not each cost a round trip; a cancel is still seen within that time.
   */
  async halt(em: EntityManager): Promise<'disconnected' | 'cancelled' | null> {
    if (this.clientSignal?.aborted) return 'disconnected';
    if (!this.#cancel.signal.aborted && Date.now() - this.#checkedAt >= CHECK_MS) {
      await this.#beat(em);
      this.#checkedAt = Date.now();
    }
    if (this.clientSignal?.aborted) return 'disconnected';
    return this.#cancel.signal.aborted ? 'cancelled' : null;
  }

  get stopReason(): 'disconnected' | 'cancelled' | null {
    if (this.clientSignal?.aborted) return 'disconnected';
    return this.#cancel.signal.aborted ? 'cancelled' : null;
  }

  dispose() {
    clearInterval(this.#timer);
  }
}

async function finishRun(
  deps: AppDeps,
  runId: string,
  status: 'completed' | 'cancelled' | 'failed',
  reason: string | null,
  summary: Record<string, unknown> | null,
) {
  await (deps.orm.em.fork() as EntityManager).execute(
    `update discovery_runs set status = ?, reason = ?, summary = ?, finished_at = now() where id = ? and status = 'running'`,
    [status, reason, summary ? JSON.stringify(summary) : null, runId],
  );
}

/** Marks the caller's running discoveries cancelled; each stops at its next step, in whichever process. */
export async function cancelDiscovery(scope: CallerScope) {
  const organization = organizationOf(scope.principal);
  const rows = await scope.em.execute(
    `update discovery_runs set cancel_requested_at = coalesce(cancel_requested_at, now())
      where organization_id = ? and started_by = ? and status = 'running'
      returning id`,
    [organization, scope.principal.id],
  );
  const ids = rows.map((r) => String(r.id));
  // Answered once the runs have stopped: one that completed before seeing the cancel says so.
  const runs = await outcomesAfterCancel(scope.deps, ids);
  const stopped = runs.filter((r) => r.status === 'cancelled').length;
  const going = runs.filter((r) => r.status === 'running').length;
  return {
    cancelled: stopped > 0,
    run_ids: ids,
    runs,
    message: !ids.length
      ? 'You have no running discovery'
      : going
        ? `Cancel requested; ${going} run(s) have not reached their next step yet`
        : stopped === ids.length
          ? `${stopped} discovery run(s) cancelled`
          : `${ids.length - stopped} of ${ids.length} run(s) ended before the cancel took effect`,
  };
}

// ---- the agent ----

function targetTablesOf(workspace: WorkspaceEntity, wanted: string[] | undefined): TargetTable[] {
  const schema = targetSchemaOf(workspace);
  if (!schema)
    throw new AppError(
      'CONFLICT',
      `Workspace ${workspace.name} has no target schema: assign one first (POST /api/workspaces/target-schema/assign)`,
      { reason: 'NO_TARGET_SCHEMA' },
    );
  const tables = schema.tables as unknown as TargetTable[];
  if (!wanted) return tables;
  const unknown = wanted.filter((name) => !tables.some((t) => t.name === name));
  if (unknown.length)
    throw new AppError('BAD_REQUEST', `The target schema ${schema.name} has no table ${unknown.join(', ')}`, {
      issues: unknown.map((name) => ({ path: ['target_tables'], message: `unknown target table ${name}` })),
    });
  return tables.filter((t) => wanted.includes(t.name));
}

const round4 = (v: number) => Math.round(v * 10_000) / 10_000;

function profiledEvent(key: string, table: IntrospectedTable, profiles: ColumnProfile[]): Draft {
  const byName = new Map(profiles.map((p) => [p.column, p]));
  return {
    type: 'table_profiled',
    table: key,
    rows_profiled: profiles[0]?.rowCount ?? 0,
    columns: table.columns.map((c) => {
      const p = byName.get(c.name);
      return {
        name: c.name,
        type: c.type,
        null_rate: p?.nullRate ?? 0,
        distinct_ratio: p?.distinctRatio ?? 0,
        min_length: p?.minLength ?? null,
        max_length: p?.maxLength ?? null,
        patterns: (p?.patterns ?? []).map((s) => ({ pattern: s.pattern, share: round4(s.share) })),
      };
    }),
  };
}

/** The source tables whose columns the offline matcher ranks near the top, for a prompt of bounded size. */
function promptSources(offline: TableMatch, sources: readonly SourceTable[]): SourceTable[] {
  const score = new Map<string, number>();
  for (const field of offline.fields)
    for (const c of field.candidates.slice(0, 3)) {
      const table = c.source_field.slice(0, c.source_field.lastIndexOf('.'));
      score.set(table, (score.get(table) ?? 0) + c.confidence);
    }
  const keep = new Set(
    [...score]
      .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
      .slice(0, PROMPT_TABLES)
      .map(([t]) => t),
  );
  if (offline.primary_table) keep.add(offline.primary_table);
  return sources.filter((s) => keep.has(s.name));
}

/**
 * The source's own types (enums, domains, extension types), which the built-in cast table cannot
 * know, described from its catalog in one statement, so that the type rule can decide for them too.
 * When the catalog cannot be read, such columns keep the rule for unknown types.
 */
async function describeUserTypes(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  run: QueryRunner,
  sources: SourceTable[],
): Promise<void> {
  // A domain over a built-in type needs nothing more: introspection gave its base type.
  const typeOf = (c: SourceTable['columns'][number]) => c.baseType ?? c.type;
  const columns = sources.flatMap((s) => s.columns).filter((c) => !isBuiltInType(typeOf(c)));
  if (columns.length === 0) return;
  try {
    const described = await lookupCatalogTypes(run, [...new Set(columns.map(typeOf))]);
    for (const c of columns) c.catalogType = described.get(typeOf(c)) ?? null;
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    scope.deps.logger.warn(
      { workspace: workspace.id, code: typeof code === 'string' ? code : null },
      'source types not described: their columns are matched by type family',
    );
  }
}

interface Summary {
  tables: number;
  columns: number;
  target_tables: number;
  fields_suggested: number;
  ambiguities: number;
  llm_calls: number;
  llm_fallbacks: number;
  llm_cached: number;
  introspection_cached: boolean;
  duration_ms: number;
}

/**
 * The discovery agent: one async generator behind the tRPC subscription, the REST event stream and
 * the run-to-end mutation. Preconditions (workspace, source, target schema, the run lock) throw before
 * the first event, so the REST route can still answer with a status; later failures become events.
 * `signal` is the client's: when it aborts the generator stops at its next step and writes nothing more.
 */
export async function* discover(
  scope: CallerScope,
  input: DiscoverInput,
  signal?: AbortSignal,
): AsyncGenerator<Event, void, unknown> {
  if (input.last_event_id) return yield* resumeDiscovery(scope, input.last_event_id, signal);
  const startedAt = performance.now();
  const workspace = await currentWorkspace(scope);
  const config = requiredConnectionConfig(scope, workspace, 'source');
  const targets = targetTablesOf(workspace, input.target_tables);
  const settings = await effectiveAdminSettings(scope, workspace.name);
  let mode: LlmMode = llmManager.mode;
  const llmDisabled = mode === 'openai' && !(await isFeatureEnabled(scope, 'llm_matching'));
  if (llmDisabled) mode = 'offline';
  const llm: OrganizationLlm | null =
    mode === 'openai'
      ? await organizationLlm(scope, { purpose: 'discovery', workspaceId: workspace.id })
      : null;

  const runId = await acquireRun(scope, workspace, mode);
  const control = new RunControl(scope.deps, runId, signal);
  const log = new EventLog(scope.deps, runId, organizationOf(scope.principal));
  let seq = 0;
  const event = (draft: Draft): Event => {
    const numbered = { ...draft, seq: ++seq } as Event;
    log.add(numbered);
    return numbered;
  };
  const summary: Summary = {
    tables: 0,
    columns: 0,
    target_tables: 0,
    fields_suggested: 0,
    ambiguities: 0,
    llm_calls: 0,
    llm_fallbacks: 0,
    llm_cached: 0,
    introspection_cached: false,
    duration_ms: 0,
  };
  let ended: { status: 'completed' | 'cancelled' | 'failed'; reason: string | null } | null = null;
  const progress = (
    step: Extract<Draft, { type: 'progress' }>['step'],
    message: string,
    extra: { done?: number; total?: number; table?: string; reason?: string } = {},
  ) =>
    event({
      type: 'progress',
      step,
      message,
      done: extra.done ?? null,
      total: extra.total ?? null,
      table: extra.table ?? null,
      reason: extra.reason ?? null,
    });

  /** Stops at a step boundary: a cancel gets its event; a client that left gets nothing. */
  async function* stopped(why: 'disconnected' | 'cancelled'): AsyncGenerator<Event, void, unknown> {
    if (why === 'disconnected') {
      ended = { status: 'cancelled', reason: 'the client disconnected' };
      return;
    }
    ended = { status: 'cancelled', reason: 'cancel requested' };
    yield event({
      type: 'cancelled',
      run_id: runId,
      message: 'Discovery cancelled; what was written so far is kept',
    });
  }

  try {
    yield event({
      type: 'started',
      run_id: runId,
      workspace_name: workspace.name,
      mode,
      target_tables: targets.map((t) => t.name),
    });
    if (llmDisabled)
      yield progress('llm_disabled', 'The llm_matching feature is off for you: the offline matcher answers');

    // 1. Introspect the selected source tables.
    const warehouse = await warehouses(scope.deps).open(config, `${workspace.id}:source`);
    const introspectionKey = `${workspace.id}:${JSON.stringify(input.tables ?? null)}`;
    const cachedIntrospection = (await introspectionCache.get(scope, introspectionKey)) as
      Awaited<ReturnType<typeof warehouse.introspect>> | undefined;
    const introspected =
      cachedIntrospection ?? (await warehouse.introspect(input.tables ? { tables: input.tables } : {}));
    if (cachedIntrospection) summary.introspection_cached = true;
    else await introspectionCache.set(scope, introspectionKey, introspected);
    // Keys and fields are names joined by dots, so a name that holds one cannot be told apart from
    // two: such tables and columns are left out, each said in an event, rather than failing the run.
    const dotless = (name: string) => !name.includes('.');
    const tables: typeof introspected.tables = [];
    for (const table of introspected.tables) {
      const key = `${table.schema}.${table.name}`;
      const columns = table.columns.filter((c) => dotless(c.name));
      const left = dotless(table.schema) && dotless(table.name) ? table.columns.length - columns.length : -1;
      if (left !== 0)
        yield event({
          type: 'error',
          message:
            left < 0
              ? `${key} is left out: its schema or table name holds a dot, which a mapping cannot name`
              : `${left} column(s) of ${key} left out (${table.columns
                  .filter((c) => !dotless(c.name))
                  .map((c) => c.name)
                  .join(', ')}): a column name that holds a dot cannot be mapped`,
          code: 'NAME_WITH_DOT',
          fatal: false,
          table: key,
        });
      if (left >= 0 && columns.length > 0) tables.push({ ...table, columns });
    }
    const byKey = new Map(tables.map((t) => [tableKey(t), t]));
    summary.tables = tables.length;
    summary.columns = tables.reduce((n, t) => n + t.columns.length, 0);
    yield progress(
      'introspected',
      `${tables.length} source tables with ${summary.columns} columns in ${introspected.schemas.join(', ')}`,
      { total: tables.length },
    );

    // 2. Profile each table in SQL (one statement per table) and detect value patterns.
    // Generated SQL, not the user's: no SQL guard parse (it costs more than running a wide profile).
    const run = (sql: string, params: unknown[]) => warehouse.aggregate(sql, { params });
    const sources: SourceTable[] = [];
    for (const [i, table] of tables.entries()) {
      const why = await control.halt(scope.em);
      if (why) return yield* stopped(why);
      const key = tableKey(table);
      let profiles: ColumnProfile[] = [];
      try {
        const columns = table.columns.map((c) => ({ name: c.name, type: c.type }));
        // An engine with its own SQL (MySQL) profiles itself; PostgreSQL runs the shared statement.
        profiles = warehouse.profileTable
          ? await warehouse.profileTable(table.schema, table.name, columns, {
              rowLimit: settings.sample_size,
            })
          : await profileTable(run, table.schema, table.name, columns, { rowLimit: settings.sample_size });
        yield event(profiledEvent(key, table, profiles));
      } catch (error) {
        const e = toAppError(error);
        // One unreadable table (permissions, a broken view) leaves the others to match on names and types.
        yield event({
          type: 'error',
          message: `Profiling ${key} failed (${e.code === 'INTERNAL_SERVER_ERROR' ? 'internal error' : e.message}); its columns are matched on names and types only`,
          code: e.code,
          fatal: false,
          table: key,
        });
      }
      sources.push(sourceTableOf(table, profiles, key));
      if ((i + 1) % 50 === 0 && i + 1 < tables.length)
        yield progress('profiling', `${i + 1} of ${tables.length} tables profiled`, {
          done: i + 1,
          total: tables.length,
        });
    }
    yield progress('profiled', `${tables.length} tables profiled`, {
      done: tables.length,
      total: tables.length,
    });

    // 3. Match each target table and 4. write its suggestions, one transaction per table.
    // An engine with its own SQL (MySQL) loads into built-in PostgreSQL types and gets no cleaning.
    const postgresSource = !warehouse.profileTable;
    if (postgresSource) await describeUserTypes(scope, workspace, run, sources);
    const options = {
      threshold: settings.discovery_confidence_threshold,
      ambiguityMargin: settings.ambiguity_margin,
      ...(postgresSource ? { converts: cleaningConverts } : {}),
    };
    const overlap = new SampleOverlap(scope, workspace, sources, {
      targetTables: targets.map((t) => t.name),
      rowLimit: settings.sample_size,
    });
    const systemPrompt = systemPromptOf(workspace);
    const successCriteria = workspace.successCriteriaPrompt ?? null;
    for (const [i, target] of targets.entries()) {
      let why = await control.halt(scope.em);
      if (why) return yield* stopped(why);
      yield progress('matching', `Matching ${target.name}`, {
        done: i,
        total: targets.length,
        table: target.name,
      });
      let outcome: MatchOutcome;
      if (mode === 'offline' || !llm) {
        outcome = {
          match: matchTable(target, sources, options),
          source: 'offline',
          fallback: null,
          usage: null,
          modelPicks: new Map(),
          refusedPicks: [],
        };
      } else {
        const narrowed = promptSources(matchTable(target, sources, options), sources);
        try {
          outcome = await matchTableWithProvider(
            { target, sources: narrowed, systemPrompt, successCriteria, options },
            {
              params: llm.params,
              meter: llm.meter,
              signal: control.signal,
              mode,
              maskPii: settings.mask_pii_in_samples,
              answers: {
                get: async (key) =>
                  (await llmAnswerCache.get(scope, `${workspace.id}:${key}`)) as CompletionResult | undefined,
                set: (key, value) => llmAnswerCache.set(scope, `${workspace.id}:${key}`, value),
              },
            },
          );
        } catch (error) {
          const stop = control.stopReason;
          if (stop) return yield* stopped(stop);
          throw error;
        }
        if (outcome.usage) summary.llm_calls++;
        if (outcome.cached) summary.llm_cached++;
        if (outcome.fallback) {
          summary.llm_fallbacks++;
          const rest = targets.length - i - 1;
          // A failing, hanging or refused endpoint will not do better for the next table: stop asking.
          const switched = outcome.fallback.reason !== 'invalid_answer' && rest > 0;
          if (switched) mode = 'offline';
          yield progress(
            'llm_fallback',
            switched
              ? `${outcome.fallback.message}; the remaining ${rest} target table(s) of this run use the offline matcher without calling the LLM`
              : outcome.fallback.message,
            {
              table: target.name,
              reason: outcome.fallback.reason,
            },
          );
        }
        for (const refused of outcome.refusedPicks)
          yield progress('llm_pick_refused', refused.message, {
            table: target.name,
            reason: 'incompatible_type',
          });
      }

      const overlapOf = await overlap.forTable(target, outcome.match);
      why = await control.halt(scope.em);
      if (why) return yield* stopped(why);
      const written = await writeTable(
        scope,
        workspace,
        target,
        { ...outcome, overlapOf },
        byKey,
        settings.auto_confirm_threshold,
        // An engine with its own SQL (MySQL) cannot run the PostgreSQL share measurement: no proposals.
        postgresSource ? { run, sources, rowLimit: settings.sample_size } : null,
      );
      if (!written) continue;
      summary.target_tables++;
      for (const c of written.connections) {
        summary.fields_suggested++;
        const evidence =
          c.evidence ??
          evidenceOf(outcome.match, outcome.modelPicks, overlapOf, c.target_field, c.source_field);
        yield event({
          type: 'suggestion',
          target_table: target.name,
          target_field: c.target_field,
          source_field: c.source_field,
          confidence: c.confidence,
          status: c.status,
          matched_by: evidence.matched_by,
          signals: evidence.signals,
          evidence,
          cleaning: cleaningOf(written.transformations[c.target_field], c.source_field),
        });
      }
      for (const a of written.ambiguities) {
        summary.ambiguities++;
        yield event({
          type: 'ambiguity',
          target_table: target.name,
          target_field: a.target_field,
          candidates: a.candidates.map((c) => ({
            source_field: c.source_field,
            confidence: c.confidence ?? 0,
            evidence: c.evidence ?? null,
          })),
          reason: a.reason ?? 'Several source columns fit about equally well',
        });
      }
      for (const k of written.kept)
        yield event({ type: 'kept', target_table: target.name, ...k, reason: keptReason(k) });
      yield progress(
        'written',
        `${target.name}: ${written.connections.length} suggestions, ${written.ambiguities.length} ambiguities, ${written.kept.length} decisions kept; ${written.changed ? `now version ${written.version}` : `unchanged at version ${written.version}`}`,
        { done: i + 1, total: targets.length, table: target.name },
      );
    }

    summary.duration_ms = Math.round(performance.now() - startedAt);
    ended = { status: 'completed', reason: null };
    yield event({ type: 'completed', run_id: runId, summary: { ...summary } });
  } catch (error) {
    const stop = control.stopReason;
    if (stop) return yield* stopped(stop);
    const e = toAppError(error);
    const message =
      e.code === 'INTERNAL_SERVER_ERROR' ? 'Discovery failed with an internal error' : e.message;
    if (e.code === 'INTERNAL_SERVER_ERROR')
      scope.deps.logger.error({ err: error, runId }, 'discovery failed');
    ended = { status: 'failed', reason: message };
    yield event({ type: 'error', message, code: e.code, fatal: true, table: null });
  } finally {
    control.dispose();
    // Ended from outside while waiting at a yield: the consumer went away.
    ended ??= {
      status: 'cancelled',
      reason: signal?.aborted ? 'the client disconnected' : 'the client stopped reading the events',
    };
    summary.duration_ms ||= Math.round(performance.now() - startedAt);
    // Stored before the run row says it ended: a resuming client then finds the last event there.
    await log.close(() =>
      event({ type: 'cancelled', run_id: runId, message: `Discovery stopped: ${ended!.reason}` }),
    );
    await finishRun(scope.deps, runId, ended.status, ended.reason, { ...summary });
  }
}

function keptReason(k: KeptDecision): string {
  switch (k.decision) {
    case 'confirmed':
      return `A person confirmed the source of ${k.target_field}`;
    case 'transformation':
      return `${k.target_field} has a hand-written transformation`;
    case 'no_source':
      return `A person decided ${k.target_field} has no source`;
    case 'rejected':
      return `A person removed ${k.source_field} → ${k.target_field}`;
    case 'cleaning_refused':
      return `A person removed discovery's cleaning of ${k.source_field} for ${k.target_field}`;
  }
}
