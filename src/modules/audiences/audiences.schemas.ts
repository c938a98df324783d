import { z } from 'zod';
import { jsonObject, MAX_PAGE_SIZE, pageInput, timestamp, uuidParam } from '../../trpc/common-schemas.ts';
import { isCalendarDate, RULE_OPS } from './audiences-rules.ts';
import {
  DESTINATION_TYPES,
  EXPORT_SCHEDULES,
  EXPORT_STATUSES,
  MATERIALIZATION_STATUSES,
} from './audiences.entity.ts';

const columnName = z.string().trim().min(1).max(63);
const columnList = z.array(columnName).max(100);

// ---- audiences ----

const definitionInput = z
  .object({
    type: z.enum(['rules', 'sql']),
    rules: jsonObject
      .optional()
      .describe(
        `Rule tree (type rules): { "all": [...] } or { "any": [...] } of conditions { field, op, value } and nested groups; ops: ${RULE_OPS.join(', ')}. "within last days" takes a number of days; between takes [low, high]; in / not in take a list.`,
      ),
    sql: z.string().max(100_000).optional().describe('One read-only SELECT (type sql)'),
  })
  .describe('What selects the members: a rule tree compiled to parameterized SQL, or a SELECT');

export const audienceIdInput = z.object({ audience_id: uuidParam('Audience') });

export const createAudienceInput = z.object({
  name: z.string().trim().min(1).max(200),
  description: z.string().max(2000).optional(),
  target_table: z
    .string()
    .trim()
    .min(1)
    .max(63)
    .describe('Table of the target schema the audience selects from'),
  definition: definitionInput,
  identifier_columns: columnList
    .optional()
    .describe(
      "Columns identifying a member; default the target table's primary key. A row is a member only if at least one of them holds a value (NULL, empty and whitespace-only are missing); rows sharing all their identifier values are one member",
    ),
  attribute_columns: columnList.optional().describe('Further columns copied into the materialized table'),
});

export const updateAudienceInput = audienceIdInput.extend({
  name: z.string().trim().min(1).max(200).optional(),
  description: z.string().max(2000).optional(),
  target_table: z.string().trim().min(1).max(63).optional(),
  definition: definitionInput.optional(),
  identifier_columns: columnList.optional(),
  attribute_columns: columnList.optional(),
});

const materializedColumn = z.object({ name: z.string(), type: z.string() });

/** Beside every figure of an audience's size, so a size below a plain count of the table explains itself. */
const rowsWithoutIdentifier = z
  .number()
  .int()
  .nullable()
  .describe(
    'Rows that matched the definition at the last materialization but are not members because every identifier column is missing: NULL, empty or whitespace only (a destination could not match or deduplicate them); not counted in the size, previews or exports. Null when not materialized, or materialized before this was counted',
  );

/** Beside every figure of an audience's size, with rows_without_identifier. */
const rowsMerged = z
  .number()
  .int()
  .nullable()
  .describe(
    "Rows that matched with an identifier at the last materialization but share all their identifier values with another such row: each group is one member, the row first in the target table's primary key standing for it (its attributes are the member's); not counted in the size, previews or exports. Null when not materialized, or materialized before this was counted",
  );

export const audienceOutput = z.object({
  id: z.string(),
  name: z.string(),
  description: z.string(),
  target_database: z.string(),
  target_schema: z.string(),
  target_table: z.string(),
  definition: z.object({
    type: z.enum(['rules', 'sql']),
    rules: jsonObject.nullable(),
    sql: z.string().nullable(),
  }),
  identifier_columns: z.array(z.string()),
  attribute_columns: z.array(z.string()),
  definition_version: z.number().int(),
  materialization: z.object({
    status: z.enum(MATERIALIZATION_STATUSES),
    stale: z.boolean().describe('The definition changed since the last successful materialization'),
    materialized_version: z.number().int().nullable(),
    table: z.string().nullable().describe('schema.view that always shows the newest version'),
    versioned_table: z.string().nullable(),
    columns: z.array(materializedColumn),
    row_count: z
      .number()
      .int()
      .nullable()
      .describe('Members: distinct identifier values among the matching rows'),
    rows_without_identifier: rowsWithoutIdentifier,
    rows_merged: rowsMerged,
    materialized_at: timestamp.nullable(),
    duration_ms: z.number().int().nullable(),
    error: z.string().nullable(),
    run_id: z.string().nullable(),
  }),
  created_at: timestamp,
  updated_at: timestamp,
});

export const audienceListInput = z.object({ ...pageInput });
export const audienceListOutput = z.object({
  workspace_name: z.string(),
  target_database: z.string().nullable(),
  target_schema: z.string().nullable(),
  total: z.number().int(),
  audiences: z.array(audienceOutput),
});

export const deleteAudienceOutput = z.object({
  success: z.literal(true),
  message: z.string(),
  dropped: z.array(z.string()).describe('Warehouse relations dropped'),
  warehouse_error: z.string().nullable().describe('Why the warehouse could not be cleaned, if it could not'),
});

const runOutput = z.object({
  run_id: z.string(),
  status: z.string(),
  created: z.boolean().describe('false when a run already under way was returned'),
});

export const materializeOutput = runOutput.extend({ audience_id: z.string() });

export const sizeOutput = z.object({
  audience_id: z.string(),
  row_count: z
    .number()
    .int()
    .nullable()
    .describe('Members: distinct identifier values among the matching rows'),
  rows_without_identifier: rowsWithoutIdentifier,
  rows_merged: rowsMerged,
  materialized: z.boolean(),
  stale: z.boolean(),
  status: z.enum(MATERIALIZATION_STATUSES),
  materialized_at: timestamp.nullable(),
  definition_version: z.number().int(),
  materialized_version: z.number().int().nullable(),
  message: z.string(),
});

const figures = {
  impressions: z.number(),
  clicks: z.number(),
  spend: z.number(),
  conversions: z.number(),
  revenue: z.number(),
  ctr: z.number().nullable().describe('clicks / impressions'),
  cpc: z.number().nullable().describe('spend / clicks'),
  cpa: z.number().nullable().describe('spend / conversions'),
  conversion_rate: z.number().nullable().describe('conversions / clicks'),
  roas: z.number().nullable().describe('revenue / spend'),
  recorded_conversions: z
    .number()
    .describe(
      'Conversion records (deduplicated on external_id) of members of the audience when they were posted',
    ),
  recorded_conversion_value: z.number(),
  unmatched_conversions: z
    .number()
    .describe('Conversion records whose customer_id was no member of the audience when they were posted'),
  unmatched_conversion_value: z.number(),
};

export const dashboardOutput = z.object({
  workspace_name: z.string(),
  audiences: z.array(
    z.object({
      id: z.string(),
      name: z.string(),
      target_table: z.string(),
      definition_type: z.enum(['rules', 'sql']),
      size: z.number().int().nullable(),
      rows_without_identifier: rowsWithoutIdentifier,
      rows_merged: rowsMerged,
      materialization_status: z.enum(MATERIALIZATION_STATUSES),
      stale: z.boolean(),
      materialized_at: timestamp.nullable(),
      freshness_seconds: z.number().int().nullable().describe('Age of the materialization'),
      export_count: z.number().int(),
      active_export_count: z.number().int(),
      last_export_at: timestamp.nullable(),
      performance: z.object(figures),
    }),
  ),
});

// ---- exports ----

const csvDestination = z.object({
  type: z.literal('csv'),
  filename: z
    .string()
    .regex(/^[\w.-]{1,100}$/, 'letters, digits, _ . - only')
    .optional(),
  delimiter: z.enum([',', ';', '\t', '|']).default(','),
  include_header: z.boolean().default(true),
  escape_formulas: z
    .boolean()
    .default(false)
    .describe(
      "For files opened in a spreadsheet: a text cell starting with = + - @ or a tab or carriage return gets a leading ' so it is not run as a formula. Off by default: it changes values (+1555… phone numbers among them) that other systems read as they are",
    ),
});
const postgresDestination = z.object({
  type: z.literal('postgres'),
  host: z.string().min(1).max(255),
  port: z.coerce.number().int().min(1).max(65535).default(5432),
  database: z.string().min(1).max(63),
  user: z.string().min(1).max(63),
  password: z.string().max(1024).optional().describe('Write-only; omit to keep the stored one'),
  ssl: z.boolean().default(false),
  schema: z.string().min(1).max(63).default('public'),
  table: z.string().min(1).max(63),
  mode: z.enum(['replace', 'append']).default('replace'),
});
const webhookDestination = z.object({
  type: z.literal('webhook'),
  url: z
    .string()
    .url()
    .max(2000)
    .refine((u) => /^https?:\/\//i.test(u), 'http(s) URLs only'),
  headers: z.record(z.string(), z.string().max(4000)).optional().describe('Values are stored encrypted'),
  batch_size: z.number().int().min(1).max(10_000).default(500),
  max_retries: z.number().int().min(0).max(10).default(3),
  timeout_ms: z.number().int().min(100).max(120_000).default(10_000),
});
const destinationInput = z.discriminatedUnion('type', [
  csvDestination,
  postgresDestination,
  webhookDestination,
]);
export type DestinationInput = z.infer<typeof destinationInput>;

const fieldMappingInput = z
  .array(z.object({ source: columnName, destination: z.string().trim().min(1).max(63) }))
  .min(1)
  .max(200)
  .describe('Audience column → destination field; default every materialized column under its own name');

export const createExportInput = z.object({
  audience_id: uuidParam('Audience'),
  name: z.string().trim().min(1).max(200).optional(),
  destination: destinationInput,
  field_mapping: fieldMappingInput.optional(),
  schedule: z.enum(EXPORT_SCHEDULES).default('manual'),
  run_now: z.boolean().default(true),
});

const exportIdInput = z.object({ export_id: uuidParam('Export') });
export const updateExportInput = exportIdInput.extend({
  name: z.string().trim().min(1).max(200).optional(),
  destination: destinationInput.optional(),
  field_mapping: fieldMappingInput.optional(),
  schedule: z.enum(EXPORT_SCHEDULES).optional(),
  status: z
    .enum(EXPORT_STATUSES)
    .optional()
    .describe('paused stops scheduled runs and cancels one under way'),
  run: z.boolean().optional().describe('Start a run now (e.g. retry a failed one)'),
});

const runView = z.object({
  run_id: z.string(),
  status: z.string(),
  progress: jsonObject.describe(
    "rows_exported (while the run is under way, rows written so far; once it failed (its worker's death included) or was cancelled, the rows the destination holds from it: 0 for a CSV or PostgreSQL run, whose partial file is removed and transaction rolled back, the acknowledged batches' rows for a webhook), total_rows (the audience's members), rows_without_identifier (left out, see the audience), rows_merged (rows sharing a member's identifier values), percent, source_table (the materialization sent), audience_stale with audience_materialized_at and audience_definition_changed_at (the audience's definition changed since that materialization); scheduled runs that materialized first: materialize_run_id, materialized_because; webhooks: batches_sent (acknowledged; rows_exported counts their rows, also after a failure or pause), delivery_id (the data and its cut: the middle of the idempotency keys <export>:<delivery>:<batch>), resumed_from_batch and resumed_from_run_id (batches an earlier attempt or run of the same delivery had delivered, not sent again), restarted_because (why an earlier delivery was not continued)",
  ),
  error: z.string().nullable(),
  started_at: timestamp.nullable(),
  finished_at: timestamp.nullable(),
});

const exportOutput = z.object({
  id: z.string(),
  audience_id: z.string(),
  name: z.string(),
  destination_type: z.enum(DESTINATION_TYPES),
  destination: jsonObject.describe('Secrets masked'),
  field_mapping: z.array(z.object({ source: z.string(), destination: z.string() })),
  schedule: z.enum(EXPORT_SCHEDULES),
  status: z.enum(EXPORT_STATUSES),
  next_run_at: timestamp.nullable(),
  last_run: runView.nullable(),
  rows_exported: z
    .number()
    .int()
    .nullable()
    .describe(
      "The rows the destination holds from the latest run that delivered any: a successful run's rows, or the rows a webhook's receiver acknowledged to a run that then failed or was paused (resumed batches included). A run that left nothing there leaves it as it was: a failed CSV run (its partial file removed) or PostgreSQL run (its transaction rolled back), a webhook run that failed before any batch was acknowledged. Null until a run delivered",
    ),
  audience_stale: z
    .boolean()
    .describe(
      "The audience's definition changed since it was materialized: a manual run sends the members of the previous definition (a scheduled run materializes first)",
    ),
  audience_materialized_at: timestamp.nullable(),
  audience_definition_changed_at: timestamp
    .nullable()
    .describe('When the definition last changed; null if before this was recorded'),
  file: z
    .object({ size: z.number().int().nullable(), download_url: z.string() })
    .nullable()
    .describe('CSV exports: the file of the last successful run'),
  created_at: timestamp,
  updated_at: timestamp,
});

export const exportWithRunOutput = z.object({ export: exportOutput, run: runOutput.nullable() });
export const exportListOutput = z.object({ audience_id: z.string(), exports: z.array(exportOutput) });

const PREVIEW_LIMIT_DEFAULT = 100;
const PREVIEW_LIMIT_MAX = 1000;
export const previewInput = z.object({
  audience_id: uuidParam('Audience'),
  export_id: uuidParam('Export'),
  limit: z.coerce.number().int().min(1).max(PREVIEW_LIMIT_MAX).default(PREVIEW_LIMIT_DEFAULT),
});
export const previewOutput = z.object({
  audience_id: z.string(),
  export_id: z.string(),
  columns: z.array(z.string()).describe('Destination field names'),
  rows: z.array(jsonObject),
  row_count: z.number().int(),
  total_rows: z.number().int().nullable().describe('Members of the materialized audience'),
  rows_without_identifier: rowsWithoutIdentifier,
  rows_merged: rowsMerged,
});

// ---- performance and conversions ----

const isoDate = z
  .string()
  .regex(/^\d{4}-\d{2}-\d{2}$/, 'an ISO date YYYY-MM-DD')
  .refine(isCalendarDate, 'not a calendar date');
const currency = z
  .string()
  .regex(/^[A-Z]{3}$/, 'an ISO-4217 code such as USD')
  .default('USD');
const amount = z.number().finite().min(0).max(1e14);
const count = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);

export const metricInput = z.object({
  audience_segment_id: uuidParam('Audience'),
  ad_platform: z.string().trim().min(1).max(64),
  campaign_id: z.string().trim().min(1).max(255),
  date: isoDate,
  impressions: count,
  clicks: count,
  spend: amount,
  conversions: amount.default(0),
  revenue: amount.default(0),
  currency,
});

const metricOutput = z.object({
  id: z.string(),
  audience_segment_id: z.string(),
  ad_platform: z.string(),
  campaign_id: z.string(),
  date: z.string(),
  impressions: z.number(),
  clicks: z.number(),
  spend: z.number(),
  conversions: z.number(),
  revenue: z.number(),
  currency: z.string(),
  created_at: timestamp,
  updated_at: timestamp,
});
export const metricWriteOutput = z.object({
  metric: metricOutput,
  created: z
    .boolean()
    .describe('false when an existing record (segment, platform, campaign, date) was updated'),
});

export const metricsQuery = z.object({
  audience_segment_id: z.string().max(64).optional(),
  ad_platform: z.string().max(64).optional(),
  campaign_id: z.string().max(255).optional(),
  start_date: isoDate.optional(),
  end_date: isoDate.optional(),
  limit: pageInput.limit.describe(`Page size, at most ${MAX_PAGE_SIZE}`),
  offset: pageInput.offset,
});
export const metricsListOutput = z.object({ total: z.number().int(), metrics: z.array(metricOutput) });

export const conversionInput = z.object({
  audience_id: uuidParam('Audience'),
  customer_id: z
    .string()
    .trim()
    .min(1)
    .max(255)
    .describe(
      "Identifier of the converting member: a value of one of the audience's identifier columns in its current materialization",
    ),
  event: z.string().trim().min(1).max(100).default('conversion'),
  value: amount.default(0),
  currency,
  occurred_at: z.iso.datetime({ offset: true }).describe('ISO-8601 date-time'),
  external_id: z.string().trim().min(1).max(255).describe('Deduplication key (e.g. the order id)'),
  ad_platform: z.string().trim().min(1).max(64).optional(),
  campaign_id: z.string().trim().min(1).max(255).optional(),
});
const conversionOutput = z.object({
  id: z.string(),
  audience_id: z.string(),
  customer_id: z.string(),
  event: z.string(),
  value: z.number(),
  currency: z.string(),
  occurred_at: timestamp,
  external_id: z.string(),
  ad_platform: z.string().nullable(),
  campaign_id: z.string().nullable(),
  member: z
    .boolean()
    .nullable()
    .describe(
      'customer_id was a member of the audience when posted; false: counted as unmatched, not among its conversions; null: posted before this was checked',
    ),
  created_at: timestamp,
});
export const conversionWriteOutput = z.object({
  conversion: conversionOutput,
  created: z.boolean().describe('false when a conversion with this external_id was already recorded'),
  warning: z
    .string()
    .nullable()
    .describe("Why the conversion does not count among the audience's (its customer_id is no member)"),
});

export const summaryOutput = z.object({
  audience_id: z.string(),
  currencies: z.array(z.string()),
  overall: z.object(figures),
  by_platform: z.array(z.object({ ad_platform: z.string().nullable(), ...figures })),
  by_day: z.array(z.object({ date: z.string(), ...figures })),
});
