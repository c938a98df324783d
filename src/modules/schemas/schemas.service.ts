import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { Workspace, type WorkspaceEntity } from '../workspaces/workspaces.entity.ts';
import { currentWorkspace, targetSchemaOf } from '../workspaces/workspaces.service.ts';
import { replaceTargetSchema } from '../workspaces/workspaces-schema.service.ts';
import type { StaleConnection } from '../workspaces/workspace-extensions.ts';
import { libraryTemplate, libraryTemplates, schemaSummary } from './schema-library.ts';
import { targetSchemaSchema, type TargetColumn, type TargetSchema } from './schemas.schemas.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';

export async function listTemplates() {
  return {
    templates: [...(await libraryTemplates())].map(([name, schema]) => schemaSummary(name, schema)),
  };
}

async function template(name: string): Promise<TargetSchema> {
  const schema = await libraryTemplate(name);
  if (!schema) throw notFound(`Library template ${name}`);
  return schema;
}

export async function getTemplate(name: string) {
  return { name, schema: await template(name) };
}

/** The library and every workspace schema of the caller's organization. */
export async function listAllSchemas(scope: CallerScope) {
  const schemas: (ReturnType<typeof schemaSummary> & {
    source: 'library' | 'workspace';
    workspace_name: string | null;
  })[] = [...(await libraryTemplates())].map(([name, schema]) => ({
    ...schemaSummary(name, schema),
    source: 'library',
    workspace_name: null,
  }));
  const workspaces = await scope.em.find(
    Workspace,
    { organization: organizationOf(scope.principal), targetSchema: { $ne: null } },
    { orderBy: { name: 'asc' } },
  );
  for (const workspace of workspaces)
    schemas.push({
      ...schemaSummary(targetSchemaOf(workspace)!.name, targetSchemaOf(workspace)!),
      source: 'workspace',
      workspace_name: workspace.name,
    });
  return { schemas };
}

function workspaceSchemaView(workspace: WorkspaceEntity) {
  return {
    workspace_name: workspace.name,
    exists: !!workspace.targetSchema,
    template_name: workspace.schemaTemplate ?? null,
    customized: workspace.schemaCustomized,
    schema: targetSchemaOf(workspace),
    updated_at: workspace.updatedAt,
  };
}

const withStale = (workspace: WorkspaceEntity, stale: StaleConnection[]) => ({
  ...workspaceSchemaView(workspace),
  stale_connections: stale,
});

export async function getWorkspaceSchema(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  if (!workspace.targetSchema)
    throw new AppError(
      'NOT_FOUND',
      `Workspace ${workspace.name} has no schema.json; assign a template or save one first`,
    );
  return workspaceSchemaView(workspace);
}

/** The workspace uses the template as it is (it may be customized later). */
export const assignTemplate = concurrentEdit(async function assignTemplate(scope: CallerScope, name: string) {
  const schema = await template(name);
  const workspace = await currentWorkspace(scope);
  const stale = await replaceTargetSchema(scope, workspace, schema, { template: name, customized: false });
  return withStale(workspace, stale);
});

/** The workspace gets its own copy, to edit; the template is remembered as its origin. */
export const copyFromLibrary = concurrentEdit(async function copyFromLibrary(
  scope: CallerScope,
  name: string,
) {
  const schema = await template(name);
  const workspace = await currentWorkspace(scope);
  const stale = await replaceTargetSchema(scope, workspace, schema, { template: name, customized: true });
  return withStale(workspace, stale);
});

export const saveWorkspaceSchema = concurrentEdit(async function saveWorkspaceSchema(
  scope: CallerScope,
  schema: TargetSchema,
) {
  const workspace = await currentWorkspace(scope);
  const stale = await replaceTargetSchema(scope, workspace, schema, {
    template: workspace.schemaTemplate ?? null,
    customized: true,
    issuesAt: (path) => ['schema', ...path],
  });
  return withStale(workspace, stale);
});

export const deleteWorkspaceSchema = concurrentEdit(async function deleteWorkspaceSchema(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  if (!workspace.targetSchema)
    throw new AppError('NOT_FOUND', `Workspace ${workspace.name} has no schema.json`);
  const stale = await replaceTargetSchema(scope, workspace, null, { template: null, customized: false });
  return withStale(workspace, stale);
});

export const addColumn = concurrentEdit(async function addColumn(
  scope: CallerScope,
  tableName: string,
  column: TargetColumn,
) {
  const workspace = await currentWorkspace(scope);
  const schema = targetSchemaOf(workspace);
  if (!schema) throw new AppError('NOT_FOUND', `Workspace ${workspace.name} has no schema.json`);
  const next = structuredClone(schema);
  const table = next.tables.find((t) => t.name === tableName);
  if (!table) throw notFound(`Table ${tableName} of the workspace schema`);
  if (table.columns.some((c) => c.name.toLowerCase() === column.name.toLowerCase()))
    throw new AppError('CONFLICT', `Table ${tableName} already has a column ${column.name}`);
  table.columns.push(column);
  const parsed = targetSchemaSchema.safeParse(next);
  if (!parsed.success)
    throw new AppError('BAD_REQUEST', 'The column is not valid', {
      issues: parsed.error.issues.map((i) => ({ path: i.path as (string | number)[], message: i.message })),
    });
  const stale = await replaceTargetSchema(scope, workspace, parsed.data, {
    template: workspace.schemaTemplate ?? null,
    customized: true,
    // The new column is the only one that can hold a new problem: tables.t.columns.c.tests… → tests…
    issuesAt: (path) => ['column', ...path.slice(4)],
  });
  return withStale(workspace, stale);
});
