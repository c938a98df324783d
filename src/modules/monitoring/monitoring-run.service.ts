import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError } from '../../app-error.ts';
import type { AppDeps, CallerScope } from '../../deps.ts';
import type { Principal } from '../../auth/principal.ts';
import {
  checkKey,
  evaluateColumnMonitoring,
  evaluateTableMonitoring,
  runColumnTests,
  type CheckResult,
  type ColumnTests,
  type KeyTest,
} from '../../quality/rules.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import type { IntrospectedTable } from '../../warehouse/warehouse.ts';
import { recordCheckResults, type AlertOutcome } from '../alerts/alerts.service.ts';
import { listQualityConfigs, type QualityConfigs } from '../schemas/quality-configs.service.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';
import { connectionConfig } from '../workspaces/workspaces.service.ts';
import { measureTables, previousMeasurements, storeSnapshots } from './monitoring-metrics.ts';
import { IdentityGraph } from './monitoring.entity.ts';

export type MonitoringReason = 'schedule' | 'materialization' | 'on_demand';

/**
 * Jobs run without a caller; services that read tenant rows take a scope with a principal, so the
 * run acts as this organization-bound system principal with no permissions (reads only what the
 * run was enqueued for).
 */
export function systemScope(deps: AppDeps, em: EntityManager, organizationId: string): CallerScope {
  const principal: Principal = {
    kind: 'service_account',
    id: '00000000-0000-0000-0000-000000000000',
    organizationId,
    username: 'dimas-monitoring',
    isSuperAdmin: false,
    mustChangePassword: false,
    permissions: new Set(),
    expiresAt: null,
  };
  return { em, deps, principal };
}

interface TablePlan {
  /** As configs name it: bare for the target, schema.table for the source. */
  configName: string;
  schema: string;
  name: string;
  tests: ColumnTests[];
  key: KeyTest | null;
  /** Something was configured on the table, besides the tests its key and nullability imply. */
  configured: boolean;
  columnMonitoring: { column: string; config: QualityConfigs['column_monitoring'][number]['config'] }[];
  tableMonitoring: QualityConfigs['table_monitoring'][number]['config'] | null;
}

function plansOf(configs: QualityConfigs): Record<'target' | 'source', Map<string, TablePlan>> {
  const plans = { target: new Map<string, TablePlan>(), source: new Map<string, TablePlan>() };
  const plan = (side: 'target' | 'source', configName: string) => {
    let p = plans[side].get(configName);
    if (!p) {
      const dot = configName.indexOf('.');
      const [schema, name] =
        side === 'target' || dot < 0
          ? [configs.target_schema, configName]
          : [configName.slice(0, dot), configName.slice(dot + 1)];
      p = {
        configName,
        schema,
        name,
        tests: [],
        key: null,
        configured: false,
        columnMonitoring: [],
        tableMonitoring: null,
      };
      plans[side].set(configName, p);
    }
    return p;
  };
  // The tests the transformation project writes too (stored and implied by schema.json), not only the stored.
  for (const t of configs.table_tests) {
    const p = plan('target', t.table_name);
    p.tests = t.columns.map(({ column, config }) => ({ column, config }));
    p.key = t.key;
    p.configured ||= t.columns.some((c) => c.configured);
  }
  for (const c of configs.column_monitoring)
    if (!c.orphaned) {
      const p = plan(c.schema_type, c.table_name);
      p.columnMonitoring.push({ column: c.column_name, config: c.config });
      p.configured = true;
    }
  for (const t of configs.table_monitoring)
    if (!t.orphaned) {
      const p = plan(t.schema_type, t.table_name);
      p.tableMonitoring = t.config;
      p.configured = true;
    }
  return plans;
}

export interface MonitoringRunRequest {
  organizationId: string;
  workspaceId: string;
  runId: string | null;
  reason: MonitoringReason;
  progress?: (progress: Record<string, unknown>) => Promise<void>;
}

export interface MonitoringRunSummary {
  [key: string]: unknown;
  reason: MonitoringReason;
  skipped?: string;
  tables_measured: number;
  checks: number;
  passed: number;
  failed: number;
  failures: { check_key: string; severity: string; message: string }[];
  errors: { table: string; message: string }[];
  alerts: AlertOutcome | null;
  /** The workspace has an identity graph and the run was triggered by fresh data: rebuild it. */
  identity_rebuild_due: boolean;
}

/**
 * One monitoring run of a workspace: fresh metrics (one statement per configured table, stored for
 * trends), the column tests (one statement per table), the column/table monitoring thresholds
 * against those metrics, and the resulting alert changes.
 */
export async function runMonitoring(
  deps: AppDeps,
  request: MonitoringRunRequest,
): Promise<MonitoringRunSummary> {
  const em = deps.orm.em.fork() as EntityManager;
  const summary: MonitoringRunSummary = {
    reason: request.reason,
    tables_measured: 0,
    checks: 0,
    passed: 0,
    failed: 0,
    failures: [],
    errors: [],
    alerts: null,
    identity_rebuild_due: false,
  };
  const workspace = await em.findOne(Workspace, {
    id: request.workspaceId,
    organization: request.organizationId,
  });
  if (!workspace) return { ...summary, skipped: 'the workspace was deleted' };
  const scope = systemScope(deps, em, request.organizationId);
  const configs = await listQualityConfigs(scope, workspace);
  const plans = plansOf(configs);
  const results: CheckResult[] = [];
  const skippedTables = new Set<string>();

  for (const side of ['target', 'source'] as const) {
    const tablePlans = [...plans[side].values()];
    if (tablePlans.length === 0) continue;
    const config = connectionConfig(scope, workspace, side);
    if (!config) {
      for (const p of tablePlans) skippedTables.add(`${p.schema}.${p.name}`);
      summary.errors.push({ table: '*', message: `No ${side} database configured: its checks were skipped` });
      continue;
    }
    await request.progress?.({ phase: 'measuring', side, tables: tablePlans.length });
    let present: IntrospectedTable[];
    const warehouse = await warehouses(deps).open(config, `${workspace.id}:${side}`);
    try {
      present = (
        await warehouse.introspect({
          schemas: [...new Set(tablePlans.map((p) => p.schema))],
          tables: tablePlans.map((p) => `${p.schema}.${p.name}`),
        })
      ).tables;
    } catch (error) {
      for (const p of tablePlans) skippedTables.add(`${p.schema}.${p.name}`);
      summary.errors.push({ table: '*', message: (error as Error).message });
      continue;
    }
    const found = new Map(present.map((t) => [`${t.schema}.${t.name}`, t]));
    const measurable: IntrospectedTable[] = [];
    const timestampColumns = new Map<string, string>();
    for (const p of tablePlans) {
      const label = `${p.schema}.${p.name}`;
      const table = found.get(label);
      // Only tests implied by schema.json on a table not created yet (no sync, no materialization):
      // nothing to test, as the project's model before its first run.
      if (!table && !p.configured) {
        skippedTables.add(label);
        continue;
      }
      // A configured table that is not there is a failure of its own; its other alerts stay as they are.
      results.push({
        check_key: checkKey('monitor', label, null, 'table_exists'),
        kind: 'monitor',
        check: 'table_exists',
        table: label,
        column: null,
        status: table ? 'pass' : 'fail',
        measured: table ? 1 : 0,
        threshold: 1,
        severity: 'error',
        message: table ? `${label} exists` : `${label} does not exist in the ${side} database`,
      });
      if (!table) {
        skippedTables.add(label);
        continue;
      }
      measurable.push(table);
      const freshness = p.tableMonitoring?.freshness?.column;
      if (freshness && table.columns.some((c) => c.name === freshness))
        timestampColumns.set(label, freshness);
    }
    const dataSource = side;
    const previous = await previousMeasurements(
      em,
      workspace.id,
      dataSource,
      measurable.map((t) => `${t.schema}.${t.name}`),
    );
    const measured = await measureTables(warehouse, measurable, { timeoutMs: 0, timestampColumns });
    await storeSnapshots(
      em,
      { organizationId: request.organizationId, workspaceId: workspace.id, dataSource, runId: request.runId },
      measured.flatMap((m) => (m.metrics ? [m.metrics] : [])),
    );
    for (const m of measured) {
      const label = `${m.table.schema}.${m.table.name}`;
      const p = tablePlans.find((x) => `${x.schema}.${x.name}` === label)!;
      if (!m.metrics) {
        skippedTables.add(label);
        summary.errors.push({ table: label, message: m.error ?? 'not measured' });
        continue;
      }
      summary.tables_measured++;
      for (const c of p.columnMonitoring)
        results.push(...evaluateColumnMonitoring(m.metrics, c.column, c.config));
      if (p.tableMonitoring)
        results.push(...evaluateTableMonitoring(m.metrics, p.tableMonitoring, previous.get(label) ?? null));
      if (p.tests.length > 0 || p.key) {
        const existing = new Set(m.table.columns.map((c) => c.name));
        const runnable = p.tests.filter((t) => existing.has(t.column));
        // A missing key column fails its own not_null test (column_exists) already.
        const key = p.key?.columns.every((c) => existing.has(c)) ? p.key : null;
        // A column's tests that cannot run at all: a failed check of their own, an alert.
        const cannotRun = (column: string | null, check: string, message: string): CheckResult => ({
          check_key: checkKey('test', label, column, check),
          kind: 'test',
          check,
          table: label,
          column,
          status: 'fail',
          measured: null,
          threshold: null,
          severity: 'error',
          message,
        });
        for (const t of p.tests.filter((x) => !existing.has(x.column)))
          results.push(
            cannotRun(t.column, 'column_exists', `${label} has no column ${t.column}: its tests cannot run`),
          );
        // The database refused the statement (a bound the column's type cannot hold), as opposed to
        // an outage.
        const refused = (error: unknown): error is AppError =>
          error instanceof AppError && error.code === 'BAD_REQUEST';
        const runTests = (tests: typeof runnable, withKey: KeyTest | null = null) =>
          warehouse.transaction(async (tx) => {
            await tx.query('set transaction read only');
            return runColumnTests(tx, { schema: m.table.schema, name: m.table.name }, tests, withKey);
          });
        try {
          results.push(...(await runTests(runnable, key)));
        } catch (error) {
          if (!refused(error)) {
            skippedTables.add(label);
            summary.errors.push({ table: label, message: `column tests: ${(error as Error).message}` });
          } else {
            // The tests run again column by column, so one test that cannot run fails alone, as an
            // alert of its own, instead of silencing every test of the table.
            for (const t of runnable) {
              try {
                results.push(...(await runTests([t])));
              } catch (columnError) {
                if (!refused(columnError)) throw columnError;
                results.push(
                  cannotRun(
                    t.column,
                    'runs',
                    `The tests of ${label}.${t.column} cannot run: ${columnError.message}`,
                  ),
                );
              }
            }
            if (key)
              try {
                results.push(...(await runTests([], key)));
              } catch (keyError) {
                if (!refused(keyError)) throw keyError;
                results.push(
                  cannotRun(
                    null,
                    'primary_key',
                    `The key test of ${label} (${key.columns.join(', ')}) cannot run: ${keyError.message}`,
                  ),
                );
              }
          }
        }
      }
    }
  }

  await request.progress?.({ phase: 'alerting', checks: results.length });
  summary.alerts = await recordCheckResults(em, results, {
    organizationId: request.organizationId,
    workspaceId: workspace.id,
    runId: request.runId,
    kinds: ['test', 'monitor'],
    skippedTables,
  });
  summary.checks = results.length;
  summary.passed = results.filter((r) => r.status === 'pass').length;
  summary.failed = results.length - summary.passed;
  summary.failures = results
    .filter((r) => r.status === 'fail')
    .slice(0, 200)
    .map((r) => ({ check_key: r.check_key, severity: r.severity, message: r.message }));
  summary.identity_rebuild_due =
    request.reason === 'materialization' &&
    (await em.count(IdentityGraph, { organization: request.organizationId, workspace: workspace.id })) > 0;
  return summary;
}
