import { z } from 'zod';
import { jsonObject, pageInput, timestamp } from '../../trpc/common-schemas.ts';
import { MIN_ALPHA } from '../../stats/result.ts';
import { executeQueryInput, executeQueryOutput } from '../sources/sources.schemas.ts';
import { HYPOTHESIS_STATUSES, STAT_TESTS } from './analytics.entity.ts';

export { executeQueryInput, executeQueryOutput };

const expression = z.string().trim().min(1).max(2000);
const testName = z
  .enum(STAT_TESTS)
  .describe(
    'welch_t, mann_whitney_u, two_proportion_z: two segment groups; chi_square: the metric as a category across the segment groups; pearson, spearman: the metric against the segment column as a second variable',
  );
const alpha = z
  .number()
  .min(MIN_ALPHA, `alpha must be at least ${MIN_ALPHA}`)
  .lt(1)
  .describe(
    `Significance level, e.g. 0.05; at least ${MIN_ALPHA} and below 1 (the interval's level 1 − alpha keeps too few digits of a smaller alpha)`,
  );
const columnName = z.string().min(1).max(63);

const metricInput = z.object({
  expression: expression.describe(
    'A numeric or boolean SQL expression over one row of the table, e.g. "lifetime_value"; NaN and ±Infinity values count as missing, like NULL, in every test and in mining (chi_square reads the metric as categories: a float or numeric NaN or ±Infinity is no category)',
  ),
  kind: z
    .enum(['numeric', 'boolean'])
    .optional()
    .describe("Read from the expression's type when omitted (boolean expressions count as 1/0)"),
});

const segmentInput = z
  .object({
    column: columnName
      .optional()
      .describe(
        'A column whose values are the groups; rows where it is NULL, or NaN or ±Infinity in a float or numeric column, are in no group',
      ),
    condition: expression.optional().describe('A boolean rule: groups "true" and "false"'),
    groups: z
      .array(z.string().max(500))
      .min(2)
      .max(100)
      .optional()
      .describe('The groups to compare, in order (the first is group 1); default all groups'),
  })
  .refine((s) => !!s.column !== !!s.condition, { message: 'give exactly one of column and condition' });

export const hypothesisIdInput = z.object({ hypothesis_id: z.string().min(1).max(64) });

export const createHypothesisInput = z.object({
  statement: z.string().trim().min(1).max(2000),
  table: z
    .string()
    .min(1)
    .max(127)
    .describe('A table of the target warehouse: schema.table, or a name looked up in the target schemas'),
  metric: metricInput,
  segment: segmentInput,
  filter: expression.optional().describe('A boolean condition; rows where it is not true are left out'),
  test: testName.default('welch_t'),
  alpha: alpha.default(0.05),
  minimum_detectable_effect: z
    .number()
    .positive()
    .max(1e12)
    .nullable()
    .optional()
    .describe(
      "The smallest effect worth detecting, in the unit of the effect size of the test (Cohen's d, r, a difference of proportions, Cramér's V, r or rho); each test result then reports its power to detect it (result.power)",
    ),
  mining_columns: z
    .array(columnName)
    .max(12)
    .optional()
    .describe(
      'Candidate segment columns for mining, each given once; default the segment column and low-cardinality columns. A segment value null stands for NULL and, in a float or numeric column, NaN and ±Infinity',
    ),
});

const statResult = z.object({
  test: testName,
  statistic: z.number().nullable(),
  p_value: z.number(),
  effect_size: z.object({ name: z.string(), value: z.number().nullable() }),
  sample_sizes: z.object({
    total: z.number(),
    groups: z.array(z.object({ group: z.string(), n: z.number() })).optional(),
  }),
  ci: z
    .object({
      of: z.string(),
      level: z.number(),
      lower: z.number().nullable(),
      upper: z.number().nullable(),
    })
    .optional()
    .describe(
      'null bounds: not a finite number (results stored before alpha was bounded, e.g. at alpha 1e-17)',
    ),
  power: z
    .object({
      effect_size: z.number().describe("The hypothesis' minimum_detectable_effect"),
      alpha: z.number(),
      value: z.number().nullable(),
    })
    .optional()
    .describe(
      'Set when the hypothesis has a minimum_detectable_effect: the probability that this test, with these sample sizes and alpha (two-sided), finds an effect of that size significant; a non-significant result with high power rules such an effect out, with low power it says little',
    ),
  details: jsonObject,
});

export const hypothesisOutput = z.object({
  id: z.string(),
  statement: z.string(),
  table: z.string().describe('schema.table in the target warehouse'),
  metric: z.object({ expression: z.string(), kind: z.enum(['numeric', 'boolean']) }),
  segment: z.object({
    column: z.string().optional(),
    condition: z.string().optional(),
    groups: z.array(z.string()).optional(),
  }),
  filter: z.string().nullable(),
  test: testName,
  alpha: z.number(),
  minimum_detectable_effect: z.number().nullable(),
  mining_columns: z.array(z.string()),
  origin: z.enum(['manual', 'generated']),
  status: z.enum(HYPOTHESIS_STATUSES),
  last_run_id: z.string().nullable(),
  result: statResult.nullable().describe('The last successful test'),
  p_value: z.number().nullable(),
  significant: z.boolean().nullable().describe('p_value < alpha'),
  tested_at: timestamp.nullable(),
  error: z.string().nullable().describe('Why the last test failed'),
  created_at: timestamp,
  updated_at: timestamp,
});

export const generateInput = z.object({
  business_context: z
    .string()
    .trim()
    .min(1)
    .max(20_000)
    .optional()
    .describe(
      "Free text: the business, its goals, what to learn; omitted = the organization's business_context (global settings)",
    ),
  tables: z
    .array(z.string().min(1).max(127))
    .max(50)
    .optional()
    .describe('Restrict to these target tables (default: the tables of the target schema)'),
  count: z.number().int().min(1).max(20).default(5).describe('How many hypotheses to propose'),
  save: z.boolean().default(true).describe('Store the proposals as draft hypotheses'),
});

const proposalOutput = z.object({
  hypothesis_id: z.string().nullable().describe('Set when saved'),
  statement: z.string(),
  table: z.string(),
  metric: z.object({ expression: z.string(), kind: z.enum(['numeric', 'boolean']) }),
  segment: z.object({
    column: z.string().optional(),
    condition: z.string().optional(),
    groups: z.array(z.string()).optional(),
  }),
  test: testName,
  rationale: z.string(),
  screen_score: z
    .number()
    .nullable()
    .describe(
      "Share of the metric's variance explained by the segment in the screening sample (eta squared)",
    ),
  columns: z.array(z.string()).describe('The real columns the proposal reads (validated)'),
});

export const generateOutput = z.object({
  mode: z.enum(['offline', 'openai']).describe('Who produced the proposals'),
  hypotheses: z.array(proposalOutput),
  rejected: z
    .array(z.object({ statement: z.string(), reason: z.string() }))
    .describe('Proposals dropped by validation (unknown columns, wrong types)'),
  fallback: z
    .object({ reason: z.string(), message: z.string() })
    .nullable()
    .describe('Set when openai mode was asked for and the offline rules answered instead'),
  usage: z
    .object({
      model: z.string(),
      prompt_tokens: z.number(),
      completion_tokens: z.number(),
      cost_usd: z.number(),
    })
    .nullable(),
});

export const testInput = hypothesisIdInput.extend({
  test: testName
    .optional()
    .describe(
      "Use (and store) this algorithm instead of the hypothesis' test; another test or alpha while a test of the hypothesis is queued or running is a 409 RUN_IN_PROGRESS",
    ),
  alpha: alpha.optional(),
});

export const runOutput = z.object({
  run_id: z.string(),
  status: z.enum(['queued', 'running', 'succeeded', 'failed', 'cancelled']),
  hypothesis_id: z.string(),
  created: z.boolean().describe('false when a run of this hypothesis was already under way and is returned'),
});

/** Long enough to cover most tests, short enough for proxies that close idle requests. */
const MAX_STATUS_WAIT_MS = 25_000;

export const statusInput = hypothesisIdInput.extend({
  wait_ms: z.coerce
    .number()
    .int()
    .min(0)
    .max(MAX_STATUS_WAIT_MS)
    .default(0)
    .describe(
      'Wait up to this long for a queued or running test to end before answering (long polling); 0 answers at once',
    ),
});

export const statusOutput = z.object({
  hypothesis_id: z.string(),
  status: z.enum(HYPOTHESIS_STATUSES),
  run: z
    .object({
      id: z.string(),
      status: z.enum(['queued', 'running', 'succeeded', 'failed', 'cancelled']),
      progress: jsonObject,
      error: z.string().nullable(),
      created_at: timestamp,
      started_at: timestamp.nullable(),
      finished_at: timestamp.nullable(),
      duration_ms: z.number().nullable(),
    })
    .nullable(),
  result: statResult.nullable(),
  p_value: z.number().nullable(),
  significant: z.boolean().nullable(),
  error: z.string().nullable(),
});

export const miningInput = hypothesisIdInput.extend({
  min_support: z.coerce
    .number()
    .min(0)
    .max(1)
    .default(0.01)
    .describe('Smallest share of the population a segment must hold'),
  depth: z.coerce.number().int().min(1).max(2).default(1).describe('1: single columns; 2: also pairs'),
  direction: z.enum(['high', 'low']).default('high'),
  limit: z.coerce.number().int().min(1).max(1000).default(50),
});

export const miningOutput = z.object({
  hypothesis_id: z.string(),
  metric: z.string(),
  columns: z.array(z.string()),
  min_support: z.number(),
  total: z.object({ n: z.number(), mean: z.number().nullable() }),
  segments: z.array(
    z.object({
      segment: z.record(z.string(), z.string().nullable()),
      n: z.number(),
      support: z.number(),
      mean: z.number().nullable(),
      difference: z.number().describe("The segment's mean minus the population's"),
      lift: z
        .number()
        .nullable()
        .describe(
          "The segment's mean over the population's; null when the population mean is zero within rounding (below 1.5e-8 of the metric's mean absolute value), where a ratio is noise: read difference instead",
        ),
    }),
  ),
});

export const createInsightInput = z.object({
  hypothesis_id: z.string().min(1).max(64),
  title: z.string().trim().min(1).max(300).optional().describe('Default: the hypothesis statement'),
  description: z.string().max(10_000).default(''),
});

const insightIdInput = z.object({ insight_id: z.string().min(1).max(64) });

export const performanceInput = insightIdInput.extend({
  metrics: jsonObject.describe('Audience results, e.g. { "ctr": 0.031, "roas": 2.4, "audience_id": "…" }'),
});

export const insightOutput = z.object({
  id: z.string(),
  hypothesis_id: z.string(),
  title: z.string(),
  description: z.string(),
  confidence: z.number().describe('1 − p-value of the test the insight rests on'),
  p_value: z.number(),
  test: z.string(),
  effect_size: z.object({ name: z.string(), value: z.number().nullable() }),
  performance: jsonObject.nullable(),
  performance_updated_at: timestamp.nullable(),
  created_at: timestamp,
  updated_at: timestamp,
});

export const highPerformersInput = z.object({
  min_confidence: z.coerce.number().min(0).max(1).default(0.95).describe('Within [0, 1]'),
  ...pageInput,
});

export const highPerformersOutput = z.object({
  min_confidence: z.number(),
  insights: z.array(insightOutput),
  total: z.number().int(),
});
