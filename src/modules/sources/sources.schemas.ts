import { z } from 'zod';
import { SAMPLE_LIMIT_DEFAULT, SAMPLE_LIMIT_MAX } from '../../warehouse/postgres.ts';
import { SAMPLE_VALUE_CUT, SAMPLE_VALUE_MAX_LENGTH } from '../../warehouse/warehouse.ts';

const relationKind = z.enum([
  'cte',
  'table',
  'view',
  'materialized_view',
  'foreign_table',
  'partitioned_table',
]);

const BASE_TYPE =
  "The type of the column's values: for a domain, the type it is over (a domain over a domain followed to the end), else type itself. Monitoring, discovery, mappings and exports judge the column by it";

const reference = z.object({ schema: z.string(), table: z.string(), column: z.string() });

const sourceColumn = z.object({
  name: z.string(),
  type: z.string().describe('PostgreSQL type, e.g. text, numeric(12,2), timestamp with time zone'),
  base_type: z.string().describe(BASE_TYPE),
  nullable: z.boolean(),
  default: z
    .string()
    .nullable()
    .describe(
      'The expression an insert without this column fills in; null for none and for a generated column',
    ),
  generated: z
    .string()
    .nullable()
    .describe(
      "A generated column's expression (PostgreSQL GENERATED ALWAYS AS … STORED, MySQL/MariaDB VIRTUAL or STORED/PERSISTENT): computed from the row, never inserted; null for other columns",
    ),
  description: z.string().nullable(),
  position: z.number().int(),
  is_primary_key: z.boolean(),
  references: reference.nullable().describe('The column a foreign key of this column points at'),
});

const sourceTable = z.object({
  name: z.string(),
  schema: z.string().nullable().describe('null for a CTE'),
  qualified_name: z.string().describe('schema.table, or the CTE name; what sample-values takes'),
  kind: relationKind,
  description: z.string().nullable(),
  estimated_rows: z.number().nullable(),
  primary_key: z.array(z.string()),
  foreign_keys: z.array(
    z.object({
      name: z.string(),
      columns: z.array(z.string()),
      references: z.object({ schema: z.string(), table: z.string(), columns: z.array(z.string()) }),
    }),
  ),
  columns: z.array(sourceColumn),
  sql: z.string().optional().describe('The query of a CTE'),
  error: z.string().optional().describe('Why the columns of a CTE could not be described'),
});

const flatColumn = z.object({
  table: z.string().describe('Qualified table name (or CTE name)'),
  schema: z.string().nullable(),
  table_kind: relationKind,
  column: z.string(),
  type: z.string(),
  base_type: z.string().describe(BASE_TYPE),
  nullable: z.boolean(),
  description: z.string().nullable(),
  position: z.number().int(),
  is_primary_key: z.boolean(),
  references: reference.nullable(),
});

export const unifiedSchemaInput = z.object({
  schema_type: z
    .enum(['source', 'target'])
    .default('source')
    .describe("Which connection of the current workspace to describe (default 'source')"),
  flatten: z.stringbool().default(false).describe('One row per column instead of tables with columns'),
});

const schemaHead = {
  workspace_name: z.string(),
  schema_type: z.enum(['source', 'target']),
  database: z.string(),
  schemas: z.array(z.string()),
  missing_schemas: z
    .array(z.string())
    .describe(
      'Schemas of the connection config the database does not have (MySQL: databases without tables); names are case-sensitive',
    ),
  table_count: z.number().int(),
  column_count: z.number().int(),
};

export const unifiedSchemaOutput = z.object({
  ...schemaHead,
  flatten: z.boolean(),
  tables: z.array(sourceTable).optional().describe('CTEs first, then tables and views (flatten=false)'),
  columns: z.array(flatColumn).optional().describe('One row per column, CTEs first (flatten=true)'),
});

export const sourceSchemaOutput = z.object({
  ...schemaHead,
  selected_tables: z.array(z.string()).nullable().describe('The tables of the source config; null = all'),
  tables: z.array(sourceTable),
});

export const sampleValuesInput = z.object({
  table_name: z
    .string()
    .min(1)
    .max(127)
    .describe('schema.table, a table of the configured schemas, or a CTE name'),
  column_name: z.string().min(1).max(63),
  limit: z.coerce
    .number()
    .int()
    .min(1)
    .max(SAMPLE_LIMIT_MAX)
    .default(SAMPLE_LIMIT_DEFAULT)
    .describe(`How many distinct values, at most ${SAMPLE_LIMIT_MAX}`),
});

export const sampleValuesOutput = z.object({
  table_name: z.string(),
  column_name: z.string(),
  limit: z.number().int(),
  masked: z
    .boolean()
    .describe('True when the column is personal and mask_pii_in_samples is on: values show their shape only'),
  value_max_length: z
    .number()
    .int()
    .describe(
      `Longest value shown, in characters (${SAMPLE_VALUE_MAX_LENGTH}): a longer one (bytes as \\x hex included) is cut to this many characters followed by '${SAMPLE_VALUE_CUT}', so any value longer than this is a cut one`,
    ),
  truncated_values: z
    .number()
    .int()
    .describe(
      'How many of the values were cut at value_max_length; each is still counted as its whole value',
    ),
  values: z
    .array(z.object({ value: z.string(), count: z.number().int() }))
    .describe('Most frequent first; distinct whole values, each shown cut at value_max_length'),
});

export const executeQueryInput = z.object({
  sql: z.string().min(1).max(100_000).describe('One SELECT / WITH / VALUES / EXPLAIN statement'),
  limit: z
    .number()
    .int()
    .min(1)
    .optional()
    .describe("Row cap; default and maximum: the workspace's query_row_limit (at most WAREHOUSE_ROW_CAP)"),
});

export const executeQueryOutput = z.object({
  columns: z.array(z.object({ name: z.string(), type: z.string() })),
  rows: z.array(z.record(z.string(), z.unknown())),
  row_count: z.number().int(),
  truncated: z.boolean().describe('More rows existed than the cap'),
  limit: z.number().int(),
  duration_ms: z.number(),
});
