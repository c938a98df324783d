import { z } from 'zod';
import { pageInput, timestamp } from '../../trpc/common-schemas.ts';
import { newUserFields } from '../auth/auth.schemas.ts';

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
  created_at: timestamp,
  updated_at: timestamp,
});
export const roleListOutput = z.object({ roles: z.array(roleOutput) });
export const roleIdInput = z.object({ role_id: z.coerce.number().int().positive() });
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
  roles: z.array(z.string().min(1).max(64)).max(50).describe('Role names; replaces the current assignment'),
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
