import OpenAI from 'openai';
import { z } from 'zod';
import { AppError } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { isFeatureEnabled } from '../../features.ts';
import { BUDGET_EXCEEDED } from '../../llm/budget.ts';
import { requestCompletion, worstCaseTokens } from '../../llm/openai.ts';
import { llmManager, type LlmManager } from '../../llm/provider.ts';
import { organizationLlm, type OrganizationLlm } from '../admin/llm-settings.service.ts';
import { qualified, quoteIdent } from '../../warehouse/postgres.ts';
import { numericMetricSql } from '../../stats/sql.ts';
import type { IntrospectedTable, Warehouse } from '../../warehouse/warehouse.ts';
import { workspaceWarehouse } from '../sources/sources.service.ts';
import { targetSchemaOf } from '../workspaces/workspaces.service.ts';
import { getGlobalSettings } from '../workspaces/workspaces-settings.service.ts';
import { Hypothesis, STAT_TESTS, type StoredSegment } from './analytics.entity.ts';
import {
  PROFILE_SAMPLE_ROWS,
  isNumericType,
  lowCardinalityColumns,
  resolveTargetTable,
  segmentCandidates,
  validateHypothesis,
  withBaseTypes,
} from './analytics-validate.ts';

/*
 * Hypothesis generation. Offline: every numeric or boolean column of a target table is a metric, every
 * low-cardinality column a segment; one GROUPING SETS query over a bounded sample gives each segment's
 * per-group count, mean and variance of every metric, from which eta² (the share of the metric's
 * variance the segment explains) ranks the pairs. Words of the business context that name a column
 * or table lift its pairs. openai mode: the model proposes from the schema, the context and the best
 * screened pairs; each proposal is validated against the real table like a hand-written hypothesis.
 */

const MAX_TABLES = 20;
const MAX_METRICS = 10;
const MAX_SEGMENTS = 8;

type Test = (typeof STAT_TESTS)[number];

export interface Proposal {
  statement: string;
  table: IntrospectedTable;
  metric: { expression: string; kind?: 'numeric' | 'boolean' };
  segment: StoredSegment;
  test: Test;
  rationale: string;
  screen_score: number | null;
  /** Other low-cardinality columns of the table, the default mining candidates. */
  segmentColumns: string[];
}

interface ScreenGroup {
  value: string;
  n: number;
  mean: number;
  variance: number;
}

interface ScreenPair {
  table: IntrospectedTable;
  metric: { name: string; kind: 'numeric' | 'boolean' };
  segment: string;
  groups: ScreenGroup[];
  sampleRows: number;
  eta2: number;
  contextMatches: string[];
  score: number;
  segmentColumns: string[];
}

const ident = (name: string) => (/^[a-z_][a-z0-9_]*$/.test(name) ? name : quoteIdent(name));
const fmt = (v: number) => (Math.abs(v) >= 1000 ? v.toFixed(0) : Number(v.toPrecision(4)).toString());

function contextWords(text: string): Set<string> {
  const words = new Set<string>();
  for (const word of text.toLowerCase().split(/[^a-z0-9]+/)) {
    if (word.length < 3) continue;
    words.add(word);
    // Plural and singular alike: "countries" names "country", "customers" names "customer".
    if (word.endsWith('ies')) words.add(`${word.slice(0, -3)}y`);
    else if (word.endsWith('s')) words.add(word.slice(0, -1));
  }
  return words;
}

const nameWords = (name: string) =>
  name
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter((w) => w.length >= 3);

/** The variance screen of one table: one GROUPING SETS query over a sample, eta² per (metric, segment). */
async function screenTable(
  warehouse: Warehouse,
  table: IntrospectedTable,
  context: Set<string>,
): Promise<ScreenPair[]> {
  const keys = new Set([...table.primary_key, ...table.foreign_keys.flatMap((fk) => fk.columns)]);
  const metrics = table.columns
    .filter(
      (c) =>
        (isNumericType(c.type) || c.type === 'boolean') && !keys.has(c.name) && !/(^id$|_id$)/i.test(c.name),
    )
    .slice(0, MAX_METRICS)
    .map((c) => ({
      name: c.name,
      kind: (c.type === 'boolean' ? 'boolean' : 'numeric') as 'numeric' | 'boolean',
    }));
  if (!metrics.length) return [];
  const segments = (await lowCardinalityColumns(warehouse, table, segmentCandidates(table))).slice(
    0,
    MAX_SEGMENTS,
  );
  if (!segments.length) return [];
  const k = segments.length;
  // The tests' own reading of a metric (NaN and ±Infinity missing), so the screen ranks what they test.
  const metricSql = metrics.map(
    (m, i) => `${numericMetricSql({ sql: quoteIdent(m.name), kind: m.kind })} AS m${i}`,
  );
  const segmentSql = segments.map((s, j) => `${quoteIdent(s.name)} AS s${j}`);
  const aliases = segments.map((_, j) => `s${j}`);
  // In numeric: a float8 variance overflows (an error, which failed the whole generation) once values
  // pass ~1e154; a metric whose moments no double holds is left out below. The sample is bounded.
  const aggregates = metrics.map(
    (_, i) =>
      `count(s.m${i})::float8 AS c${i}, avg(s.m${i}::numeric)::text AS a${i}, var_pop(s.m${i}::numeric)::text AS v${i}`,
  );
  const result = await warehouse.readOnlyQuery(
    `WITH s AS (SELECT ${[...metricSql, ...segmentSql].join(', ')} FROM ${qualified(table)} LIMIT ${PROFILE_SAMPLE_ROWS}) ` +
      `SELECT GROUPING(${aliases.join(', ')})::int AS gid, ${aliases.map((a) => `${a}::text AS ${a}`).join(', ')}, ` +
      `count(*)::float8 AS n, ${aggregates.join(', ')} FROM s GROUP BY GROUPING SETS (${aliases.map((a) => `(${a})`).join(', ')})`,
  );
  const fullMask = 2 ** k - 1;
  const pairs: ScreenPair[] = [];
  const segmentColumns = segments.map((s) => s.name);
  segments.forEach((segment, j) => {
    // GROUPING() sets a bit for each column NOT grouped; its first argument is the most significant bit.
    const gid = fullMask ^ (1 << (k - 1 - j));
    const rows = result.rows.filter((r) => Number(r.gid) === gid && r[`s${j}`] !== null);
    metrics.forEach((metric, i) => {
      if (metric.name === segment.name) return;
      const groups = rows
        .map((r) => ({
          value: String(r[`s${j}`]),
          n: Number(r[`c${i}`]),
          mean: Number(r[`a${i}`]),
          variance: Number(r[`v${i}`]),
        }))
        .filter((g) => g.n > 0);
      if (groups.length < 2) return;
      const n = groups.reduce((sum, g) => sum + g.n, 0);
      const mean = groups.reduce((sum, g) => sum + g.n * g.mean, 0) / n;
      const between = groups.reduce((sum, g) => sum + g.n * (g.mean - mean) ** 2, 0);
      const total = groups.reduce((sum, g) => sum + g.n * (g.variance + (g.mean - mean) ** 2), 0);
      if (!(total > 0 && Number.isFinite(total) && Number.isFinite(between))) return;
      const eta2 = between / total;
      const named = [
        ...new Set([...nameWords(metric.name), ...nameWords(segment.name), ...nameWords(table.name)]),
      ];
      const contextMatches = named.filter((w) => context.has(w));
      pairs.push({
        table,
        metric,
        segment: segment.name,
        groups,
        sampleRows: n,
        eta2,
        contextMatches,
        score: eta2 * (1 + contextMatches.length),
        segmentColumns,
      });
    });
  });
  return pairs;
}

/** The test and groups a screened pair suggests. */
function proposalOf(pair: ScreenPair): Proposal | null {
  const { metric, segment, table } = pair;
  const byMean = [...pair.groups].sort((a, b) => b.mean - a.mean);
  const where = `${table.schema}.${table.name}`;
  let test: Test;
  let groups: ScreenGroup[] | undefined;
  let statement: string;
  const quantity = metric.kind === 'boolean' ? `The rate of ${metric.name}` : `Average ${metric.name}`;
  if (metric.kind === 'boolean' && pair.groups.length > 2) {
    test = 'chi_square';
    statement = `${quantity} in ${where} depends on ${segment}`;
  } else {
    test = metric.kind === 'boolean' ? 'two_proportion_z' : 'welch_t';
    // With more than two groups, the two with the most different means among groups of some size.
    const floor = Math.max(2, 0.05 * pair.sampleRows);
    const eligible = pair.groups.length === 2 ? byMean : byMean.filter((g) => g.n >= floor);
    if (eligible.length < 2) return null;
    groups = [eligible[0], eligible[eligible.length - 1]];
    statement = `${quantity} in ${where} differs between ${segment} = ${groups[0].value} and ${segment} = ${groups[1].value}`;
  }
  const means = (groups ?? byMean)
    .slice(0, 6)
    .map((g) => `${g.value}: ${fmt(g.mean)} (n=${g.n})`)
    .join(', ');
  const rationale =
    `In a screening sample of ${pair.sampleRows} rows, ${segment} explains ${(pair.eta2 * 100).toFixed(1)}% of the variance of ${metric.name} ` +
    `(eta² = ${pair.eta2.toFixed(4)}); ${metric.kind === 'boolean' ? 'rates' : 'means'} by group: ${means}.` +
    (pair.contextMatches.length ? ` The business context mentions ${pair.contextMatches.join(', ')}.` : '');
  return {
    statement,
    table,
    metric: { expression: ident(metric.name), kind: metric.kind },
    segment: { column: segment, ...(groups ? { groups: groups.map((g) => g.value) } : {}) },
    test,
    rationale,
    screen_score: pair.eta2,
    segmentColumns: pair.segmentColumns,
  };
}

// ---- openai mode ----

const llmAnswerSchema = z.object({
  hypotheses: z
    .array(
      z.object({
        statement: z.string().min(1).max(2000),
        table: z.string().min(1).max(127),
        metric: z.object({
          expression: z.string().min(1).max(2000),
          kind: z.enum(['numeric', 'boolean']).optional(),
        }),
        segment: z.object({
          column: z.string().min(1).max(63).optional(),
          condition: z.string().min(1).max(2000).optional(),
          groups: z.array(z.string().max(500)).min(2).max(100).optional(),
        }),
        test: z.enum(STAT_TESTS),
        rationale: z.string().max(4000).optional(),
      }),
    )
    .max(50),
});

const LLM_INSTRUCTIONS = `You propose testable hypotheses for a marketing and customer analytics team.
Each hypothesis compares a metric across segments of ONE table of the warehouse described below.
- metric.expression: a numeric or boolean SQL expression over one row of that table, using only its columns.
- segment: {"column": "<a column with few distinct values>"} or {"condition": "<boolean SQL expression>"}, optionally "groups": ["<value 1>", "<value 2>"] to compare.
- test: welch_t (numeric metric, two groups), mann_whitney_u (skewed numeric metric, two groups), two_proportion_z (boolean metric, two groups), chi_square (categorical or boolean metric across groups), pearson or spearman (numeric metric against a numeric segment column).
Use only the tables and columns listed. Prefer hypotheses that matter for the business context.
Answer with JSON only: {"hypotheses": [{"statement": "...", "table": "schema.table", "metric": {"expression": "...", "kind": "numeric" | "boolean"}, "segment": {...}, "test": "...", "rationale": "..."}]}`;

interface LlmOutcome {
  proposals: { raw: z.infer<typeof llmAnswerSchema>['hypotheses'][number] }[];
  usage: { model: string; prompt_tokens: number; completion_tokens: number; cost_usd: number };
  ok: boolean;
  reason?: string;
}

async function proposeWithLlm(
  llm: OrganizationLlm,
  input: {
    context: string;
    count: number;
    tables: IntrospectedTable[];
    screened: Proposal[];
    workspaceId: string;
  },
): Promise<LlmOutcome> {
  const meter = llm.meter;
  const prompt = {
    system: LLM_INSTRUCTIONS,
    user: JSON.stringify({
      business_context: input.context,
      how_many: input.count,
      tables: input.tables.map((t) => ({
        name: `${t.schema}.${t.name}`,
        description: t.description ?? '',
        estimated_rows: t.estimated_rows,
        columns: t.columns.map((c) => ({ name: c.name, type: c.type, description: c.description ?? '' })),
      })),
      screened_candidates: input.screened.slice(0, 10).map((p) => ({
        statement: p.statement,
        test: p.test,
        eta_squared: p.screen_score,
      })),
    }),
  };
  await meter.check(worstCaseTokens(prompt, llm.params));
  let completion;
  try {
    completion = await requestCompletion(llm.manager.client(llm.params), llm.params, prompt);
  } catch (error) {
    await meter.record({ model: llm.params.model, outcome: 'error', promptTokens: 0, completionTokens: 0 });
    throw error;
  }
  let parsed: z.infer<typeof llmAnswerSchema> | undefined;
  let reason: string | undefined;
  try {
    const text = (completion.content ?? '')
      .trim()
      .replace(/^```(?:json)?\s*/i, '')
      .replace(/\s*```$/, '');
    const result = llmAnswerSchema.safeParse(JSON.parse(text));
    if (result.success) parsed = result.data;
    else reason = `the answer did not have the expected shape (${result.error.issues[0]?.message})`;
  } catch {
    reason = 'the answer was not JSON';
  }
  const cost = await meter.record({
    model: completion.model,
    outcome: parsed ? 'ok' : 'invalid_answer',
    promptTokens: completion.promptTokens,
    completionTokens: completion.completionTokens,
  });
  return {
    proposals: (parsed?.hypotheses ?? []).map((raw) => ({ raw })),
    usage: {
      model: completion.model,
      prompt_tokens: completion.promptTokens,
      completion_tokens: completion.completionTokens,
      cost_usd: cost,
    },
    ok: !!parsed,
    reason,
  };
}

function describeLlmError(error: unknown): string {
  if (error instanceof OpenAI.APIConnectionTimeoutError) return 'the request timed out';
  if (error instanceof OpenAI.APIConnectionError) return 'the endpoint could not be reached';
  if (error instanceof OpenAI.APIError) return `the endpoint answered ${error.status ?? 'an error'}`;
  return error instanceof Error ? error.message.slice(0, 200) : 'unknown error';
}

// ---- the route ----

export interface GenerateInput {
  /** Omitted: the organization's `business_context` global setting. */
  business_context?: string;
  tables?: string[];
  count: number;
  save: boolean;
}

export async function generateHypotheses(
  scope: CallerScope,
  input: GenerateInput,
  /** Tests pass their own manager to be in openai mode without switching the process. */
  manager: LlmManager = llmManager,
) {
  const businessContext =
    input.business_context ?? (await getGlobalSettings(scope)).settings.business_context.trim();
  if (!businessContext)
    throw new AppError(
      'BAD_REQUEST',
      "business_context is required: send it, or save the organization's business_context with PUT /api/workspaces/global-settings",
    );
  const { workspace, config, warehouse } = await workspaceWarehouse(scope, 'target');
  let tables: IntrospectedTable[];
  if (input.tables?.length) {
    tables = [];
    for (const name of input.tables) {
      const table = await resolveTargetTable(warehouse, config, name);
      // "customers" and "analytics.customers" are one table: screened twice, it was proposed twice.
      if (!tables.some((t) => t.schema === table.schema && t.name === table.name)) tables.push(table);
    }
  } else {
    const all = (await warehouse.introspect({ tables: [] })).tables;
    // The target schema names the tables that matter; the warehouse may hold others (audiences, staging).
    const named = new Set((targetSchemaOf(workspace)?.tables ?? []).map((t) => t.name));
    const chosen = all.filter((t) => named.has(t.name));
    tables = chosen.length ? chosen : all;
  }
  // Named tables come base-typed from resolveTargetTable already; introspected ones not.
  tables = input.tables?.length ? tables.slice(0, MAX_TABLES) : withBaseTypes(tables.slice(0, MAX_TABLES));
  if (!tables.length)
    throw new AppError(
      'CONFLICT',
      `The target warehouse has no tables in ${config.schemas.join(', ')} to form hypotheses on`,
      {
        reason: 'NO_TARGET_TABLES',
      },
    );

  const context = contextWords(businessContext);
  const pairs: ScreenPair[] = [];
  for (const table of tables) pairs.push(...(await screenTable(warehouse, table, context)));
  pairs.sort((a, b) => b.score - a.score || b.eta2 - a.eta2);
  const screened = pairs.map(proposalOf).filter((p): p is Proposal => p !== null);

  let mode: 'offline' | 'openai' = 'offline';
  let fallback: { reason: string; message: string } | null = null;
  let usage: LlmOutcome['usage'] | null = null;
  const rejected: { statement: string; reason: string }[] = [];
  const accepted: (Proposal & { columns: string[]; metricKind: 'numeric' | 'boolean' })[] = [];

  const accept = async (proposal: Proposal) => {
    const checked = await validateHypothesis(warehouse, proposal.table, {
      metric: proposal.metric,
      segment: proposal.segment,
      test: proposal.test,
    });
    accepted.push({ ...proposal, columns: checked.columns, metricKind: checked.metricKind });
  };

  if (manager.mode === 'openai') {
    if (!(await isFeatureEnabled(scope, 'llm_hypotheses')))
      fallback = {
        reason: 'feature_disabled',
        message: 'The llm_hypotheses feature is off; the offline rules answered',
      };
    else {
      try {
        const llm = await organizationLlm(
          scope,
          { purpose: 'hypotheses', workspaceId: workspace.id },
          manager,
        );
        const outcome = await proposeWithLlm(llm, {
          context: businessContext,
          count: input.count,
          tables,
          screened,
          workspaceId: workspace.id,
        });
        usage = outcome.usage;
        for (const { raw } of outcome.proposals) {
          if (accepted.length >= input.count) break;
          try {
            const table = await resolveTargetTable(warehouse, config, raw.table);
            await accept({
              statement: raw.statement,
              table,
              metric: raw.metric,
              segment: raw.segment,
              test: raw.test,
              rationale: raw.rationale ?? '',
              screen_score: null,
              segmentColumns:
                pairs.filter((p) => p.table === table || p.table.name === table.name)[0]?.segmentColumns ??
                [],
            });
          } catch (error) {
            if (!(error instanceof AppError) || error.code !== 'BAD_REQUEST') throw error;
            rejected.push({ statement: raw.statement, reason: error.message });
          }
        }
        if (accepted.length) mode = 'openai';
        else
          fallback = {
            reason: 'invalid_answer',
            message: `The LLM answer was unusable (${outcome.reason ?? 'no proposal passed validation'}); the offline rules answered`,
          };
      } catch (error) {
        if (error instanceof AppError && error.details.reason === BUDGET_EXCEEDED)
          fallback = { reason: 'budget_exceeded', message: error.message };
        else if (error instanceof AppError) throw error;
        else fallback = { reason: 'llm_error', message: `The LLM call failed: ${describeLlmError(error)}` };
      }
    }
  }

  if (mode === 'offline')
    for (const proposal of screened) {
      if (accepted.length >= input.count) break;
      try {
        await accept(proposal);
      } catch (error) {
        if (!(error instanceof AppError) || error.code !== 'BAD_REQUEST') throw error;
        rejected.push({ statement: proposal.statement, reason: error.message });
      }
    }

  const saved = input.save
    ? accepted.map((p) =>
        scope.em.create(Hypothesis, {
          organization: organizationOf(scope.principal),
          workspace,
          statement: p.statement,
          targetSchema: p.table.schema,
          targetTable: p.table.name,
          metric: { expression: p.metric.expression, kind: p.metricKind },
          segment: p.segment,
          filter: null,
          test: p.test,
          alpha: 0.05,
          minimumDetectableEffect: null,
          // The screened low-cardinality columns only, the segment column first when it is one of them:
          // a proposal's segment column (the model's choice) may hold far too many values to mine.
          miningColumns: [
            ...new Set([
              ...(p.segment.column && p.segmentColumns.includes(p.segment.column) ? [p.segment.column] : []),
              ...p.segmentColumns,
            ]),
          ].slice(0, 12),
          origin: 'generated',
          status: 'draft',
          createdById: scope.principal.id,
        }),
      )
    : [];
  if (saved.length) await scope.em.flush();

  return {
    mode,
    hypotheses: accepted.map((p, i) => ({
      hypothesis_id: saved[i]?.id ?? null,
      statement: p.statement,
      table: `${p.table.schema}.${p.table.name}`,
      metric: { expression: p.metric.expression, kind: p.metricKind },
      segment: p.segment,
      test: p.test,
      rationale: p.rationale,
      screen_score: p.screen_score,
      columns: p.columns,
    })),
    rejected,
    fallback,
    usage,
  };
}
