import { createTwoFilesPatch } from 'diff';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope, Scope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import type { Warehouse } from '../../warehouse/warehouse.ts';
import { quoteIdent } from '../../warehouse/postgres.ts';
import { planMapping, splitSourceField, type TargetTable } from '../../transform/mapping.ts';
import { columnSql, generateSelectSql, selectSqlFromPlan } from '../../transform/sql.ts';
import { generatePython } from '../../transform/python.ts';
import { pushWorkspaceFiles, type PushResult } from '../../vcs/push-workspace.ts';
import { invalidateWorkspaceCaches, mappingCache } from '../workspaces/workspaces-cache.ts';
import { currentWorkspace, type WorkspaceEntity } from '../workspaces/workspaces.service.ts';
import { workspaceFiles } from '../workspaces/workspaces-files.service.ts';
import { WorkspaceCommit } from '../workspaces/workspaces.entity.ts';
import { piiPolicyOf } from '../sources/pii-policy.service.ts';
import { MappingCommit, TableMapping, type TableMappingEntity } from './mappings.entity.ts';
import { hasUncommittedChanges } from './mappings-merge.ts';
import { fanOutProblems, measureFanOut } from './mappings-fanout.ts';
import {
  MATERIALIZE_MAPPING_KIND,
  findMapping,
  materializeKey,
  mappingChanged,
  requireMapping,
} from './mappings.service.ts';
import { sourceCatalog, sourceWarehouseOf, targetTableOf } from './mappings-catalog.ts';
import { generationInput } from './mappings-wildcard.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';

// ---- generated SQL ----

async function workingSql(scope: Scope, workspace: WorkspaceEntity, mapping: TableMappingEntity) {
  const { mapping: input, target } = await generationInput(scope, workspace, mapping);
  return { ...(await generateSelectSql(input, target)), target };
}

async function newestCommit(scope: Scope, workspace: WorkspaceEntity, tableName: string) {
  return scope.em.findOne(
    MappingCommit,
    { organization: workspace.organization.id, workspace: workspace.id, tableName },
    { orderBy: { version: 'desc' } },
  );
}

export async function transformCode(scope: CallerScope, tableName: string) {
  const { workspace, mapping } = await requireMapping(scope, tableName);
  const cacheKey = `${workspace.id}:sql:${tableName}:${mapping.version}:${mapping.updatedAt.getTime()}`;
  const generated = (await mappingCache.getOrLoad(
    { em: scope.em, organizationId: workspace.organization.id },
    cacheKey,
    () => workingSql(scope, workspace, mapping),
  )) as Awaited<ReturnType<typeof workingSql>>;
  const commit = await newestCommit(scope, workspace, tableName);
  return {
    table_name: tableName,
    version: mapping.version,
    committed_version: mapping.committedVersion ?? null,
    sql: generated.sql,
    columns: generated.columns,
    committed_sql: commit?.sql ?? null,
    matches_committed: commit?.sql === generated.sql,
  };
}

export async function batchTransformCode(scope: CallerScope, input: { table_names?: string[] }) {
  const workspace = await currentWorkspace(scope);
  const mappings = await scope.em.find(
    TableMapping,
    {
      organization: organizationOf(scope.principal),
      workspace: workspace.id,
      ...(input.table_names ? { tableName: { $in: input.table_names } } : {}),
    },
    { orderBy: { tableName: 'asc' } },
  );
  const found = new Set(mappings.map((m) => m.tableName));
  const results = [];
  for (const name of input.table_names ?? [])
    if (!found.has(name))
      results.push({
        table_name: name,
        ok: false,
        sql: null,
        columns: [],
        error: `Mapping of table ${name} not found`,
        issues: [],
      });
  for (const mapping of mappings) {
    try {
      const { sql, columns } = await workingSql(scope, workspace, mapping);
      results.push({ table_name: mapping.tableName, ok: true, sql, columns, error: null, issues: [] });
    } catch (error) {
      if (!(error instanceof AppError) || !['BAD_REQUEST', 'NOT_FOUND', 'CONFLICT'].includes(error.code))
        throw error;
      results.push({
        table_name: mapping.tableName,
        ok: false,
        sql: null,
        columns: [],
        error: error.message,
        issues: error.details.issues ?? [],
      });
    }
  }
  results.sort((a, b) => a.table_name.localeCompare(b.table_name));
  return { results };
}

/** A plan of one target column (the others left out), so a field shows even while others are unmapped. */
async function fieldPlan(
  scope: Scope,
  workspace: WorkspaceEntity,
  mapping: TableMappingEntity,
  field: string,
  expression?: string,
) {
  const { mapping: input, target } = await generationInput(scope, workspace, mapping);
  const column = target.columns.find((c) => c.name === field);
  if (!column) throw notFound(`Column ${field} of target table ${target.name}`);
  const single: TargetTable = { name: target.name, columns: [{ ...column, nullable: true }] };
  if (expression !== undefined)
    input.transformations = { ...input.transformations, [field]: { expression, description: null } };
  const plan = await planMapping(
    {
      ...input,
      connections: input.connections.filter((c) => c.target_field === field),
      transformations: input.transformations?.[field] ? { [field]: input.transformations[field] } : {},
    },
    single,
  );
  return { plan, column: plan.columns[0], target };
}

export async function fieldTransform(
  scope: CallerScope,
  input: { table_name: string; target_field: string },
) {
  const { workspace, mapping } = await requireMapping(scope, input.table_name);
  const { plan, column, target } = await fieldPlan(scope, workspace, mapping, input.target_field);
  const source = column.source;
  const transformation = mapping.transformations[input.target_field];
  return {
    table_name: input.table_name,
    target_field: input.target_field,
    type: target.columns.find((c) => c.name === input.target_field)!.type,
    source: source.kind,
    source_field: source.kind === 'column' ? `${source.table}.${source.column}` : null,
    transformation: transformation ?? null,
    sql: columnSql(plan, column),
  };
}

export async function generateCode(scope: CallerScope, tableName: string) {
  const { workspace, mapping } = await requireMapping(scope, tableName);
  const { mapping: input, target } = await generationInput(scope, workspace, mapping);
  const catalog = await sourceCatalog(scope, workspace);
  const sourceColumns: Record<string, Record<string, string>> = {};
  for (const key of Object.keys(mapping.tables)) {
    const table = catalog.byKey.get(key);
    if (table) sourceColumns[key] = Object.fromEntries(table.columns);
  }
  const { code, inputs } = await generatePython(input, target, { sourceColumns });
  const files = inputs.map((i) => i.file).join(', ');
  return {
    table_name: tableName,
    language: 'python' as const,
    filename: `${tableName}.py`,
    code,
    version: mapping.version,
    usage: `python3 ${tableName}.py --input-dir <directory with ${files}> --output ${tableName}.csv [--null '\\N']`,
    inputs,
  };
}

// ---- running it on the source ----

export async function previewTransformation(
  scope: CallerScope,
  input: { table_name: string; target_field?: string; expression?: string; limit: number },
) {
  if (input.expression !== undefined && !input.target_field)
    throw new AppError('BAD_REQUEST', 'expression previews one field: give target_field too');
  const workspace = await currentWorkspace(scope);
  targetTableOf(workspace, input.table_name);
  const mapping = await findMapping(scope.em, workspace, input.table_name);
  if (!mapping) throw notFound(`Mapping of table ${input.table_name}`);
  let sql: string;
  if (input.target_field) {
    const { plan, column } = await fieldPlan(scope, workspace, mapping, input.target_field, input.expression);
    // The source values the field is computed from, beside the result.
    const sources = new Map<string, string>();
    if (column.source.kind === 'column') sources.set(`${column.source.table}.${column.source.column}`, '');
    const lines = [...sources.keys()].map((field) => {
      const { table, column: name } = splitSourceField(field)!;
      const t = table === plan.primary.key ? plan.primary : plan.joins.find((j) => j.key === table)!;
      return `${t.schema ? `${quoteIdent(t.schema)}.` : ''}${quoteIdent(t.name)}.${quoteIdent(name)} AS ${quoteIdent(field)}`;
    });
    const select = selectSqlFromPlan(plan).sql.split('\n');
    sql = [select[0], ...lines.map((l) => `  ${l},`), ...select.slice(1)].join('\n');
  } else {
    sql = (await workingSql(scope, workspace, mapping)).sql;
  }
  const warehouse = await sourceWarehouseOf(scope, workspace);
  const result = await warehouse.readOnlyQuery(sql, { limit: input.limit });
  const { rows, masked } = (await piiPolicyOf(scope, workspace)).rows(
    result.columns.map((c) => c.name),
    result.rows,
  );
  return {
    table_name: input.table_name,
    target_field: input.target_field ?? null,
    sql,
    columns: result.columns,
    rows,
    masked_columns: masked,
    row_count: result.row_count,
    truncated: result.truncated,
    duration_ms: result.duration_ms,
  };
}

/** JSON with sorted keys: jsonb does not keep the key order a document was written in. */
export function canonicalJson(value: unknown): string {
  const sort = (v: unknown): unknown =>
    Array.isArray(v)
      ? v.map(sort)
      : v && typeof v === 'object' && !(v instanceof Date)
        ? Object.fromEntries(
            Object.keys(v)
              .sort()
              .map((k) => [k, sort((v as Record<string, unknown>)[k])]),
          )
        : v;
  return JSON.stringify(sort(value ?? null));
}

const same = (a: unknown, b: unknown) => canonicalJson(a) === canonicalJson(b);

async function countRows(warehouse: Warehouse, sql: string): Promise<number | null> {
  try {
    const { rows } = await warehouse.readOnlyQuery(`SELECT count(*) AS n FROM (\n${sql}\n) AS counted`, {
      limit: 1,
    });
    return Number(rows[0].n);
  } catch (error) {
    // Too slow to count within the statement timeout: the sample still tells what changes.
    if (error instanceof AppError && error.details.reason === 'STATEMENT_TIMEOUT') return null;
    throw error;
  }
}

export async function transformationDiff(scope: CallerScope, input: { table_name: string; limit: number }) {
  const { workspace, mapping } = await requireMapping(scope, input.table_name);
  const now = await workingSql(scope, workspace, mapping);
  const commit = await newestCommit(scope, workspace, input.table_name);
  const before = commit?.sql ?? '';
  const sqlDiff = createTwoFilesPatch(
    commit ? `a/${input.table_name}.sql` : '/dev/null',
    `b/${input.table_name}.sql`,
    before ? `${before}\n` : '',
    `${now.sql}\n`,
    commit ? `version ${commit.version}` : '',
    `version ${mapping.version}`,
  );
  const newColumns = now.columns.map((c) => c.name);
  const oldColumns = commit?.columns.map((c) => c.name) ?? [];
  const pk = (now.target.primary_key ?? []).filter(
    (k) => newColumns.includes(k) && (!commit || oldColumns.includes(k)),
  );
  const order = pk.length ? `\nORDER BY ${pk.map(quoteIdent).join(', ')}` : '';
  const sampled = (sql: string) => `SELECT * FROM (\n${sql}\n) AS sampled${order}`;
  const warehouse = await sourceWarehouseOf(scope, workspace);
  const after = await warehouse.readOnlyQuery(sampled(now.sql), { limit: input.limit });
  const previous = commit ? await warehouse.readOnlyQuery(sampled(commit.sql), { limit: input.limit }) : null;
  const [rowsBefore, rowsAfter] = await Promise.all([
    commit ? countRows(warehouse, commit.sql) : Promise.resolve(null),
    countRows(warehouse, now.sql),
  ]);

  const shared = newColumns.filter((c) => oldColumns.includes(c));
  const keyOf = (row: Record<string, unknown>) =>
    JSON.stringify(pk.length ? pk.map((k) => row[k]) : shared.map((c) => row[c]));
  const changes: {
    change: 'added' | 'removed' | 'changed';
    key: Record<string, unknown>;
    before: Record<string, unknown> | null;
    after: Record<string, unknown> | null;
    columns: string[];
  }[] = [];
  const changedColumns = new Set<string>();
  const keyColumns = pk.length ? pk : shared;
  const keyObject = (row: Record<string, unknown>) =>
    Object.fromEntries(keyColumns.map((k) => [k, row[k] ?? null]));
  if (previous) {
    // Rows matched by key (the primary key, else the whole row over the shared columns).
    const old = new Map<string, Record<string, unknown>[]>();
    for (const row of previous.rows) old.set(keyOf(row), [...(old.get(keyOf(row)) ?? []), row]);
    for (const row of after.rows) {
      const matches = old.get(keyOf(row));
      const match = matches?.shift();
      if (!match) {
        changes.push({ change: 'added', key: keyObject(row), before: null, after: row, columns: newColumns });
        continue;
      }
      const differing = shared.filter((c) => !same(match[c], row[c]));
      if (differing.length) {
        differing.forEach((c) => changedColumns.add(c));
        changes.push({
          change: 'changed',
          key: keyObject(row),
          before: match,
          after: row,
          columns: differing,
        });
      }
    }
    for (const rest of old.values())
      for (const row of rest)
        changes.push({
          change: 'removed',
          key: keyObject(row),
          before: row,
          after: null,
          columns: oldColumns,
        });
  } else {
    for (const row of after.rows)
      changes.push({ change: 'added', key: keyObject(row), before: null, after: row, columns: newColumns });
  }
  const count = (kind: string) => changes.filter((c) => c.change === kind).length;
  return {
    table_name: input.table_name,
    committed_version: commit?.version ?? null,
    version: mapping.version,
    has_changes: await mappingChanged(scope.em, workspace, mapping),
    sql_diff: sqlDiff,
    data_diff: {
      sample_size: input.limit,
      key_columns: keyColumns,
      rows_before: rowsBefore,
      rows_after: rowsAfter,
      added_rows: count('added'),
      removed_rows: count('removed'),
      changed_rows: count('changed'),
      changed_columns: [...changedColumns].sort(),
      added_columns: newColumns.filter((c) => !oldColumns.includes(c) && !!commit),
      removed_columns: oldColumns.filter((c) => !newColumns.includes(c)),
      changes,
    },
  };
}

// ---- commit ----

function vcsView(push: PushResult) {
  return push.pushed
    ? { pushed: true, reason: null, message: null, commit: push.commit }
    : { pushed: false, reason: push.reason, message: push.message, commit: push.commit ?? null };
}

export const commitTransformation = concurrentEdit(async function commitTransformation(
  scope: CallerScope,
  input: { table_name: string; message: string },
) {
  const { workspace, mapping } = await requireMapping(scope, input.table_name);
  const effective = await generationInput(scope, workspace, mapping);
  const generated = {
    ...(await generateSelectSql(effective.mapping, effective.target)),
    target: effective.target,
  };
  // A join that gives a primary row several rows is refused unless a person accepted it.
  const fanOut = fanOutProblems(
    await measureFanOut(await sourceWarehouseOf(scope, workspace), input.table_name, mapping.tables),
  );
  if (fanOut.length)
    throw new AppError('UNPROCESSABLE_CONTENT', fanOut.map((p) => p.message).join(' '), {
      reason: 'FAN_OUT',
      issues: fanOut,
    });
  const previous = await newestCommit(scope, workspace, input.table_name);
  const document = {
    table_name: mapping.tableName,
    tables: mapping.tables,
    connections: mapping.connections,
    transformations: mapping.transformations,
    ambiguities: mapping.ambiguities,
  };
  if (previous && previous.sql === generated.sql && !hasUncommittedChanges(document, previous.mapping))
    throw new AppError(
      'CONFLICT',
      `Nothing to commit: the mapping of ${input.table_name} is the committed version ${previous.version}`,
    );
  const version = Math.max(mapping.version, (previous?.version ?? 0) + 1);
  const author = scope.principal.username ?? null;
  const { commit, snapshot } = await scope.em.transactional(async (em) => {
    const tx = { ...scope, em };
    const fresh = (await em.findOne(TableMapping, { id: mapping.id }))!;
    fresh.version = version;
    fresh.committedVersion = version;
    const commit = em.create(MappingCommit, {
      organization: workspace.organization.id,
      workspace: workspace.id,
      tableName: input.table_name,
      version,
      sql: generated.sql,
      columns: generated.columns.map((c) => ({ name: c.name, type: c.type })),
      // `effective`: what the generators read (wildcards expanded, stale entries left out).
      mapping: { ...document, version, committed_version: version, effective: effective.mapping },
      targetTable: generated.target as unknown as Record<string, unknown>,
      author,
      message: input.message,
    });
    await em.flush();
    // The workspace commit is the whole projection, the same files `download` zips and the push
    // sends: a partial list would make the push replace the remote directory with it.
    const files = await workspaceFiles(tx, workspace);
    const snapshot = em.create(WorkspaceCommit, {
      organization: workspace.organization.id,
      workspace: workspace.id,
      message: `${input.table_name} v${version}: ${input.message}`,
      author,
      files,
    });
    await em.flush();
    return { commit, snapshot };
  });
  invalidateWorkspaceCaches(workspace.organization.id, workspace.id);
  const push = await pushWorkspaceFiles(scope, snapshot.files, snapshot.message, {
    workspace: workspace.name,
  });
  return {
    table_name: input.table_name,
    version,
    committed_version: version,
    commit_id: commit.id,
    sql: commit.sql,
    author,
    message: commit.message,
    committed_at: commit.createdAt,
    workspace_commit_id: snapshot.id,
    vcs: vcsView(push),
  };
});

// ---- materialize ----

export async function materialize(scope: CallerScope, tableName: string) {
  const { workspace, mapping } = await requireMapping(scope, tableName);
  const commit = await newestCommit(scope, workspace, tableName);
  if (!commit)
    throw new AppError(
      'CONFLICT',
      `The mapping of ${tableName} has no committed transformation: commit it first (POST /api/mappings/${tableName}/commit-transformation)`,
      { reason: 'NOT_COMMITTED' },
    );
  if (!workspace.targetConfig)
    throw new AppError('CONFLICT', `Workspace ${workspace.name} has no target warehouse configured`, {
      reason: 'NO_TARGET_CONFIG',
    });
  if (!workspace.sourceConfig)
    throw new AppError('CONFLICT', `Workspace ${workspace.name} has no source database configured`, {
      reason: 'NO_SOURCE_CONFIG',
    });
  const { run, created } = await scope.deps.jobs.enqueue(
    MATERIALIZE_MAPPING_KIND,
    { workspace_id: workspace.id, table_name: tableName, commit_id: commit.id, version: commit.version },
    {
      organizationId: workspace.organization.id,
      workspaceId: workspace.id,
      singletonKey: materializeKey(workspace, tableName),
    },
  );
  if (created) {
    // Bookkeeping beside the document, not an edit of it: written as it is, whatever revision the
    // mapping has reached meanwhile.
    await scope.em.nativeUpdate(TableMapping, { id: mapping.id }, { lastRunId: run.id });
    mapping.lastRunId = run.id;
  }
  return {
    run_id: run.id,
    status: run.status,
    table_name: tableName,
    version: Number(run.payload.version ?? commit.version),
    created,
  };
}
