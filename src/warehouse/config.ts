import { z } from 'zod';

const identifier = z.string().min(1).max(63);

/**
 * A warehouse connection as a workspace stores it (DESIGN §5): the source database, the target
 * warehouse, or a reverse-ETL destination. The password is write-only: stored encrypted, never returned.
 */
export const connectionConfigSchema = z.object({
  type: z
    .enum(['postgres', 'mysql'])
    .describe(
      'postgres: source and target; mysql (MySQL 8, MariaDB 10.6+): a source, extract-loaded into the target',
    ),
  host: z.string().min(1).max(255),
  port: z.coerce
    .number()
    .int()
    .min(1)
    .max(65535)
    .optional()
    .describe('Default 5432 for postgres, 3306 for mysql'),
  database: z.string().min(1).max(63),
  user: z.string().min(1).max(63),
  password: z.string().max(1024).optional(),
  schemas: z
    .array(identifier)
    .min(1)
    .max(50)
    .default(['public'])
    .describe('PostgreSQL schemas; for mysql the databases to read (default: `database`)'),
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
  raw_schema: identifier
    .optional()
    .describe(
      'mysql: the schema of the target warehouse the tables are loaded into (default raw_<database>)',
    ),
  cursor_columns: z
    .record(z.string().min(1).max(127), z.string().min(1).max(64))
    .optional()
    .describe(
      'mysql: table → column whose growth marks new and changed rows (default: updated_at-like column, else the auto-increment key)',
    ),
});

export type ConnectionConfig = z.infer<typeof connectionConfigSchema>;

/** How a stored config is shown: everything but the password, which is only reported as set. */
export function maskConnectionConfig(config: ConnectionConfig | null | undefined) {
  if (!config) return null;
  const { password, ...visible } = config;
  return { ...visible, port: portOf(visible), password_set: !!password };
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

const DEFAULT_PORTS = { postgres: 5432, mysql: 3306 } as const;

/** The port a config connects to (stored configs may leave it to the engine's default). */
export const portOf = (config: Pick<ConnectionConfig, 'type' | 'port'>): number =>
  config.port ?? DEFAULT_PORTS[config.type];
