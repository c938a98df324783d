import { z } from 'zod';
import { jsonObject, timestamp } from '../../trpc/common-schemas.ts';
import { JOIN_TYPES } from '../../transform/mapping.ts';
import { CLEANING_KINDS } from '../discovery/cleaning-kinds.ts';

const tableName = z.string().trim().min(1).max(63).describe('Table of the target schema');
const fieldName = z.string().trim().min(1).max(63);
/**
 * `table.column` or `schema.table.column`; `table.*` for a wildcard. Names are written as the
 * catalog spells them, spaces included (`Sales Data.Customer Orders.Amount $`, as discovery writes
 * them); a name holding a dot cannot be told apart from two names.
 */
const sourceField = z
  .string()
  .trim()
  .min(3)
  .max(255)
  .regex(/^[^.]+(\.[^.]+){1,2}$/, 'must be "table.column" or "schema.table.column"');
const sourceTable = z
  .string()
  .trim()
  .min(1)
  .max(127)
  .regex(/^[^.]+(\.[^.]+)?$/, 'must be "table" or "schema.table"');
const expression = z.string().trim().min(1).max(20_000);
const sampleLimit = z.coerce
  .number()
  .int()
  .min(1)
  .max(1000)
  .default(20)
  .describe('Source rows to run it on (at most 1000)');

export const tableNameParam = z.object({ table_name: tableName });

// ---- the mapping document ----

const tableRelation = z.object({
  relationship: z.enum(['primary', 'join']),
  join_type: z
    .enum(JOIN_TYPES as [string, ...string[]])
    .nullable()
    .optional(),
  join_on: z.string().nullable().optional(),
  accept_fan_out: z.boolean().nullable().optional(),
});

/** Why discovery proposed a source (the stream's suggestion events carry the same object). */
/** A piece of evidence that spoke for a suggestion. */
export const suggestionSignal = z.enum(['name', 'type', 'pattern', 'overlap', 'model']);

export const suggestionEvidence = z
  .object({
    name: z.number().describe('How much the names mean the same, 0–1'),
    type: z.number().describe('How well the source type can feed the target type, values considered, 0–1'),
    pattern: z
      .number()
      .describe(
        'Share of sampled values with the pattern the field expects; negative when they contradict it',
      ),
    value_pattern: z
      .string()
      .nullable()
      .describe('The value pattern that spoke (email, phone, country_code, timestamp…); null when none did'),
    overlap: z
      .number()
      .nullable()
      .describe(
        "Share (0–1) of the source column's sampled distinct non-blank values that the target column already holds in the target table (trimmed, case-insensitive, over the table's first sample_size rows); null when not measured: no target warehouse, the table or column missing there, a table without rows, or a source column without samples",
      ),
    llm: z.boolean().describe('Whether the LLM named this very source for this field'),
    matched_by: z.enum(['offline', 'openai']),
    signals: z.array(suggestionSignal).describe('The pieces of evidence that spoke for the suggestion'),
  })
  .describe('Why discovery proposed this source; absent for a connection a person made');

const connectionOutput = z.object({
  source_field: z.string(),
  target_field: z.string(),
  status: z.enum(['suggested', 'confirmed']),
  confidence: z.number().nullable(),
  evidence: suggestionEvidence.nullable().optional(),
  stale: z.string().nullable().optional().describe('Why the connection no longer applies (schema changed)'),
});

const transformationOutput = z.object({
  expression: z.string(),
  description: z.string().nullable(),
  stale: z.string().nullable().optional(),
  proposed: z
    .object({
      kind: z.enum(CLEANING_KINDS),
      source_field: z.string(),
      share: z.number().describe('Share of the sampled non-blank source values the expression converts'),
      sampled: z.number().int().describe('Non-blank source values in the sample the share was measured on'),
    })
    .nullable()
    .optional()
    .describe(
      'Set on a cleaning discovery proposed (refreshed by each discovery); absent once a person wrote or accepted it',
    ),
});

const ambiguityOutput = z.object({
  target_field: z.string(),
  candidates: z.array(
    z.object({
      source_field: z.string(),
      confidence: z.number().nullable(),
      reason: z.string().nullable().optional(),
      evidence: suggestionEvidence.nullable().optional(),
    }),
  ),
  reason: z.string().nullable().optional(),
});

const runOutput = z.object({
  run_id: z.string(),
  status: z.enum(['queued', 'running', 'succeeded', 'failed', 'cancelled']),
  progress: jsonObject,
  result: jsonObject.nullable(),
  error: z.string().nullable(),
  retry_count: z.number().int(),
  created_at: timestamp,
  started_at: timestamp.nullable(),
  finished_at: timestamp.nullable(),
  duration_ms: z.number().nullable(),
});

export const mappingOutput = z.object({
  table_name: z.string(),
  tables: z.record(z.string(), tableRelation),
  connections: z.array(connectionOutput),
  transformations: z.record(z.string(), transformationOutput),
  ambiguities: z.array(ambiguityOutput),
  version: z.number().int().describe('0 for a table of the schema that has no mapping yet'),
  committed_version: z.number().int().nullable(),
  decisions: z
    .array(
      z.object({
        target_field: z.string(),
        source_field: z.string().nullable(),
        cleaning: z.enum(['refused']).nullable().optional(),
      }),
    )
    .describe(
      'What a person refused and discovery will not propose again: a removed connection, source_field null for a field resolved to "no source", or cleaning "refused" for a removed cleaning proposal',
    ),
  has_uncommitted_changes: z
    .boolean()
    .describe('The mapping differs from the one its newest commit recorded (or was never committed)'),
  materialization: z
    .object({
      materialized_version: z.number().int().nullable(),
      materialized_at: timestamp.nullable(),
      rows: z.number().nullable(),
      last_run: runOutput.nullable(),
    })
    .describe('The newest materialization run of the table'),
  created_at: timestamp.nullable(),
  updated_at: timestamp.nullable(),
});

export const listInput = z.object({
  include_workspace: z.stringbool().default(false).describe('Add the workspace summary'),
});
export const listOutput = z.object({
  workspace_name: z.string(),
  mappings: z.array(mappingOutput),
  workspace: z
    .object({
      name: z.string(),
      description: z.string(),
      source_configured: z.boolean(),
      target_configured: z.boolean(),
      schema_name: z.string().nullable(),
      schema_tables: z.array(z.string()),
      unmapped_tables: z.array(z.string()),
    })
    .optional(),
});

// ---- tables ----

export const tablesOutput = z.object({
  table_name: z.string(),
  primary_table: z.string().nullable(),
  tables: z.array(
    z.object({
      source_table: z.string(),
      relationship: z.enum(['primary', 'join']),
      join_type: z.string().nullable(),
      join_on: z.string().nullable(),
      accept_fan_out: z.boolean(),
    }),
  ),
});

export const tableInput = tableNameParam.extend({
  source_table: sourceTable.describe('Source relation, "schema.table" or "table"'),
  relationship: z.enum(['primary', 'join']),
  join_type: z
    .enum(JOIN_TYPES as [string, ...string[]])
    .optional()
    .describe('For a join; default left'),
  join_on: expression
    .optional()
    .describe('For a join: a boolean SQL expression, e.g. customers.id = orders.customer_id'),
  accept_fan_out: z
    .boolean()
    .optional()
    .describe(
      'For a join: accept that it gives some primary rows more than one row (validate and commit refuse such a join otherwise)',
    ),
});

const problem = z.object({ path: z.array(z.union([z.string(), z.number()])), message: z.string() });

export const validateOutput = z.object({
  table_name: z.string(),
  valid: z.boolean(),
  problems: z.array(problem),
  fan_out: z
    .array(
      z.object({
        source_table: z.string(),
        join_on: z.string(),
        primary_rows: z.number().int().nullable(),
        joined_rows: z.number().int().nullable(),
        multiplied_rows: z.number().int().nullable(),
        max_rows_per_primary_row: z.number().int().nullable(),
        measured: z.boolean(),
        accepted: z.boolean(),
      }),
    )
    .describe(
      'Rows per primary row of each join, counted exactly on the source (LEFT joined, in order); measured false when the count ran past the statement timeout',
    ),
});

export const sourceTableParam = tableNameParam.extend({ source_table: sourceTable });
export const removeTableOutput = mappingOutput.extend({ removed_connections: z.array(connectionOutput) });

// ---- wildcard ----

export const wildcardOutput = z.object({
  table_name: z.string(),
  wildcard_tables: z.array(z.string()),
  fields: z.array(
    z.object({
      target_field: z.string(),
      source_field: z.string().nullable(),
      expression: z.string().nullable(),
      origin: z.enum(['transformation', 'connection', 'wildcard', 'unmapped']),
      status: z.enum(['suggested', 'confirmed']).nullable(),
    }),
  ),
});

// ---- connections and transformations ----

export const connectionInput = tableNameParam.extend({
  connection: z.object({
    source_field: sourceField.describe(
      '"table.column" ("schema.table.column"); "table.*" with target_field "*" maps by name',
    ),
    target_field: z.union([fieldName, z.literal('*')]),
    status: z.enum(['suggested', 'confirmed']).default('confirmed'),
    confidence: z.number().min(0).max(1).nullable().optional(),
  }),
});

export const deleteConnectionInput = tableNameParam.extend({
  source_field: sourceField,
  target_field: z.union([fieldName, z.literal('*')]),
});

export const transformationInput = tableNameParam.extend({
  transformation: z.object({
    target_field: fieldName,
    expression: expression.describe('One SQL expression over the tables of the mapping'),
    description: z.string().max(2000).nullable().optional(),
  }),
});

export const fieldParam = tableNameParam.extend({ target_field: fieldName });

export const resolveInput = z.object({
  resolve_input: z.object({
    table_name: tableName,
    target_field: fieldName,
    source_field: sourceField.nullable().describe('The chosen candidate, or null for none'),
  }),
});

// ---- generated code ----

const generatedColumn = z.object({
  name: z.string(),
  type: z.string(),
  sql: z.string(),
  source: z.enum(['expression', 'column', 'null']),
});

export const transformCodeOutput = z.object({
  table_name: z.string(),
  version: z.number().int(),
  committed_version: z.number().int().nullable(),
  sql: z.string(),
  columns: z.array(generatedColumn),
  committed_sql: z.string().nullable(),
  matches_committed: z.boolean(),
});

export const batchInput = z.object({
  table_names: z
    .array(tableName)
    .max(500)
    .optional()
    .describe('Default: every mapped table of the workspace'),
});
export const batchOutput = z.object({
  results: z.array(
    z.object({
      table_name: z.string(),
      ok: z.boolean(),
      sql: z.string().nullable(),
      columns: z.array(generatedColumn),
      error: z.string().nullable(),
      issues: z.array(problem),
    }),
  ),
});

export const fieldTransformOutput = z.object({
  table_name: z.string(),
  target_field: z.string(),
  type: z.string(),
  source: z.enum(['expression', 'column', 'null']),
  source_field: z.string().nullable(),
  transformation: transformationOutput.nullable(),
  sql: z.string().describe('The column expression as the generated SELECT has it, cast to the target type'),
});

export const generateCodeOutput = z.object({
  table_name: z.string(),
  language: z.literal('python'),
  filename: z.string(),
  code: z.string(),
  version: z.number().int(),
  usage: z.string(),
  inputs: z
    .array(
      z.object({
        source_table: z.string(),
        file: z.string().describe('The CSV file the script reads the table from, in --input-dir'),
        query: z
          .string()
          .describe(
            "The SELECT to export the table with (e.g. psql: \\copy (query) TO 'file' WITH (FORMAT csv, HEADER, NULL '\\N')): the columns the script reads, money as numeric",
          ),
      }),
    )
    .describe('One CSV export per source table of the mapping'),
});

// ---- preview, diff, commit, materialize ----

export const previewInput = tableNameParam.extend({
  target_field: fieldName.optional().describe('One field; default the whole table'),
  expression: expression.optional().describe('An unsaved expression for target_field, to try it out'),
  limit: sampleLimit,
});
export const previewOutput = z.object({
  table_name: z.string(),
  target_field: z.string().nullable(),
  sql: z.string(),
  columns: z.array(z.object({ name: z.string(), type: z.string() })),
  rows: z.array(jsonObject),
  masked_columns: z
    .array(z.string())
    .describe('Personal columns whose values show their shape only (mask_pii_in_samples)'),
  row_count: z.number().int(),
  truncated: z.boolean(),
  duration_ms: z.number(),
});

export const diffInput = tableNameParam.extend({ limit: sampleLimit });
export const diffOutput = z.object({
  table_name: z.string(),
  committed_version: z.number().int().nullable(),
  version: z.number().int(),
  has_changes: z.boolean(),
  sql_diff: z.string().describe('Unified diff of the committed SQL and the SQL a commit would record'),
  data_diff: z.object({
    sample_size: z.number().int(),
    key_columns: z.array(z.string()).describe('How rows are matched: the primary key, or whole rows'),
    rows_before: z
      .number()
      .nullable()
      .describe('Rows the committed SQL produces (null before the first commit)'),
    rows_after: z.number().nullable(),
    added_rows: z.number().int(),
    removed_rows: z.number().int(),
    changed_rows: z.number().int(),
    changed_columns: z.array(z.string()),
    added_columns: z.array(z.string()),
    removed_columns: z.array(z.string()),
    changes: z.array(
      z.object({
        change: z.enum(['added', 'removed', 'changed']),
        key: jsonObject,
        before: jsonObject.nullable(),
        after: jsonObject.nullable(),
        columns: z.array(z.string()),
      }),
    ),
  }),
});

export const commitInput = tableNameParam.extend({
  message: z.string().trim().min(1).max(2000).describe('Why: the commit message'),
});
export const commitOutput = z.object({
  table_name: z.string(),
  version: z.number().int(),
  committed_version: z.number().int(),
  commit_id: z.string(),
  sql: z.string(),
  author: z.string().nullable(),
  message: z.string(),
  committed_at: timestamp,
  workspace_commit_id: z.string(),
  vcs: z.object({
    pushed: z.boolean(),
    reason: z.string().nullable(),
    message: z.string().nullable(),
    commit: z.string().nullable(),
  }),
});

export const materializeOutput = z.object({
  run_id: z.string(),
  status: z.enum(['queued', 'running', 'succeeded', 'failed', 'cancelled']),
  table_name: z.string(),
  version: z.number().int(),
  created: z.boolean().describe('false: a run of this table was already under way; that run is returned'),
});

export const clearAllInput = z.object({
  confirm_workspace_name: z
    .string()
    .max(100)
    .optional()
    .describe('The name of the current workspace, typed again, to confirm'),
});
export const clearAllOutput = z.object({
  success: z.literal(true),
  workspace_name: z.string(),
  deleted_mappings: z.number().int(),
  deleted_commits: z.number().int(),
});
