import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope, Scope } from '../../deps.ts';
import { splitSourceField, type TargetTable } from '../../transform/mapping.ts';
import { invalidateWorkspaceCaches } from '../workspaces/workspaces-cache.ts';
import { currentWorkspace, type WorkspaceEntity } from '../workspaces/workspaces.service.ts';
import type { JobRunView } from '../../jobs/queue.ts';
import {
  MappingCommit,
  TableMapping,
  type MappingDecision,
  type StoredConnection,
  type StoredTransformation,
  type TableMappingEntity,
} from './mappings.entity.ts';
import {
  hasUncommittedChanges,
  mergeDiscovery,
  canonicalMapping,
  type DiscoveredMapping,
} from './mappings-merge.ts';
import {
  checkExpression,
  mappingTableResolver,
  resolveSourceTable,
  sourceCatalog,
  targetColumn,
  targetTableOf,
} from './mappings-catalog.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';

/** The job kind of a table materialization (mappings.jobs.ts). */
export const MATERIALIZE_MAPPING_KIND = 'mapping-materialize';

/** `table.*` → `*`: every target column filled from the column of the same name. */
export const WILDCARD_FIELD = '*';

// ---- loading and viewing ----

/** A table's mapping before anyone mapped anything: version 0, so the first change makes it 1. */
function emptyMapping(scope: Scope, workspace: WorkspaceEntity, tableName: string): TableMappingEntity {
  return scope.em.create(TableMapping, {
    organization: workspace.organization.id,
    workspace: workspace.id,
    tableName,
    tables: {},
    connections: [],
    transformations: {},
    ambiguities: [],
    version: 0,
  });
}

export async function findMapping(
  em: EntityManager,
  workspace: WorkspaceEntity,
  tableName: string,
): Promise<TableMappingEntity | null> {
  return em.findOne(TableMapping, {
    organization: workspace.organization.id,
    workspace: workspace.id,
    tableName,
  });
}

/** A mapping of the current workspace; 404 when the table has none. */
export async function requireMapping(scope: CallerScope, tableName: string) {
  const workspace = await currentWorkspace(scope);
  const mapping = await findMapping(scope.em, workspace, tableName);
  if (!mapping) {
    // Say which of the two is missing: the table, or its mapping.
    targetTableOf(workspace, tableName);
    throw notFound(`Mapping of table ${tableName}`);
  }
  return { workspace, mapping };
}

async function latestRun(
  scope: Scope,
  workspace: WorkspaceEntity,
  tableName: string,
): Promise<JobRunView | null> {
  const [row] = await scope.em.execute(
    `select id from job_runs where organization_id = ? and kind = ? and singleton_key = ? order by created_at desc limit 1`,
    [workspace.organization.id, MATERIALIZE_MAPPING_KIND, materializeKey(workspace, tableName)],
  );
  return row ? scope.deps.jobs.getRun(row.id, workspace.organization.id, scope.em) : null;
}

export const materializeKey = (workspace: WorkspaceEntity, tableName: string) =>
  `${workspace.id}:${tableName}`;

export function runView(run: JobRunView) {
  return {
    run_id: run.id,
    status: run.status,
    progress: run.progress,
    result: run.result,
    error: run.error,
    retry_count: run.retry_count,
    created_at: run.created_at,
    started_at: run.started_at,
    finished_at: run.finished_at,
    duration_ms: run.duration_ms,
  };
}

/** The mapping document as it is stored and shown (mappings/<table>.json carries the same). */
export function mappingDocument(mapping: MappingFields) {
  return {
    table_name: mapping.tableName,
    tables: mapping.tables,
    connections: mapping.connections,
    transformations: mapping.transformations,
    ambiguities: mapping.ambiguities,
    version: mapping.version,
    committed_version: mapping.committedVersion ?? null,
  };
}

/** The mapping the newest commit of a table recorded (null before the first commit). */
async function committedMapping(
  em: EntityManager,
  workspace: WorkspaceEntity,
  tableName: string,
): Promise<Record<string, unknown> | null> {
  const commit = await em.findOne(
    MappingCommit,
    { organization: workspace.organization.id, workspace: workspace.id, tableName },
    { orderBy: { version: 'desc' }, fields: ['mapping'] },
  );
  return commit?.mapping ?? null;
}

/** The one definition of "changed since the last commit" (view, transformation-diff, drift). */
export async function mappingChanged(
  em: EntityManager,
  workspace: WorkspaceEntity,
  mapping: TableMappingEntity,
) {
  if (mapping.committedVersion == null) return true;
  return hasUncommittedChanges(mapping, await committedMapping(em, workspace, mapping.tableName));
}

/** What a mapping's view shows of it: the entity, or a row read for the view alone. */
export type MappingFields = Pick<
  TableMappingEntity,
  | 'tableName'
  | 'tables'
  | 'connections'
  | 'transformations'
  | 'ambiguities'
  | 'decisions'
  | 'version'
  | 'committedVersion'
  | 'materializedVersion'
  | 'materializedAt'
  | 'materializedRows'
  | 'createdAt'
  | 'updatedAt'
>;

export function viewOf(
  mapping: MappingFields,
  hasChanges: boolean,
  lastRun: ReturnType<typeof runView> | null,
) {
  return {
    ...mappingDocument(mapping),
    decisions: mapping.decisions ?? [],
    has_uncommitted_changes: hasChanges,
    materialization: {
      materialized_version: mapping.materializedVersion ?? null,
      materialized_at: mapping.materializedAt ?? null,
      rows: mapping.materializedRows ?? null,
      last_run: lastRun,
    },
    created_at: mapping.createdAt,
    updated_at: mapping.updatedAt,
  };
}

export async function mappingView(scope: Scope, workspace: WorkspaceEntity, mapping: TableMappingEntity) {
  const run = await latestRun(scope, workspace, mapping.tableName);
  return viewOf(
    await withRecordedMaterialization(scope.em, mapping, run),
    await mappingChanged(scope.em, workspace, mapping),
    run ? runView(run) : null,
  );
}

/**
 * A materialization records its version and rows on the mapping before its run is marked ended, and
 * the mapping here was read before the run: a succeeded run whose figures the mapping does not show
 * means the mapping was read before that write, so the figures are read again from its row (the
 * entity, with this request's edits, stays as it is).
 */
async function withRecordedMaterialization(
  em: EntityManager,
  mapping: TableMappingEntity,
  run: JobRunView | null,
): Promise<MappingFields> {
  const result = run?.status === 'succeeded' ? run.result : null;
  if (
    !result ||
    (result.version === mapping.materializedVersion && result.rows_written === mapping.materializedRows)
  )
    return mapping;
  const [row] = (await em.execute(
    `select materialized_version, materialized_at, materialized_rows from mappings where id = ?`,
    [mapping.id],
  )) as {
    materialized_version: number | null;
    materialized_at: Date | null;
    materialized_rows: string | number | null;
  }[];
  if (!row) return mapping;
  return {
    ...mapping,
    materializedVersion: row.materialized_version,
    materializedAt: row.materialized_at === null ? null : new Date(row.materialized_at),
    materializedRows: row.materialized_rows === null ? null : Number(row.materialized_rows),
  };
}

// ---- writing ----

/**
 * Loads (or starts) the mapping of a table of the current workspace, lets `change` edit it and
 * stores it with its version bumped. The target table must exist in the schema (404 otherwise).
 * Edits made at the same time run again until each lands (`concurrentEdit`).
 */
async function editMappingOnce<T>(
  scope: CallerScope,
  tableName: string,
  change: (ctx: {
    workspace: WorkspaceEntity;
    target: TargetTable;
    mapping: TableMappingEntity;
  }) => Promise<T>,
  options: { create?: boolean } = { create: true },
): Promise<{ mapping: TableMappingEntity; workspace: WorkspaceEntity; result: T }> {
  const workspace = await currentWorkspace(scope);
  const target = targetTableOf(workspace, tableName);
  let mapping = await findMapping(scope.em, workspace, tableName);
  if (!mapping) {
    if (!options.create) throw notFound(`Mapping of table ${tableName}`);
    mapping = emptyMapping(scope, workspace, tableName);
  }
  const result = await change({ workspace, target, mapping });
  mapping.version += 1;
  await scope.em.flush();
  invalidateWorkspaceCaches(workspace.organization.id, workspace.id);
  return { mapping, workspace, result };
}

// The wrapper passes its arguments through, so the edit's own signature (generic in T) holds.
export const editMapping = concurrentEdit(editMappingOnce) as typeof editMappingOnce;

export async function addConnection(
  scope: CallerScope,
  input: {
    table_name: string;
    connection: {
      source_field: string;
      target_field: string;
      status: 'suggested' | 'confirmed';
      confidence?: number | null;
    };
  },
) {
  const { connection } = input;
  const { mapping, workspace } = await editMapping(
    scope,
    input.table_name,
    async ({ workspace, target, mapping }) => {
      const split = splitSourceField(connection.source_field)!;
      const wildcard = split.column === WILDCARD_FIELD;
      if (wildcard !== (connection.target_field === WILDCARD_FIELD))
        throw new AppError(
          'BAD_REQUEST',
          'A wildcard connection maps "table.*" to target_field "*"; neither side may be a wildcard alone',
        );
      if (!wildcard && !targetColumn(target, connection.target_field))
        throw new AppError(
          'BAD_REQUEST',
          `Target table ${target.name} has no column ${connection.target_field}`,
        );
      let catalog = await sourceCatalog(scope, workspace);
      const resolved = await resolveSourceTable(scope, workspace, split.table, catalog);
      catalog = resolved.catalog;
      const table = resolved.table;
      if (!wildcard && !table.columns.has(split.column)) {
        const fresh = await sourceCatalog(scope, workspace, { refresh: true });
        if (!fresh.byKey.get(table.key)?.columns.has(split.column))
          throw new AppError('BAD_REQUEST', `Source table ${table.key} has no column ${split.column}`);
      }
      if (!mapping.tables[table.key]) {
        if (Object.keys(mapping.tables).length > 0)
          throw new AppError(
            'BAD_REQUEST',
            `Source table ${table.key} is not part of the mapping of ${target.name}: add it first with POST /api/mappings/${target.name}/tables (relationship "join" with join_on)`,
          );
        mapping.tables = { [table.key]: { relationship: 'primary' } };
      }
      const sourceField = `${table.key}.${split.column}`;
      // Confirming discovery's own proposal keeps its evidence; a connection made by hand has none.
      const proposed = mapping.connections.find(
        (c) => c.source_field === sourceField && c.target_field === connection.target_field,
      );
      const stored: StoredConnection = {
        source_field: sourceField,
        target_field: connection.target_field,
        status: connection.status,
        confidence: connection.confidence ?? null,
        ...(proposed?.evidence ? { evidence: proposed.evidence } : {}),
      };
      const others = mapping.connections.filter(
        (c) => !(c.source_field === sourceField && c.target_field === connection.target_field),
      );
      mapping.connections = [...others, stored];
      mapping.decisions = withoutDecisions(mapping, connection.target_field, sourceField);
      // Discovery's cleaning of another source does not apply to the one the person chose.
      const proposal = mapping.transformations[connection.target_field]?.proposed;
      if (proposal && connection.status === 'confirmed' && proposal.source_field !== sourceField) {
        const { [connection.target_field]: _dropped, ...rest } = mapping.transformations;
        mapping.transformations = rest;
      }
      if (connection.status === 'confirmed')
        mapping.ambiguities = mapping.ambiguities.filter((a) => a.target_field !== connection.target_field);
    },
  );
  return mappingView(scope, workspace, mapping);
}

/** The mapping's refusals minus "no source" for the field and the refusal of this source for it. */
function withoutDecisions(mapping: TableMappingEntity, targetField: string, sourceField: string) {
  return (mapping.decisions ?? []).filter(
    (d) =>
      d.cleaning === 'refused' ||
      !(d.target_field === targetField && (d.source_field === null || d.source_field === sourceField)),
  );
}

/** Records a person's refusal once; discovery reads it (mergeDiscovery). */
function withDecision(mapping: TableMappingEntity, decision: MappingDecision) {
  const others = (mapping.decisions ?? []).filter(
    (d) =>
      !(
        d.target_field === decision.target_field &&
        d.source_field === decision.source_field &&
        (d.cleaning ?? null) === (decision.cleaning ?? null)
      ),
  );
  return [...others, decision];
}

/** A source field as written (bare or qualified table) → its stored spelling, if the mapping has it. */
function storedSourceField(mapping: TableMappingEntity, written: string): string {
  const split = splitSourceField(written);
  if (!split) return written;
  const key = mappingTableResolver(Object.keys(mapping.tables))(split.table);
  return key ? `${key}.${split.column}` : written;
}

export async function deleteConnection(
  scope: CallerScope,
  input: { table_name: string; source_field: string; target_field: string },
) {
  const { mapping, workspace } = await editMapping(
    scope,
    input.table_name,
    async ({ mapping }) => {
      const sourceField = storedSourceField(mapping, input.source_field);
      const kept = mapping.connections.filter(
        (c) => !(c.source_field === sourceField && c.target_field === input.target_field),
      );
      if (kept.length === mapping.connections.length)
        throw notFound(`Connection ${input.source_field} → ${input.target_field} of ${input.table_name}`);
      mapping.connections = kept;
      // Discovery's cleaning of the removed source goes with it.
      if (mapping.transformations[input.target_field]?.proposed?.source_field === sourceField) {
        const { [input.target_field]: _dropped, ...rest } = mapping.transformations;
        mapping.transformations = rest;
      }
      // Removing a connection by hand refuses it: a later discovery does not bring it back.
      if (input.target_field !== WILDCARD_FIELD)
        mapping.decisions = withDecision(mapping, {
          target_field: input.target_field,
          source_field: sourceField,
        });
    },
    { create: false },
  );
  return mappingView(scope, workspace, mapping);
}

export async function setTransformation(
  scope: CallerScope,
  input: {
    table_name: string;
    transformation: { target_field: string; expression: string; description?: string | null };
  },
) {
  const { transformation } = input;
  const { mapping, workspace } = await editMapping(
    scope,
    input.table_name,
    async ({ workspace, target, mapping }) => {
      if (!targetColumn(target, transformation.target_field))
        throw new AppError(
          'BAD_REQUEST',
          `Target table ${target.name} has no column ${transformation.target_field}`,
        );
      const tableKeys = Object.keys(mapping.tables);
      let catalog = await sourceCatalog(scope, workspace);
      try {
        await checkExpression(
          transformation.expression,
          tableKeys,
          catalog,
          `Transformation for ${transformation.target_field}`,
        );
      } catch (error) {
        // A column created since the catalog was read: look again before refusing.
        if (!(error instanceof AppError) || !/has no column/.test(error.message)) throw error;
        catalog = await sourceCatalog(scope, workspace, { refresh: true });
        await checkExpression(
          transformation.expression,
          tableKeys,
          catalog,
          `Transformation for ${transformation.target_field}`,
        );
      }
      const stored: StoredTransformation = {
        expression: transformation.expression,
        description: transformation.description ?? null,
      };
      mapping.transformations = { ...mapping.transformations, [transformation.target_field]: stored };
    },
  );
  return mappingView(scope, workspace, mapping);
}

export async function deleteTransformation(
  scope: CallerScope,
  input: { table_name: string; target_field: string },
) {
  const { mapping, workspace } = await editMapping(
    scope,
    input.table_name,
    async ({ mapping }) => {
      const removed = mapping.transformations[input.target_field];
      if (!removed) throw notFound(`Transformation of ${input.table_name}.${input.target_field}`);
      const { [input.target_field]: _removed, ...rest } = mapping.transformations;
      mapping.transformations = rest;
      // Removing discovery's cleaning refuses it: a later discovery does not propose it again.
      if (removed.proposed)
        mapping.decisions = withDecision(mapping, {
          target_field: input.target_field,
          source_field: removed.proposed.source_field,
          cleaning: 'refused',
        });
    },
    { create: false },
  );
  return mappingView(scope, workspace, mapping);
}

// ---- ambiguities ----

export async function resolveAmbiguity(
  scope: CallerScope,
  input: { resolve_input: { table_name: string; target_field: string; source_field: string | null } },
) {
  const { table_name, target_field, source_field } = input.resolve_input;
  const { mapping, workspace } = await editMapping(
    scope,
    table_name,
    async ({ mapping }) => {
      const ambiguity = mapping.ambiguities.find((a) => a.target_field === target_field);
      if (!ambiguity) throw notFound(`Open ambiguity for ${table_name}.${target_field}`);
      const candidates = ambiguity.candidates.map((c) => storedSourceField(mapping, c.source_field));
      const chosen = source_field === null ? null : storedSourceField(mapping, source_field);
      if (chosen !== null && !candidates.includes(chosen))
        throw new AppError(
          'BAD_REQUEST',
          `${source_field} is not a candidate for ${target_field}; choose one of ${candidates.join(', ')} or null for none`,
        );
      // The candidates that lost are suggestions no longer; the choice becomes a confirmed connection.
      mapping.connections = mapping.connections.filter(
        (c) =>
          !(
            c.target_field === target_field &&
            (candidates.includes(c.source_field) || c.source_field === chosen)
          ),
      );
      if (chosen) {
        const candidate = ambiguity.candidates[candidates.indexOf(chosen)];
        mapping.connections.push({
          source_field: chosen,
          target_field,
          status: 'confirmed',
          confidence: candidate.confidence ?? null,
          ...(candidate.evidence ? { evidence: candidate.evidence } : {}),
        });
        const table = splitSourceField(chosen)?.table;
        if (table && Object.keys(mapping.tables).length === 0)
          mapping.tables = { [table]: { relationship: 'primary' } };
      } else mapping.decisions = withDecision(mapping, { target_field, source_field: null });
      mapping.ambiguities = mapping.ambiguities.filter((a) => a !== ambiguity);
    },
    { create: false },
  );
  return mappingView(scope, workspace, mapping);
}

// ---- discovery writes (used by the discovery agent and setup-environment) ----

/**
 * Writes discovery's suggestions into a table's mapping under the person's decisions
 * (mergeDiscovery). The version moves only when the mapping changed. Runs on the given em (the
 * caller's transaction) and leaves the flush to it.
 */
export async function writeSuggestions(
  scope: Scope,
  workspace: WorkspaceEntity,
  tableName: string,
  found: DiscoveredMapping,
  options: { autoConfirm?: number | null } = {},
) {
  let mapping = await findMapping(scope.em, workspace, tableName);
  if (!mapping) mapping = emptyMapping(scope, workspace, tableName);
  const before = mapping.version === 0 ? null : canonicalMapping(mapping);
  const merged = mergeDiscovery(mapping, found, options);
  const changed = before !== canonicalMapping(merged);
  // Unchanged, the run may still explain its proposals anew (fresh samples, evidence first kept by
  // this run): the explanation is refreshed without counting as a change of the mapping.
  const explained =
    JSON.stringify([merged.connections, merged.ambiguities]) !==
    JSON.stringify([mapping.connections, mapping.ambiguities]);
  if (changed || explained) {
    mapping.tables = merged.tables;
    mapping.connections = merged.connections;
    mapping.ambiguities = merged.ambiguities;
    mapping.transformations = merged.transformations;
  }
  if (changed) {
    mapping.version += 1;
    invalidateWorkspaceCaches(workspace.organization.id, workspace.id);
  }
  return { mapping, changed, kept: merged.kept };
}

// ---- clear-all ----

export async function clearAll(scope: CallerScope, input: { confirm_workspace_name?: string }) {
  const workspace = await currentWorkspace(scope);
  if (input.confirm_workspace_name !== workspace.name)
    throw new AppError(
      'BAD_REQUEST',
      `Clearing removes every mapping and committed transformation of workspace ${workspace.name}; confirm by passing confirm_workspace_name=${workspace.name}`,
    );
  const where = { organization: workspace.organization.id, workspace: workspace.id };
  const { deletedMappings, deletedCommits } = await scope.em.transactional(async (em) => ({
    deletedCommits: await em.nativeDelete(MappingCommit, where),
    deletedMappings: await em.nativeDelete(TableMapping, where),
  }));
  invalidateWorkspaceCaches(workspace.organization.id, workspace.id);
  return {
    success: true as const,
    workspace_name: workspace.name,
    deleted_mappings: deletedMappings,
    deleted_commits: deletedCommits,
  };
}
