import { z } from 'zod';
import {
  connectionConfigSchema,
  connectionWarningSchema,
  connectionWarningsSchema,
} from '../../warehouse/config.ts';
import { jsonObject, pageInput, timestamp } from '../../trpc/common-schemas.ts';
import { staleConnection, targetSchemaSchema } from '../schemas/schemas.schemas.ts';
import { reverseEtlDestinations } from '../schemas/reverse-etl.schemas.ts';

/**
 * Single path segments that share /api/workspaces/ with /{workspace_name}; a workspace may not be
 * called like one (the REST adapter matches case-insensitively, so neither in another case).
 */
export const RESERVED_WORKSPACE_NAMES = [
  'admin-settings',
  'user-preferences',
  'global-settings',
  'current',
  'source-config',
  'target-schema',
  'workflow-status',
  'metrics',
  'schema',
  'select',
  'create',
  'discover',
  'flush-cache',
  'flush-mapping-cache',
  'test-stored-password',
  'benchmark',
] as const;

export const workspaceName = z
  .string()
  .min(1)
  .max(63)
  .regex(
    /^[a-zA-Z][a-zA-Z0-9_-]*$/,
    'must start with a letter and use only letters, digits, _ and - (at most 63 characters)',
  )
  .describe(`Unique in the organization; not one of: ${RESERVED_WORKSPACE_NAMES.join(', ')}`);

export const workspaceNameParam = z.object({ workspace_name: z.string().min(1).max(100) });

/**
 * Fields that only one engine reads are refused on the other, instead of being stored and ignored:
 * the extract–load's raw_schema and cursor_columns exist for MySQL sources only, and CTEs are run on
 * PostgreSQL only.
 */
export function engineFields(
  config: { type: 'postgres' | 'mysql'; raw_schema?: string; cursor_columns?: object; ctes?: unknown[] },
  ctx: z.RefinementCtx,
) {
  const refuse = (field: string, message: string) =>
    ctx.addIssue({ code: 'custom', path: [field], message, input: undefined });
  if (config.type === 'postgres') {
    for (const field of ['raw_schema', 'cursor_columns'] as const)
      if (config[field] !== undefined)
        refuse(
          field,
          `${field} applies to mysql sources only (their extract–load into the target); a postgres connection is read in place`,
        );
  } else if (config.ctes?.length)
    refuse(
      'ctes',
      'ctes are run on postgres connections only; on mysql, define a view on the source instead',
    );
}

/** A config as a client sends it: the masked form it read may come back (password kept). */
const connectionConfigInput = connectionConfigSchema
  .extend({
    password_set: z
      .boolean()
      .optional()
      .describe('As returned on read; with no password given, true keeps the stored one and false clears it'),
  })
  .superRefine(engineFields);
export type ConnectionConfigInput = z.infer<typeof connectionConfigInput>;

const maskedConnectionConfig = connectionConfigSchema
  .omit({ password: true })
  .extend({ password_set: z.boolean() });

// ---- workflow ----

export const WORKFLOW_TASKS = [
  'connect_source',
  'configure_target',
  'assign_schema',
  'discover',
  'review_mappings',
  'generate_project',
  'sync_schema',
  'materialize',
] as const;
export type WorkflowTask = (typeof WORKFLOW_TASKS)[number];

const workflowTaskState = z.object({
  completed: z.boolean(),
  completed_at: z.string().nullable().describe('ISO-8601 UTC timestamp'),
  data: jsonObject,
});

export const workflowStateOutput = z.object({
  workspace_name: z.string(),
  tasks: z.record(z.string(), workflowTaskState),
});

export const workflowMarkInput = workspaceNameParam.extend({
  task_data: z.object({
    task: z.enum(WORKFLOW_TASKS),
    data: jsonObject.optional().describe('Task data to store (completion only); replaces earlier data'),
  }),
});

export const workflowStatusOutput = z.object({
  workspace_name: z.string(),
  progress: z.number().describe('Completed tasks / all tasks, 0..1'),
  next_task: z.enum(WORKFLOW_TASKS).nullable(),
  tasks: z.array(
    z.object({
      task: z.enum(WORKFLOW_TASKS),
      description: z.string(),
      status: z.enum(['completed', 'available', 'blocked']),
      completed: z.boolean().describe('Derived from the workspace state'),
      marked_complete: z.boolean().describe('The stored workflow flag'),
      completed_at: z.string().nullable(),
      blocked_by: z.array(z.enum(WORKFLOW_TASKS)),
      detail: z.string(),
    }),
  ),
});

// ---- workspaces ----

const workspaceOutput = z.object({
  id: z.string(),
  name: z.string(),
  description: z.string(),
  is_current: z.boolean().describe("Selected by the caller (the caller's preference)"),
  last_used_at: timestamp.nullable().describe('When the caller last selected it'),
  source_configured: z.boolean(),
  target_configured: z.boolean(),
  schema_assigned: z.boolean(),
  schema_template: z.string().nullable(),
  created_at: timestamp,
  updated_at: timestamp,
});

/** Warnings about the workspace's connections (e.g. a superuser role), each naming its side. */
const sideWarnings = z
  .array(connectionWarningSchema.extend({ side: z.enum(['source', 'target']) }))
  .describe(
    "What the last connection's identity check saw of each side's role: a superuser or a role that bypasses row-level security",
  );

export const workspaceDetailOutput = workspaceOutput.extend({
  source_config: maskedConnectionConfig.nullable(),
  target_config: maskedConnectionConfig.nullable(),
  schema_customized: z.boolean(),
  table_count: z.number().int(),
  workflow_state: z.record(z.string(), workflowTaskState),
  warnings: sideWarnings,
});

export const workspaceListInput = z.object(pageInput);
export const workspaceListOutput = z.object({
  workspaces: z.array(workspaceOutput),
  current_workspace: z.string().nullable(),
  total: z.number().int(),
});

export const createWorkspaceInput = z.object({
  name: workspaceName,
  description: z.string().max(2000).optional(),
  source_config: connectionConfigInput.optional(),
  target_config: connectionConfigInput.optional(),
  template_name: z.string().max(100).optional().describe('Library schema template to assign'),
  select: z.boolean().default(true).describe('Make it the current workspace of the caller'),
});

export const updateWorkspaceInput = workspaceNameParam.extend({
  name: workspaceName.optional().describe('A new name'),
  description: z.string().max(2000).optional(),
});

export const selectWorkspaceInput = z.object({ workspace_name: z.string().min(1).max(100) });
export const selectOutput = z.object({ success: z.literal(true), workspace: workspaceDetailOutput });

export const sourceConfigOutput = z.object({
  workspace_name: z.string(),
  configured: z.boolean(),
  source_config: maskedConnectionConfig.nullable(),
  warnings: connectionWarningsSchema,
});
export const sourceConfigInput = z.object({ source_config: connectionConfigInput });

// ---- target schema of the current workspace ----

export const schemaCheckOutput = z.object({
  workspace_name: z.string(),
  assigned: z.boolean(),
  template_name: z.string().nullable(),
  customized: z.boolean(),
  table_count: z.number().int(),
});
export const schemaContentOutput = z.object({
  workspace_name: z.string(),
  template_name: z.string().nullable(),
  schema: targetSchemaSchema,
});
export const currentSchemaOutput = z.object({
  workspace_name: z.string(),
  template_name: z.string().nullable(),
  customized: z.boolean(),
  schema: targetSchemaSchema.nullable(),
});
export const availableSchemasOutput = z.object({
  workspace_name: z.string(),
  schemas: z.array(
    z.object({
      name: z.string(),
      source: z.enum(['library', 'workspace']),
      workspace_name: z.string().nullable(),
      description: z.string(),
      table_count: z.number().int(),
      is_assigned: z.boolean(),
    }),
  ),
});
export const assignSchemaInput = z
  .object({
    template_name: z.string().min(1).max(100).optional().describe('A library template'),
    from_workspace: z.string().min(1).max(100).optional().describe("Another workspace's schema, copied"),
  })
  .refine((v) => !!v.template_name !== !!v.from_workspace, {
    message: 'Give exactly one of template_name and from_workspace',
  });
export const assignSchemaOutput = schemaCheckOutput.extend({ stale_connections: z.array(staleConnection) });

// ---- complete configuration ----

export const configOutput = z.object({
  workspace_name: z.string(),
  description: z.string(),
  source_config: maskedConnectionConfig.nullable(),
  target_config: maskedConnectionConfig.nullable(),
  target_schema: targetSchemaSchema.nullable(),
  schema_template: z.string().nullable(),
  settings: jsonObject.describe('Admin settings of the workspace (overrides of the global ones)'),
  system_prompt: z.string().nullable(),
  success_criteria_prompt: z.string().nullable(),
  workflow_state: z.record(z.string(), workflowTaskState),
  warnings: sideWarnings,
});

export const configSaveInput = workspaceNameParam.extend({
  description: z.string().max(2000).optional(),
  source_config: connectionConfigInput.nullable().optional(),
  target_config: connectionConfigInput.nullable().optional(),
  target_schema: targetSchemaSchema.nullable().optional(),
  schema_template: z.string().max(100).nullable().optional(),
  settings: jsonObject.optional(),
  system_prompt: z.string().max(100_000).nullable().optional(),
  success_criteria_prompt: z.string().max(100_000).nullable().optional(),
  workflow_state: z.partialRecord(z.enum(WORKFLOW_TASKS), workflowTaskState).optional(),
  // Declared so that what GET answered can be saved again as it is; any other unknown key is a 400.
  warnings: sideWarnings.optional().describe('As returned on read; read-only, ignored'),
});
export const configSaveOutput = configOutput.extend({ stale_connections: z.array(staleConnection) });

// ---- prompts ----

export const systemPromptOutput = z.object({
  workspace_name: z.string(),
  prompt: z.string(),
  is_custom: z.boolean(),
  default_prompt: z.string(),
});
export const systemPromptInput = workspaceNameParam.extend({ prompt: z.string().min(1).max(100_000) });
export const promptFileOutput = z.object({
  workspace_name: z.string(),
  content: z.string(),
  exists: z.boolean(),
});
export const promptFileInput = workspaceNameParam.extend({ content: z.string().max(100_000) });

// ---- files ----

export const gitDiffOutput = z.object({
  workspace_name: z.string(),
  base_commit: z
    .object({ id: z.string(), message: z.string(), created_at: timestamp })
    .nullable()
    .describe('The last commit; null = compared with the empty tree'),
  has_changes: z.boolean(),
  files: z.array(
    z.object({
      path: z.string(),
      status: z.enum(['added', 'modified', 'deleted']),
      additions: z.number().int(),
      deletions: z.number().int(),
    }),
  ),
  diff: z.string().describe('Unified diff'),
});

export const downloadOutput = z.object({
  filename: z.string(),
  files: z.array(z.object({ path: z.string(), content: z.string() })),
});

// ---- metrics ----

export const metricsOutput = z.object({
  workspace_name: z.string(),
  schema_tables: z.number().int(),
  schema_fields: z.number().int(),
  pii_fields: z.number().int(),
  mapped_tables: z.number().int(),
  mapped_fields: z.number().int(),
  unmapped_fields: z.number().int(),
  confirmed_connections: z.number().int(),
  suggested_connections: z.number().int(),
  open_ambiguities: z.number().int(),
  mapping_coverage: z.number().describe('Mapped fields / schema fields, 0..1'),
  project_generated: z.boolean(),
  materialized_tables: z.number().int(),
  last_materialized_at: timestamp.nullable(),
  schema_sync_status: z.enum(['no_schema', 'not_synced', 'in_sync', 'out_of_sync']),
  schema_synced_at: timestamp.nullable(),
});

// ---- caches, benchmark ----

export const flushOutput = z.object({
  success: z.literal(true),
  message: z.string(),
  cleared: z.number().int(),
});

const timing = z.object({
  operations: z.number().int(),
  total_ms: z.number(),
  avg_ms: z.number(),
  ops_per_sec: z.number(),
});
export const benchmarkOutput = z.object({
  filesystem: z.object({ write: timing, read: timing, delete: timing }),
  file_access: z.object({ stat: timing, open_read_close: timing }),
  database: z.object({ round_trip: timing, workspace_query: timing }),
  total_ms: z.number(),
  database_kind: z.string(),
});

// ---- settings ----

const identityName = z.string().regex(/^[a-z][a-z0-9_]{0,62}$/, 'lower-case letters, digits and _');
const columnName = z.string().min(1).max(63);
const tableName = z
  .string()
  .regex(/^[^.]+\.[^.]+$/, 'schema.table')
  .max(127)
  .describe('A table of the workspace database, as schema.table');
const survivorshipRule = z
  .enum(['most_frequent', 'most_recent', 'source_priority', 'first_non_null'])
  .describe('How a profile field picks among the values of a cluster (default most_frequent)');

/** Identity resolution of the workspace: limits, confirmed sources, and the unified profile's fields. */
export const identityResolutionSettings = z.strictObject({
  max_cluster_size: z.number().int().min(2).max(1_000_000).optional().describe('Default 1000'),
  max_degree: z.number().int().min(1).max(1_000_000).optional().describe('Default 100'),
  max_merge_jump_ratio: z.number().positive().max(100).optional().describe('Default 0.5'),
  incremental: z
    .boolean()
    .optional()
    .describe(
      'Append-only sources: a build reads only the records added since the last one (default false: full builds, which also see changed and deleted records)',
    ),
  sources: z
    .array(
      z.strictObject({
        table: tableName,
        key_column: columnName.optional().describe('The record key (default: a one-column primary key)'),
        timestamp_column: columnName.optional().describe('Recency of a record, for most_recent'),
        identifiers: z
          .array(
            z.strictObject({
              column: columnName,
              type: identityName.describe('email, phone, customer_id, …'),
              normalize: z.enum(['email', 'phone', 'trim']).optional(),
            }),
          )
          .min(1)
          .max(20),
      }),
    )
    .max(50)
    .optional()
    .describe(
      'Confirmed identity sources; omitted = the ones proposed from profiling (see GET identity-graph)',
    ),
  source_priority: z.array(tableName).max(50).optional().describe('For source_priority and ties'),
  profile_fields: z
    .array(
      z.strictObject({
        name: identityName,
        rule: survivorshipRule.optional(),
        columns: z
          .array(z.strictObject({ table: tableName, column: columnName }))
          .min(1)
          .max(50)
          .optional()
          .describe('Default: the columns of that name in the identity sources'),
      }),
    )
    .max(100)
    .optional()
    .describe(
      'Fields of the unified profile besides the identifier types; default: columns shared by sources',
    ),
});
export type IdentityResolutionSettings = z.infer<typeof identityResolutionSettings>;

/** Admin settings of a workspace (or global ones that every workspace inherits), with their defaults. */
export const adminSettingsFields = {
  discovery_confidence_threshold: z
    .number()
    .min(0)
    .max(1)
    .describe('Lowest confidence at which discovery suggests a connection (default 0.5)'),
  ambiguity_margin: z
    .number()
    .min(0)
    .max(1)
    .describe('Candidates closer than this in confidence are reported as an ambiguity (default 0.1)'),
  auto_confirm_threshold: z
    .number()
    .min(0)
    .max(1)
    .nullable()
    .describe('Suggestions at or above this confidence are confirmed automatically; null = never (default)'),
  sample_size: z.number().int().min(10).max(100_000).describe('Rows sampled per source table (default 1000)'),
  query_row_limit: z
    .number()
    .int()
    .min(1)
    .max(100_000)
    .describe(
      'Row cap (default and maximum limit) of ad-hoc queries on the source and the target, within WAREHOUSE_ROW_CAP (default 1000)',
    ),
  query_timeout_seconds: z
    .number()
    .int()
    .min(1)
    .max(600)
    .describe('Statement timeout of ad-hoc queries, within WAREHOUSE_STATEMENT_TIMEOUT_MS (default 30)'),
  mask_pii_in_samples: z
    .boolean()
    .describe('Mask values of PII columns in samples and previews (default true)'),
  reverse_etl_connections: reverseEtlDestinations,
  identity_resolution: identityResolutionSettings,
};

export const ADMIN_SETTINGS_DEFAULTS = {
  discovery_confidence_threshold: 0.5,
  ambiguity_margin: 0.1,
  auto_confirm_threshold: null,
  sample_size: 1000,
  query_row_limit: 1000,
  query_timeout_seconds: 30,
  mask_pii_in_samples: true,
  reverse_etl_connections: [],
  identity_resolution: {},
};
const adminSettings = z.object(adminSettingsFields);
export type AdminSettings = z.infer<typeof adminSettings>;

const settingsWorkspace = z
  .string()
  .min(1)
  .max(100)
  .optional()
  .describe('The workspace; omitted = the global admin settings of the organization');

export const adminSettingsQuery = z.object({ workspace_name: settingsWorkspace });
export const adminSettingsCreateInput = z.strictObject({
  workspace_name: settingsWorkspace,
  ...adminSettings.partial().shape,
});
export const adminSettingsUpdateInput = z.strictObject({
  workspace_name: settingsWorkspace,
  ...Object.fromEntries(Object.entries(adminSettingsFields).map(([k, v]) => [k, v.nullable().optional()])),
} as { workspace_name: typeof settingsWorkspace } & {
  [K in keyof typeof adminSettingsFields]: z.ZodOptional<z.ZodNullable<(typeof adminSettingsFields)[K]>>;
});
/** A workspace's admin settings as the config route takes them: the workspace is the route's own. */
export const workspaceSettingsInput = adminSettingsUpdateInput.omit({ workspace_name: true });
export const adminSettingsOutput = z.object({
  workspace_name: z.string().nullable(),
  scope: z.enum(['workspace', 'global']),
  settings: adminSettings.partial().describe('What is stored at this level'),
  effective: adminSettings.describe(
    'Defaults, overridden by the global settings, overridden by the workspace',
  ),
  is_default: z.boolean().describe('Nothing stored at this level'),
});

export const globalSettingsFields = {
  business_context: z
    .string()
    .max(20_000)
    .describe(
      'What the business does: hypothesis generation uses it when a request gives no business_context',
    ),
};
export const GLOBAL_SETTINGS_DEFAULTS = {
  business_context: '',
};
const globalSettings = z.object(globalSettingsFields);
export const globalSettingsUpdateInput = z.strictObject(
  Object.fromEntries(Object.entries(globalSettingsFields).map(([k, v]) => [k, v.nullable().optional()])) as {
    [K in keyof typeof globalSettingsFields]: z.ZodOptional<z.ZodNullable<(typeof globalSettingsFields)[K]>>;
  },
);
export const globalSettingsOutput = z.object({
  settings: globalSettings,
  updated_at: timestamp.nullable(),
});

export const userPreferencesFields = {
  theme: z.enum(['light', 'dark', 'system']).describe('default system'),
  language: z.string().min(2).max(35).describe('default en'),
  timezone: z.string().min(1).max(64).describe('default UTC'),
  date_format: z.string().min(1).max(32).describe('default YYYY-MM-DD'),
  page_size: z.number().int().min(10).max(500).describe('default 50'),
};
export const USER_PREFERENCES_DEFAULTS = {
  theme: 'system' as const,
  language: 'en',
  timezone: 'UTC',
  date_format: 'YYYY-MM-DD',
  page_size: 50,
};
const userPreferences = z.object(userPreferencesFields);
export type UserPreferences = z.infer<typeof userPreferences>;
export const userPreferencesCreateInput = z.strictObject(userPreferences.partial().shape);
export const userPreferencesUpdateInput = z.strictObject(
  Object.fromEntries(Object.entries(userPreferencesFields).map(([k, v]) => [k, v.nullable().optional()])) as {
    [K in keyof typeof userPreferencesFields]: z.ZodOptional<
      z.ZodNullable<(typeof userPreferencesFields)[K]>
    >;
  },
);
export const userPreferencesOutput = z.object({
  preferences: userPreferences,
  current_workspace: z.string().nullable().describe('Set with POST /api/workspaces/select'),
  last_used: z.array(z.object({ workspace_name: z.string(), last_used_at: timestamp })),
});
