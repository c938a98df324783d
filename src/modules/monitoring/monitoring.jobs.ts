import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../../deps.ts';
import { isFeatureEnabledFor } from '../../features.ts';
import { buildIdentityGraph } from './identity.service.ts';
import { runMonitoring, type MonitoringReason } from './monitoring-run.service.ts';

export const IDENTITY_RESOLUTION_KIND = 'identity-resolution';
const MONITORING_RUN_KIND = 'monitoring-run';
/** A workspace with checks is measured at least this often. */
const MONITORING_INTERVAL_MS = 60 * 60_000;
/** An identity graph is rebuilt at least this often (and after every materialization). */
const IDENTITY_REBUILD_INTERVAL_MS = 24 * 60 * 60_000;

interface MonitoringRunPayload extends Record<string, unknown> {
  workspace_id: string;
  reason: MonitoringReason;
}

/**
 * Queues a monitoring run of a workspace (after a materialization, on a schedule or on demand).
 * One run at a time per workspace: while one is queued or running, that run is returned.
 */
export async function enqueueMonitoringRun(
  deps: AppDeps,
  input: { organizationId: string; workspaceId: string; reason: MonitoringReason },
) {
  const { run, created } = await deps.jobs.enqueue(
    MONITORING_RUN_KIND,
    { workspace_id: input.workspaceId, reason: input.reason },
    { organizationId: input.organizationId, workspaceId: input.workspaceId, singletonKey: input.workspaceId },
  );
  return { run_id: run.id, status: run.status, created };
}

/**
 * Queues the periodic work that is due, across organizations: a monitoring run for every workspace
 * with checks (column tests, stored or implied by schema.json, or monitoring configs) and a target
 * warehouse that has not had one for MONITORING_INTERVAL_MS, and a rebuild of every identity graph
 * older than IDENTITY_REBUILD_INTERVAL_MS.
 * Safe in several processes: the singleton key keeps one active run per workspace.
 */
export async function runDueMonitoring(
  deps: AppDeps,
  options: { organizationId?: string } = {},
): Promise<{ monitoring: string[]; identity: string[] }> {
  // Across organizations: the server's own session, not a tenant's. A key or a NOT NULL column of
  // schema.json is a test too (src/quality/table-tests.ts).
  const em = deps.orm.em.fork() as EntityManager;
  const org = options.organizationId ?? null;
  const due = await em.execute(
    `select w.id, w.organization_id from workspaces w
      where w.target_config is not null and (?::uuid is null or w.organization_id = ?::uuid)
        and (exists (select 1 from schema_configs c where c.workspace_id = w.id
                       and c.kind in ('column_monitoring', 'table_monitoring'))
             or w.target_schema::text like '%"tests"%'
             or jsonb_path_exists(w.target_schema, ?::jsonpath)
             or jsonb_path_exists(w.target_schema, ?::jsonpath))
        and not exists (select 1 from job_runs j where j.workspace_id = w.id and j.kind = ?
                          and j.created_at > now() - make_interval(secs => ?))
      order by w.id limit 200`,
    [
      org,
      org,
      '$.tables[*] ? (@.primary_key.size() > 0)',
      '$.tables[*].columns[*] ? (@.nullable == false)',
      MONITORING_RUN_KIND,
      MONITORING_INTERVAL_MS / 1000,
    ],
  );
  const stale = await em.execute(
    `select g.workspace_id as id, g.organization_id from identity_graphs g
      where (?::uuid is null or g.organization_id = ?::uuid)
        and (g.last_built_at is null or g.last_built_at < now() - make_interval(secs => ?))
        and not exists (select 1 from job_runs j where j.workspace_id = g.workspace_id and j.kind = ?
                          and j.created_at > now() - make_interval(secs => ?))
      order by g.workspace_id limit 200`,
    [
      org,
      org,
      IDENTITY_REBUILD_INTERVAL_MS / 1000,
      IDENTITY_RESOLUTION_KIND,
      IDENTITY_REBUILD_INTERVAL_MS / 1000,
    ],
  );
  const out = { monitoring: [] as string[], identity: [] as string[] };
  for (const w of due) {
    await enqueueMonitoringRun(deps, {
      organizationId: w.organization_id,
      workspaceId: w.id,
      reason: 'schedule',
    });
    out.monitoring.push(w.id);
  }
  for (const g of stale) {
    if (!(await isFeatureEnabledFor(em, g.organization_id, 'identity_resolution'))) continue;
    await enqueueIdentityResolution(deps, {
      organizationId: g.organization_id,
      workspaceId: g.id,
      reason: 'schedule',
    });
    out.identity.push(g.id);
  }
  return out;
}

/** One build at a time per workspace: a second request while one is queued or running joins it. */
export async function enqueueIdentityResolution(
  deps: AppDeps,
  input: { organizationId: string; workspaceId: string; reason: string },
) {
  const { run, created } = await deps.jobs.enqueue(
    IDENTITY_RESOLUTION_KIND,
    { workspace_id: input.workspaceId, reason: input.reason },
    { organizationId: input.organizationId, workspaceId: input.workspaceId, singletonKey: input.workspaceId },
  );
  return { run_id: run.id, status: run.status, created };
}

interface IdentityResolutionPayload extends Record<string, unknown> {
  workspace_id: string;
  reason: string;
}

/** The cron of the look for due monitoring and identity rebuilds (UTC): every five minutes. */
const DUE_MONITORING_CRON = '*/5 * * * *';

/** The monitoring area's job kinds and its periodic work; called once per server before the queue starts. */
export async function registerMonitoringJobs(deps: AppDeps): Promise<void> {
  await deps.jobs.register<MonitoringRunPayload>(
    MONITORING_RUN_KIND,
    async (payload, context) => {
      const summary = await runMonitoring(deps, {
        organizationId: context.organizationId,
        workspaceId: payload.workspace_id,
        runId: context.runId,
        reason: payload.reason,
        progress: (p) => context.progress(p),
      });
      if (summary.identity_rebuild_due) {
        const em = deps.orm.em.fork() as EntityManager;
        if (await isFeatureEnabledFor(em, context.organizationId, 'identity_resolution'))
          summary.identity_run = await enqueueIdentityResolution(deps, {
            organizationId: context.organizationId,
            workspaceId: payload.workspace_id,
            reason: payload.reason,
          });
      }
      return summary;
    },
    // An alert names the run that last saw it, however long ago that was.
    { retryLimit: 1, retryDelaySeconds: 30, timeoutSeconds: 2 * 3600, retain: { namedBy: ['alerts'] } },
  );
  await deps.jobs.register<IdentityResolutionPayload>(
    IDENTITY_RESOLUTION_KIND,
    async (payload, context) => {
      await context.progress({ phase: 'resolving' });
      return buildIdentityGraph(deps, {
        organizationId: context.organizationId,
        workspaceId: payload.workspace_id,
        runId: context.runId,
      });
    },
    // A build replaces the graph in one transaction, so a retry starts from a clean state. One build
    // at a time per process: each may hold IDENTITY_IN_PROCESS_IDENTIFIERS' worth of labels in memory,
    // and the server's memory bound (README) is for one.
    {
      retryLimit: 1,
      retryDelaySeconds: 10,
      timeoutSeconds: 4 * 3600,
      concurrency: 1,
      retain: { namedBy: ['identity_graphs', 'alerts'] },
    },
  );
  // One look per tick in the whole cluster (the queue's scheduler), whichever process takes it.
  await deps.jobs.schedule('monitoring-due', DUE_MONITORING_CRON, async () => {
    await runDueMonitoring(deps);
  });
}
