import { z } from 'zod';
import { jsonObject, timestamp } from '../../trpc/common-schemas.ts';

const tableName = z.string().trim().min(1).max(63);

const fileSummary = z.object({ path: z.string(), size: z.number().int() });
const modelSummary = z.object({ table_name: z.string(), committed_version: z.number().int() });

export const generateInput = z.object({
  table_names: z
    .array(tableName)
    .min(1, 'give at least one table, or leave table_names out for every committed one')
    .max(500)
    .optional()
    .describe('Models to include; default every table with a committed transformation'),
});

export const generateOutput = z.object({
  workspace_name: z.string(),
  generated_at: timestamp,
  fingerprint: z.string(),
  files: z.array(fileSummary),
  models: z.array(modelSummary),
  skipped: z.array(z.object({ table_name: z.string(), reason: z.string() })),
});

export const statusOutput = z.object({
  workspace_name: z.string(),
  generated: z.boolean(),
  generated_at: timestamp.nullable(),
  generated_by: z.string().nullable(),
  fingerprint: z.string().nullable(),
  in_sync: z.boolean().nullable().describe('null when no project was generated'),
  files: z.array(fileSummary),
  models: z.array(modelSummary),
});

export const modelInput = z.object({ table_name: tableName });
export const modelOutput = z.object({
  table_name: z.string(),
  path: z.string(),
  sql: z.string(),
  committed_version: z.number().int(),
  generated_at: timestamp,
});

export const driftOutput = z.object({
  workspace_name: z.string(),
  generated: z.boolean(),
  in_sync: z.boolean(),
  project_fingerprint: z.string().nullable(),
  current_fingerprint: z.string().nullable(),
  changes: z.array(
    z.object({
      table_name: z.string(),
      reasons: z.array(
        z.enum([
          'mapping_committed',
          'schema_changed',
          'table_added',
          'table_removed',
          'uncommitted_changes',
        ]),
      ),
      project_version: z.number().int().nullable(),
      committed_version: z.number().int().nullable(),
    }),
  ),
});

export const testModelInput = z.object({
  table_name: tableName,
  sample_size: z.coerce
    .number()
    .int()
    .min(1)
    .max(10_000)
    .default(100)
    .describe('Model rows to test (at most 10000)'),
});

export const testModelOutput = z.object({
  table_name: z.string(),
  sample_size: z.number().int(),
  rows_tested: z.number().int(),
  passed: z.number().int(),
  failed: z.number().int(),
  errors: z.number().int(),
  tests: z.array(
    z.object({
      name: z.string(),
      column: z.string(),
      test: z.string(),
      status: z.enum(['pass', 'fail', 'error']),
      failures: z.number().int(),
      failing_rows: z.array(jsonObject),
      message: z.string().nullable(),
    }),
  ),
});

export const deleteOutput = z.object({
  success: z.literal(true),
  message: z.string(),
  deleted_files: z.number().int(),
});
