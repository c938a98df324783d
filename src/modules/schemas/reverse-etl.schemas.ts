import { z } from 'zod';

/*
 * Reverse-ETL destinations, held in the admin settings (`reverse_etl_connections`, workspace or
 * global level): where the rows of a target table can be sent. Secrets (a database password, a
 * webhook token) are sealed when stored and shown only as `password_set` / `secret_set`.
 */

const connectionName = z
  .string()
  .min(1)
  .max(63)
  .regex(/^[a-zA-Z][a-zA-Z0-9_-]*$/, 'must start with a letter and use only letters, digits, _ and -');

const common = {
  name: connectionName.describe('Unique among the connections of the workspace'),
  description: z.string().max(2000).optional(),
};

const postgresDestination = z.object({
  ...common,
  type: z.literal('postgres'),
  host: z.string().min(1).max(255),
  port: z.number().int().min(1).max(65535).default(5432),
  database: z.string().min(1).max(63),
  user: z.string().min(1).max(63),
  password: z.string().max(1024).optional().describe('Write-only'),
  password_set: z
    .boolean()
    .optional()
    .describe('As returned on read; with no password given, true keeps the stored one and false clears it'),
  schema: z.string().min(1).max(63).default('public').describe('Schema the tables are written into'),
  ssl: z.boolean().default(false),
});

const webhookDestination = z.object({
  ...common,
  type: z.literal('webhook'),
  url: z
    .url({ protocol: /^https?$/ })
    .max(2000)
    .describe('Rows are POSTed (or PUT) here as JSON batches'),
  method: z.enum(['POST', 'PUT']).default('POST'),
  batch_size: z.number().int().min(1).max(10_000).default(500),
  secret: z.string().max(4096).optional().describe('Write-only; sent as a bearer token'),
  secret_set: z.boolean().optional().describe('As returned on read; like password_set'),
});

const csvDestination = z.object({
  ...common,
  type: z.literal('csv'),
  file_name: z
    .string()
    .min(1)
    .max(255)
    .regex(/^[^/\\]+$/, 'a file name, no directories')
    .default('{table}.csv')
    .describe('{table} is replaced by the table name'),
  delimiter: z.enum([',', ';', '\t', '|']).default(','),
  include_header: z.boolean().default(true),
});

export const reverseEtlDestination = z.discriminatedUnion('type', [
  postgresDestination,
  webhookDestination,
  csvDestination,
]);
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
  .describe('Reverse-ETL destinations: another PostgreSQL database, a webhook URL or a CSV file export');
