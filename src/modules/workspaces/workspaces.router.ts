import { authedProcedure, permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import { successOutput } from '../../trpc/common-schemas.ts';
import * as s from './workspaces.schemas.ts';
import * as workspaces from './workspaces.service.ts';
import * as workspaceSchema from './workspaces-schema.service.ts';
import * as workflow from './workspaces-workflow.service.ts';
import * as settings from './workspaces-settings.service.ts';
import * as config from './workspaces-config.service.ts';
import * as files from './workspaces-files.service.ts';
import * as ops from './workspaces-ops.service.ts';
import * as db from './workspaces-database.schemas.ts';
import * as database from '../sources/sources.service.ts';

const tag = 'workspaces';
const read = permissionProcedure('workspace.read');
const write = permissionProcedure('workspace.write');
const manage = permissionProcedure('settings.manage');
const base = '/api/workspaces';

/*
 * Every static path comes before /{workspace_name}: the REST adapter takes the first match, and
 * workspace names equal to a static segment are refused at creation.
 */
export const workspacesRouter = router({
  adminSettingsGet: read
    .meta(
      rest(
        'GET',
        `${base}/admin-settings`,
        'Admin settings of a workspace, or the global ones when workspace_name is omitted',
        tag,
      ),
    )
    .input(s.adminSettingsQuery)
    .output(s.adminSettingsOutput)
    .query(({ ctx, input }) => settings.getAdminSettings(ctx, input.workspace_name)),

  adminSettingsCreate: manage
    .meta(
      rest(
        'POST',
        `${base}/admin-settings`,
        'Create or replace admin settings (keys not given fall back to their defaults)',
        tag,
      ),
    )
    .input(s.adminSettingsCreateInput)
    .output(s.adminSettingsOutput)
    .mutation(({ ctx, input }) => settings.writeAdminSettings(ctx, input, 'replace')),

  adminSettingsUpdate: manage
    .meta(
      rest(
        'PUT',
        `${base}/admin-settings`,
        'Update admin settings: given keys are merged, null resets a key to its default',
        tag,
      ),
    )
    .input(s.adminSettingsUpdateInput)
    .output(s.adminSettingsOutput)
    .mutation(({ ctx, input }) => settings.writeAdminSettings(ctx, input, 'merge')),

  adminSettingsDelete: manage
    .meta(
      rest(
        'DELETE',
        `${base}/admin-settings`,
        'Delete admin settings: reset the workspace (or global) level to the defaults',
        tag,
      ),
    )
    .input(s.adminSettingsQuery)
    .output(s.adminSettingsOutput)
    .mutation(({ ctx, input }) =>
      settings.writeAdminSettings(ctx, { workspace_name: input.workspace_name }, 'reset'),
    ),

  userPreferencesGet: authedProcedure
    .meta(
      rest(
        'GET',
        `${base}/user-preferences`,
        'Preferences of the current user, with defaults filled in',
        tag,
      ),
    )
    .output(s.userPreferencesOutput)
    .query(({ ctx }) => settings.getUserPreferences(ctx)),

  userPreferencesCreate: authedProcedure
    .meta(
      rest(
        'POST',
        `${base}/user-preferences`,
        'Create or replace preferences (keys not given fall back to their defaults)',
        tag,
      ),
    )
    .input(s.userPreferencesCreateInput)
    .output(s.userPreferencesOutput)
    .mutation(({ ctx, input }) => settings.writeUserPreferences(ctx, input, 'replace')),

  userPreferencesUpdate: authedProcedure
    .meta(
      rest(
        'PUT',
        `${base}/user-preferences`,
        'Update preferences: given keys are merged, null resets a key to its default',
        tag,
      ),
    )
    .input(s.userPreferencesUpdateInput)
    .output(s.userPreferencesOutput)
    .mutation(({ ctx, input }) => settings.writeUserPreferences(ctx, input, 'merge')),

  userPreferencesDelete: authedProcedure
    .meta(
      rest(
        'DELETE',
        `${base}/user-preferences`,
        'Delete preferences: reset them to the defaults (the selected workspace stays)',
        tag,
      ),
    )
    .output(s.userPreferencesOutput)
    .mutation(({ ctx }) => settings.writeUserPreferences(ctx, {}, 'reset')),

  globalSettingsGet: read
    .meta(
      rest(
        'GET',
        `${base}/global-settings`,
        'Global settings of the organization, with defaults filled in',
        tag,
      ),
    )
    .output(s.globalSettingsOutput)
    .query(({ ctx }) => settings.getGlobalSettings(ctx)),

  globalSettingsUpdate: manage
    .meta(
      rest(
        'PUT',
        `${base}/global-settings`,
        'Update global settings: given keys are merged, null resets a key to its default',
        tag,
      ),
    )
    .input(s.globalSettingsUpdateInput)
    .output(s.globalSettingsOutput)
    .mutation(({ ctx, input }) => settings.updateGlobalSettings(ctx, input)),

  list: read
    .meta(
      rest(
        'GET',
        base,
        "List the workspaces of the organization with the caller's preference information (current, last used); limit at most 500",
        tag,
      ),
    )
    .input(s.workspaceListInput)
    .output(s.workspaceListOutput)
    .query(({ ctx, input }) => workspaces.listWorkspaces(ctx, input)),

  current: read
    .meta(rest('GET', `${base}/current`, 'Details of the current workspace (409 when none is selected)', tag))
    .output(s.workspaceDetailOutput)
    .query(({ ctx }) => workspaces.getCurrentWorkspace(ctx)),

  sourceConfigGet: read
    .meta(
      rest(
        'GET',
        `${base}/source-config`,
        'Source configuration of the current workspace (password never returned)',
        tag,
      ),
    )
    .output(s.sourceConfigOutput)
    .query(({ ctx }) => workspaces.getSourceConfig(ctx)),

  sourceConfigSave: write
    .meta(
      rest(
        'POST',
        `${base}/source-config`,
        'Replace the source configuration of the current workspace; without a password the stored one is kept',
        tag,
      ),
    )
    .input(s.sourceConfigInput)
    .output(s.sourceConfigOutput)
    .mutation(({ ctx, input }) => workspaces.saveSourceConfig(ctx, input.source_config)),

  targetSchemaCheck: read
    .meta(
      rest(
        'GET',
        `${base}/target-schema/check`,
        'Whether a target schema is assigned to the current workspace',
        tag,
      ),
    )
    .output(s.schemaCheckOutput)
    .query(({ ctx }) => workspaceSchema.checkTargetSchema(ctx)),

  targetSchemaContent: read
    .meta(
      rest(
        'GET',
        `${base}/target-schema/content`,
        'Content of the assigned target schema (404 when none)',
        tag,
      ),
    )
    .output(s.schemaContentOutput)
    .query(({ ctx }) => workspaceSchema.targetSchemaContent(ctx)),

  targetSchemaAvailable: read
    .meta(
      rest(
        'GET',
        `${base}/target-schema/available`,
        'Target schemas available for the current workspace: library templates and schemas of other workspaces',
        tag,
      ),
    )
    .output(s.availableSchemasOutput)
    .query(({ ctx }) => workspaceSchema.availableSchemas(ctx)),

  targetSchemaAssign: write
    .meta(
      rest(
        'POST',
        `${base}/target-schema/assign`,
        "Assign a target schema to the current workspace: a library template or a copy of another workspace's",
        tag,
      ),
    )
    .input(s.assignSchemaInput)
    .output(s.assignSchemaOutput)
    .mutation(({ ctx, input }) => workspaceSchema.assignTargetSchema(ctx, input)),

  workflowStatus: read
    .meta(
      rest(
        'GET',
        `${base}/workflow-status`,
        'Detailed workflow status of the current workspace, derived from its real state',
        tag,
      ),
    )
    .output(s.workflowStatusOutput)
    .query(({ ctx }) => workflow.workflowStatus(ctx)),

  metrics: read
    .meta(
      rest(
        'GET',
        `${base}/metrics`,
        'Metrics of the current workspace: schema size, mapped tables and fields, materialization, sync status',
        tag,
      ),
    )
    .output(s.metricsOutput)
    .query(({ ctx }) => workflow.workspaceMetrics(ctx)),

  schema: read
    .meta(rest('GET', `${base}/schema`, 'Schema of the current workspace (null when none is assigned)', tag))
    .output(s.currentSchemaOutput)
    .query(({ ctx }) => workspaceSchema.currentSchema(ctx)),

  select: read
    .meta(
      rest(
        'POST',
        `${base}/select`,
        'Select the current workspace of the caller (kept across logins and API processes)',
        tag,
      ),
    )
    .input(s.selectWorkspaceInput)
    .output(s.selectOutput)
    .mutation(({ ctx, input }) => workspaces.selectWorkspace(ctx, input.workspace_name)),

  create: write
    .meta(
      rest(
        'POST',
        `${base}/create`,
        'Create a workspace (selected for the caller unless select is false)',
        tag,
      ),
    )
    .input(s.createWorkspaceInput)
    .output(s.workspaceDetailOutput)
    .mutation(({ ctx, input }) => workspaces.createWorkspace(ctx, input)),

  flushCache: authedProcedure
    .meta(
      rest(
        'POST',
        `${base}/flush-cache`,
        'Flush the request cache of the current user, forcing a reload of user context',
        tag,
      ),
    )
    .output(s.flushOutput)
    .mutation(({ ctx }) => ops.flushRequestCache(ctx)),

  flushMappingCache: write
    .meta(
      rest(
        'POST',
        `${base}/flush-mapping-cache`,
        "Flush the organization's mapping cache and the file-access caches",
        tag,
      ),
    )
    .output(s.flushOutput)
    .mutation(({ ctx }) => ops.flushMappingCache(ctx)),

  benchmark: permissionProcedure('org.admin')
    .meta(
      rest(
        'POST',
        `${base}/benchmark`,
        'Time filesystem, file-access and database operations (a few seconds at most)',
        tag,
      ),
    )
    .output(s.benchmarkOutput)
    .mutation(({ ctx }) => ops.runBenchmark(ctx)),

  testStoredPassword: read
    .meta(
      rest(
        'POST',
        `${base}/test-stored-password`,
        "Test the stored password of the current workspace's data source (422 with the driver's reason)",
        tag,
      ),
    )
    .output(db.testStoredPasswordOutput)
    .mutation(({ ctx }) => database.testStoredPassword(ctx)),

  databaseCheck: read
    .meta(
      rest(
        'GET',
        `${base}/{workspace}/database/check`,
        'Whether the source and target databases of the workspace are configured and reachable',
        tag,
      ),
    )
    .input(db.databaseCheckInput)
    .output(db.databaseCheckOutput)
    .query(({ ctx, input }) => database.databaseCheck(ctx, input.workspace)),

  databaseTest: write
    .meta(
      rest(
        'POST',
        `${base}/{workspace}/database/test`,
        'Test the target database connection (stored, or the config sent, without saving it); 422 with the reason',
        tag,
      ),
    )
    .input(db.databaseTestInput)
    .output(db.databaseTestOutput)
    .mutation(({ ctx, input }) => database.databaseTest(ctx, input.workspace, input.config)),

  databaseCatalogs: write
    .meta(
      rest(
        'POST',
        `${base}/{workspace}/database/catalogs`,
        'Databases and schemas the target credentials (stored, or sent) can see',
        tag,
      ),
    )
    .input(db.databaseTestInput)
    .output(db.databaseCatalogsOutput)
    .mutation(({ ctx, input }) => database.databaseCatalogs(ctx, input.workspace, input.config)),

  workflowState: read
    .meta(
      rest(
        'GET',
        `${base}/{workspace_name}/workflow/state`,
        'Stored workflow state of a workspace: task → completed, completed_at, data',
        tag,
      ),
    )
    .input(s.workspaceNameParam)
    .output(s.workflowStateOutput)
    .query(({ ctx, input }) => workflow.workflowState(ctx, input.workspace_name)),

  workflowComplete: write
    .meta(
      rest(
        'POST',
        `${base}/{workspace_name}/workflow/complete`,
        'Mark a workflow task complete, with its data',
        tag,
      ),
    )
    .input(s.workflowMarkInput)
    .output(s.workflowStateOutput)
    .mutation(({ ctx, input }) => workflow.markWorkflowTask(ctx, input, true)),

  workflowIncomplete: write
    .meta(
      rest('POST', `${base}/{workspace_name}/workflow/incomplete`, 'Mark a workflow task incomplete', tag),
    )
    .input(s.workflowMarkInput)
    .output(s.workflowStateOutput)
    .mutation(({ ctx, input }) => workflow.markWorkflowTask(ctx, input, false)),

  configGet: read
    .meta(
      rest(
        'GET',
        `${base}/{workspace_name}/config`,
        'Complete configuration of a workspace (secrets masked; can be posted back as is)',
        tag,
      ),
    )
    .input(s.workspaceNameParam)
    .output(s.configOutput)
    .query(({ ctx, input }) => config.getConfig(ctx, input.workspace_name)),

  configSave: write
    .meta(
      rest(
        'POST',
        `${base}/{workspace_name}/config`,
        'Save the complete configuration: keys given are saved, null clears; masked passwords are kept',
        tag,
      ),
    )
    .input(s.configSaveInput)
    .output(s.configSaveOutput)
    .mutation(({ ctx, input }) => config.saveConfig(ctx, input)),

  systemPromptGet: read
    .meta(
      rest(
        'GET',
        `${base}/{workspace_name}/system-prompt`,
        'System prompt of the workspace (its own, or the default)',
        tag,
      ),
    )
    .input(s.workspaceNameParam)
    .output(s.systemPromptOutput)
    .query(({ ctx, input }) => config.getSystemPrompt(ctx, input.workspace_name)),

  systemPromptUpdate: write
    .meta(
      rest('PUT', `${base}/{workspace_name}/system-prompt`, 'Set the workspace-specific system prompt', tag),
    )
    .input(s.systemPromptInput)
    .output(s.systemPromptOutput)
    .mutation(({ ctx, input }) => config.setSystemPrompt(ctx, input.workspace_name, input.prompt)),

  systemPromptClone: write
    .meta(
      rest(
        'POST',
        `${base}/{workspace_name}/system-prompt/clone`,
        'Clone the default system prompt into a workspace-specific one (409 when it has one)',
        tag,
      ),
    )
    .input(s.workspaceNameParam)
    .output(s.systemPromptOutput)
    .mutation(({ ctx, input }) => config.cloneSystemPrompt(ctx, input.workspace_name)),

  systemPromptDelete: write
    .meta(
      rest(
        'DELETE',
        `${base}/{workspace_name}/system-prompt`,
        'Delete the workspace-specific prompt and revert to the default',
        tag,
      ),
    )
    .input(s.workspaceNameParam)
    .output(s.systemPromptOutput)
    .mutation(({ ctx, input }) => config.deleteSystemPrompt(ctx, input.workspace_name)),

  promptGet: read
    .meta(
      rest(
        'GET',
        `${base}/{workspace_name}/prompt`,
        'Prompt file with the user-defined success criteria',
        tag,
      ),
    )
    .input(s.workspaceNameParam)
    .output(s.promptFileOutput)
    .query(({ ctx, input }) => config.getPromptFile(ctx, input.workspace_name)),

  promptUpdate: write
    .meta(
      rest(
        'PUT',
        `${base}/{workspace_name}/prompt`,
        'Replace the prompt file with the user-defined success criteria',
        tag,
      ),
    )
    .input(s.promptFileInput)
    .output(s.promptFileOutput)
    .mutation(({ ctx, input }) => config.setPromptFile(ctx, input.workspace_name, input.content)),

  gitDiff: read
    .meta(
      rest(
        'GET',
        `${base}/{workspace_name}/git-diff`,
        "Unified diff of the workspace's files against its last commit (the empty tree before the first)",
        tag,
      ),
    )
    .input(s.workspaceNameParam)
    .output(s.gitDiffOutput)
    .query(({ ctx, input }) => files.gitDiff(ctx, input.workspace_name)),

  download: read
    .meta(
      rest(
        'GET',
        `${base}/{workspace_name}/download`,
        "Download the workspace's files as a .zip archive (application/zip)",
        tag,
      ),
    )
    .input(s.workspaceNameParam)
    .output(s.downloadOutput)
    .query(({ ctx, input }) => files.downloadFiles(ctx, input.workspace_name)),

  get: read
    .meta(rest('GET', `${base}/{workspace_name}`, 'Workspace details by name', tag))
    .input(s.workspaceNameParam)
    .output(s.workspaceDetailOutput)
    .query(({ ctx, input }) => workspaces.getWorkspace(ctx, input.workspace_name)),

  update: write
    .meta(rest('PUT', `${base}/{workspace_name}`, 'Update workspace details (name, description)', tag))
    .input(s.updateWorkspaceInput)
    .output(s.workspaceDetailOutput)
    .mutation(({ ctx, input }) => workspaces.updateWorkspace(ctx, input)),

  delete: write
    .meta(rest('DELETE', `${base}/{workspace_name}`, 'Delete a workspace with everything in it', tag))
    .input(s.workspaceNameParam)
    .output(successOutput)
    .mutation(({ ctx, input }) => workspaces.deleteWorkspace(ctx, input.workspace_name)),
});
