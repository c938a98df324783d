import { z } from 'zod';
import { jsonObject, pageInput, timestamp } from '../../trpc/common-schemas.ts';

const username = z
  .string()
  .trim()
  .min(3)
  .max(64)
  .regex(/^[a-zA-Z0-9][a-zA-Z0-9._@-]*$/, 'letters, digits and . _ @ - only');
const password = z.string().min(1).max(1024);
/**
 * Role names given to assign roles: trimmed like the names roles are created with (a name of spaces is a
 * 400), then matched regardless of case (users/names.ts).
 */
export const roleNames = z.array(z.string().trim().min(1).max(64)).max(50);
const domain = z
  .string()
  .trim()
  .toLowerCase()
  .min(3)
  .max(253)
  .regex(
    /^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$/,
    'must be a domain name such as acme.com',
  );

export const loginInput = z.object({
  username: z.string().min(1).max(255),
  domain: z.string().min(1).max(255),
  password,
});
export const superAdminLoginInput = z.object({ username: z.string().min(1).max(255), password });

const userInfo = z.object({
  id: z.string(),
  username: z.string(),
  organization_id: z.string().nullable(),
  is_super_admin: z.boolean(),
  must_change_password: z.boolean(),
  permissions: z.array(z.string()),
});

export const loginOutput = z.object({ token: z.string(), expires_at: timestamp, user: userInfo });

export const sessionOutput = z.object({
  kind: z.enum(['user', 'service_account']),
  expires_at: timestamp.nullable(),
  user: userInfo,
});

export const sessionListOutput = z.object({
  sessions: z.array(
    z.object({
      id: z.string().describe('First characters of the session hash; never the token'),
      user_id: z.string(),
      username: z.string(),
      created_at: timestamp,
      expires_at: timestamp,
      ip_address: z.string().nullable(),
      user_agent: z.string().nullable(),
    }),
  ),
  total: z.number().int(),
});
export const pageQuery = z.object(pageInput);

export const preferencesOutput = z.object({ preferences: jsonObject });
export const preferencesInput = z.object({ preferences: jsonObject });

export const changePasswordInput = z.object({ current_password: password, new_password: password });

export const organizationOutput = z.object({
  id: z.string(),
  name: z.string(),
  domain: z.string(),
  created_at: timestamp,
  updated_at: timestamp,
});
const organizationSummaryOutput = organizationOutput.extend({
  user_count: z.number().int(),
  workspace_count: z.number().int(),
});
export const publicOrganizationsOutput = z.object({
  organizations: z.array(z.object({ id: z.string(), name: z.string(), domain: z.string() })),
});
export const organizationListOutput = z.object({
  organizations: z.array(organizationSummaryOutput),
  total: z.number(),
});

export const createOrganizationInput = z.object({
  name: z.string().trim().min(1).max(200),
  domain,
  admin: z
    .object({ username, email: z.string().email().optional(), password: z.string().max(1024).optional() })
    .optional()
    .describe(
      'An admin user to create with the organization; a temporary password is generated when omitted',
    ),
});
export const createOrganizationOutput = z.object({
  organization: organizationOutput,
  admin: z
    .object({ id: z.string(), username: z.string(), temporary_password: z.string().optional() })
    .optional(),
});
export const updateOrganizationInput = z.object({
  org_id: z.string(),
  name: z.string().trim().min(1).max(200).optional(),
  domain: domain.optional(),
});

export const userOutput = z.object({
  id: z.string(),
  username: z.string(),
  email: z.string().nullable(),
  organization_id: z.string().nullable(),
  is_super_admin: z.boolean(),
  is_active: z.boolean(),
  must_change_password: z.boolean(),
  roles: z.array(z.string()),
  last_login_at: timestamp.nullable(),
  created_at: timestamp,
  updated_at: timestamp,
});
export const userListOutput = z.object({ users: z.array(userOutput), total: z.number().int() });
export const adminUserListInput = z.object({ organization_id: z.string().optional(), ...pageInput });

/** Shared by the super-admin and the organization-admin user routes. */
export const newUserFields = {
  username,
  email: z.string().email().max(255).optional(),
  password: z
    .string()
    .max(1024)
    .optional()
    .describe('Initial password; when omitted a temporary one is generated and returned once'),
  roles: roleNames.default(['viewer']).describe('Role names'),
  must_change_password: z.boolean().default(true),
};
export const superAdminCreateUserInput = z.object({
  organization_id: z.string().optional().describe('Omit (with is_super_admin) for a super admin'),
  is_super_admin: z.boolean().default(false),
  ...newUserFields,
});
export const createdUserOutput = z.object({ user: userOutput, temporary_password: z.string().optional() });
export const superAdminUpdateUserInput = z.object({
  user_id: z.string(),
  email: z.string().email().max(255).nullable().optional(),
  is_active: z.boolean().optional(),
  must_change_password: z.boolean().optional(),
  roles: roleNames.optional(),
});

export const orgIdInput = z.object({ org_id: z.string() });
export const userIdInput = z.object({ user_id: z.string() });
export const deleteWorkspaceInput = z.object({ tenant_id: z.string(), workspace_name: z.string() });

export const workspaceSummaryOutput = z.object({
  workspaces: z.array(
    z.object({
      id: z.string(),
      name: z.string(),
      description: z.string(),
      created_at: timestamp,
      updated_at: timestamp,
    }),
  ),
});

export const logFilesOutput = z.object({
  files: z.array(z.object({ name: z.string(), size: z.number().int(), modified_at: timestamp })),
});
