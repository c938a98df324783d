import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import type { SecretBox } from '../../auth/secret-box.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { budgetStatus, createBudgetMeter, type Meter } from '../../llm/budget.ts';
import { DEFAULT_LLM_PARAMETERS, llmParametersSchema, type LlmParameters } from '../../llm/parameters.ts';
import { LLM_MODES, llmManager, type LlmManager, type LlmMode } from '../../llm/provider.ts';
import { outboundHttp } from '../../outbound-http.ts';
import { LlmSettings, type LlmSettingsEntity } from './llm-settings.entity.ts';

const PARAMETER_KEYS = Object.keys(llmParametersSchema.shape) as (keyof typeof llmParametersSchema.shape)[];

/** Stored values over the defaults; a stored document from an older schema keeps only what still parses. */
function parametersOf(row: LlmSettingsEntity | null): Omit<LlmParameters, 'api_key'> {
  if (!row) return { ...DEFAULT_LLM_PARAMETERS };
  const parsed = llmParametersSchema.safeParse(row.parameters);
  return parsed.success ? parsed.data : { ...DEFAULT_LLM_PARAMETERS };
}

/**
 * The organization's LLM parameters with the key decrypted, for code that calls the model
 * (discovery, hypothesis generation). Never hand the result to a client.
 */
export async function loadLlmParameters(
  em: EntityManager,
  organizationId: string,
  secrets: SecretBox,
): Promise<LlmParameters> {
  const row = await em.findOne(LlmSettings, { organization: organizationId });
  const params: LlmParameters = parametersOf(row);
  if (row?.apiKeyEncrypted) params.api_key = secrets.decrypt(row.apiKeyEncrypted);
  return params;
}

export interface OrganizationLlm {
  manager: LlmManager;
  mode: LlmMode;
  params: LlmParameters;
  meter: Meter;
}

/**
 * The one way an LLM caller gets the organization's configuration: the process mode, the stored
 * parameters (endpoint, model, key, limits) and a meter on the organization's budget. Every caller
 * (discovery, hypothesis generation, any later one) goes through here so none can fall back to the
 * built-in defaults by forgetting to load them.
 */
export async function organizationLlm(
  scope: Pick<CallerScope, 'em' | 'deps' | 'principal'>,
  context: { purpose: string; workspaceId?: string | null },
  manager: LlmManager = llmManager,
): Promise<OrganizationLlm> {
  const organization = organizationOf(scope.principal);
  const params = await loadLlmParameters(scope.em, organization, scope.deps.secrets);
  return {
    manager,
    mode: manager.mode,
    params,
    meter: createBudgetMeter(scope.em, organization, params, context),
  };
}

function view(row: LlmSettingsEntity | null) {
  return {
    ...parametersOf(row),
    api_key_set: !!row?.apiKeyEncrypted,
    api_key_hint: row?.apiKeyEncrypted ? (row.apiKeyHint ?? null) : null,
    is_default: !row,
    updated_at: row?.updatedAt ?? null,
  };
}

const hintOf = (key: string) => (key.length >= 12 ? `…${key.slice(-4)}` : null);

export async function getLlmParameters(scope: CallerScope) {
  const organization = organizationOf(scope.principal);
  return view(await scope.em.findOne(LlmSettings, { organization }));
}

export interface LlmParametersInput extends Partial<Omit<LlmParameters, 'api_key'>> {
  api_key?: string | null;
}

/** Merges the given keys into the stored parameters (the rest keep their value) and validates the result. */
export async function saveLlmParameters(scope: CallerScope, input: LlmParametersInput) {
  const organization = organizationOf(scope.principal);
  let row = await scope.em.findOne(LlmSettings, { organization });
  const next: Record<string, unknown> = { ...parametersOf(row) };
  for (const key of PARAMETER_KEYS) if (input[key] !== undefined) next[key] = input[key];
  const parsed = llmParametersSchema.safeParse(next);
  if (!parsed.success)
    throw new AppError('BAD_REQUEST', 'Invalid LLM parameters', {
      issues: parsed.error.issues.map((i) => ({ path: i.path as (string | number)[], message: i.message })),
    });
  await outboundHttp(scope.deps.env).checkDestination(parsed.data.base_url, 'The LLM base_url');
  row ??= scope.em.create(LlmSettings, {
    organization,
    parameters: {},
    apiKeyEncrypted: null,
    apiKeyHint: null,
  });
  row.parameters = parsed.data;
  if (input.api_key === null) {
    row.apiKeyEncrypted = null;
    row.apiKeyHint = null;
  } else if (input.api_key !== undefined) {
    row.apiKeyEncrypted = scope.deps.secrets.encrypt(input.api_key);
    row.apiKeyHint = hintOf(input.api_key);
  }
  await scope.em.flush();
  // Clients are cached per base URL and key; a changed key or endpoint must not reuse old sockets.
  llmManager.reset();
  return view(row);
}

const MODE_DESCRIPTION: Record<LlmMode, string> = {
  offline: 'Deterministic offline matcher; no network, no cost',
  openai:
    "The organization's OpenAI-compatible endpoint (llm-parameters), metered against its monthly budget",
};

function modeView(manager: LlmManager) {
  return { mode: manager.mode, available_modes: [...LLM_MODES], description: MODE_DESCRIPTION[manager.mode] };
}

/** The process-level mode: each API process has its own (LLM_MODE at start, then set-llm-mode). */
export function getLlmMode(manager: LlmManager = llmManager) {
  return modeView(manager);
}

export function setLlmMode(mode: LlmMode, manager: LlmManager = llmManager) {
  const previous = manager.mode;
  manager.setMode(mode);
  return { ...modeView(manager), previous_mode: previous };
}

/** This month's LLM spend of the caller's organization against its budget. */
export async function llmBudgetStatus(scope: CallerScope) {
  const organization = organizationOf(scope.principal);
  const params = parametersOf(await scope.em.findOne(LlmSettings, { organization }));
  const status = await budgetStatus(scope.em, organization, params);
  return { ...status, llm_mode: llmManager.mode, price_per_1k_tokens: params.price_per_1k_tokens };
}
