import { sourceLoadView, startSourceLoad } from '../sources/sources.jobs.ts';
import { createHash } from 'node:crypto';
import { AppError } from '../../app-error.ts';
import type { CallerScope, Scope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import {
  ddlScript,
  diffSchema,
  generateDdl,
  syncSchema,
  syncStatements,
  type SchemaDiff,
} from '../../warehouse/ddl.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import { reconcileSchema, registerWorkspaceExtension } from '../workspaces/workspace-extensions.ts';
import {
  connectionConfig,
  requiredConnectionConfig,
  currentWorkspace,
  targetSchemaOf,
  type WorkspaceEntity,
} from '../workspaces/workspaces.service.ts';
import { applyDefaultMonitors } from '../monitoring/default-monitors.service.ts';
import { SchemaSyncRun } from './schemas.entity.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';
import type { TargetSchema } from './schemas.schemas.ts';

/*
 * schema.json ↔ the target warehouse: what differs (sync status), the DDL, and the sync itself (one
 * transaction, destructive changes only with allow_destructive, mappings reconciled afterwards).
 */

type Indicator = 'in_sync' | 'pending' | 'drifted' | 'error';

/** What the warehouse must match: table structure only (descriptions and tests do not change DDL). */
function structureFingerprint(schema: TargetSchema): string {
  const tables = [...schema.tables]
    .sort((a, b) => a.name.localeCompare(b.name))
    .map((t) => ({
      name: t.name,
      primary_key: t.primary_key,
      columns: t.columns.map((c) => [c.name, c.type, c.nullable !== false]),
    }));
  return createHash('sha256').update(JSON.stringify(tables)).digest('hex');
}

function requireSchema(workspace: WorkspaceEntity): TargetSchema {
  const schema = targetSchemaOf(workspace);
  if (!schema)
    throw new AppError('NOT_FOUND', `Workspace ${workspace.name} has no schema.json; assign a schema first`);
  return schema;
}

function requireTarget(scope: CallerScope, workspace: WorkspaceEntity) {
  const config = requiredConnectionConfig(scope, workspace, 'target');
  return config;
}

/** Missing pieces a sync adds → pending; columns or types only allow_destructive changes → drifted. */
function indicatorOf(diff: SchemaDiff): Indicator {
  if (diff.in_sync) return 'in_sync';
  if (diff.extra_columns.length || diff.type_mismatches.length) return 'drifted';
  return 'pending';
}

function tableStatuses(schema: TargetSchema, diff: SchemaDiff) {
  return schema.tables.map((t) => {
    const of = <T extends { table: string }>(list: T[]) => list.filter((x) => x.table === t.name);
    const exists = !diff.missing_tables.includes(t.name);
    const missing = of(diff.missing_columns).map((c) => c.column);
    const extra = of(diff.extra_columns).map((c) => c.column);
    const types = of(diff.type_mismatches).map((c) => `${c.column}: ${c.actual}, expected ${c.expected}`);
    const nullability = of(diff.nullability_mismatches).length;
    const status: Indicator =
      extra.length || types.length
        ? 'drifted'
        : !exists || missing.length || nullability
          ? 'pending'
          : 'in_sync';
    return {
      table_name: t.name,
      status,
      exists,
      missing_columns: exists ? missing : t.columns.map((c) => c.name),
      extra_columns: extra,
      type_mismatches: types,
    };
  });
}

async function lastRun(scope: Scope & { principal?: unknown }, workspace: WorkspaceEntity) {
  return scope.em.findOne(
    SchemaSyncRun,
    { organization: workspace.organization.id, workspace: workspace.id },
    { orderBy: { createdAt: 'desc' } },
  );
}

export async function syncStatus(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const schema = targetSchemaOf(workspace);
  const run = await lastRun(scope, workspace);
  const config = connectionConfig(scope, workspace, 'target');
  const base = {
    workspace_name: workspace.name,
    target_schema: config?.schemas[0] ?? null,
    last_synced_at: run?.createdAt ?? null,
    schema_changed_since_sync: run && schema ? run.schemaFingerprint !== structureFingerprint(schema) : null,
    source_load: await sourceLoadView(scope, workspace.id),
  };
  const failed = (message: string) => ({
    ...base,
    status: 'error' as const,
    message,
    tables: [],
    differences: null,
    pending_statements: [],
    destructive_changes: [],
  });
  if (!schema) return failed(`Workspace ${workspace.name} has no schema.json`);
  if (!config) return failed(`Workspace ${workspace.name} has no target warehouse configured`);
  const targetSchema = config.schemas[0];
  let diff: SchemaDiff;
  try {
    const warehouse = await warehouses(scope.deps).open(config, `${workspace.id}:target`);
    diff = diffSchema(
      schema,
      await warehouse.introspect({ schemas: [targetSchema], tables: [] }),
      targetSchema,
    );
  } catch (error) {
    // An unreachable warehouse is a state to show, not a failed request.
    if (error instanceof AppError && error.code === 'UNPROCESSABLE_CONTENT') return failed(error.message);
    throw error;
  }
  const status = indicatorOf(diff);
  const { statements, skipped } = syncStatements(schema, diff, { targetSchema });
  const messages: Record<Indicator, string> = {
    in_sync: `The tables of ${targetSchema} match schema.json`,
    pending: 'schema.json has tables or columns the warehouse does not: sync to create them',
    drifted:
      'The warehouse has columns or types schema.json does not; a sync keeps them unless allow_destructive is set',
    error: '',
  };
  return {
    ...base,
    status,
    message: messages[status],
    tables: tableStatuses(schema, diff),
    differences: diff,
    // The first statement only makes sure the schema exists; alone it changes nothing.
    pending_statements: diff.in_sync ? [] : statements,
    destructive_changes: skipped,
  };
}

/**
 * What follows a sync the warehouse applied: mappings pointing at fields schema.json no longer has are
 * flagged (never dropped), and default monitors (primary-key tests, freshness) are proposed for what
 * the sync created. The DDL took its time, so the workspace and its mappings are read again (and
 * again, should a person's edit land in between); both steps leave what they already did as it is.
 */
const followAppliedSchema = concurrentEdit(async function followAppliedSchema(
  scope: CallerScope,
  workspaceId: string,
  schema: TargetSchema,
) {
  const workspace = await scope.em.findOneOrFail(Workspace, {
    id: workspaceId,
    organization: organizationOf(scope.principal),
  });
  const stale = await reconcileSchema(scope, workspace, schema);
  await scope.em.flush();
  await applyDefaultMonitors(scope, workspace);
  return stale;
});

export async function syncWorkspaceSchema(
  scope: CallerScope,
  input: {
    allow_destructive: boolean;
    dry_run: boolean;
    grant_user?: string;
    load_source?: { mode: 'incremental' | 'full' };
  },
) {
  const workspace = await currentWorkspace(scope);
  const schema = requireSchema(workspace);
  const config = requireTarget(scope, workspace);
  // The raw copy of a MySQL source is part of what the target needs; it runs as a job of its own.
  const sourceLoad =
    input.load_source && !input.dry_run ? await startSourceLoad(scope, input.load_source.mode) : null;
  const targetSchema = config.schemas[0];
  const warehouse = await warehouses(scope.deps).open(config, `${workspace.id}:target`);
  const result = await syncSchema(warehouse, schema, {
    targetSchema,
    allowDestructive: input.allow_destructive,
    dryRun: input.dry_run,
    grantUser: input.grant_user,
  });
  let syncedAt: Date | null = null;
  let stale: Awaited<ReturnType<typeof reconcileSchema>> = [];
  if (result.applied) {
    const run = scope.em.create(SchemaSyncRun, {
      organization: organizationOf(scope.principal),
      workspace: workspace.id,
      schemaFingerprint: structureFingerprint(schema),
      targetSchema,
      statements: result.statements,
      skipped: result.skipped,
      allowDestructive: input.allow_destructive,
      triggeredBy: scope.principal.username,
    });
    await scope.em.flush();
    syncedAt = run.createdAt;
    stale = await followAppliedSchema(scope, workspace.id, schema);
  }
  return {
    workspace_name: workspace.name,
    applied: result.applied,
    dry_run: input.dry_run,
    target_schema: targetSchema,
    statements: result.statements,
    skipped: result.skipped,
    status: indicatorOf(result.after),
    before: result.before,
    after: result.after,
    stale_connections: stale,
    synced_at: syncedAt,
    source_load: sourceLoad,
  };
}

export async function workspaceDdl(scope: CallerScope, input: { grant_user?: string }) {
  const workspace = await currentWorkspace(scope);
  const schema = requireSchema(workspace);
  const targetSchema = connectionConfig(scope, workspace, 'target')?.schemas[0] ?? 'public';
  const statements = generateDdl(schema, { targetSchema, grantUser: input.grant_user });
  return {
    workspace_name: workspace.name,
    target_schema: targetSchema,
    grant_user: input.grant_user ?? null,
    table_count: schema.tables.length,
    statements,
    ddl: ddlScript(statements),
  };
}

// Workflow status and metrics learn about syncs without a warehouse round trip: the newest applied
// sync is in sync while schema.json's table structure is the one it synced and nothing was left out.
registerWorkspaceExtension({
  name: 'schema-sync',
  async facts(scope, workspace) {
    const run = await lastRun(scope, workspace);
    const schema = targetSchemaOf(workspace);
    if (!run || !schema) return {};
    const inSync = run.schemaFingerprint === structureFingerprint(schema) && run.skipped.length === 0;
    return { schema_synced_at: run.createdAt, schema_sync_status: inSync ? 'in_sync' : 'out_of_sync' };
  },
});
