import { isDeepStrictEqual } from 'node:util';
import { AppError } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { libraryTemplate, libraryTemplates } from '../schemas/schema-library.ts';
import type { TargetSchema } from '../schemas/schemas.schemas.ts';
import type { StaleConnection } from './workspace-extensions.ts';
import type { WorkflowTaskState, WorkspaceEntity } from './workspaces.entity.ts';
import { workspaceSettingsInput, type ConnectionConfigInput } from './workspaces.schemas.ts';
import {
  connectionWarnings,
  maskedConfig,
  storeConnectionConfig,
  targetSchemaOf,
  workflowStateOf,
  workspaceByName,
} from './workspaces.service.ts';
import { replaceTargetSchema } from './workspaces-schema.service.ts';
import { invalidateSourceCaches, invalidateWorkspaceCaches } from './workspaces-cache.ts';
import { maskSettingsSecrets, sealSettingsSecrets } from '../schemas/reverse-etl.service.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';
import { nullableByDesign } from './workspaces-settings.service.ts';

/** The prompt the discovery agent runs with unless a workspace has its own. */
const DEFAULT_SYSTEM_PROMPT = `You are a data-integration assistant. You map columns of a source database to the fields of a target schema.

For every target field:
- Propose the source column (table.column) that holds the same information, or an SQL expression over the source tables when values must be combined, cast or cleaned.
- Prefer exact semantic matches over similar names; check value patterns (e-mail, phone, date, country, currency) against the target field's description and type.
- Give a confidence between 0 and 1. When two candidates are close, report an ambiguity instead of guessing.
- Never invent source columns. Leave a field unmapped when nothing fits.
- Treat fields marked as PII with care: do not copy sample values into explanations.`;

/** The prompt in effect for a workspace (its own, or the default). */
export function systemPromptOf(workspace: WorkspaceEntity): string {
  return workspace.systemPrompt ?? DEFAULT_SYSTEM_PROMPT;
}

function configView(scope: CallerScope, workspace: WorkspaceEntity) {
  return {
    workspace_name: workspace.name,
    description: workspace.description,
    source_config: maskedConfig(workspace, 'source'),
    target_config: maskedConfig(workspace, 'target'),
    target_schema: targetSchemaOf(workspace),
    schema_template: workspace.schemaTemplate ?? null,
    settings: maskSettingsSecrets(workspace.settings),
    system_prompt: workspace.systemPrompt ?? null,
    success_criteria_prompt: workspace.successCriteriaPrompt ?? null,
    workflow_state: workflowStateOf(workspace),
    warnings: connectionWarnings(scope, workspace),
  };
}

export async function getConfig(scope: CallerScope, name: string) {
  return configView(scope, await workspaceByName(scope, name));
}

/**
 * Saves the keys present in the document; null clears a key. What GET returned can be sent back as
 * is: masked connection configs keep their stored passwords.
 */
export const saveConfig = concurrentEdit(async function saveConfig(
  scope: CallerScope,
  input: {
    workspace_name: string;
    description?: string;
    source_config?: ConnectionConfigInput | null;
    target_config?: ConnectionConfigInput | null;
    target_schema?: TargetSchema | null;
    schema_template?: string | null;
    settings?: Record<string, unknown>;
    system_prompt?: string | null;
    success_criteria_prompt?: string | null;
    workflow_state?: Record<string, WorkflowTaskState>;
  },
) {
  const workspace = await workspaceByName(scope, input.workspace_name);
  if (input.settings !== undefined) {
    const parsed = workspaceSettingsInput.safeParse(input.settings);
    if (!parsed.success)
      throw new AppError('BAD_REQUEST', 'Invalid settings', {
        issues: parsed.error.issues.map((i) => ({
          path: ['settings', ...(i.path as (string | number)[])],
          message: i.message,
        })),
      });
    // null falls back to the inherited value, except where null is itself a value (GET shows it so).
    workspace.settings = sealSettingsSecrets(
      scope,
      Object.fromEntries(
        Object.entries(parsed.data).filter(
          ([k, v]) => v !== undefined && (v !== null || nullableByDesign(k)),
        ),
      ),
      workspace.settings,
    );
  }
  if (input.schema_template != null && !(await libraryTemplates()).has(input.schema_template))
    throw new AppError('BAD_REQUEST', `Unknown library template ${input.schema_template}`, {
      issues: [{ path: ['schema_template'], message: 'not a library template' }],
    });
  if (input.target_schema === null && input.schema_template != null)
    throw new AppError(
      'BAD_REQUEST',
      `schema_template ${input.schema_template} with target_schema null: a template names where a schema came from, and null removes the schema; send schema_template without target_schema to assign the library template`,
    );
  if (input.description !== undefined) workspace.description = input.description;
  if (input.source_config !== undefined)
    workspace.sourceConfig = input.source_config
      ? storeConnectionConfig(scope, input.source_config, workspace.sourceConfig)
      : null;
  if (input.target_config !== undefined)
    workspace.targetConfig = input.target_config
      ? storeConnectionConfig(scope, input.target_config, workspace.targetConfig)
      : null;
  if (input.system_prompt !== undefined) workspace.systemPrompt = input.system_prompt || null;
  if (input.success_criteria_prompt !== undefined)
    workspace.successCriteriaPrompt = input.success_criteria_prompt;
  if (input.workflow_state !== undefined) workspace.workflowState = input.workflow_state;
  let stale: StaleConnection[] = [];
  // Compared as JSON values: the stored schema comes back from jsonb with its keys reordered.
  const schemaChanged =
    input.target_schema !== undefined &&
    !isDeepStrictEqual(
      JSON.parse(JSON.stringify(input.target_schema)),
      JSON.parse(JSON.stringify(workspace.targetSchema ?? null)),
    );
  const template =
    !schemaChanged && !workspace.targetSchema && input.schema_template != null
      ? await libraryTemplate(input.schema_template)
      : null;
  if (schemaChanged)
    stale = await replaceTargetSchema(scope, workspace, input.target_schema ?? null, {
      template:
        input.schema_template !== undefined ? input.schema_template : (workspace.schemaTemplate ?? null),
      customized: true,
      issuesAt: (path) => ['target_schema', ...path],
    });
  else if (template)
    // No schema yet: the named template is assigned, as template_name does at creation.
    stale = await replaceTargetSchema(scope, workspace, template, {
      template: input.schema_template!,
      customized: false,
    });
  else if (workspace.targetSchema && input.schema_template !== undefined)
    workspace.schemaTemplate = input.schema_template;
  await scope.em.flush();
  invalidateWorkspaceCaches(workspace.organization.id, workspace.id);
  if (input.source_config !== undefined || input.target_schema !== undefined || template)
    invalidateSourceCaches(workspace.organization.id, workspace.id);
  return { ...configView(scope, workspace), stale_connections: stale };
});

// ---- prompts ----

function promptView(workspace: WorkspaceEntity) {
  return {
    workspace_name: workspace.name,
    prompt: systemPromptOf(workspace),
    is_custom: workspace.systemPrompt != null,
    default_prompt: DEFAULT_SYSTEM_PROMPT,
  };
}

export async function getSystemPrompt(scope: CallerScope, name: string) {
  return promptView(await workspaceByName(scope, name));
}

export const setSystemPrompt = concurrentEdit(async function setSystemPrompt(
  scope: CallerScope,
  name: string,
  prompt: string,
) {
  const workspace = await workspaceByName(scope, name);
  workspace.systemPrompt = prompt;
  await scope.em.flush();
  return promptView(workspace);
});

export const cloneSystemPrompt = concurrentEdit(async function cloneSystemPrompt(
  scope: CallerScope,
  name: string,
) {
  const workspace = await workspaceByName(scope, name);
  if (workspace.systemPrompt != null)
    throw new AppError(
      'CONFLICT',
      `Workspace ${workspace.name} already has its own system prompt; edit it with PUT or delete it first`,
    );
  workspace.systemPrompt = DEFAULT_SYSTEM_PROMPT;
  await scope.em.flush();
  return promptView(workspace);
});

export const deleteSystemPrompt = concurrentEdit(async function deleteSystemPrompt(
  scope: CallerScope,
  name: string,
) {
  const workspace = await workspaceByName(scope, name);
  workspace.systemPrompt = null;
  await scope.em.flush();
  return promptView(workspace);
});

function promptFileView(workspace: WorkspaceEntity) {
  return {
    workspace_name: workspace.name,
    content: workspace.successCriteriaPrompt ?? '',
    exists: workspace.successCriteriaPrompt != null,
  };
}

export async function getPromptFile(scope: CallerScope, name: string) {
  return promptFileView(await workspaceByName(scope, name));
}

export const setPromptFile = concurrentEdit(async function setPromptFile(
  scope: CallerScope,
  name: string,
  content: string,
) {
  const workspace = await workspaceByName(scope, name);
  workspace.successCriteriaPrompt = content;
  await scope.em.flush();
  return promptFileView(workspace);
});
