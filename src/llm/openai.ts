import type OpenAI from 'openai';
import { z } from 'zod';
import {
  ambiguityOf,
  type Candidate,
  type MatchOptions,
  type SourceTable,
  type TableMatch,
  type TargetTable,
} from './offline-matcher.ts';
import { canFeed } from './matcher-values.ts';
import type { LlmParameters } from './parameters.ts';
import { isPersonalColumn } from './pii.ts';

/** The answer the model must give: one entry per target field it has an opinion on. */
const llmMatchAnswerSchema = z.object({
  primary_table: z.string().nullable().optional(),
  mappings: z
    .array(
      z.object({
        target_field: z.string().min(1),
        source_field: z.string().min(1).nullable(),
        confidence: z.number().min(0).max(1),
        reason: z.string().max(2000).optional(),
      }),
    )
    .max(2000),
});

export type LlmMatchAnswer = z.infer<typeof llmMatchAnswerSchema>;

export interface MatchPromptInput {
  target: TargetTable;
  sources: readonly SourceTable[];
  /** The offline result, offered to the model as a starting point. */
  offline: TableMatch;
  systemPrompt?: string | null;
  successCriteria?: string | null;
  /**
   * Workspace setting mask_pii_in_samples (default on): no value of a personal column (see pii.ts)
   * goes into the prompt, only its name, type, patterns and statistics. Off: up to five sampled
   * values of every column, each cut to 80 characters.
   */
  maskPii?: boolean;
}

const BASE_INSTRUCTIONS = `You map columns of a source database to the fields of a target table for a data-integration platform.
For each target field choose the one source column (written "table.column") that holds the same information, or null when none does.
Use the column names, types, value patterns and samples. One source column feeds at most one target field.
Give a confidence between 0 and 1 that a careful data engineer would agree.
Answer with JSON only, exactly this shape:
{"primary_table": "<source table the target rows come from>", "mappings": [{"target_field": "...", "source_field": "table.column" | null, "confidence": 0.0, "reason": "..."}]}`;

export function buildMatchPrompt(input: MatchPromptInput): { system: string; user: string } {
  const system = [
    BASE_INSTRUCTIONS,
    input.systemPrompt?.trim() ? `Workspace instructions:\n${input.systemPrompt.trim()}` : '',
    input.successCriteria?.trim() ? `Success criteria:\n${input.successCriteria.trim()}` : '',
  ]
    .filter(Boolean)
    .join('\n\n');
  const hints = Object.fromEntries(
    input.offline.fields.map((f) => [
      f.target_field,
      f.candidates.slice(0, 3).map((c) => ({ source_field: c.source_field, confidence: c.confidence })),
    ]),
  );
  // Source columns that the offline matcher puts first for a target field the schema marks as pii.
  const feedsPii = new Set(
    input.offline.fields
      .filter((f) =>
        input.target.columns.some((c) => c.name === f.target_field && (c as { pii?: boolean }).pii),
      )
      .flatMap((f) => f.candidates.slice(0, 3).map((c) => c.source_field)),
  );
  const maskPii = input.maskPii ?? true;
  const user = JSON.stringify({
    target_table: {
      name: input.target.name,
      primary_key: input.target.primary_key ?? [],
      fields: input.target.columns.map((c) => ({
        name: c.name,
        type: c.type,
        description: c.description ?? '',
      })),
    },
    source_tables: input.sources.map((t) => ({
      name: t.name,
      columns: t.columns.map((c) => {
        const withheld = maskPii && isPersonalColumn(c, feedsPii.has(`${t.name}.${c.name}`));
        return {
          name: c.name,
          type: c.type,
          // A domain's name alone does not say what its values are.
          base_type: c.baseType,
          primary_key: c.isPrimaryKey || undefined,
          references: c.references ? `${c.references.table}.${c.references.column}` : undefined,
          null_rate: c.nullRate,
          distinct_ratio: c.distinctRatio,
          patterns: c.patterns,
          personal: withheld || undefined,
          samples: withheld ? undefined : (c.samples ?? []).slice(0, 5).map((v) => v.slice(0, 80)),
        };
      }),
    })),
    offline_suggestions: hints,
  });
  return { system, user };
}

export type ParsedAnswer = { ok: true; answer: LlmMatchAnswer } | { ok: false; reason: string };

/** Reads and checks the model's answer: JSON, the schema, and only fields and columns that exist. */
export function parseMatchAnswer(
  content: string | null | undefined,
  target: TargetTable,
  sources: readonly SourceTable[],
): ParsedAnswer {
  if (!content?.trim()) return { ok: false, reason: 'the answer was empty' };
  // Models asked for JSON still like to fence it.
  const text = content
    .trim()
    .replace(/^```(?:json)?\s*/i, '')
    .replace(/\s*```$/, '');
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return { ok: false, reason: 'the answer was not JSON' };
  }
  const parsed = llmMatchAnswerSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    return {
      ok: false,
      reason: `the answer did not have the expected shape (${issue.path.join('.') || 'root'}: ${issue.message})`,
    };
  }
  const fields = new Set(target.columns.map((c) => c.name));
  const columns = new Set(sources.flatMap((t) => t.columns.map((c) => `${t.name}.${c.name}`)));
  for (const m of parsed.data.mappings) {
    if (!fields.has(m.target_field))
      return { ok: false, reason: `the answer names an unknown target field "${m.target_field}"` };
    if (m.source_field !== null && !columns.has(m.source_field))
      return { ok: false, reason: `the answer names an unknown source column "${m.source_field}"` };
  }
  const tables = new Set(sources.map((t) => t.name));
  if (parsed.data.primary_table && !tables.has(parsed.data.primary_table))
    return { ok: false, reason: `the answer names an unknown primary table "${parsed.data.primary_table}"` };
  return { ok: true, answer: parsed.data };
}

/** A source column the model proposed for a field whose type it cannot feed (see `canFeed`). */
export interface RefusedPick {
  target_field: string;
  source_field: string;
  /** What happened and what the field got instead, for the person reviewing the run. */
  message: string;
}

export interface MergedAnswer {
  match: TableMatch;
  /** `target_field → source_field` of the suggestions that are the model's own picks. */
  modelPicks: Map<string, string>;
  refused: RefusedPick[];
}

/**
 * The model's choices over the offline result: its pick leads each field's candidates, fields it
 * left out keep the offline suggestion, and a column it gave to two fields goes to the surer one.
 * A pick the offline matcher's type rule refuses counts as no answer for that field, whatever its
 * confidence: the generated SQL would fail on it, and it must not take a column from another field.
 */
export function mergeAnswer(
  offline: TableMatch,
  answer: LlmMatchAnswer,
  tables: { target: TargetTable; sources: readonly SourceTable[] },
  options: MatchOptions = {},
): MergedAnswer {
  const threshold = options.threshold ?? 0.5;
  const fieldTypes = new Map(tables.target.columns.map((c) => [c.name, c.type]));
  const columns = new Map<string, SourceTable['columns'][number]>(
    tables.sources.flatMap((t) => t.columns.map((c) => [`${t.name}.${c.name}`, c] as const)),
  );
  const refusedPicks: LlmMatchAnswer['mappings'] = [];
  const accepted = answer.mappings.filter((m) => {
    const column = m.source_field ? columns.get(m.source_field) : undefined;
    const type = fieldTypes.get(m.target_field);
    if (!column || type === undefined || canFeed(column, type, options.converts)) return true;
    refusedPicks.push(m);
    return false;
  });
  const byField = new Map(accepted.map((m) => [m.target_field, m]));
  const claimed = new Map<string, { field: string; confidence: number }>();
  for (const m of accepted) {
    if (!m.source_field || m.confidence < threshold) continue;
    const current = claimed.get(m.source_field);
    if (!current || m.confidence > current.confidence)
      claimed.set(m.source_field, { field: m.target_field, confidence: m.confidence });
  }
  const takenByModel = new Set(claimed.keys());
  const fields = offline.fields.map((f) => {
    const m = byField.get(f.target_field);
    if (!m) {
      // The model said nothing about this field; keep the offline pick unless the model used that column.
      const keep = f.suggestion && !takenByModel.has(f.suggestion.source_field) ? f.suggestion : null;
      return { ...f, suggestion: keep };
    }
    const offlineOf = (source: string) => f.candidates.find((c) => c.source_field === source);
    const candidates: Candidate[] = f.candidates.filter((c) => c.source_field !== m.source_field);
    let suggestion: Candidate | null = null;
    if (m.source_field) {
      const pick: Candidate = {
        source_field: m.source_field,
        confidence: Math.round(m.confidence * 1000) / 1000,
        evidence: offlineOf(m.source_field)?.evidence ?? { name: 0, type: 0, pattern: 0 },
      };
      candidates.unshift(pick);
      if (claimed.get(m.source_field)?.field === f.target_field) suggestion = pick;
    }
    candidates.sort((a, b) => b.confidence - a.confidence);
    return {
      ...f,
      candidates,
      suggestion,
      ambiguity: ambiguityOf(f.target_field, candidates, options),
    };
  });
  const modelPicks = new Map(
    fields.flatMap((f) =>
      f.suggestion && byField.get(f.target_field)?.source_field === f.suggestion.source_field
        ? [[f.target_field, f.suggestion.source_field] as const]
        : [],
    ),
  );
  const refused = refusedPicks.map((m) => {
    const source = m.source_field!;
    const now = fields.find((f) => f.target_field === m.target_field)?.suggestion;
    const before = offline.fields.find((f) => f.target_field === m.target_field)?.suggestion;
    const takenFor = before && claimed.get(before.source_field)?.field;
    // A model that names a field twice may have had another, compatible pick accepted for it.
    const outcome = now
      ? modelPicks.has(m.target_field)
        ? `the model's other pick for it, ${now.source_field}, is used`
        : `kept the offline suggestion ${now.source_field}`
      : before && takenFor && takenFor !== m.target_field
        ? `left without a suggestion: the offline one, ${before.source_field}, is the model's pick for ${takenFor}`
        : before
          ? 'left without a suggestion'
          : 'left without a suggestion: the offline matcher has none';
    return {
      target_field: m.target_field,
      source_field: source,
      message:
        `The model proposed ${source} (${columns.get(source)!.type}) for ${fieldTypes.get(m.target_field)} ` +
        `field ${m.target_field} of ${tables.target.name}: incompatible types, no cast exists; ${outcome}`,
    };
  });
  return {
    match: {
      ...offline,
      primary_table: answer.primary_table ?? offline.primary_table,
      fields,
      ambiguities: fields.flatMap((f) => (f.ambiguity ? [f.ambiguity] : [])),
    },
    modelPicks,
    refused,
  };
}

export interface CompletionResult {
  content: string | null;
  model: string;
  promptTokens: number;
  completionTokens: number;
  /** False when the server reported no usage and the counts are estimated from the text. */
  usageReported: boolean;
}

/**
 * The most tokens a call can be billed for: the prompt, counted at three characters a token (fewer
 * than the usual four, so that dense or non-English text is not underestimated), plus every token
 * the answer is allowed. The budget refuses a call whose worst case would cross it.
 */
export function worstCaseTokens(
  prompt: { system: string; user: string },
  params: Pick<LlmParameters, 'max_tokens'>,
): number {
  return Math.ceil((prompt.system.length + prompt.user.length) / 3) + params.max_tokens;
}

/** One chat completion asking for a JSON object. */
export async function requestCompletion(
  client: OpenAI,
  params: LlmParameters,
  prompt: { system: string; user: string },
  signal?: AbortSignal,
): Promise<CompletionResult> {
  const completion = await client.chat.completions.create(
    {
      model: params.model,
      temperature: params.temperature,
      max_tokens: params.max_tokens,
      response_format: { type: 'json_object' },
      messages: [
        { role: 'system', content: prompt.system },
        { role: 'user', content: prompt.user },
      ],
    },
    { signal },
  );
  const content = completion.choices?.[0]?.message?.content ?? null;
  const usage = completion.usage;
  // About four characters per token, when the server does not say.
  const estimate = (s: string) => Math.ceil(s.length / 4);
  return {
    content,
    model: completion.model || params.model,
    promptTokens: usage?.prompt_tokens ?? estimate(prompt.system + prompt.user),
    completionTokens: usage?.completion_tokens ?? estimate(content ?? ''),
    usageReported: !!usage,
  };
}
