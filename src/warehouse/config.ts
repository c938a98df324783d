import { z } from 'zod';

const identifier = z.string().min(1).max(63);

/**
 * A warehouse connection as a workspace stores it (DESIGN §5): the source database, the target
 * warehouse, or a reverse-ETL destination. The password is write-only: stored encrypted, never returned.
 */
export const connectionConfigSchema = z.object({
  type: z.literal('postgres'),
  host: z.string().min(1).max(255),
  port: z.coerce.number().int().min(1).max(65535).default(5432),
  database: z.string().min(1).max(63),
  user: z.string().min(1).max(63),
  password: z.string().max(1024).optional(),
  schemas: z.array(identifier).min(1).max(50).default(['public']),
  tables: z
    .array(z.string().min(1).max(127))
    .max(5000)
    .optional()
    .describe('Selected tables; all when omitted'),
  ssl: z.boolean().default(false),
  ctes: z
    .array(
      z.object({ name: identifier, sql: z.string().min(1).max(100_000), description: z.string().optional() }),
    )
    .max(100)
    .optional()
    .describe('Reusable named source queries, listed before tables in the unified schema'),
});

export type ConnectionConfig = z.infer<typeof connectionConfigSchema>;

/** How a stored config is shown: everything but the password, which is only reported as set. */
export function maskConnectionConfig(config: ConnectionConfig | null | undefined) {
  if (!config) return null;
  const { password, ...visible } = config;
  return { ...visible, password_set: !!password };
}

/** Something about a connection the user should fix even though it works (e.g. a superuser role). */
export const connectionWarningSchema = z.object({
  code: z.enum(['SUPERUSER', 'BYPASS_RLS']),
  message: z.string(),
});

export type ConnectionWarning = z.infer<typeof connectionWarningSchema>;

export const connectionWarningsSchema = z
  .array(connectionWarningSchema)
  .describe(
    "What the last connection's identity check saw of the role: a superuser or a role that bypasses row-level security",
  );
