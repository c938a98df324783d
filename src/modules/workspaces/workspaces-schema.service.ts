import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { libraryTemplate, libraryTemplates } from '../schemas/schema-library.ts';
import type { TargetSchema } from '../schemas/schemas.schemas.ts';
import { newTestProblems, refuseProblems } from '../schemas/column-test-problems.ts';
import { reconcileSchema, type StaleConnection } from './workspace-extensions.ts';
import { invalidateWorkspaceCaches } from './workspaces-cache.ts';
import { Workspace, type WorkspaceEntity } from './workspaces.entity.ts';
import { currentWorkspace, workspaceByName, targetSchemaOf } from './workspaces.service.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';

// ---- target schema of the current workspace ----

function schemaCheck(workspace: WorkspaceEntity) {
  return {
    workspace_name: workspace.name,
    assigned: !!workspace.targetSchema,
    template_name: workspace.schemaTemplate ?? null,
    customized: workspace.schemaCustomized,
    table_count: targetSchemaOf(workspace)?.tables.length ?? 0,
  };
}

export async function checkTargetSchema(scope: CallerScope) {
  return schemaCheck(await currentWorkspace(scope));
}

export async function targetSchemaContent(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const schema = targetSchemaOf(workspace);
  if (!schema)
    throw new AppError('NOT_FOUND', `Workspace ${workspace.name} has no target schema; assign one first`, {
      reason: 'NO_TARGET_SCHEMA',
    });
  return { workspace_name: workspace.name, template_name: workspace.schemaTemplate ?? null, schema };
}

export async function currentSchema(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  return {
    workspace_name: workspace.name,
    template_name: workspace.schemaTemplate ?? null,
    customized: workspace.schemaCustomized,
    schema: targetSchemaOf(workspace),
  };
}

export async function availableSchemas(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const schemas = [];
  for (const [name, schema] of await libraryTemplates())
    schemas.push({
      name,
      source: 'library' as const,
      workspace_name: null,
      description: schema.description ?? '',
      table_count: schema.tables.length,
      is_assigned: workspace.schemaTemplate === name && !workspace.schemaCustomized,
    });
  const others = await scope.em.find(
    Workspace,
    { organization: organizationOf(scope.principal), targetSchema: { $ne: null } },
    { orderBy: { name: 'asc' } },
  );
  for (const other of others) {
    const schema = targetSchemaOf(other)!;
    schemas.push({
      name: schema.name,
      source: 'workspace' as const,
      workspace_name: other.name,
      description: schema.description ?? '',
      table_count: schema.tables.length,
      is_assigned: other.id === workspace.id,
    });
  }
  return { workspace_name: workspace.name, schemas };
}

/**
 * The one way a workspace's schema changes: its column tests are held to the rule of PUT …/test
 * (newTestProblems: every new problem at once, 400, nothing stored), mappings are reconciled
 * (connections to vanished fields flagged and reported), then the schema is stored. `issuesAt` places
 * a problem's path within the document at its place in the caller's request.
 */
export async function replaceTargetSchema(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  schema: TargetSchema | null,
  origin: {
    template: string | null;
    customized: boolean;
    issuesAt?: (path: (string | number)[]) => (string | number)[];
  },
): Promise<StaleConnection[]> {
  // Before anything is reconciled or flushed; a test the stored document already had is let through.
  if (schema) {
    const at = origin.issuesAt ?? ((path) => path);
    refuseProblems(
      newTestProblems(schema, targetSchemaOf(workspace)).map((p) => ({ ...p, path: at(p.path) })),
      [],
    );
  }
  const stale = await reconcileSchema(scope, workspace, schema);
  workspace.targetSchema = schema;
  workspace.schemaTemplate = schema ? origin.template : null;
  workspace.schemaCustomized = schema ? origin.customized : false;
  await scope.em.flush();
  invalidateWorkspaceCaches(workspace.organization.id, workspace.id);
  return stale;
}

export const assignTargetSchema = concurrentEdit(async function assignTargetSchema(
  scope: CallerScope,
  input: { template_name?: string; from_workspace?: string },
) {
  const workspace = await currentWorkspace(scope);
  let stale: StaleConnection[];
  if (input.template_name) {
    const template = await libraryTemplate(input.template_name);
    if (!template) throw notFound(`Library template ${input.template_name}`);
    stale = await replaceTargetSchema(scope, workspace, template, {
      template: input.template_name,
      customized: false,
    });
  } else {
    const source = await workspaceByName(scope, input.from_workspace!);
    const schema = targetSchemaOf(source);
    if (!schema) throw new AppError('BAD_REQUEST', `Workspace ${source.name} has no target schema to copy`);
    stale = await replaceTargetSchema(scope, workspace, structuredClone(schema), {
      template: source.schemaTemplate ?? null,
      customized: true,
      // A test stored in the other workspace before the rule is new here: it is refused like any.
      issuesAt: () => ['from_workspace'],
    });
  }
  return { ...schemaCheck(workspace), stale_connections: stale };
});
