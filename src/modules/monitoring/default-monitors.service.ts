import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { detectTimestampColumn } from '../../quality/metrics.ts';
import { TableMapping } from '../mappings/mappings.entity.ts';
import { SchemaConfig } from '../schemas/schemas.entity.ts';
import type { TargetSchema } from '../schemas/schemas.schemas.ts';
import { targetSchemaOf, type WorkspaceEntity } from '../workspaces/workspaces.service.ts';
import { replaceTargetSchema } from '../workspaces/workspaces-schema.service.ts';
import { DefaultMonitor } from './monitoring.entity.ts';

/*
 * Default monitors proposed from schema.json and the mappings:
 *   - primary key: the column tests not_null + unique (severity error) on a single-column key; on a
 *     composite key, not_null on each column (uniqueness of a key spanning columns is not a column test);
 *   - freshness: a table monitoring config on the table's timestamp column (max age 48 h, warning),
 *     the column chosen among the timestamp columns the mapping fills when it fills any, else among
 *     all of them (names like updated_at, loaded_at, created_at first).
 * A default is added only where nothing is configured, and only once: a default the user removed is
 * remembered (monitoring_default_monitors) and never proposed again.
 */

const DEFAULT_FRESHNESS_MAX_AGE_SECONDS = 48 * 3600;

export interface DefaultMonitorProposal {
  key: string;
  kind: 'column_test' | 'table_monitoring';
  table_name: string;
  column_name: string | null;
  config: Record<string, unknown>;
  /** new: would be added; configured: the user already has one there; declined: added once, since removed. */
  state: 'new' | 'configured' | 'declined';
}

type Table = TargetSchema['tables'][number];

function mappedColumns(
  mapping: { connections: { target_field: string }[]; transformations: Record<string, unknown> } | undefined,
) {
  if (!mapping) return new Set<string>();
  return new Set([
    ...mapping.connections.map((c) => c.target_field),
    ...Object.keys(mapping.transformations),
  ]);
}

export async function proposeDefaultMonitors(
  scope: CallerScope,
  workspace: WorkspaceEntity,
): Promise<DefaultMonitorProposal[]> {
  const schema = targetSchemaOf(workspace);
  if (!schema) return [];
  const organization = organizationOf(scope.principal);
  const mappings = await scope.em.find(TableMapping, { organization, workspace: workspace.id });
  const tableConfigs = await scope.em.find(SchemaConfig, {
    organization,
    workspace: workspace.id,
    schemaType: 'target',
    kind: 'table_monitoring',
  });
  const remembered = await scope.em.find(DefaultMonitor, { organization, workspace: workspace.id });
  const done = new Set(remembered.map((d) => d.monitorKey));
  const monitored = new Set(tableConfigs.map((c) => c.tableName));
  const proposals: DefaultMonitorProposal[] = [];
  const state = (key: string, configured: boolean) =>
    configured ? 'configured' : done.has(key) ? 'declined' : 'new';
  for (const table of schema.tables as Table[]) {
    const single = table.primary_key.length === 1;
    for (const name of table.primary_key) {
      const column = table.columns.find((c) => c.name === name);
      if (!column) continue;
      const key = `pk:${table.name}:${name}`;
      proposals.push({
        key,
        kind: 'column_test',
        table_name: table.name,
        column_name: name,
        config: single
          ? { not_null: true, unique: true, severity: 'error' }
          : { not_null: true, severity: 'error' },
        state: state(key, (column as { tests?: unknown }).tests !== undefined),
      });
    }
    const stamps = table.columns.map((c) => ({ name: c.name, type: c.type }));
    const filled = mappedColumns(mappings.find((m) => m.tableName === table.name));
    const column =
      detectTimestampColumn(stamps.filter((c) => filled.has(c.name))) ?? detectTimestampColumn(stamps);
    if (column) {
      const key = `freshness:${table.name}`;
      proposals.push({
        key,
        kind: 'table_monitoring',
        table_name: table.name,
        column_name: column,
        config: {
          freshness: { max_age_seconds: DEFAULT_FRESHNESS_MAX_AGE_SECONDS, column },
          severity: 'warning',
        },
        state: state(key, monitored.has(table.name)),
      });
    }
  }
  return proposals;
}

/**
 * Adds the proposals in state `new` (called after a schema sync) and remembers them. Column tests go
 * onto the schema.json columns, where the transformation project reads them; freshness goes into a
 * table monitoring config.
 */
export async function applyDefaultMonitors(scope: CallerScope, workspace: WorkspaceEntity) {
  const proposals = (await proposeDefaultMonitors(scope, workspace)).filter((p) => p.state === 'new');
  if (proposals.length === 0) return { added: [] as DefaultMonitorProposal[] };
  const organization = organizationOf(scope.principal);
  const tests = proposals.filter((p) => p.kind === 'column_test');
  if (tests.length > 0) {
    const next = structuredClone(targetSchemaOf(workspace)!);
    for (const p of tests) {
      const column = next.tables
        .find((t) => t.name === p.table_name)
        ?.columns.find((c) => c.name === p.column_name);
      if (column) (column as Record<string, unknown>).tests = p.config;
    }
    await replaceTargetSchema(scope, workspace, next, {
      template: workspace.schemaTemplate ?? null,
      customized: workspace.schemaCustomized,
    });
  }
  for (const p of proposals) {
    if (p.kind === 'table_monitoring')
      scope.em.create(SchemaConfig, {
        organization,
        workspace: workspace.id,
        schemaType: 'target',
        tableName: p.table_name,
        columnName: '',
        kind: 'table_monitoring',
        config: p.config,
        updatedBy: 'dimas (default monitor)',
      });
    scope.em.create(DefaultMonitor, {
      organization,
      workspace: workspace.id,
      monitorKey: p.key,
      config: p.config,
    });
  }
  await scope.em.flush();
  return { added: proposals.map((p) => ({ ...p, state: 'configured' as const })) };
}
