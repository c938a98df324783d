import { z } from 'zod';

/**
 * An organization's LLM parameters (admin `llm-parameters`). The key is write-only: stored
 * encrypted by whoever persists the parameters and handed to the provider decrypted.
 */
export const llmParametersSchema = z.object({
  base_url: z
    .string()
    .url()
    .default('https://api.openai.com/v1')
    .describe('OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, LM Studio), up to /v1'),
  model: z.string().min(1).max(200).default('gpt-4o-mini'),
  temperature: z.number().min(0).max(2).default(0),
  max_tokens: z.number().int().min(16).max(200_000).default(4000),
  timeout_seconds: z.number().min(1).max(600).default(60),
  monthly_budget_usd: z.number().min(0).max(1_000_000).default(20),
  price_per_1k_tokens: z
    .number()
    .min(0)
    .max(1000)
    .default(0.002)
    .describe('USD per 1000 tokens, prompt and completion'),
});

export type LlmParameters = z.infer<typeof llmParametersSchema> & {
  /** Decrypted API key; local servers often need none. */
  api_key?: string | null;
};

export const DEFAULT_LLM_PARAMETERS: LlmParameters = llmParametersSchema.parse({});

/** USD for a number of tokens at the configured price, rounded to the micro-dollar the ledger keeps. */
export function costOf(tokens: number, params: Pick<LlmParameters, 'price_per_1k_tokens'>): number {
  return Math.round((tokens / 1000) * params.price_per_1k_tokens * 1e6) / 1e6;
}
