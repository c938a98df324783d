import { z } from 'zod';

/*
 * Reverse-ETL connections, held in the admin settings (`reverse_etl_connections`, workspace or
 * global level): PostgreSQL databases that hold copies of the target tables, which monitoring
 * measures by name (GET /api/monitoring/metrics/datasource/{name}: the tables assigned to the connection, else
 * every table of its schema). The password is sealed when stored and shown only as `password_set`.
 * dimas itself sends no rows: webhook and CSV destinations, and an assignment's write mode, were
 * accepted once and read by nothing, so they are refused now.
 */

const connectionName = z
  .string()
  .min(1)
  .max(63)
  .regex(/^[a-zA-Z][a-zA-Z0-9_-]*$/, 'must start with a letter and use only letters, digits, _ and -');

export const reverseEtlDestination = z.object({
  name: connectionName.describe('Unique among the connections of the workspace'),
  description: z.string().max(2000).optional(),
  type: z.literal('postgres', {
    error:
      'must be postgres: a reverse-ETL connection is a database whose tables monitoring measures (webhook and csv destinations are not supported: nothing sends rows to them)',
  }),
  host: z.string().min(1).max(255),
  port: z.number().int().min(1).max(65535).default(5432),
  database: z.string().min(1).max(63),
  user: z.string().min(1).max(63),
  password: z.string().max(1024).optional().describe('Write-only'),
  password_set: z
    .boolean()
    .optional()
    .describe('As returned on read; with no password given, true keeps the stored one and false clears it'),
  schema: z.string().min(1).max(63).default('public').describe('Schema of the tables monitoring measures'),
  ssl: z.boolean().default(false),
});
export type ReverseEtlDestination = z.infer<typeof reverseEtlDestination>;

export const reverseEtlDestinations = z
  .array(reverseEtlDestination)
  .max(50)
  .superRefine((list, ctx) => {
    const seen = new Set<string>();
    list.forEach((d, i) => {
      if (seen.has(d.name.toLowerCase()))
        ctx.addIssue({ code: 'custom', path: [i, 'name'], message: `Duplicate connection name ${d.name}` });
      seen.add(d.name.toLowerCase());
    });
  })
  .describe(
    'Reverse-ETL connections: PostgreSQL databases that hold copies of the target tables (dimas sends no rows itself), measured by monitoring under their name',
  );
