import { defineEntity, p } from '@mikro-orm/core';
import { Organization } from '../modules/users/users.entity.ts';
import { Workspace } from '../modules/workspaces/workspaces.entity.ts';

/** One metered LLM call: the ledger that budget status sums per organization and month. */
export const LlmUsage = defineEntity({
  name: 'LlmUsage',
  tableName: 'llm_usage',
  properties: {
    id: p.bigint('number').primary().autoincrement(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).nullable().deleteRule('set null'),
    /** What the call was for: discovery, hypotheses, … */
    purpose: p.string(),
    model: p.string(),
    /** ok, invalid_answer (tokens spent, answer unusable) or error. */
    outcome: p.string(),
    promptTokens: p.integer(),
    completionTokens: p.integer(),
    totalTokens: p.integer(),
    costUsd: p.decimal('number').precision(14).scale(6),
    createdAt: p.datetime().onCreate(() => new Date()),
  },
  indexes: [{ properties: ['organization', 'createdAt'] }],
});
