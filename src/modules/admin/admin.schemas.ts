import { z } from 'zod';
import { pageInput, timestamp } from '../../trpc/common-schemas.ts';
import {
  createOrganizationInput,
  newUserFields,
  organizationOutput,
  roleNames,
  userOutput,
} from '../auth/auth.schemas.ts';
import { mappingOutput } from '../mappings/mappings.schemas.ts';
import { templateSummary } from '../schemas/schemas.schemas.ts';
import {
  RESERVED_WORKSPACE_NAMES,
  engineFields,
  workspaceDetailOutput,
  workspaceName,
} from '../workspaces/workspaces.schemas.ts';
import { connectionConfigSchema } from '../../warehouse/config.ts';
import { CACHE_NAMES, MAX_CACHE_ENTRIES, MAX_TTL_SECONDS, isCacheName } from '../../cache.ts';
import { isFeatureName } from '../../features.ts';
import { llmParametersSchema } from '../../llm/parameters.ts';
import { branchNameProblem } from '../../vcs/branch-name.ts';
import { LLM_MODES } from '../../llm/provider.ts';

const roleName = z
  .string()
  .trim()
  .min(1)
  .max(64)
  .regex(/^[a-zA-Z0-9][a-zA-Z0-9 ._-]*$/, 'letters, digits, space and . _ - only');
const permissionList = z.array(z.string().min(1).max(64)).max(50);

export const roleOutput = z.object({
  id: z.number().int(),
  name: z.string(),
  description: z.string(),
  permissions: z.array(z.string()),
  is_builtin: z.boolean(),
  user_count: z.number().int(),
  service_account_count: z.number().int(),
  created_at: timestamp,
  updated_at: timestamp,
});
export const roleListOutput = z.object({ roles: z.array(roleOutput) });
// The bound of the integer column, so an oversized id is a 400 rather than a database error.
export const roleIdInput = z.object({ role_id: z.coerce.number().int().positive().max(2_147_483_647) });
export const createRoleInput = z.object({
  name: roleName,
  description: z.string().max(500).optional(),
  permissions: permissionList,
});
export const updateRoleInput = roleIdInput.extend({
  name: roleName.optional(),
  description: z.string().max(500).optional(),
});
export const updateRolePermissionsInput = roleIdInput.extend({ permissions: permissionList });

export const permissionListOutput = z.object({
  permissions: z.array(z.object({ name: z.string(), description: z.string() })),
});

export const userPageInput = z.object(pageInput);
export const createUserInput = z.object(newUserFields);
export const updateUserInput = z.object({
  user_id: z.string(),
  email: z.string().email().max(255).nullable().optional(),
  is_active: z.boolean().optional(),
  must_change_password: z.boolean().optional(),
});
export const setUserPasswordInput = z.object({
  user_id: z.string(),
  password: z.string().min(1).max(1024),
  must_change_password: z.boolean().default(true),
});
export const updateUserRolesInput = z.object({
  user_id: z.string(),
  roles: roleNames.describe('Role names; replaces the current assignment'),
});

export const systemInfoOutput = z.object({
  version: z.string(),
  git_commit: z.string().nullable(),
  started_at: timestamp,
  uptime_seconds: z.number().int(),
  database: z.object({ kind: z.enum(['embedded', 'server']), version: z.string() }),
  node_version: z.string(),
  platform: z.string(),
});

// ---- cache settings, feature flags, user overrides, version control (issue 10) ----

const cacheConfig = {
  enabled: z.boolean(),
  ttl_seconds: z
    .number()
    .int()
    .min(0)
    .max(MAX_TTL_SECONDS)
    .describe('Time to live of an entry (0 = no caching)'),
  max_entries: z
    .number()
    .int()
    .min(0)
    .max(MAX_CACHE_ENTRIES)
    .describe('Entries kept per organization and API process; least recently used go first'),
};

export const cacheSettingsOutput = z.object({
  caches: z.array(
    z.object({
      name: z.string(),
      description: z.string(),
      ...cacheConfig,
      defaults: z.object(cacheConfig),
      entries: z.number().int().describe('Entries this API process holds for the organization now'),
    }),
  ),
  updated_at: timestamp.nullable(),
});
export const saveCacheSettingsOutput = cacheSettingsOutput.extend({
  cleared: z.array(z.string()).describe('Caches cleared by this save (switched on or off, or asked for)'),
});

const knownNames =
  (known: (name: string) => boolean, what: string) => (value: object, ctx: z.RefinementCtx) => {
    for (const name of Object.keys(value))
      if (!known(name)) ctx.addIssue({ code: 'custom', path: [name], message: `unknown ${what} ${name}` });
  };

export const cacheSettingsInput = z.object({
  caches: z
    .record(z.string(), z.object(cacheConfig).partial().strict())
    .superRefine(knownNames(isCacheName, 'cache'))
    .default({})
    .describe('Cache name → the settings to change; unnamed caches and fields keep their values'),
  clear: z
    .array(z.string().refine(isCacheName, 'unknown cache'))
    .max(CACHE_NAMES.length)
    .default([])
    .describe('Caches to clear now, whatever their settings'),
});

const featureInfo = z.object({
  name: z.string(),
  description: z.string(),
  default: z.boolean(),
  user_overridable: z.boolean(),
  organization_value: z.boolean().nullable().describe("The organization's setting; null = the default"),
  enabled: z.boolean().describe('Effective value for the organization'),
});

export const featureSettingsOutput = z.object({
  features: z.array(featureInfo),
  allow_user_overrides: z.boolean(),
  updated_at: timestamp.nullable(),
});

export const featureSettingsInput = z.object({
  features: z
    .record(z.string(), z.boolean().nullable())
    .superRefine(knownNames(isFeatureName, 'feature'))
    .default({})
    .describe('Feature name → on/off; null returns it to the default; unnamed features keep their value'),
  allow_user_overrides: z.boolean().optional().describe('Whether users may override overridable features'),
});

export const userFeatureAccessOutput = z.object({
  has_access: z.boolean(),
  reason: z.string().nullable().describe('Why not, when has_access is false'),
  organization_id: z.string().nullable(),
  overridable_features: z.array(z.string()),
});

const overrideTarget = {
  user_id: z
    .string()
    .min(1)
    .max(64)
    .optional()
    .describe('Another user of your organization (needs org.admin); default: yourself'),
  organization_id: z.string().min(1).max(64).optional().describe('Must be your own organization when given'),
};

export const userFeatureOverridesQuery = z.object(overrideTarget);
export const userFeatureOverridesInput = z.object({
  ...overrideTarget,
  overrides: z
    .record(z.string(), z.boolean().nullable())
    .superRefine(knownNames(isFeatureName, 'feature'))
    .describe('Feature name → on/off; null removes the override'),
});

export const userFeatureOverridesOutput = z.object({
  user_id: z.string(),
  organization_id: z.string(),
  allow_user_overrides: z.boolean(),
  overrides: z.record(z.string(), z.boolean()),
  features: z.array(
    featureInfo.extend({
      user_value: z.boolean().nullable().describe("The user's override; null = none"),
      enabled: z.boolean().describe('Effective value for the user'),
    }),
  ),
  updated_at: timestamp.nullable(),
});

const branchName = z
  .string()
  .trim()
  .min(1)
  .max(255)
  .superRefine((name, ctx) => {
    const problem = branchNameProblem(name);
    if (problem) ctx.addIssue({ code: 'custom', message: `not a valid git branch name: ${problem}` });
  });

export const vcsConfigInput = z.object({
  enabled: z.boolean().default(true).describe('Push on commit-transformation when true'),
  url: z
    .string()
    .trim()
    .min(1)
    .max(2000)
    .describe('HTTPS URL of the repository (http only for loopback hosts)'),
  branch: branchName.default('main'),
  author_name: z.string().trim().min(1).max(255).default('dimas'),
  author_email: z.string().trim().email().max(255).default('dimas@noreply.invalid'),
  path_prefix: z
    .string()
    .trim()
    .max(500)
    .default('')
    .describe('Directory of the repository the files go under'),
  username: z
    .string()
    .trim()
    .min(1)
    .max(255)
    .default('x-access-token')
    .describe('Basic-auth user sent with the token (GitLab: oauth2; Bitbucket: your user name)'),
  token: z
    .string()
    .min(1)
    .max(4096)
    .nullable()
    .optional()
    .describe('Access token; omitted = keep the stored one, null = remove it. Never returned.'),
});

export const vcsConfigOutput = z.object({
  configured: z.boolean(),
  enabled: z.boolean(),
  url: z.string().nullable(),
  branch: z.string(),
  author_name: z.string(),
  author_email: z.string(),
  path_prefix: z.string(),
  username: z.string(),
  token_set: z.boolean(),
  last_push_at: timestamp.nullable(),
  last_push_commit: z.string().nullable(),
  last_push_error: z.string().nullable(),
  updated_at: timestamp.nullable(),
});

export const vcsTestOutput = z.object({
  success: z.literal(true),
  message: z.string(),
  url: z.string(),
  branch: z.string(),
  branch_exists: z.boolean(),
  default_branch: z.string().nullable(),
  default_branch_note: z
    .string()
    .nullable()
    .describe(
      "null when the remote names its HEAD's branch; otherwise how it was inferred, or why it is unknown",
    ),
  refs: z.number().int(),
  push_access: z.boolean(),
  token_used: z.enum(['given', 'stored', 'none']),
});

// ---- LLM parameters and mode (issue 6) ----

const llmFields = llmParametersSchema.shape;
const httpUrl = llmFields.base_url
  .unwrap()
  .refine((url) => /^https?:\/\//i.test(url), 'must be an http(s) URL');

/** Keys left out keep their stored value (or the default); the whole result is validated again. */
export const llmParametersInput = z.object({
  base_url: httpUrl.optional(),
  model: llmFields.model.unwrap().optional(),
  temperature: llmFields.temperature.unwrap().optional(),
  max_tokens: llmFields.max_tokens.unwrap().optional(),
  timeout_seconds: llmFields.timeout_seconds.unwrap().optional(),
  monthly_budget_usd: llmFields.monthly_budget_usd.unwrap().optional(),
  price_per_1k_tokens: llmFields.price_per_1k_tokens.unwrap().optional(),
  api_key: z
    .string()
    .min(1)
    .max(4096)
    .nullable()
    .optional()
    .describe('API key; omitted = keep the stored one, null = remove it. Never returned.'),
});

export const llmParametersOutput = z.object({
  base_url: z.string(),
  model: z.string(),
  temperature: z.number(),
  max_tokens: z.number().int(),
  timeout_seconds: z.number(),
  monthly_budget_usd: z.number(),
  price_per_1k_tokens: z.number(),
  api_key_set: z.boolean(),
  api_key_hint: z.string().nullable().describe('The last characters of the key, e.g. "…x9Qa"'),
  is_default: z.boolean().describe('Nothing saved yet: the defaults apply'),
  updated_at: timestamp.nullable(),
});

export const llmModeOutput = z.object({
  mode: z.enum(LLM_MODES),
  available_modes: z.array(z.enum(LLM_MODES)),
  description: z.string(),
});

export const setLlmModeInput = z.object({ mode: z.enum(LLM_MODES) });

export const setLlmModeOutput = llmModeOutput.extend({ previous_mode: z.enum(LLM_MODES) });

// ---- setup-environment (issue 10) ----

export const setupEnvironmentInput = z.object({
  organization: createOrganizationInput.pick({ name: true, domain: true }),
  admin: z
    .object({ username: newUserFields.username, email: newUserFields.email })
    .describe('The organization admin; a temporary password is generated and returned once'),
  workspace: z.object({
    name: workspaceName.refine(
      (name) => !(RESERVED_WORKSPACE_NAMES as readonly string[]).includes(name.toLowerCase()),
      'is reserved: a route of /api/workspaces has this name',
    ),
    description: z.string().max(2000).optional(),
  }),
  source: connectionConfigSchema
    .superRefine(engineFields)
    .describe('The source database of the workspace (password stored encrypted)'),
  template: z.string().min(1).max(100).describe('Library schema template for the target schema'),
  discover: z
    .boolean()
    .default(true)
    .describe('Run an offline discovery on the source and store its suggestions as the initial mappings'),
});

export const setupEnvironmentOutput = z.object({
  organization: organizationOutput,
  admin: z.object({
    user: userOutput,
    temporary_password: z.string().describe('Shown only in this answer; must be changed at first login'),
  }),
  workspace: workspaceDetailOutput,
  schema: templateSummary.extend({ template_name: z.string() }),
  discovery: z.object({
    ran: z.boolean(),
    run_id: z.string().nullable(),
    mode: z.literal('offline'),
    source_tables: z.number().int(),
    source_columns: z.number().int(),
    unprofiled_tables: z
      .array(z.string())
      .describe('Source tables that could not be profiled; matched on names and types only'),
    fields_suggested: z.number().int(),
    ambiguities: z.number().int(),
    mappings: z.array(
      mappingOutput.pick({
        table_name: true,
        tables: true,
        connections: true,
        transformations: true,
        ambiguities: true,
        version: true,
        committed_version: true,
      }),
    ),
  }),
});
