import { z } from 'zod';
import { timestamp } from '../../trpc/common-schemas.ts';
import { roleNames } from '../auth/auth.schemas.ts';

const name = z
  .string()
  .trim()
  .min(1)
  .max(100)
  .regex(/^[a-zA-Z0-9][a-zA-Z0-9 ._-]*$/, 'letters, digits, space and . _ - only');
const roles = roleNames.describe('Role names');
const expiresInDays = z
  .number()
  .int()
  .min(1)
  .max(3650)
  .optional()
  .describe('Key lifetime; omit for no expiry');

export const serviceAccountOutput = z.object({
  id: z.string(),
  name: z.string(),
  description: z.string(),
  is_active: z.boolean(),
  roles: z.array(z.string()),
  key_prefix: z.string(),
  key_expires_at: timestamp.nullable(),
  last_used_at: timestamp.nullable(),
  created_at: timestamp,
  updated_at: timestamp,
});
export const serviceAccountListOutput = z.object({ service_accounts: z.array(serviceAccountOutput) });
export const serviceAccountWithKeyOutput = z.object({
  service_account: serviceAccountOutput,
  api_key: z.string().describe('Shown once; store it now'),
});

export const accountIdInput = z.object({ account_id: z.string() });
export const createServiceAccountInput = z.object({
  name,
  description: z.string().max(500).optional(),
  roles: roles.default(['viewer']),
  expires_in_days: expiresInDays,
});
export const updateServiceAccountInput = accountIdInput.extend({
  name: name.optional(),
  description: z.string().max(500).optional(),
  is_active: z.boolean().optional(),
  roles: roles.optional(),
});
export const rotateKeyInput = accountIdInput.extend({
  grace_period_minutes: z
    .number()
    .int()
    .min(0)
    .max(7 * 24 * 60)
    .default(0)
    .describe('How long the previous key keeps working'),
  expires_in_days: expiresInDays,
});
export const apiKeyInfoOutput = z.object({
  key_prefix: z.string(),
  masked_key: z.string(),
  created_at: timestamp,
  expires_at: timestamp.nullable(),
  last_used_at: timestamp.nullable(),
  previous_key_valid_until: timestamp.nullable(),
});
