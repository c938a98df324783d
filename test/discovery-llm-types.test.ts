import { createParser } from 'eventsource-parser';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { fakeOpenAi } from './helpers/fake-openai.ts';
import { call, createTenant, createWorkspace, superAdminToken, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import type { DiscoveryEvent } from '../src/modules/discovery/discovery.schemas.ts';

/*
 * openai mode, the model's answer against the column types: discovery over a real PostgreSQL source
 * with array columns, a local OpenAI-compatible server scripted to answer, read through the REST
 * event stream and the mapping view. The model's picks obey the offline matcher's type rule.
 */
const source = scratchDatabase('dllmt');
const llm = fakeOpenAi({ model: 'test-model' });

let server: TestServer;
let llmUrl: string;
let tenant: Tenant;
let superAdmin: string;

const targetSchema = {
  name: 'c360',
  tables: [
    {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'text', nullable: false },
        { name: 'email', type: 'text' },
        { name: 'first_name', type: 'text' },
        { name: 'loyalty_points', type: 'integer', description: 'Points balance in the loyalty program' },
        { name: 'signup_date', type: 'date' },
        { name: 'tier', type: 'text' },
      ],
    },
  ],
};

async function discover(token: string): Promise<DiscoveryEvent[]> {
  const res = await fetch(`${server.url}/api/workspaces/discover`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({}),
  });
  expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
  const events: DiscoveryEvent[] = [];
  const parser = createParser({ onEvent: (m) => events.push(JSON.parse(m.data)) });
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parser.feed(value);
  }
  return events;
}

beforeAll(async () => {
  await source.create();
  await source.sql(`create schema picks;
     create table picks.customers (id integer primary key, email text, first_name text,
       points_balance integer, points_history integer[], signed_up date, segment text, tags text[]);
     insert into picks.customers
       select g, 'user' || g || '@example.com', 'name' || g, g * 10, array[g, g * 2, g * 3],
              date '2024-01-01' + g, (array['gold', 'silver', 'bronze'])[1 + g % 3], array['vip', 'tag' || g]
         from generate_series(1, 30) g;`);
  llmUrl = await llm.start();
  server = await startTestServer();
  tenant = await createTenant(server);
  superAdmin = await superAdminToken(server);
  await createWorkspace(server, tenant.admin.token, {
    name: unique('dllmt'),
    source_config: pgConfig(source.name, { schemas: ['picks'] }),
    target_schema: targetSchema,
  });
  const params = await call(server, 'POST', '/api/admin/llm-parameters', {
    token: tenant.admin.token,
    body: { base_url: llmUrl, model: 'test-model', monthly_budget_usd: 100 },
  });
  expect(params.status, JSON.stringify(params.body)).toBe(200);
  const mode = await call(server, 'POST', '/api/admin/set-llm-mode', {
    token: superAdmin,
    body: { mode: 'openai' },
  });
  expect(mode.status, JSON.stringify(mode.body)).toBe(200);
});

afterAll(async () => {
  await server?.close();
  await llm.close();
  await source.drop();
});

describe('openai mode: the model proposes a column whose type the field cannot take', () => {
  it('keeps the offline suggestion, does not offer the pick as a candidate, and says why; a compatible pick still wins', async () => {
    llm.queue.push({
      content: JSON.stringify({
        primary_table: 'picks.customers',
        mappings: [
          { target_field: 'customer_id', source_field: 'picks.customers.id', confidence: 0.97 },
          // No cast from integer[] to integer nor from text[] to date: the generated SQL would fail.
          {
            target_field: 'loyalty_points',
            source_field: 'picks.customers.points_history',
            confidence: 0.99,
          },
          { target_field: 'signup_date', source_field: 'picks.customers.tags', confidence: 0.95 },
          // A text field takes an array (as its text): the rule allows it.
          { target_field: 'first_name', source_field: 'picks.customers.tags', confidence: 0.6 },
          // Compatible, and not what the offline matcher suggests.
          { target_field: 'tier', source_field: 'picks.customers.segment', confidence: 0.9 },
        ],
      }),
    });
    const events = await discover(tenant.admin.token);
    expect(events.at(-1), JSON.stringify(events.at(-1))).toMatchObject({
      type: 'completed',
      summary: { llm_calls: 1, llm_fallbacks: 0 },
    });
    const suggestions = Object.fromEntries(
      events.flatMap((e) => (e.type === 'suggestion' ? [[e.target_field, e]] : [])),
    );
    expect(suggestions.loyalty_points).toMatchObject({
      source_field: 'picks.customers.points_balance',
      matched_by: 'offline',
    });
    expect(suggestions.loyalty_points.signals).not.toContain('model');
    expect(suggestions.signup_date).toMatchObject({
      source_field: 'picks.customers.signed_up',
      matched_by: 'offline',
    });
    expect(suggestions.tier).toMatchObject({ source_field: 'picks.customers.segment', matched_by: 'openai' });
    expect(suggestions.first_name).toMatchObject({
      source_field: 'picks.customers.tags',
      matched_by: 'openai',
    });
    expect(suggestions.customer_id).toMatchObject({
      source_field: 'picks.customers.id',
      matched_by: 'openai',
    });

    const refused = events.filter((e) => e.type === 'progress' && e.step === 'llm_pick_refused');
    expect(refused).toEqual([
      expect.objectContaining({
        table: 'customers',
        reason: 'incompatible_type',
        message:
          'The model proposed picks.customers.points_history (integer[]) for integer field loyalty_points of ' +
          'customers: incompatible types, no cast exists; kept the offline suggestion picks.customers.points_balance',
      }),
      expect.objectContaining({
        table: 'customers',
        reason: 'incompatible_type',
        message:
          'The model proposed picks.customers.tags (text[]) for date field signup_date of customers: ' +
          'incompatible types, no cast exists; kept the offline suggestion picks.customers.signed_up',
      }),
    ]);

    // The mapping a person reviews: the refused columns are neither connected nor offered.
    const mapping = await call(server, 'GET', '/api/mappings/customers', { token: tenant.admin.token });
    expect(mapping.status, JSON.stringify(mapping.body)).toBe(200);
    const connections = mapping.body.connections as { source_field: string; target_field: string }[];
    expect(connections.filter((c) => ['loyalty_points', 'signup_date'].includes(c.target_field))).toEqual([
      expect.objectContaining({
        target_field: 'loyalty_points',
        source_field: 'picks.customers.points_balance',
      }),
      expect.objectContaining({ target_field: 'signup_date', source_field: 'picks.customers.signed_up' }),
    ]);
    const offered = (
      mapping.body.ambiguities as { target_field: string; candidates: { source_field: string }[] }[]
    )
      .filter((a) => ['loyalty_points', 'signup_date'].includes(a.target_field))
      .flatMap((a) => a.candidates.map((c) => c.source_field));
    expect(offered).not.toContain('picks.customers.points_history');
    expect(offered).not.toContain('picks.customers.tags');

    // The generated SQL runs: no cast of an array into a scalar.
    const code = await call(server, 'GET', '/api/mappings/customers/transform-code', {
      token: tenant.admin.token,
    });
    expect(code.status, JSON.stringify(code.body)).toBe(200);
    const [row] = await source.sql(`select * from (${code.body.sql}) t where customer_id = '3'`);
    expect(row).toMatchObject({ loyalty_points: 30, tier: 'gold' });
  });
});

/*
 * Types the field cannot take although the names agree: a jsonb column named like the date field,
 * and the source's own types (a domain over jsonb, an enum, a domain over integer), which discovery
 * describes from the source's catalog. Discovery over PostgreSQL, read through REST.
 */
describe('discovery over columns PostgreSQL cannot cast to the field', () => {
  it('suggests no jsonb column for a date field, holds user types to their catalog, and the SQL runs', async () => {
    await source.sql(`create schema typed;
       create type typed.member_tier as enum ('gold', 'silver', 'bronze');
       create domain typed.birth_json as jsonb;
       create domain typed.visit_count as integer check (value >= 0);
       create table typed.members (id integer primary key, email text, signup_date jsonb,
         birthday typed.birth_json, tier typed.member_tier, visits typed.visit_count, created bigint);
       insert into typed.members
         select g, 'member' || g || '@example.com',
                jsonb_build_object('date', (date '2024-01-01' + g)::text, 'channel', 'web'),
                jsonb_build_object('day', 1 + g % 28, 'month', 1 + g % 12),
                (array['gold', 'silver', 'bronze'])[1 + g % 3]::typed.member_tier, g * 10,
                1704067200 + g * 86400
           from generate_series(1, 30) g;`);
    const other = await createTenant(server);
    await createWorkspace(server, other.admin.token, {
      name: unique('dllmt'),
      source_config: pgConfig(source.name, { schemas: ['typed'] }),
      target_schema: {
        name: 'members',
        tables: [
          {
            name: 'members',
            primary_key: ['member_id'],
            columns: [
              { name: 'member_id', type: 'text', nullable: false },
              { name: 'email', type: 'text' },
              { name: 'signup_date', type: 'date' },
              { name: 'date_of_birth', type: 'date' },
              { name: 'tier', type: 'text' },
              { name: 'visits', type: 'integer' },
              { name: 'created_at', type: 'timestamptz' },
            ],
          },
        ],
      },
    });
    const params = await call(server, 'POST', '/api/admin/llm-parameters', {
      token: other.admin.token,
      body: { base_url: llmUrl, model: 'test-model', monthly_budget_usd: 100 },
    });
    expect(params.status, JSON.stringify(params.body)).toBe(200);
    // The model leaves signup_date to the offline matcher and gives date_of_birth the jsonb domain.
    llm.queue.push({
      content: JSON.stringify({
        primary_table: 'typed.members',
        mappings: [
          { target_field: 'member_id', source_field: 'typed.members.id', confidence: 0.97 },
          { target_field: 'email', source_field: 'typed.members.email', confidence: 0.99 },
          { target_field: 'date_of_birth', source_field: 'typed.members.birthday', confidence: 0.95 },
          { target_field: 'tier', source_field: 'typed.members.tier', confidence: 0.9 },
          { target_field: 'visits', source_field: 'typed.members.visits', confidence: 0.9 },
        ],
      }),
    });
    const events = await discover(other.admin.token);
    expect(events.at(-1), JSON.stringify(events.at(-1))).toMatchObject({
      type: 'completed',
      summary: { llm_calls: 1, llm_fallbacks: 0 },
    });
    const suggestions = Object.fromEntries(
      events.flatMap((e) => (e.type === 'suggestion' ? [[e.target_field, e]] : [])),
    );
    expect(suggestions.signup_date).toBeUndefined();
    expect(suggestions.date_of_birth).toBeUndefined();
    // An enum casts to text and a domain over integer is an integer: the catalog says so, not the name.
    expect(suggestions.tier).toMatchObject({ source_field: 'typed.members.tier', matched_by: 'openai' });
    expect(suggestions.visits).toMatchObject({ source_field: 'typed.members.visits', matched_by: 'openai' });
    // No cast from bigint to timestamptz either, but discovery converts epoch seconds with to_timestamp().
    expect(suggestions.created_at).toMatchObject({
      source_field: 'typed.members.created',
      cleaning: { kind: 'epoch_seconds', share: 1 },
    });
    const refused = events.filter((e) => e.type === 'progress' && e.step === 'llm_pick_refused');
    expect(refused).toEqual([
      expect.objectContaining({
        table: 'members',
        reason: 'incompatible_type',
        message:
          'The model proposed typed.members.birthday (typed.birth_json) for date field date_of_birth of members: ' +
          'incompatible types, no cast exists; left without a suggestion: the offline matcher has none',
      }),
    ]);

    const mapping = await call(server, 'GET', '/api/mappings/members', { token: other.admin.token });
    expect(mapping.status, JSON.stringify(mapping.body)).toBe(200);
    const connected = (mapping.body.connections as { source_field: string }[]).map((c) => c.source_field);
    const offered = (mapping.body.ambiguities as { candidates: { source_field: string }[] }[]).flatMap((a) =>
      a.candidates.map((c) => c.source_field),
    );
    for (const column of ['typed.members.signup_date', 'typed.members.birthday']) {
      expect(connected).not.toContain(column);
      expect(offered).not.toContain(column);
    }

    // The generated SQL runs: no jsonb is cast to a date.
    const code = await call(server, 'GET', '/api/mappings/members/transform-code', {
      token: other.admin.token,
    });
    expect(code.status, JSON.stringify(code.body)).toBe(200);
    const rows = await source.sql(`select * from (${code.body.sql}) t order by visits`);
    expect(rows).toHaveLength(30);
    expect(rows[2]).toMatchObject({
      member_id: '3',
      email: 'member3@example.com',
      signup_date: null,
      date_of_birth: null,
      tier: 'gold',
      visits: 30,
      created_at: new Date('2024-01-04T00:00:00Z'),
    });
  });
});
