import { z } from 'zod';
import { connectionConfigSchema, connectionWarningsSchema } from '../../warehouse/config.ts';
import { engineFields } from './workspaces.schemas.ts';

/** The workspace-scoped database routes (check, test, catalogs, test-stored-password). */

const workspaceParam = z.string().min(1).max(100).describe('Workspace name');

export const databaseCheckInput = z.object({ workspace: workspaceParam });

const reachability = z.object({
  configured: z.boolean(),
  reachable: z.boolean(),
  server_version: z.string().nullable(),
  error: z.string().nullable().describe("Why it is unreachable (the driver's reason)"),
  warnings: connectionWarningsSchema,
});

export const databaseCheckOutput = z.object({
  workspace_name: z.string(),
  source: reachability,
  target: reachability,
});

export const databaseTestInput = z.object({
  workspace: workspaceParam,
  config: connectionConfigSchema
    .superRefine(engineFields)
    .optional()
    .describe(
      'A connection to test instead of the stored target config; nothing is saved. Without a password, the stored target password is used only for the same host, port, database and user',
    ),
});

export const databaseTestOutput = z.object({
  success: z.literal(true),
  server_version: z.string(),
  database: z.string(),
  user: z.string(),
  latency_ms: z.number(),
  warnings: connectionWarningsSchema,
});

export const databaseCatalogsOutput = z.object({
  workspace_name: z.string(),
  databases: z.array(z.string()),
  schemas: z.array(z.string()),
});

export const testStoredPasswordOutput = z.object({
  success: z.literal(true),
  workspace_name: z.string(),
  password_set: z.boolean(),
  message: z.string(),
  warnings: connectionWarningsSchema,
});
