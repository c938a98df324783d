import type { EntityManager } from '@mikro-orm/postgresql';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { AppError } from '../src/app-error.ts';
import { budgetStatus, createBudgetMeter, BUDGET_EXCEEDED, type Meter } from '../src/llm/budget.ts';
import { LlmUsage } from '../src/llm/llm-usage.entity.ts';
import { LlmManager, llmManager, matchTableWithProvider, type MatchContext } from '../src/llm/provider.ts';
import { DEFAULT_LLM_PARAMETERS, costOf, type LlmParameters } from '../src/llm/parameters.ts';
import type { SourceTable, TargetTable } from '../src/llm/offline-matcher.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { fakeOpenAi } from './helpers/fake-openai.ts';
import { createTenant, type Tenant } from './helpers/api.ts';

// ---------------------------------------------------------------- a local OpenAI-compatible server

const llm = fakeOpenAi();
const { queue, requests } = llm;
let llmUrl: string;

beforeAll(async () => {
  llmUrl = await llm.start();
});

afterAll(() => llm.close());

// ---------------------------------------------------------------- the matching problem

const target: TargetTable = {
  name: 'customers',
  primary_key: ['customer_id'],
  columns: [
    { name: 'customer_id', type: 'text', description: 'Stable identifier' },
    { name: 'email', type: 'text' },
    { name: 'full_name', type: 'text' },
    { name: 'phone', type: 'text' },
  ],
};
const sources: SourceTable[] = [
  {
    name: 'crm_contacts',
    columns: [
      { name: 'id', type: 'integer', isPrimaryKey: true, samples: ['1', '2'] },
      { name: 'mail', type: 'text', patterns: [{ pattern: 'email', share: 1 }], samples: ['a@example.com'] },
      { name: 'contact_label', type: 'text', samples: ['Ada Lovelace', 'Alan Turing'] },
      { name: 'nick', type: 'text', samples: ['ada'] },
    ],
  },
];
const goodAnswer = JSON.stringify({
  primary_table: 'crm_contacts',
  mappings: [
    { target_field: 'customer_id', source_field: 'crm_contacts.id', confidence: 0.97, reason: 'primary key' },
    { target_field: 'email', source_field: 'crm_contacts.mail', confidence: 0.99 },
    { target_field: 'full_name', source_field: 'crm_contacts.contact_label', confidence: 0.8 },
    { target_field: 'phone', source_field: null, confidence: 0.9 },
  ],
});

let server: TestServer;
let tenant: Tenant;
let params: LlmParameters;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
});

afterAll(async () => {
  await server?.close();
});

beforeEach(() => {
  queue.length = 0;
  requests.length = 0;
  params = {
    ...DEFAULT_LLM_PARAMETERS,
    base_url: llmUrl,
    model: 'test-model',
    api_key: 'sk-test-123',
    temperature: 0.2,
    max_tokens: 900,
    timeout_seconds: 2,
    monthly_budget_usd: 10,
    price_per_1k_tokens: 0.5,
  };
});

const em = () => server.deps.orm.em.fork() as EntityManager;

function context(
  overrides: Partial<MatchContext> = {},
  organizationId = tenant.organization.id,
): MatchContext {
  return {
    params,
    meter: createBudgetMeter(em(), organizationId, params, { purpose: 'discovery' }),
    manager: new LlmManager('openai'),
    ...overrides,
  };
}

async function usageRows(organizationId: string) {
  return em().find(LlmUsage, { organization: organizationId }, { orderBy: { id: 'asc' } });
}

const request = {
  target,
  sources,
  systemPrompt: 'Prefer CRM columns.',
  successCriteria: 'Every customer has an e-mail.',
};

// ---------------------------------------------------------------- tests

describe('LLM mode', () => {
  it('is offline by default and switches process-wide, resetting the clients', () => {
    expect(llmManager.mode).toBe('offline');
    const manager = new LlmManager();
    expect(manager.mode).toBe('offline');
    const client = manager.client(params);
    expect(manager.client(params)).toBe(client);
    const generation = manager.generation;
    manager.setMode('openai');
    expect(manager.mode).toBe('openai');
    expect(manager.generation).toBe(generation + 1);
    expect(manager.client(params)).not.toBe(client);
    manager.reset();
    expect(manager.mode).toBe('openai');
  });

  it('offline mode answers from the offline matcher without calling anything', async () => {
    const calls: string[] = [];
    const meter: Meter = {
      check: async () => void calls.push('check'),
      record: async () => (calls.push('record'), 0),
    };
    const out = await matchTableWithProvider(request, { params, meter, manager: new LlmManager() });
    expect(out).toMatchObject({ source: 'offline', fallback: null, usage: null });
    expect(out.match.fields.find((f) => f.target_field === 'email')?.suggestion?.source_field).toBe(
      'crm_contacts.mail',
    );
    expect(calls).toEqual([]);
    expect(requests).toHaveLength(0);
  });
});

describe('openai mode against a local OpenAI-compatible server', () => {
  it('sends the prompts and profiles, validates the answer and meters the call', async () => {
    const t = await createTenant(server);
    queue.push({ content: goodAnswer });
    const out = await matchTableWithProvider(request, context({}, t.organization.id));

    expect(out.source).toBe('openai');
    expect(out.fallback).toBeNull();
    const byField = Object.fromEntries(out.match.fields.map((f) => [f.target_field, f]));
    expect(byField.full_name.suggestion).toMatchObject({
      source_field: 'crm_contacts.contact_label',
      confidence: 0.8,
    });
    expect(byField.customer_id.suggestion?.source_field).toBe('crm_contacts.id');
    expect(byField.phone.suggestion).toBeNull();
    expect(out.match.primary_table).toBe('crm_contacts');
    expect(out.usage).toEqual({
      model: 'test-model-0613',
      prompt_tokens: 1200,
      completion_tokens: 300,
      cost_usd: 0.75,
    });

    const [sent] = requests;
    expect(sent.headers.authorization).toBe('Bearer sk-test-123');
    expect(sent.body).toMatchObject({
      model: 'test-model',
      temperature: 0.2,
      max_tokens: 900,
      response_format: { type: 'json_object' },
    });
    const [system, user] = sent.body.messages;
    expect(system.role).toBe('system');
    expect(system.content).toContain('Prefer CRM columns.');
    expect(system.content).toContain('Every customer has an e-mail.');
    const payload = JSON.parse(user.content);
    expect(payload.target_table.fields.map((f: any) => f.name)).toEqual([
      'customer_id',
      'email',
      'full_name',
      'phone',
    ]);
    const label = payload.source_tables[0].columns.find((c: any) => c.name === 'contact_label');
    expect(label.samples).toEqual(['Ada Lovelace', 'Alan Turing']);
    // Contact data stays out of the prompt: the e-mail column is described by its pattern only.
    const mail = payload.source_tables[0].columns.find((c: any) => c.name === 'mail');
    expect(mail.samples).toBeUndefined();
    expect(mail.patterns).toEqual([{ pattern: 'email', share: 1 }]);
    expect(payload.offline_suggestions.email[0].source_field).toBe('crm_contacts.mail');

    const rows = await usageRows(t.organization.id);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({
      purpose: 'discovery',
      model: 'test-model-0613',
      outcome: 'ok',
      promptTokens: 1200,
      completionTokens: 300,
      totalTokens: 1500,
    });
    expect(Number(rows[0].costUsd)).toBeCloseTo(0.75, 6);
  });

  it.each([
    ['not JSON at all', 'Sure! Here is the mapping: email -> mail', /not JSON/],
    ['JSON of the wrong shape', JSON.stringify({ mapping: { email: 'mail' } }), /expected shape \(mappings/],
    [
      'a confidence out of range',
      JSON.stringify({
        mappings: [{ target_field: 'email', source_field: 'crm_contacts.mail', confidence: 7 }],
      }),
      /expected shape/,
    ],
    [
      'an invented column',
      JSON.stringify({
        mappings: [{ target_field: 'email', source_field: 'crm_contacts.e_mail', confidence: 0.9 }],
      }),
      /unknown source column "crm_contacts.e_mail"/,
    ],
    [
      'an invented field',
      JSON.stringify({ mappings: [{ target_field: 'mood', source_field: null, confidence: 0.9 }] }),
      /unknown target field "mood"/,
    ],
    ['an empty answer', '', /empty/],
  ])(
    'falls back to the offline result on %s, says so, and still meters the tokens',
    async (_label, content, reason) => {
      const t = await createTenant(server);
      queue.push({ content });
      const out = await matchTableWithProvider(request, context({}, t.organization.id));
      expect(out.source).toBe('offline');
      expect(out.fallback?.reason).toBe('invalid_answer');
      expect(out.fallback?.message).toMatch(reason);
      expect(out.fallback?.message).toContain("offline matcher's result is used for customers");
      expect(out.match.fields.find((f) => f.target_field === 'email')?.suggestion?.source_field).toBe(
        'crm_contacts.mail',
      );
      const rows = await usageRows(t.organization.id);
      expect(rows.map((r) => r.outcome)).toEqual(['invalid_answer']);
      expect(rows[0].totalTokens).toBe(1500);
    },
  );

  it('accepts a fenced JSON answer and estimates tokens when the server reports none', async () => {
    queue.push({ content: '```json\n' + goodAnswer + '\n```', usage: null });
    const out = await matchTableWithProvider(request, context());
    expect(out.source).toBe('openai');
    expect(out.usage!.prompt_tokens).toBeGreaterThan(100);
    expect(out.usage!.cost_usd).toBe(costOf(out.usage!.prompt_tokens + out.usage!.completion_tokens, params));
  });

  it('falls back when the endpoint fails, times out or cannot be reached', async () => {
    queue.push({ status: 500 });
    const failed = await matchTableWithProvider(request, context());
    expect(failed.fallback).toMatchObject({ reason: 'llm_error' });
    expect(failed.fallback!.message).toMatch(/answered 500/);

    queue.push({ content: goodAnswer, delayMs: 3_000 });
    const started = Date.now();
    const slow = await matchTableWithProvider(
      request,
      context({ params: { ...params, timeout_seconds: 1 } }),
    );
    expect(slow.fallback!.message).toMatch(/timed out/);
    expect(Date.now() - started).toBeLessThan(2_900);

    const down = await matchTableWithProvider(
      request,
      context({ params: { ...params, base_url: 'http://127.0.0.1:9/v1' } }),
    );
    expect(down.fallback!.message).toMatch(/could not be reached/);
    expect(JSON.stringify([failed, slow, down])).not.toContain('sk-test-123');
  });

  it('stops, without falling back, when the caller aborts', async () => {
    queue.push({ content: goodAnswer, delayMs: 1_500 });
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 100);
    await expect(matchTableWithProvider(request, context({ signal: controller.signal }))).rejects.toThrow();
  });

  it("holds the model's picks to the offline type rule: a refused pick takes no column and is not a model pick", async () => {
    const typed: TargetTable = {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'text' },
        { name: 'email', type: 'text' },
        { name: 'interests', type: 'text' },
        { name: 'visits', type: 'integer' },
        { name: 'order_count', type: 'integer' },
        { name: 'score', type: 'integer' },
      ],
    };
    const contacts: SourceTable[] = [
      {
        name: 'contacts',
        columns: [
          { name: 'id', type: 'integer', isPrimaryKey: true },
          { name: 'mail', type: 'text', patterns: [{ pattern: 'email', share: 1 }] },
          { name: 'visit_count', type: 'integer' },
          { name: 'visit_log', type: 'integer[]' },
          { name: 'interests', type: 'text[]' },
        ],
      },
    ];
    queue.push({
      content: JSON.stringify({
        mappings: [
          { target_field: 'visits', source_field: 'contacts.visit_log', confidence: 0.95 },
          { target_field: 'order_count', source_field: 'contacts.visit_count', confidence: 0.7 },
          // Surer than anything else in the answer: without the rule it would take the column from `interests`.
          { target_field: 'score', source_field: 'contacts.interests', confidence: 0.99 },
        ],
      }),
    });
    const out = await matchTableWithProvider({ target: typed, sources: contacts }, context());
    expect(out.source).toBe('openai');
    const byField = Object.fromEntries(out.match.fields.map((f) => [f.target_field, f]));
    expect(byField.interests.suggestion?.source_field).toBe('contacts.interests');
    expect(byField.order_count.suggestion?.source_field).toBe('contacts.visit_count');
    expect(byField.visits.suggestion).toBeNull();
    expect(byField.score.suggestion).toBeNull();
    expect(byField.visits.candidates.map((c) => c.source_field)).not.toContain('contacts.visit_log');
    expect(byField.score.candidates.map((c) => c.source_field)).not.toContain('contacts.interests');
    expect(Object.fromEntries(out.modelPicks)).toEqual({ order_count: 'contacts.visit_count' });
    expect(out.refusedPicks).toEqual([
      {
        target_field: 'visits',
        source_field: 'contacts.visit_log',
        message:
          'The model proposed contacts.visit_log (integer[]) for integer field visits of customers: incompatible ' +
          "types, no cast exists; left without a suggestion: the offline one, contacts.visit_count, is the model's pick for order_count",
      },
      {
        target_field: 'score',
        source_field: 'contacts.interests',
        message:
          'The model proposed contacts.interests (text[]) for integer field score of customers: incompatible ' +
          'types, no cast exists; left without a suggestion: the offline matcher has none',
      },
    ]);
  });
});

describe('budget', () => {
  it('reports the month spend per organization and refuses a call whose worst case would cross the budget', async () => {
    const t = await createTenant(server);
    const other = await createTenant(server);
    // The server reports 1500 tokens at $0.5 per 1k = $0.75 a call. The worst case the check counts is
    // the prompt (at 3 characters a token) plus max_tokens: with 300 that is well under $1.
    params.monthly_budget_usd = 1;
    params.max_tokens = 300;
    const org = t.organization.id;
    const before = await budgetStatus(em(), org, params);
    expect(before).toMatchObject({
      spent_usd: 0,
      remaining_usd: 1,
      exceeded: false,
      calls: 0,
      total_tokens: 0,
    });

    queue.push({ content: goodAnswer }, { content: goodAnswer });
    expect((await matchTableWithProvider(request, context({}, org))).source).toBe('openai');
    expect(await budgetStatus(em(), org, params)).toMatchObject({
      spent_usd: 0.75,
      remaining_usd: 0.25,
      exceeded: false,
      calls: 1,
    });

    // $0.25 left is less than the next call's worst case: refused before anything is sent.
    const refused = await matchTableWithProvider(request, context({}, org));
    expect(refused.source).toBe('offline');
    expect(refused.fallback?.reason).toBe('budget_exceeded');
    expect(refused.fallback?.message).toMatch(
      /could cost up to \$0\.\d+ \(prompt \+ max_tokens\), more than the \$0\.2500 left .*\(\$0\.75 of \$1\.00\)/,
    );
    expect(requests).toHaveLength(1);
    expect(refused.match.fields.find((f) => f.target_field === 'email')?.suggestion?.source_field).toBe(
      'crm_contacts.mail',
    );
    queue.length = 0;
    // A huge max_tokens is refused even with most of the budget left.
    const t2 = await createTenant(server);
    const wide = await matchTableWithProvider(request, {
      ...context({}, t2.organization.id),
      params: { ...params, max_tokens: 200_000 },
    });
    expect(wide.fallback?.reason).toBe('budget_exceeded');
    expect(requests).toHaveLength(1);
    // Spend reaching the budget reads as spent.
    queue.push({ content: goodAnswer });
    params.monthly_budget_usd = 0.75;
    const spent = await matchTableWithProvider(request, context({}, org));
    expect(spent.fallback?.message).toMatch(/LLM budget for \d{4}-\d{2} is spent \(\$0\.75 of \$0\.75\)/);
    queue.length = 0;
    params.monthly_budget_usd = 1;

    const status = await budgetStatus(em(), org, params);
    expect(status).toMatchObject({
      spent_usd: 0.75,
      remaining_usd: 0.25,
      exceeded: false,
      calls: 1,
      total_tokens: 1500,
      monthly_budget_usd: 1,
    });
    expect(status.period_start.toISOString()).toMatch(/-01T00:00:00.000Z$/);

    // Another organization's budget is its own.
    expect(await budgetStatus(em(), other.organization.id, params)).toMatchObject({
      spent_usd: 0,
      exceeded: false,
    });
    // A higher budget leaves more room.
    expect(await budgetStatus(em(), org, { monthly_budget_usd: 5 })).toMatchObject({
      remaining_usd: 4.25,
      exceeded: false,
    });
  });

  it('throws a clear AppError from the meter and counts only the current month', async () => {
    const t = await createTenant(server);
    const org = t.organization.id;
    const e = em();
    const lastMonth = new Date();
    lastMonth.setUTCDate(1);
    lastMonth.setUTCMonth(lastMonth.getUTCMonth() - 1);
    await e.insert(LlmUsage, {
      organization: org,
      purpose: 'discovery',
      model: 'm',
      outcome: 'ok',
      promptTokens: 100000,
      completionTokens: 0,
      totalTokens: 100000,
      costUsd: 50,
      createdAt: lastMonth,
    });
    const meter = createBudgetMeter(
      e,
      org,
      { monthly_budget_usd: 0.01, price_per_1k_tokens: 0.5 },
      { purpose: 'hypotheses' },
    );
    await expect(meter.check()).resolves.toBeUndefined();
    expect(await meter.record({ model: 'm', outcome: 'ok', promptTokens: 30, completionTokens: 10 })).toBe(
      0.02,
    );
    const error = await meter.check().then(
      () => null,
      (err: unknown) => err,
    );
    expect(error).toBeInstanceOf(AppError);
    expect(error).toMatchObject({ code: 'TOO_MANY_REQUESTS', details: { reason: BUDGET_EXCEEDED } });
    expect((error as AppError).message).toMatch(/refused until next month or a higher budget/);
    const rows = await usageRows(org);
    expect(rows.map((r) => r.purpose)).toEqual(['discovery', 'hypotheses']);
  });
});
