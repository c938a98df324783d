import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../deps.ts';
import { isFeatureEnabledFor } from '../features.ts';
import { runMonitoring, type MonitoringReason } from '../modules/monitoring/monitoring-run.service.ts';
import { enqueueIdentityResolution, IDENTITY_RESOLUTION_KIND } from './identity-resolution.ts';

export const MONITORING_RUN_KIND = 'monitoring-run';
/** A workspace with checks is measured at least this often. */
export const MONITORING_INTERVAL_MS = 60 * 60_000;
/** An identity graph is rebuilt at least this often (and after every materialization). */
export const IDENTITY_REBUILD_INTERVAL_MS = 24 * 60 * 60_000;

export interface MonitoringRunPayload extends Record<string, unknown> {
  workspace_id: string;
  reason: MonitoringReason;
}

const registered = new WeakMap<AppDeps, Promise<void>>();

/** Registers the job kind once per server, before the first enqueue. */
export function ensureMonitoringRunJob(deps: AppDeps): Promise<void> {
  let ready = registered.get(deps);
  if (!ready) {
    ready = deps.jobs.register<MonitoringRunPayload>(
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
      { retryLimit: 1, retryDelaySeconds: 30, timeoutSeconds: 2 * 3600 },
    );
    registered.set(deps, ready);
  }
  return ready;
}

/**
 * Queues a monitoring run of a workspace (after a materialization, on a schedule or on demand).
 * One run at a time per workspace: while one is queued or running, that run is returned.
 */
export async function enqueueMonitoringRun(
  deps: AppDeps,
  input: { organizationId: string; workspaceId: string; reason: MonitoringReason },
) {
  await ensureMonitoringRunJob(deps);
  const { run, created } = await deps.jobs.enqueue(
    MONITORING_RUN_KIND,
    { workspace_id: input.workspaceId, reason: input.reason },
    { organizationId: input.organizationId, workspaceId: input.workspaceId, singletonKey: input.workspaceId },
  );
  return { run_id: run.id, status: run.status, created };
}

/**
 * Queues the periodic work that is due, across organizations: a monitoring run for every workspace
 * with checks (column tests or monitoring configs) and a target warehouse that has not had one for
 * MONITORING_INTERVAL_MS, and a rebuild of every identity graph older than IDENTITY_REBUILD_INTERVAL_MS.
 * Safe in several processes: the singleton key keeps one active run per workspace.
 */
export async function runDueMonitoring(
  deps: AppDeps,
  options: { organizationId?: string } = {},
): Promise<{ monitoring: string[]; identity: string[] }> {
  const conn = deps.orm.em.fork().getConnection();
  const org = options.organizationId ?? null;
  const due = await conn.execute(
    `select w.id, w.organization_id from workspaces w
      where w.target_config is not null and (?::uuid is null or w.organization_id = ?::uuid)
        and (exists (select 1 from schema_configs c where c.workspace_id = w.id
                       and c.kind in ('column_monitoring', 'table_monitoring'))
             or w.target_schema::text like '%"tests"%')
        and not exists (select 1 from job_runs j where j.workspace_id = w.id and j.kind = ?
                          and j.created_at > now() - make_interval(secs => ?))
      order by w.id limit 200`,
    [org, org, MONITORING_RUN_KIND, MONITORING_INTERVAL_MS / 1000],
  );
  const stale = await conn.execute(
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
  const em = deps.orm.em.fork() as EntityManager;
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

/** Looks for due monitoring every `intervalMs`; returns the function that stops it. */
export function startMonitoringScheduler(deps: AppDeps, intervalMs = 5 * 60_000): () => void {
  const timer = setInterval(() => {
    runDueMonitoring(deps).catch((error) => deps.logger.warn({ err: error }, 'monitoring scheduler'));
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}
