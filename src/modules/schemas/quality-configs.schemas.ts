import { z } from 'zod';
import {
  columnMonitoringConfigSchema,
  columnTestConfigSchema,
  tableMonitoringConfigSchema,
} from '../../quality/rules.ts';
import { timestamp } from '../../trpc/common-schemas.ts';

/*
 * Column tests, column monitoring and table monitoring configurations. The config shapes are the
 * ones the quality runner (src/quality/rules.ts) evaluates, so what is stored here runs as is.
 */

const name = z.string().min(1).max(63);
const schemaType = z
  .enum(['target', 'source'])
  .default('target')
  .describe(
    "Which schema the table belongs to: 'target' (schema.json, default) or 'source' (the source database)",
  );

export const columnParams = z.object({ table_name: name, column_name: name });
export const columnMonitoringParams = columnParams.extend({ schema_type: schemaType });
export const tableMonitoringParams = z.object({ table_name: name, schema_type: schemaType });

const TEST_KEYS = ['not_null', 'unique', 'accepted_values', 'relationships', 'range', 'regex'] as const;

export const columnTestInput = columnParams.extend({
  config: columnTestConfigSchema
    .strict()
    .refine((c) => TEST_KEYS.some((k) => c[k] !== undefined && c[k] !== false), {
      message: `Give at least one test: ${TEST_KEYS.join(', ')} (DELETE removes the config)`,
    })
    .describe(
      'dbt-style column tests: not_null, unique, accepted_values [..], relationships { to, field }, range { min, max }, regex, severity',
    ),
});

export const columnMonitoringInput = columnMonitoringParams.extend({
  config: columnMonitoringConfigSchema
    .strict()
    .refine((c) => c.null_rate || c.distinct || c.range, {
      message: 'Give at least one threshold: null_rate, distinct, range (DELETE removes the config)',
    })
    .describe(
      'Thresholds: null_rate { max }, distinct { min, max }, range { min, max }; each with a severity',
    ),
});

export const tableMonitoringInput = tableMonitoringParams.extend({
  config: tableMonitoringConfigSchema
    .strict()
    .refine((c) => c.freshness || c.volume, {
      message: 'Give at least one threshold: freshness, volume (DELETE removes the config)',
    })
    .describe(
      'Thresholds: freshness { max_age_seconds, column }, volume { min_rows, max_rows, max_change_ratio }; each with a severity',
    ),
});

const head = {
  workspace_name: z.string(),
  schema_type: z.enum(['target', 'source']),
  table_name: z.string(),
  configured: z.boolean().describe('False when the table or column has no such config'),
};

export const columnTestOutput = z.object({
  ...head,
  column_name: z.string(),
  config: columnTestConfigSchema.nullable(),
  implied: z
    .array(z.enum(['not_null', 'unique']))
    .describe(
      'Tests the column has from schema.json itself, whatever config says: not_null in the primary key or with nullable: false, unique as a one-column key. Monitoring runs them and the transformation project writes them, merged with config',
    ),
  problems: z
    .array(z.string())
    .describe(
      "Why a stored test does not apply to the column's type (saved before such tests were refused): it still runs, and its run reports the failure",
    ),
});

export const columnMonitoringOutput = z.object({
  ...head,
  column_name: z.string(),
  config: columnMonitoringConfigSchema.nullable(),
  updated_at: timestamp.nullable(),
});

export const tableMonitoringOutput = z.object({
  ...head,
  config: tableMonitoringConfigSchema.nullable(),
  updated_at: timestamp.nullable(),
});

const entry = {
  schema_type: z.enum(['target', 'source']),
  table_name: z.string(),
  orphaned: z
    .boolean()
    .describe('The table or column is no longer in the target schema; the config is kept, not run'),
};

export const qualityConfigsSummaryOutput = z.object({
  workspace_name: z.string(),
  totals: z.object({
    column_tests: z.number().int(),
    column_monitoring: z.number().int(),
    table_monitoring: z.number().int(),
    tables_covered: z.number().int(),
    orphaned: z.number().int(),
  }),
  tests_by_kind: z.record(z.string(), z.number().int()).describe('How many columns have each test'),
  column_tests: z.array(z.object({ ...entry, column_name: z.string(), config: columnTestConfigSchema })),
  column_monitoring: z.array(
    z.object({ ...entry, column_name: z.string(), config: columnMonitoringConfigSchema }),
  ),
  table_monitoring: z.array(z.object({ ...entry, config: tableMonitoringConfigSchema })),
});
