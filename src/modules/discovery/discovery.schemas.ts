import { z } from 'zod';
import { timestamp } from '../../trpc/common-schemas.ts';
import { LLM_MODES } from '../../llm/provider.ts';
import { suggestionEvidence, suggestionSignal } from '../mappings/mappings.schemas.ts';
import { CLEANING_KINDS } from './cleaning-kinds.ts';

const tableList = z.array(z.string().trim().min(1).max(127)).min(1).max(5000);

export const discoverInput = z.object({
  tables: tableList
    .optional()
    .describe(
      'Source tables to profile (`table` or `schema.table`); default the source config selection, else all',
    ),
  target_tables: tableList
    .optional()
    .describe('Tables of the target schema to match; default every table of the schema'),
  last_event_id: z
    .string()
    .max(100)
    .optional()
    .describe(
      'Resume a stream instead of starting a run: the id of the last event received (`<run_id>:<seq>`); ' +
        'the `Last-Event-ID` header does the same',
    ),
});

export type DiscoverInput = z.infer<typeof discoverInput>;

const seq = z.number().int().positive().describe('1, 2, 3… within a run; the SSE `id:` is `<run_id>:<seq>`');
const candidate = z.object({
  source_field: z.string(),
  confidence: z.number(),
  evidence: suggestionEvidence.nullable().optional(),
});

const PROGRESS_STEPS = [
  'introspected',
  'profiling',
  'profiled',
  'matching',
  'llm_disabled',
  'llm_fallback',
  'llm_pick_refused',
  'written',
] as const;

export const discoveryEvent = z.discriminatedUnion('type', [
  z.object({
    type: z.literal('started'),
    seq,
    run_id: z.string(),
    workspace_name: z.string(),
    mode: z
      .enum(LLM_MODES)
      .describe('offline, or openai when the process mode and the llm_matching feature allow it'),
    target_tables: z.array(z.string()),
  }),
  z.object({
    type: z.literal('progress'),
    seq,
    step: z.enum(PROGRESS_STEPS),
    message: z.string(),
    done: z.number().int().nullable(),
    total: z.number().int().nullable(),
    table: z.string().nullable(),
    reason: z
      .string()
      .nullable()
      .describe(
        'llm_fallback: budget_exceeded, llm_error or invalid_answer; llm_pick_refused: incompatible_type ' +
          '(one event per field whose model pick has a type the field cannot take)',
      ),
  }),
  z.object({
    type: z.literal('table_profiled'),
    seq,
    table: z.string().describe('schema.table'),
    rows_profiled: z.number().int(),
    columns: z.array(
      z.object({
        name: z.string(),
        type: z.string(),
        null_rate: z.number(),
        distinct_ratio: z.number(),
        min_length: z.number().int().nullable(),
        max_length: z.number().int().nullable(),
        patterns: z.array(z.object({ pattern: z.string(), share: z.number() })),
      }),
    ),
  }),
  z.object({
    type: z.literal('suggestion'),
    seq,
    target_table: z.string(),
    target_field: z.string(),
    source_field: z.string().describe('schema.table.column'),
    confidence: z.number(),
    status: z.enum(['suggested', 'confirmed']).describe('confirmed when at or above auto_confirm_threshold'),
    matched_by: z
      .enum(['offline', 'openai'])
      .describe('openai only when the model itself named this column for this field'),
    signals: z
      .array(suggestionSignal)
      .describe(
        'What produced the suggestion: name, type and value-pattern evidence, values the target already holds, and the model',
      ),
    evidence: suggestionEvidence,
    cleaning: z
      .object({
        kind: z.enum(CLEANING_KINDS),
        expression: z.string(),
        description: z.string().nullable(),
        share: z.number().describe('Share of the sampled non-blank source values the expression converts'),
        sampled: z.number().int(),
      })
      .nullable()
      .describe('The cleaning discovery proposed for this field (written as its transformation), or null'),
  }),
  z.object({
    type: z.literal('ambiguity'),
    seq,
    target_table: z.string(),
    target_field: z.string(),
    candidates: z.array(candidate),
    reason: z.string(),
  }),
  z.object({
    type: z.literal('kept'),
    seq,
    target_table: z.string(),
    target_field: z.string(),
    source_field: z.string().nullable().describe('rejected: the source a person removed'),
    decision: z
      .enum(['confirmed', 'transformation', 'no_source', 'rejected', 'cleaning_refused'])
      .describe('The decision of a person that discovery left as it was instead of its own proposal'),
    reason: z.string(),
  }),
  z.object({
    type: z.literal('completed'),
    seq,
    run_id: z.string(),
    summary: z.object({
      tables: z.number().int().describe('Source tables profiled'),
      columns: z.number().int(),
      target_tables: z.number().int().describe('Mappings written'),
      fields_suggested: z.number().int(),
      ambiguities: z.number().int(),
      llm_calls: z.number().int(),
      llm_fallbacks: z.number().int(),
      llm_cached: z
        .number()
        .int()
        .describe('Target tables answered from the llm_responses cache (no call, no cost)'),
      introspection_cached: z
        .boolean()
        .describe('The source introspection came from the introspection cache'),
      duration_ms: z.number().int(),
    }),
  }),
  z.object({
    type: z.literal('cancelled'),
    seq,
    run_id: z.string(),
    message: z.string(),
  }),
  z.object({
    type: z.literal('error'),
    seq,
    message: z.string(),
    code: z.string(),
    fatal: z.boolean().describe('false: one table was skipped and the run goes on'),
    table: z.string().nullable(),
  }),
]);

export type DiscoveryEvent = z.infer<typeof discoveryEvent>;

export const cancelOutput = z.object({
  cancelled: z
    .boolean()
    .describe('At least one running discovery of the caller stopped because of this cancel'),
  run_ids: z.array(z.string()),
  runs: z
    .array(
      z.object({
        run_id: z.string(),
        status: z
          .enum(['running', 'completed', 'cancelled', 'failed'])
          .describe('How the run ended; running if it had not reached its next step within 10 s'),
        reason: z.string().nullable(),
      }),
    )
    .describe('The outcome of each run the cancel reached'),
  message: z.string(),
});

export const budgetStatusOutput = z.object({
  period_start: timestamp,
  period_end: timestamp,
  monthly_budget_usd: z.number(),
  spent_usd: z.number(),
  remaining_usd: z.number(),
  exceeded: z.boolean(),
  calls: z.number().int(),
  total_tokens: z.number().int(),
  price_per_1k_tokens: z.number(),
  llm_mode: z.enum(LLM_MODES),
});
