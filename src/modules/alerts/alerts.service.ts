import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import type { CheckResult, Severity } from '../../quality/rules.ts';
import { UUID, workspaceByName } from '../workspaces/workspaces.service.ts';
import { Alert, type AlertEntity } from './alerts.entity.ts';

const SEVERITY_RANK: Record<Severity, number> = { info: 0, warning: 1, error: 2, critical: 3 };

/** What makes a failure "the same" for a dismissal: its severity and its threshold. */
function signature(severity: string, threshold: unknown): string {
  return JSON.stringify([severity, threshold ?? null]);
}

/** A dismissed alert whose snooze ran out is due again (the next run confirms or resolves it). */
function effectiveStatus(alert: AlertEntity, now: number): AlertEntity['status'] {
  if (alert.status === 'dismissed' && alert.snoozedUntil && alert.snoozedUntil.getTime() <= now)
    return 'active';
  return alert.status;
}

function alertView(alert: AlertEntity, now = Date.now()) {
  const status = effectiveStatus(alert, now);
  return {
    id: alert.id,
    workspace_id: alert.workspace.id,
    check_key: alert.checkKey,
    kind: alert.kind,
    check: alert.checkName,
    table_name: alert.tableName,
    column_name: alert.columnName ?? null,
    severity: alert.severity,
    status,
    measured: (alert.measured ?? null) as number | string | null,
    threshold: (alert.threshold ?? null) as number | string | Record<string, unknown> | null,
    message: alert.message,
    occurrences: alert.occurrences,
    first_seen_at: alert.firstSeenAt,
    last_seen_at: alert.lastSeenAt,
    resolved_at: alert.resolvedAt ?? null,
    dismissal:
      status === 'dismissed' && alert.dismissedAt
        ? {
            dismissed_at: alert.dismissedAt,
            dismissed_by: alert.dismissedBy ?? null,
            reason: alert.dismissReason ?? '',
            snoozed_until: alert.snoozedUntil ?? null,
          }
        : null,
    last_run_id: alert.lastRunId ?? null,
  };
}

export interface AlertOutcome {
  raised: number;
  updated: number;
  reactivated: number;
  still_dismissed: number;
  resolved: number;
}

export interface RecordOptions {
  organizationId: string;
  workspaceId: string;
  runId: string | null;
  /** The kinds of check this evaluation covers: open alerts of these kinds not re-evaluated are resolved… */
  kinds: CheckResult['kind'][];
  /** …except those of tables that could not be measured this time (`schema.table`). */
  skippedTables?: Set<string>;
}

/**
 * Turns a run's check results into alert changes: a new failure raises an alert, a persisting one
 * updates it (one alert per check, never one per run), a dismissed one stays dismissed unless its
 * snooze ended or the failure changed (severity or threshold), and a passing check — or a check
 * that no longer exists — resolves it.
 */
export async function recordCheckResults(
  em: EntityManager,
  results: CheckResult[],
  options: RecordOptions,
): Promise<AlertOutcome> {
  const { organizationId: organization, workspaceId: workspace, runId } = options;
  const open = await em.find(Alert, {
    organization,
    workspace,
    status: { $in: ['active', 'dismissed'] },
    kind: { $in: options.kinds },
  });
  const byKey = new Map(open.map((a) => [a.checkKey, a]));
  const seen = new Set<string>();
  const outcome: AlertOutcome = { raised: 0, updated: 0, reactivated: 0, still_dismissed: 0, resolved: 0 };
  const now = new Date();
  const refresh = (alert: AlertEntity, r: CheckResult) => {
    alert.severity = r.severity;
    alert.measured = r.measured;
    alert.threshold = r.threshold;
    alert.message = r.message;
    alert.lastSeenAt = now;
    alert.lastRunId = runId;
    alert.occurrences += 1;
  };
  for (const r of results) {
    seen.add(r.check_key);
    const alert = byKey.get(r.check_key);
    if (r.status === 'pass') {
      if (alert) {
        alert.status = 'resolved';
        alert.resolvedAt = now;
        alert.lastRunId = runId;
        outcome.resolved++;
      }
      continue;
    }
    if (!alert) {
      em.create(Alert, {
        organization,
        workspace,
        checkKey: r.check_key,
        kind: r.kind,
        checkName: r.check,
        tableName: r.table,
        columnName: r.column,
        severity: r.severity,
        status: 'active',
        measured: r.measured,
        threshold: r.threshold,
        message: r.message,
        occurrences: 1,
        firstSeenAt: now,
        lastSeenAt: now,
        lastRunId: runId,
      });
      outcome.raised++;
    } else if (alert.status === 'active') {
      refresh(alert, r);
      outcome.updated++;
    } else {
      const snoozeOver = !!alert.snoozedUntil && alert.snoozedUntil.getTime() <= now.getTime();
      const changed = alert.dismissedSignature !== signature(r.severity, r.threshold);
      refresh(alert, r);
      if (snoozeOver || changed) {
        alert.status = 'active';
        alert.snoozedUntil = null;
        alert.dismissedSignature = null;
        outcome.reactivated++;
      } else outcome.still_dismissed++;
    }
  }
  for (const alert of open)
    if (!seen.has(alert.checkKey) && !options.skippedTables?.has(alert.tableName)) {
      alert.status = 'resolved';
      alert.resolvedAt = now;
      alert.lastRunId = runId;
      outcome.resolved++;
    }
  await em.flush();
  return outcome;
}

// ---- routes ----

export async function activeAlerts(
  scope: CallerScope,
  input: { workspace: string; severity?: Severity; limit: number; offset: number },
) {
  const workspace = await workspaceByName(scope, input.workspace);
  const now = Date.now();
  const open = await scope.em.find(Alert, {
    organization: organizationOf(scope.principal),
    workspace: workspace.id,
    $or: [{ status: 'active' }, { status: 'dismissed', snoozedUntil: { $lte: new Date(now) } }],
  });
  const counts = { info: 0, warning: 0, error: 0, critical: 0 };
  for (const a of open) counts[a.severity]++;
  const selected = open
    .filter((a) => !input.severity || a.severity === input.severity)
    .sort(
      (a, b) =>
        SEVERITY_RANK[b.severity] - SEVERITY_RANK[a.severity] ||
        b.lastSeenAt.getTime() - a.lastSeenAt.getTime() ||
        a.checkKey.localeCompare(b.checkKey),
    );
  return {
    workspace_name: workspace.name,
    total: selected.length,
    counts,
    alerts: selected.slice(input.offset, input.offset + input.limit).map((a) => alertView(a, now)),
  };
}

export async function dismissAlert(
  scope: CallerScope,
  input: { alert_id: string; reason: string; snooze_minutes?: number },
) {
  const alert = UUID.test(input.alert_id)
    ? await scope.em.findOne(Alert, { id: input.alert_id, organization: organizationOf(scope.principal) })
    : null;
  if (!alert) throw notFound('Alert');
  if (alert.status === 'resolved')
    throw new AppError('CONFLICT', 'This alert is already resolved: its check passes again');
  const now = new Date();
  alert.status = 'dismissed';
  alert.dismissedAt = now;
  alert.dismissedBy = scope.principal.username;
  alert.dismissReason = input.reason;
  alert.snoozedUntil = input.snooze_minutes ? new Date(now.getTime() + input.snooze_minutes * 60_000) : null;
  alert.dismissedSignature = signature(alert.severity, alert.threshold);
  await scope.em.flush();
  return alertView(alert, now.getTime());
}
