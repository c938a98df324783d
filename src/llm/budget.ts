import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError } from '../app-error.ts';
import { LlmUsage } from './llm-usage.entity.ts';
import { costOf, type LlmParameters } from './parameters.ts';

export interface BudgetStatus {
  /** First instant of the current month, UTC. */
  period_start: Date;
  period_end: Date;
  monthly_budget_usd: number;
  spent_usd: number;
  remaining_usd: number;
  exceeded: boolean;
  calls: number;
  total_tokens: number;
}

interface UsageRecord {
  model: string;
  outcome: 'ok' | 'invalid_answer' | 'error';
  promptTokens: number;
  completionTokens: number;
}

/** What an LLM call needs from the budget: permission before, a ledger entry after. */
export interface Meter {
  /**
   * Throws AppError TOO_MANY_REQUESTS (reason LLM_BUDGET_EXCEEDED) when the month's spend plus the
   * cost of `worstCaseTokens` (prompt + max_tokens) would cross the budget.
   */
  check(worstCaseTokens?: number): Promise<void>;
  /** Records the call and returns its cost in USD. */
  record(usage: UsageRecord): Promise<number>;
}

export const BUDGET_EXCEEDED = 'LLM_BUDGET_EXCEEDED';

const round6 = (v: number) => Math.round(v * 1e6) / 1e6;

function monthOf(now: Date): { start: Date; end: Date } {
  return {
    start: new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1)),
    end: new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1)),
  };
}

/** The organization's spend this month (UTC) against its budget, summed in SQL from the ledger. */
export async function budgetStatus(
  em: EntityManager,
  organizationId: string,
  params: Pick<LlmParameters, 'monthly_budget_usd'>,
  now = new Date(),
): Promise<BudgetStatus> {
  const { start, end } = monthOf(now);
  const [row] = await em.execute(
    `select coalesce(sum(cost_usd), 0) as spent, count(*) as calls, coalesce(sum(total_tokens), 0) as tokens
       from llm_usage where organization_id = ? and created_at >= ? and created_at < ?`,
    [organizationId, start, end],
  );
  const spent = round6(Number(row.spent));
  const budget = params.monthly_budget_usd;
  return {
    period_start: start,
    period_end: end,
    monthly_budget_usd: budget,
    spent_usd: spent,
    remaining_usd: round6(Math.max(0, budget - spent)),
    exceeded: spent >= budget,
    calls: Number(row.calls),
    total_tokens: Number(row.tokens),
  };
}

function budgetExceededError(status: BudgetStatus, worstCaseUsd = 0): AppError {
  const month = status.period_start.toISOString().slice(0, 7);
  const spent = `$${status.spent_usd.toFixed(2)} of $${status.monthly_budget_usd.toFixed(2)}`;
  return new AppError(
    'TOO_MANY_REQUESTS',
    status.exceeded
      ? `The organization's LLM budget for ${month} is spent (${spent}); LLM calls are refused until next month or a higher budget`
      : `This LLM call could cost up to $${worstCaseUsd.toFixed(4)} (prompt + max_tokens), more than the ` +
          `$${status.remaining_usd.toFixed(4)} left of the organization's budget for ${month} (${spent}); ` +
          'it is refused: lower max_tokens or raise the budget',
    { reason: BUDGET_EXCEEDED },
  );
}

/**
 * The meter of one organization (and optionally workspace) for one purpose. A call passes the check
 * only when its worst case fits; concurrent calls may each pass and together overshoot by at most
 * their worst cases; the next check refuses.
 */
export function createBudgetMeter(
  em: EntityManager,
  organizationId: string,
  params: Pick<LlmParameters, 'monthly_budget_usd' | 'price_per_1k_tokens'>,
  context: { purpose: string; workspaceId?: string | null },
): Meter {
  return {
    async check(worstCaseTokens = 0) {
      const status = await budgetStatus(em, organizationId, params);
      const worst = costOf(worstCaseTokens, params);
      if (status.exceeded || status.spent_usd + worst > status.monthly_budget_usd)
        throw budgetExceededError(status, worst);
    },
    async record(usage) {
      const total = usage.promptTokens + usage.completionTokens;
      const cost = costOf(total, params);
      await em.insert(LlmUsage, {
        organization: organizationId,
        workspace: context.workspaceId ?? null,
        purpose: context.purpose,
        model: usage.model,
        outcome: usage.outcome,
        promptTokens: usage.promptTokens,
        completionTokens: usage.completionTokens,
        totalTokens: total,
        costUsd: cost,
        createdAt: new Date(),
      });
      return cost;
    },
  };
}
