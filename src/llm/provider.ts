import { createHash } from 'node:crypto';
import OpenAI from 'openai';
import { AppError } from '../app-error.ts';
import { outboundHttp, type OutboundHttp } from '../outbound-http.ts';
import { DEFAULT_BLOCKED_NETWORKS } from '../warehouse/network-guard.ts';
import { BUDGET_EXCEEDED, type Meter } from './budget.ts';
import {
  matchTable,
  type MatchOptions,
  type SourceTable,
  type TableMatch,
  type TargetTable,
} from './offline-matcher.ts';
import {
  buildMatchPrompt,
  mergeAnswer,
  parseMatchAnswer,
  requestCompletion,
  worstCaseTokens,
  type CompletionResult,
  type LlmMatchAnswer,
  type RefusedPick,
} from './openai.ts';
import type { LlmParameters } from './parameters.ts';

export const LLM_MODES = ['offline', 'openai'] as const;
export type LlmMode = (typeof LLM_MODES)[number];

/**
 * The process-level LLM mode and the clients built for it. `set-llm-mode` switches the mode and
 * resets: clients (and whatever they hold: keep-alive sockets, stale keys or base URLs) are dropped
 * and rebuilt on the next call.
 */
export class LlmManager {
  #mode: LlmMode;
  #clients = new Map<string, OpenAI>();
  #generation = 0;
  #outbound: OutboundHttp;

  constructor(
    mode: LlmMode = 'offline',
    outbound = outboundHttp({ OUTBOUND_BLOCKED_NETWORKS: DEFAULT_BLOCKED_NETWORKS.join(',') }),
  ) {
    this.#mode = mode;
    this.#outbound = outbound;
  }

  /** The server's outbound guard: the organization's endpoint is a tenant-chosen address. */
  useOutbound(outbound: OutboundHttp): void {
    this.#outbound = outbound;
    this.reset();
  }

  get mode(): LlmMode {
    return this.#mode;
  }

  /** Counts resets, so holders of a client can tell theirs is from before one. */
  get generation(): number {
    return this.#generation;
  }

  setMode(mode: LlmMode): void {
    this.#mode = mode;
    this.reset();
  }

  reset(): void {
    this.#clients.clear();
    this.#generation++;
  }

  client(params: LlmParameters): OpenAI {
    const key = JSON.stringify([params.base_url, params.api_key ?? '', params.timeout_seconds]);
    let client = this.#clients.get(key);
    if (!client) {
      client = new OpenAI({
        baseURL: params.base_url,
        // Local OpenAI-compatible servers accept any key; the client insists on one.
        apiKey: params.api_key || 'not-needed',
        timeout: params.timeout_seconds * 1000,
        // A failed call falls back to the offline result at once rather than retrying the budget away.
        maxRetries: 0,
        fetch: this.#outbound.fetch as unknown as typeof fetch,
      });
      this.#clients.set(key, client);
    }
    return client;
  }
}

/** The one manager of this process. */
export const llmManager = new LlmManager();

export interface TableMatchRequest {
  target: TargetTable;
  sources: readonly SourceTable[];
  systemPrompt?: string | null;
  successCriteria?: string | null;
  options?: MatchOptions;
}

export interface MatchContext {
  params: LlmParameters;
  meter: Meter;
  /** Stops the call when the discovery is cancelled or its client goes away. */
  signal?: AbortSignal;
  manager?: LlmManager;
  /** Overrides the manager's mode (e.g. when the organization's feature flag disables LLM matching). */
  mode?: LlmMode;
  /** Workspace setting mask_pii_in_samples: personal columns go out as patterns and statistics only. */
  maskPii?: boolean;
  /** Answers to identical requests (cache llm_responses): a hit is neither sent nor metered. */
  answers?: {
    get(key: string): Promise<CompletionResult | undefined>;
    set(key: string, value: CompletionResult): Promise<void>;
  };
}

type FallbackReason = 'budget_exceeded' | 'llm_error' | 'invalid_answer';

export interface MatchOutcome {
  match: TableMatch;
  /** Who produced `match`. */
  source: 'offline' | 'openai';
  /** Set when openai mode was asked for and the offline result was used instead: worth an event. */
  fallback: { reason: FallbackReason; message: string } | null;
  usage: { model: string; prompt_tokens: number; completion_tokens: number; cost_usd: number } | null;
  /** True when the model's answer came from the llm_responses cache. */
  cached?: boolean;
  /** `target_field → source_field` of the suggestions the model itself made (empty unless source is openai). */
  modelPicks: ReadonlyMap<string, string>;
  /** The model's picks refused for their types, each with a note for the person reviewing the run. */
  refusedPicks: readonly RefusedPick[];
}

const isAbort = (error: unknown, signal?: AbortSignal) =>
  !!signal?.aborted ||
  (error instanceof Error && (error.name === 'AbortError' || error instanceof OpenAI.APIUserAbortError));

/**
 * Matches one target table: the offline matcher always runs (it is cheap, it is the fallback, and
 * its candidates go into the prompt); in openai mode the model's answer then decides. A refused,
 * failed or unusable call yields the offline result with a `fallback` saying why. Cancellation is
 * not a fallback: the abort propagates.
 */
export async function matchTableWithProvider(
  req: TableMatchRequest,
  ctx: MatchContext,
): Promise<MatchOutcome> {
  const manager = ctx.manager ?? llmManager;
  const mode = ctx.mode ?? manager.mode;
  const offline = matchTable(req.target, req.sources, req.options);
  if (mode === 'offline')
    return {
      match: offline,
      source: 'offline',
      fallback: null,
      usage: null,
      modelPicks: new Map(),
      refusedPicks: [],
    };

  const table = req.target.name;
  const fallback = (
    reason: FallbackReason,
    message: string,
    usage: MatchOutcome['usage'] = null,
  ): MatchOutcome => ({
    match: offline,
    source: 'offline',
    fallback: { reason, message: `${message}; the offline matcher's result is used for ${table}` },
    usage,
    modelPicks: new Map(),
    refusedPicks: [],
  });

  const prompt = buildMatchPrompt({
    target: req.target,
    sources: req.sources,
    offline,
    systemPrompt: req.systemPrompt,
    successCriteria: req.successCriteria,
    maskPii: ctx.maskPii ?? true,
  });
  // Everything that shapes the answer: the same key means the same request to the same model.
  const cacheKey = createHash('sha256')
    .update(
      JSON.stringify([
        ctx.params.base_url,
        ctx.params.model,
        ctx.params.temperature,
        ctx.params.max_tokens,
        prompt,
      ]),
    )
    .digest('hex');
  const hit = await ctx.answers?.get(cacheKey);
  if (hit) {
    const parsedHit = parseMatchAnswer(hit.content, req.target, req.sources);
    if (parsedHit.ok) return { ...answered(offline, parsedHit.answer, req, null), cached: true };
  }
  try {
    await ctx.meter.check(worstCaseTokens(prompt, ctx.params));
  } catch (error) {
    if (error instanceof AppError && error.details.reason === BUDGET_EXCEEDED)
      return fallback('budget_exceeded', error.message);
    throw error;
  }
  let completion;
  try {
    completion = await requestCompletion(manager.client(ctx.params), ctx.params, prompt, ctx.signal);
  } catch (error) {
    if (isAbort(error, ctx.signal)) throw error;
    await ctx.meter.record({
      model: ctx.params.model,
      outcome: 'error',
      promptTokens: 0,
      completionTokens: 0,
    });
    return fallback('llm_error', `The LLM call for ${table} failed: ${describeError(error)}`);
  }
  const parsed = parseMatchAnswer(completion.content, req.target, req.sources);
  const cost = await ctx.meter.record({
    model: completion.model,
    outcome: parsed.ok ? 'ok' : 'invalid_answer',
    promptTokens: completion.promptTokens,
    completionTokens: completion.completionTokens,
  });
  const usage = {
    model: completion.model,
    prompt_tokens: completion.promptTokens,
    completion_tokens: completion.completionTokens,
    cost_usd: cost,
  };
  if (!parsed.ok)
    return fallback('invalid_answer', `The LLM answer for ${table} was unusable: ${parsed.reason}`, usage);
  await ctx.answers?.set(cacheKey, completion);
  return answered(offline, parsed.answer, req, usage);
}

function answered(
  offline: TableMatch,
  answer: LlmMatchAnswer,
  req: TableMatchRequest,
  usage: MatchOutcome['usage'],
): MatchOutcome {
  const { match, modelPicks, refused } = mergeAnswer(offline, answer, req, req.options);
  return { match, source: 'openai', fallback: null, usage, modelPicks, refusedPicks: refused };
}

/** A short, secret-free description of a failed call. */
function describeError(error: unknown): string {
  if (error instanceof OpenAI.APIConnectionTimeoutError) return 'the request timed out';
  if (error instanceof OpenAI.APIConnectionError) return 'the endpoint could not be reached';
  if (error instanceof OpenAI.APIError) return `the endpoint answered ${error.status ?? 'an error'}`;
  return error instanceof Error ? error.message.slice(0, 200) : 'unknown error';
}
