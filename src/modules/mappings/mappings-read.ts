import { hasUncommittedChanges } from './mappings-merge.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import type { JobRunView } from '../../jobs/queue.ts';
import {
  currentWorkspace,
  selectedWorkspaceGone,
  selectedWorkspaceIdOrFail,
  targetSchemaOf,
} from '../workspaces/workspaces.service.ts';
import { targetTableOf } from './mappings-catalog.ts';
import type { TableMappingEntity } from './mappings.entity.ts';
import { MATERIALIZE_MAPPING_KIND, viewOf, type MappingFields, type runView } from './mappings.service.ts';

/*
 * The two mapping reads (GET /api/mappings and GET /api/mappings/{table_name}) on rows rather than
 * entities: the mappings only pass through to the answer, and their commits and runs are read in the
 * same statement.
 */

/**
 * Mappings of a workspace read for their views in one statement: each with the mapping its newest
 * commit recorded and its newest materialization run (read here, on the request's connection and
 * under its row-level security, rather than through the job queue's connection). The count of
 * statements stays one however many mappings there are. The run's key is `materializeKey` (workspace
 * id, colon, table name) spelled in SQL.
 */
const MAPPING_VIEW_COLUMNS = `m.table_name, m.tables, m.connections, m.transformations, m.ambiguities,
  m.decisions, m.version, m.committed_version, m.materialized_version, m.materialized_at,
  m.materialized_rows, m.created_at, m.updated_at,
  case when m.committed_version is null then null else
    (select c.mapping from mapping_commits c
      where c.organization_id = m.organization_id and c.workspace_id = m.workspace_id
        and c.table_name = m.table_name
      order by c.version desc limit 1) end as committed_mapping,
  (select to_jsonb(r) from job_runs r
    where r.organization_id = m.organization_id and r.kind = '${MATERIALIZE_MAPPING_KIND}'
      and r.singleton_key = m.workspace_id || ':' || m.table_name
    order by r.created_at desc limit 1) as last_run`;

interface MappingViewRow {
  table_name: string;
  tables: TableMappingEntity['tables'];
  connections: TableMappingEntity['connections'];
  transformations: TableMappingEntity['transformations'];
  ambiguities: TableMappingEntity['ambiguities'];
  decisions: TableMappingEntity['decisions'];
  version: number;
  committed_version: number | null;
  materialized_version: number | null;
  materialized_at: string | null;
  materialized_rows: string | number | null;
  created_at: string;
  updated_at: string;
  committed_mapping: Record<string, unknown> | null;
  last_run: Record<string, unknown> | null;
}

const dateOf = (value: unknown) => (value == null ? null : new Date(value as string));

/** A job run as `to_jsonb` gives it, as the run part of a mapping's view. */
function runViewOfJson(run: Record<string, unknown>): ReturnType<typeof runView> {
  const startedAt = dateOf(run.started_at);
  const finishedAt = dateOf(run.finished_at);
  return {
    run_id: String(run.id),
    status: run.status as JobRunView['status'],
    progress: (run.progress as JobRunView['progress']) ?? {},
    result: (run.result as JobRunView['result']) ?? null,
    error: (run.error as string | null) ?? null,
    retry_count: Number(run.retry_count),
    created_at: dateOf(run.created_at)!,
    started_at: startedAt,
    finished_at: finishedAt,
    duration_ms: startedAt && finishedAt ? finishedAt.getTime() - startedAt.getTime() : null,
  };
}

function viewOfRow(row: MappingViewRow) {
  const mapping: MappingFields = {
    tableName: row.table_name,
    tables: row.tables,
    connections: row.connections,
    transformations: row.transformations,
    ambiguities: row.ambiguities,
    decisions: row.decisions,
    version: row.version,
    committedVersion: row.committed_version,
    materializedVersion: row.materialized_version,
    materializedAt: dateOf(row.materialized_at),
    materializedRows: row.materialized_rows == null ? null : Number(row.materialized_rows),
    createdAt: new Date(row.created_at),
    updatedAt: new Date(row.updated_at),
  };
  const hasChanges = row.committed_version == null || hasUncommittedChanges(mapping, row.committed_mapping);
  return viewOf(mapping, hasChanges, row.last_run ? runViewOfJson(row.last_run) : null);
}

function emptyView(tableName: string) {
  return {
    table_name: tableName,
    tables: {},
    connections: [],
    transformations: {},
    ambiguities: [],
    version: 0,
    committed_version: null,
    decisions: [],
    has_uncommitted_changes: false,
    materialization: { materialized_version: null, materialized_at: null, rows: null, last_run: null },
    created_at: null,
    updated_at: null,
  };
}

export async function listMappings(scope: CallerScope, input: { include_workspace: boolean }) {
  const workspace = await currentWorkspace(scope);
  const rows: MappingViewRow[] = await scope.em.execute(
    `select ${MAPPING_VIEW_COLUMNS} from mappings m
      where m.organization_id = ? and m.workspace_id = ? order by m.table_name asc`,
    [organizationOf(scope.principal), workspace.id],
  );
  const schema = targetSchemaOf(workspace);
  const mapped = new Set(rows.map((m) => m.table_name));
  return {
    workspace_name: workspace.name,
    mappings: rows.map(viewOfRow),
    ...(input.include_workspace
      ? {
          workspace: {
            name: workspace.name,
            description: workspace.description,
            source_configured: !!workspace.sourceConfig,
            target_configured: !!workspace.targetConfig,
            schema_name: schema?.name ?? null,
            schema_tables: schema?.tables.map((t) => t.name) ?? [],
            unmapped_tables: schema?.tables.map((t) => t.name).filter((t) => !mapped.has(t)) ?? [],
          },
        }
      : {}),
  };
}

/**
 * One statement: the selected workspace joined with the table's mapping. Only a table without a
 * mapping reads the workspace's schema, to tell an unmapped table (an empty view) from an unknown one.
 */
export async function getMapping(scope: CallerScope, tableName: string) {
  const workspaceId = await selectedWorkspaceIdOrFail(scope);
  const [row]: (MappingViewRow & { mapped: boolean })[] = await scope.em.execute(
    `select m.id is not null as mapped, ${MAPPING_VIEW_COLUMNS}
       from workspaces w
       left join mappings m on m.organization_id = w.organization_id and m.workspace_id = w.id
                           and m.table_name = ?
      where w.id = ? and w.organization_id = ?`,
    [tableName, workspaceId, organizationOf(scope.principal)],
  );
  if (!row) throw selectedWorkspaceGone(scope);
  if (row.mapped) return viewOfRow(row);
  targetTableOf(await currentWorkspace(scope), tableName);
  return emptyView(tableName);
}
