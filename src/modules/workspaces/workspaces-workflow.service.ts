import type { CallerScope } from '../../deps.ts';
import { collectFacts } from './workspace-extensions.ts';
import { WORKFLOW_TASKS, type WorkflowTask } from './workspaces.schemas.ts';
import { currentWorkspace, workspaceByName, targetSchemaOf, workflowStateOf } from './workspaces.service.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';

// ---- workflow ----

const TASK_INFO: Record<WorkflowTask, { description: string; after: WorkflowTask[] }> = {
  connect_source: { description: 'Configure the source database', after: [] },
  configure_target: { description: 'Configure the target warehouse', after: [] },
  assign_schema: { description: 'Assign a target schema (library template or your own)', after: [] },
  discover: {
    description: 'Run discovery to suggest field mappings',
    after: ['connect_source', 'assign_schema'],
  },
  review_mappings: { description: 'Confirm suggested mappings and resolve ambiguities', after: ['discover'] },
  generate_project: { description: 'Generate the transformation project', after: ['review_mappings'] },
  sync_schema: {
    description: 'Create the target tables in the warehouse',
    after: ['configure_target', 'assign_schema'],
  },
  materialize: {
    description: 'Materialize the mappings into the target tables',
    after: ['generate_project', 'sync_schema'],
  },
};

export async function workflowState(scope: CallerScope, name: string) {
  const workspace = await workspaceByName(scope, name);
  return { workspace_name: workspace.name, tasks: workflowStateOf(workspace) };
}

export const markWorkflowTask = concurrentEdit(async function markWorkflowTask(
  scope: CallerScope,
  input: { workspace_name: string; task_data: { task: WorkflowTask; data?: Record<string, unknown> } },
  completed: boolean,
) {
  const workspace = await workspaceByName(scope, input.workspace_name);
  const previous = workspace.workflowState[input.task_data.task];
  workspace.workflowState = {
    ...workspace.workflowState,
    [input.task_data.task]: {
      completed,
      completed_at: completed ? new Date().toISOString() : null,
      data: input.task_data.data ?? previous?.data ?? {},
    },
  };
  await scope.em.flush();
  return { workspace_name: workspace.name, tasks: workflowStateOf(workspace) };
});

/** What is really done, from the rows; the stored flags are reported beside it, not trusted. */
export async function workflowStatus(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const facts = await collectFacts(scope, workspace);
  const flags = workflowStateOf(workspace);
  const mapped = facts.confirmed_connections + facts.suggested_connections;
  const derived: Record<WorkflowTask, { done: boolean; detail: string }> = {
    connect_source: {
      done: !!workspace.sourceConfig,
      detail: workspace.sourceConfig ? 'Source database configured' : 'No source configuration yet',
    },
    configure_target: {
      done: !!workspace.targetConfig,
      detail: workspace.targetConfig ? 'Target warehouse configured' : 'No target configuration yet',
    },
    assign_schema: {
      done: !!workspace.targetSchema,
      detail: workspace.targetSchema
        ? `Schema ${targetSchemaOf(workspace)!.name} with ${targetSchemaOf(workspace)!.tables.length} tables`
        : 'No target schema assigned',
    },
    discover: {
      done: mapped > 0,
      detail: mapped > 0 ? `${mapped} connections in ${facts.mapped_tables} mappings` : 'No mappings yet',
    },
    review_mappings: {
      done:
        (flags.review_mappings.completed && mapped > 0) ||
        (facts.confirmed_connections > 0 &&
          facts.suggested_connections === 0 &&
          facts.open_ambiguities === 0),
      detail: `${facts.confirmed_connections} confirmed, ${facts.suggested_connections} suggested, ${facts.open_ambiguities} open ambiguities`,
    },
    generate_project: {
      done: facts.project_generated,
      detail: facts.project_generated
        ? facts.project_drift
          ? 'Project generated but out of date with the mappings'
          : 'Project generated'
        : 'No transformation project yet',
    },
    sync_schema: {
      done: facts.schema_sync_status === 'in_sync',
      detail: `Target tables ${facts.schema_sync_status.replace('_', ' ')}`,
    },
    materialize: {
      done: !!facts.last_materialized_at,
      detail: facts.last_materialized_at
        ? `${facts.materialized_tables} tables, last at ${facts.last_materialized_at.toISOString()}`
        : 'Nothing materialized yet',
    },
  };
  const tasks = WORKFLOW_TASKS.map((task) => {
    const blockedBy = TASK_INFO[task].after.filter((t) => !derived[t].done);
    const done = derived[task].done;
    return {
      task,
      description: TASK_INFO[task].description,
      status: done
        ? ('completed' as const)
        : blockedBy.length
          ? ('blocked' as const)
          : ('available' as const),
      completed: done,
      marked_complete: flags[task].completed,
      completed_at: done ? flags[task].completed_at : null,
      blocked_by: blockedBy,
      detail: derived[task].detail,
    };
  });
  const completed = tasks.filter((t) => t.completed).length;
  return {
    workspace_name: workspace.name,
    progress: completed / tasks.length,
    next_task: tasks.find((t) => t.status === 'available')?.task ?? null,
    tasks,
  };
}

// ---- metrics ----

export async function workspaceMetrics(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const facts = await collectFacts(scope, workspace);
  const schema = targetSchemaOf(workspace);
  const fields = schema?.tables.reduce((n, t) => n + t.columns.length, 0) ?? 0;
  const pii = schema?.tables.reduce((n, t) => n + t.columns.filter((c) => c.pii).length, 0) ?? 0;
  return {
    workspace_name: workspace.name,
    schema_tables: schema?.tables.length ?? 0,
    schema_fields: fields,
    pii_fields: pii,
    mapped_tables: facts.mapped_tables,
    mapped_fields: facts.mapped_fields,
    unmapped_fields: Math.max(0, fields - facts.mapped_fields),
    confirmed_connections: facts.confirmed_connections,
    suggested_connections: facts.suggested_connections,
    open_ambiguities: facts.open_ambiguities,
    mapping_coverage: fields ? Math.min(1, facts.mapped_fields / fields) : 0,
    project_generated: facts.project_generated,
    materialized_tables: facts.materialized_tables,
    last_materialized_at: facts.last_materialized_at,
    schema_sync_status: schema ? facts.schema_sync_status : ('no_schema' as const),
    schema_synced_at: facts.schema_synced_at,
  };
}
