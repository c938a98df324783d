import { z } from 'zod';
import { timestamp } from '../../trpc/common-schemas.ts';

const scalar = z.union([z.number(), z.string()]).nullable();

const columnMetricsView = z.object({
  name: z.string(),
  type: z.string(),
  null_count: z.number().int(),
  null_rate: z.number().nullable().describe('null_count / row_count; null for an empty table'),
  distinct_count: z.number().int().nullable(),
  distinct_exact: z.boolean().describe('false: estimated (large table) from pg_stats or a sample'),
  distinct_method: z.enum(['exact', 'pg_stats', 'sample']).nullable(),
  min: scalar.describe('Ordered types only; dates and timestamps as ISO-8601'),
  max: scalar,
});

const tableMetricsView = z.object({
  table: z.string().describe('schema.table'),
  row_count: z.number().int(),
  columns: z.array(columnMetricsView),
  freshness: z
    .object({ column: z.string(), max_timestamp: z.string().nullable(), age_seconds: z.number().nullable() })
    .nullable()
    .describe("From the table's timestamp column (configured, else detected)"),
  last_change: z
    .object({
      at: z.string().nullable(),
      total_modifications: z.number().nullable(),
      modifications_since_analyze: z.number().nullable(),
      last_analyzed_at: z.string().nullable(),
    })
    .nullable(),
  measured_at: timestamp,
  duration_ms: z.number(),
  previous: z
    .object({ row_count: z.number().int(), measured_at: timestamp })
    .nullable()
    .describe('The measurement before this one (trend)'),
});

export const metricsOutput = z.object({
  workspace_name: z.string(),
  data_source: z.string().describe('target, source or connection:<name>'),
  database: z.string(),
  schemas: z.array(z.string()),
  measured_at: timestamp,
  tables: z.array(tableMetricsView),
  missing_tables: z.array(z.string()).describe('Tables of schema.json not found in the warehouse'),
  errors: z.array(z.object({ table: z.string(), message: z.string() })),
  truncated: z.boolean().describe('More tables exist than one request measures'),
});

export const workspaceMetricsInput = z.object({
  first_table_only: z
    .stringbool()
    .default(false)
    .describe('Measure only the first table of schema.json (a quick answer)'),
});

export const datasourceMetricsInput = z.object({
  config_name: z
    .string()
    .min(1)
    .max(63)
    .describe("'source', 'target', or the name of a reverse-ETL connection of the workspace"),
});

export const identityGraphInput = z.object({
  database: z
    .string()
    .min(1)
    .max(63)
    .optional()
    .describe("The target database's name (the graph lives there); another name answers 404"),
});

const runSummary = z.object({
  run_id: z.number().int(),
  started_at: timestamp,
  finished_at: timestamp,
  identifiers: z.number().int(),
  clusters: z.number().int(),
  merged_identifiers: z.number().int(),
  largest_cluster: z.number().int(),
  oversized_components: z.number().int(),
  iterations: z.number().int(),
  max_degree: z.number().int(),
  max_cluster_size: z.number().int(),
});

const buildView = z
  .object({
    run_id: z.string().nullable(),
    status: z.string().nullable().describe('queued, running, succeeded, failed, cancelled'),
    error: z.string().nullable(),
    result: z.record(z.string(), z.unknown()).nullable(),
  })
  .nullable();

export const identityGraphOutput = z.object({
  workspace_name: z.string(),
  database: z.string(),
  schema: z.string(),
  schema_created: z.boolean().describe('create-schema was called for this workspace'),
  built: z.boolean(),
  message: z.string(),
  last_built_at: timestamp.nullable(),
  identifiers: z.number().int(),
  identifiers_by_type: z.record(z.string(), z.number().int()),
  edges: z.number().int(),
  ignored_edges: z.number().int().describe('Edges of over-connected identifiers, not used for merging'),
  flagged_identifiers: z.number().int(),
  identifiers_near_max_degree: z
    .number()
    .int()
    .describe(
      'Unflagged identifiers with near_max_degree_from or more neighbours: they still link their records (health check degree_near_limit)',
    ),
  near_max_degree_from: z
    .number()
    .int()
    .nullable()
    .describe("80% of the last build's max_degree, rounded up (null before a build)"),
  clusters: z.number().int(),
  singletons: z.number().int(),
  largest_cluster: z.object({ cluster_id: z.number().int(), size: z.number().int() }).nullable(),
  cluster_size_distribution: z.record(z.string(), z.number().int()),
  largest_clusters: z.array(
    z.object({
      cluster_id: z.number().int(),
      size: z.number().int(),
      records: z.number().int(),
      identifiers: z.record(z.string(), z.array(z.string())),
    }),
  ),
  recent_runs: z.array(runSummary),
  unified_profiles: z
    .object({
      table: z.string(),
      profiles: z.number().int(),
      records_without_profile: z
        .number()
        .int()
        .describe(
          'Records of the graph in no profile: every identifier they carry is flagged by the runaway-merge guards',
        ),
      records_without_profile_by_source: z.record(z.string(), z.number().int()),
    })
    .nullable()
    .describe('The unified profiles as their last build recorded them (null before one)'),
  last_build: buildView,
});

export const createIdentitySchemaOutput = z.object({
  workspace_name: z.string(),
  database: z.string(),
  schema: z.string(),
  created: z.boolean().describe('false when the tables already existed (idempotent)'),
  tables: z.array(z.string()),
  view: z.string(),
  build: z
    .object({ run_id: z.string(), status: z.string(), created: z.boolean() })
    .nullable()
    .describe('The resolution run queued to build the graph (null when the feature is off)'),
  message: z.string(),
});
