import { createTRPCClient, httpLink, httpSubscriptionLink, splitLink } from '@trpc/client';
import { EventSource } from 'eventsource';
import { createParser } from 'eventsource-parser';
import superjson from 'superjson';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { fakeOpenAi } from './helpers/fake-openai.ts';
import {
  call,
  createTenant,
  createWorkspace,
  superAdminToken,
  unique,
  until,
  type Tenant,
  type TestUser,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import type { AppRouter } from '../src/trpc/router.ts';
import type { DiscoveryEvent } from '../src/modules/discovery/discovery.schemas.ts';
import { planMapping, proposeJoin } from '../src/modules/discovery/discovery-plan.ts';
import type { IntrospectedTable } from '../src/warehouse/warehouse.ts';

/*
 * The discovery agent over a real PostgreSQL source: the REST event stream read with a real SSE
 * parser, the tRPC subscription through @trpc/client, cancel, disconnect, the per-workspace lock, and
 * openai mode against a local OpenAI-compatible server (valid, malformed, budget spent).
 */
const source = scratchDatabase('disc');

const sourceConfig = (schemas: string[], tables?: string[]) =>
  pgConfig(source.name, { schemas, ...(tables ? { tables } : {}) });

const targetSchema = {
  name: 'c360',
  tables: [
    {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'text', nullable: false, description: 'Identifier of the customer' },
        { name: 'email', type: 'text' },
        { name: 'first_name', type: 'text' },
        { name: 'last_name', type: 'text' },
        { name: 'phone', type: 'text' },
        { name: 'city', type: 'text' },
        { name: 'country_code', type: 'text' },
        { name: 'loyalty_points', type: 'integer', description: 'Points balance in the loyalty program' },
      ],
    },
    {
      name: 'orders',
      primary_key: ['order_id'],
      columns: [
        { name: 'order_id', type: 'text', nullable: false },
        { name: 'customer_id', type: 'text' },
        { name: 'order_total', type: 'numeric' },
        { name: 'ordered_at', type: 'timestamptz' },
      ],
    },
  ],
};

let server: TestServer;
let tenant: Tenant;
let viewer: TestUser;
let superAdmin: string;

// ---------------------------------------------------------------- a local OpenAI-compatible server

// The model named in answers is the one the workspace's parameters ask for.
const llm = fakeOpenAi({ model: 'test-model' });
const { queue: llmQueue, requests: llmRequests } = llm;
let llmUrl: string;

// ---------------------------------------------------------------- helpers

/** A workspace of the tenant's admin, selected, over the scratch source and the target schema above. */
async function workspaceFor(
  t: Tenant,
  options: { schemas?: string[]; tables?: string[] } = {},
  on: TestServer = server,
) {
  return createWorkspace(on, t.admin.token, {
    name: unique('disc'),
    source_config: sourceConfig(options.schemas ?? ['crm'], options.tables),
    target_schema: targetSchema,
  });
}

async function select(user: TestUser, workspace: string) {
  const res = await call(server, 'POST', '/api/workspaces/select', {
    token: user.token,
    body: { workspace_name: workspace },
  });
  expect(res.status).toBe(200);
}

/**
 * POST /api/workspaces/discover read as a client does: fetch, then the byte stream through
 * eventsource-parser. `onEvent` may return true to stop reading (the connection is then closed).
 */
async function stream(
  token: string,
  body: unknown = {},
  onEvent: (e: DiscoveryEvent, ids: string[]) => boolean | void | Promise<boolean | void> = () => {},
  on: TestServer = server,
  headers: Record<string, string> = {},
) {
  const controller = new AbortController();
  const res = await fetch(`${on.url}/api/workspaces/discover`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
    signal: controller.signal,
  });
  if (!res.headers.get('content-type')?.startsWith('text/event-stream'))
    return {
      status: res.status,
      error: await res.json(),
      events: [] as DiscoveryEvent[],
      ids: [],
      names: [],
      comments: [],
    };
  const events: DiscoveryEvent[] = [];
  const ids: string[] = [];
  const names: string[] = [];
  const comments: string[] = [];
  let stop = false;
  const pending: DiscoveryEvent[] = [];
  const parser = createParser({
    onEvent: (message) => {
      ids.push(message.id ?? '');
      names.push(message.event ?? '');
      pending.push(JSON.parse(message.data));
    },
    onComment: (comment) => comments.push(comment),
  });
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  try {
    while (!stop) {
      const { done, value } = await reader.read();
      if (done) break;
      parser.feed(value);
      while (pending.length && !stop) {
        const e = pending.shift()!;
        events.push(e);
        if (await onEvent(e, ids)) stop = true;
      }
    }
  } finally {
    if (stop) controller.abort();
  }
  return { status: res.status, error: null, events, ids, names, comments };
}

async function runRow(runId: string) {
  const [row] = await server.deps.orm.em
    .fork()
    .getConnection()
    .execute('select status, reason, summary, cancel_requested_at from discovery_runs where id = ?', [runId]);
  return row;
}

function trpc(token: string, on: TestServer = server) {
  return createTRPCClient<AppRouter>({
    links: [
      splitLink({
        condition: (op) => op.type === 'subscription',
        true: httpSubscriptionLink({
          url: `${on.url}/trpc`,
          transformer: superjson,
          EventSource,
          eventSourceOptions: {
            fetch: (input, init) =>
              fetch(input, { ...init, headers: { ...init?.headers, authorization: `Bearer ${token}` } }),
          },
        }),
        false: httpLink({
          url: `${on.url}/trpc`,
          transformer: superjson,
          headers: { authorization: `Bearer ${token}` },
        }),
      }),
    ],
  });
}

// ---------------------------------------------------------------- setup

beforeAll(async () => {
  await source.create();
  await source.sql(`create schema crm; create schema slow;
     create table crm.customers (id integer primary key, first_name text, last_name text, email text,
       phone text, city text, country text, created_at timestamptz default now());
     create table crm.orders (id integer primary key, customer_id integer references crm.customers (id),
       total numeric(10,2), ordered_at timestamptz);
     create table crm.loyalty (customer_id integer primary key, member_no text, points_balance integer);
     insert into crm.customers (id, first_name, last_name, email, phone, city, country)
       select g, 'name' || g, 'last' || g, 'user' || g || '@example.com', '+1 415 555 ' || lpad(g::text, 4, '0'),
              (array['Paris','Berlin','Austin'])[1 + g % 3], (array['FR','DE','US'])[1 + g % 3]
         from generate_series(1, 40) g;
     insert into crm.orders select g, 1 + g % 40, g * 1.5, now() - g * interval '1 day' from generate_series(1, 80) g;
     insert into crm.loyalty select g, 'M' || g, g * 10 from generate_series(1, 40) g;
     -- Slow relations: each profile of one takes about a second, so a run can be caught mid-way.
     create table slow.customers (id integer primary key, email text);
     insert into slow.customers values (1, 'a@b.co');
     ${[1, 2, 3, 4, 5, 6]
       .map(
         (i) =>
           `create view slow.zz_wait_${i} as select g as id, pg_sleep(0.25)::text as nap from generate_series(1, 4) g;`,
       )
       .join('\n')}`);
  llmUrl = await llm.start();

  server = await startTestServer();
  tenant = await createTenant(server);
  viewer = await tenant.addUser(['viewer']);
  superAdmin = await superAdminToken(server);
});

afterAll(async () => {
  await server?.close();
  await llm.close();
  await source.drop();
});

// ---------------------------------------------------------------- the agent

describe('POST /api/workspaces/discover (REST event stream)', () => {
  it('streams the steps as SSE and writes suggestions into the mappings', async () => {
    await workspaceFor(tenant);
    const { status, events, ids } = await stream(tenant.admin.token);
    expect(status).toBe(200);
    expect(events.map((e) => e.seq)).toEqual(events.map((_, i) => i + 1));
    expect(ids).toEqual(events.map((e) => `${(events[0] as { run_id: string }).run_id}:${e.seq}`));
    expect(events[0]).toMatchObject({
      type: 'started',
      mode: 'offline',
      target_tables: ['customers', 'orders'],
    });
    expect(events.at(-1)!.type).toBe('completed');

    const profiled = events.filter((e) => e.type === 'table_profiled');
    expect(profiled.map((e) => e.table).sort()).toEqual(['crm.customers', 'crm.loyalty', 'crm.orders']);
    const customers = profiled.find((e) => e.table === 'crm.customers')!;
    expect(customers.rows_profiled).toBe(40);
    const email = customers.columns.find((c) => c.name === 'email')!;
    expect(email).toMatchObject({ null_rate: 0, distinct_ratio: 1 });
    expect(email.patterns[0]).toMatchObject({ pattern: 'email' });
    expect(customers.columns.find((c) => c.name === 'created_at')).toBeTruthy();

    const suggestions = events.filter((e) => e.type === 'suggestion');
    const pick = (table: string, field: string) =>
      suggestions.find((s) => s.target_table === table && s.target_field === field)?.source_field;
    expect(pick('customers', 'email')).toBe('crm.customers.email');
    expect(pick('customers', 'first_name')).toBe('crm.customers.first_name');
    expect(pick('customers', 'customer_id')).toBe('crm.customers.id');
    expect(pick('orders', 'order_id')).toBe('crm.orders.id');
    expect(pick('orders', 'ordered_at')).toBe('crm.orders.ordered_at');
    for (const s of suggestions) {
      expect(s.confidence).toBeGreaterThanOrEqual(0.5);
      expect(s.status).toBe('suggested');
    }

    const completed = events.at(-1) as Extract<DiscoveryEvent, { type: 'completed' }>;
    expect(completed.summary).toMatchObject({
      tables: 3,
      target_tables: 2,
      fields_suggested: suggestions.length,
      ambiguities: events.filter((e) => e.type === 'ambiguity').length,
      llm_calls: 0,
    });
    expect(completed.summary.duration_ms).toBeGreaterThanOrEqual(0);
    expect((await runRow(completed.run_id)).status).toBe('completed');

    // The mapping holds the suggestions, the primary table, and a join where one is needed.
    const mapping = await call(server, 'GET', '/api/mappings/customers', { token: tenant.admin.token });
    expect(mapping.status, JSON.stringify(mapping.body)).toBe(200);
    const connections = mapping.body.connections as {
      source_field: string;
      target_field: string;
      status: string;
      confidence: number;
    }[];
    expect(connections.find((c) => c.target_field === 'email')).toMatchObject({
      source_field: 'crm.customers.email',
      status: 'suggested',
    });
    expect(mapping.body.tables['crm.customers']).toMatchObject({ relationship: 'primary' });
    const fromLoyalty = connections.find((c) => c.source_field.startsWith('crm.loyalty.'));
    if (fromLoyalty)
      expect(mapping.body.tables['crm.loyalty']).toMatchObject({
        relationship: 'join',
        join_on: '"crm"."customers"."id" = "crm"."loyalty"."customer_id"',
      });
  });

  it('keeps confirmed connections on a second run', async () => {
    const name = await workspaceFor(tenant);
    expect((await stream(tenant.admin.token)).events.at(-1)!.type).toBe('completed');
    // The user decides that the phone column feeds city (odd, but theirs to decide).
    const confirm = await call(server, 'POST', '/api/mappings/customers/connection', {
      token: tenant.admin.token,
      body: {
        connection: { source_field: 'crm.customers.phone', target_field: 'city', status: 'confirmed' },
      },
    });
    expect(confirm.status, JSON.stringify(confirm.body)).toBe(200);
    const again = await stream(tenant.admin.token);
    expect(again.events.at(-1)!.type).toBe('completed');
    expect(
      again.events.some(
        (e) => e.type === 'suggestion' && e.target_field === 'city' && e.target_table === 'customers',
      ),
    ).toBe(false);
    const mapping = await call(server, 'GET', '/api/mappings/customers', { token: tenant.admin.token });
    const city = mapping.body.connections.filter((c: { target_field: string }) => c.target_field === 'city');
    expect(city).toEqual([
      expect.objectContaining({ source_field: 'crm.customers.phone', status: 'confirmed' }),
    ]);
    expect(name).toBeTruthy();
  });

  it('profiles only the tables asked for and matches only the target tables asked for', async () => {
    await workspaceFor(tenant);
    const { events } = await stream(tenant.admin.token, {
      tables: ['customers'],
      target_tables: ['customers'],
    });
    expect(events.filter((e) => e.type === 'table_profiled').map((e) => e.table)).toEqual(['crm.customers']);
    expect(events[0]).toMatchObject({ target_tables: ['customers'] });
    expect(events.at(-1)).toMatchObject({ type: 'completed', summary: { tables: 1, target_tables: 1 } });
  });

  it('answers 401, 403, 400 and 409 before streaming, as JSON', async () => {
    await workspaceFor(tenant);
    const anonymous = await call(server, 'POST', '/api/workspaces/discover', { body: {} });
    expect(anonymous.status).toBe(401);
    expect(anonymous.body.code).toBe('UNAUTHORIZED');
    const ws = await workspaceFor(tenant);
    await select(viewer, ws);
    const refused = await call(server, 'POST', '/api/workspaces/discover', { token: viewer.token, body: {} });
    expect(refused.status).toBe(403);
    const bad = await call(server, 'POST', '/api/workspaces/discover', {
      token: tenant.admin.token,
      body: { tables: 'customers' },
    });
    expect(bad.status).toBe(400);
    expect(bad.body.code).toBe('BAD_REQUEST');
    const unknownTarget = await call(server, 'POST', '/api/workspaces/discover', {
      token: tenant.admin.token,
      body: { target_tables: ['nope'] },
    });
    expect(unknownTarget.status).toBe(400);
    expect(unknownTarget.body.message).toMatch(/no table nope/);
    const malformed = await call(server, 'POST', '/api/workspaces/discover', {
      token: tenant.admin.token,
      body: '{"tables": [',
    });
    expect(malformed.status).toBe(400);
    const noWorkspace = await createTenant(server);
    const none = await call(server, 'POST', '/api/workspaces/discover', {
      token: noWorkspace.admin.token,
      body: {},
    });
    expect(none.status).toBe(409);
    expect(none.body.reason).toBe('NO_WORKSPACE_SELECTED');
  });

  it('refuses a second run for the same workspace with 409 while one is running', async () => {
    await workspaceFor(tenant, { schemas: ['slow'] });
    let conflict: Awaited<ReturnType<typeof call>> | undefined;
    const first = await stream(tenant.admin.token, {}, async (e) => {
      if (e.type !== 'table_profiled' || conflict) return;
      conflict = await call(server, 'POST', '/api/workspaces/discover', {
        token: tenant.admin.token,
        body: {},
      });
      await call(server, 'POST', '/api/workspaces/discover/cancel', { token: tenant.admin.token });
    });
    expect(conflict!.status, String(conflict!.body).slice(0, 3000)).toBe(409);
    expect(conflict!.body).toMatchObject({ code: 'CONFLICT', reason: 'DISCOVERY_RUNNING' });
    expect(first.events.at(-1)!.type).toBe('cancelled');
    // The lock is released with the run: the next one starts.
    const next = await stream(tenant.admin.token, { tables: ['customers'] });
    expect(next.events.at(-1)!.type).toBe('completed');
  });

  it('caps the event streams one user holds open (429 with retry_after and Retry-After), and frees the slot at the end', async () => {
    // Its own server (in embedded mode its own database too), so its own organization.
    const capped = await startTestServer({ SSE_MAX_STREAMS_PER_USER: '1' });
    try {
      const owner = await createTenant(capped);
      await workspaceFor(owner, { schemas: ['slow'] }, capped);
      let refused: Awaited<ReturnType<typeof call>> | undefined;
      const first = await stream(
        owner.admin.token,
        {},
        async (e) => {
          if (e.type !== 'table_profiled' || refused) return;
          refused = await call(capped, 'POST', '/api/workspaces/discover', {
            token: owner.admin.token,
            body: {},
          });
          await call(capped, 'POST', '/api/workspaces/discover/cancel', { token: owner.admin.token });
        },
        capped,
      );
      expect(refused!.status).toBe(429);
      expect(refused!.body).toMatchObject({ code: 'TOO_MANY_REQUESTS', retry_after: 5 });
      expect(refused!.headers.get('retry-after')).toBe('5');
      expect(first.events.at(-1)!.type).toBe('cancelled');
      const next = await stream(owner.admin.token, { tables: ['customers'] }, undefined, capped);
      expect(next.events.at(-1)!.type).toBe('completed');
    } finally {
      await capped.close();
    }
  });

  it('counts tRPC subscriptions in the same cap as REST streams', async () => {
    const capped = await startTestServer({ SSE_MAX_STREAMS_PER_USER: '1' });
    try {
      const owner = await createTenant(capped);
      await workspaceFor(owner, { schemas: ['slow'] }, capped);
      const client = trpc(owner.admin.token, capped);
      let refused: Awaited<ReturnType<typeof call>> | undefined;
      let last: string | undefined;
      await new Promise<void>((resolve, reject) => {
        const sub = client.discovery.discover.subscribe(
          {},
          {
            onData: async ({ data: e }) => {
              last = e.type;
              if (e.type === 'table_profiled' && !refused) {
                // Another workspace, so only the cap (not its one run at a time) can refuse the stream.
                await workspaceFor(owner, { tables: ['customers'] }, capped);
                refused = await call(capped, 'POST', '/api/workspaces/discover', {
                  token: owner.admin.token,
                  body: {},
                });
              }
              if (e.type === 'completed' || e.type === 'cancelled' || e.type === 'error') {
                sub.unsubscribe();
                resolve();
              }
            },
            onError: reject,
          },
        );
      });
      // The subscription held the caller's one slot: the REST stream was refused.
      expect(refused!.status).toBe(429);
      expect(refused!.headers.get('retry-after')).toBe('5');
      expect(last).toBe('completed');
      // Its end frees the slot: the server lets it go as the subscription closes, which may be just
      // after the client read the last event (a client told 429 retries after Retry-After).
      const next = await until(
        'the slot freed by the subscription',
        () => stream(owner.admin.token, { tables: ['customers'] }, undefined, capped),
        (s) => s.status !== 429,
        10_000,
      );
      expect(next.events.at(-1)!.type).toBe('completed');
    } finally {
      await capped.close();
    }
  });

  it('stops at the next step when cancelled and keeps what was written consistent', async () => {
    await workspaceFor(tenant, { schemas: ['slow'] });
    let cancel: Awaited<ReturnType<typeof call>> | undefined;
    const { events } = await stream(tenant.admin.token, {}, async (e) => {
      if (e.type === 'table_profiled' && !cancel)
        cancel = await call(server, 'POST', '/api/workspaces/discover/cancel', { token: tenant.admin.token });
    });
    expect(cancel!.status).toBe(200);
    expect(cancel!.body).toMatchObject({ cancelled: true, run_ids: [expect.any(String)] });
    const last = events.at(-1)!;
    expect(last.type).toBe('cancelled');
    expect(events.filter((e) => e.type === 'table_profiled').length).toBeLessThan(7);
    expect(events.some((e) => e.type === 'completed' || e.type === 'suggestion')).toBe(false);
    const row = await runRow((events[0] as { run_id: string }).run_id);
    expect(row).toMatchObject({ status: 'cancelled', reason: 'cancel requested' });
    const mappings = await call(server, 'GET', '/api/mappings', { token: tenant.admin.token });
    expect(mappings.body.mappings ?? []).toEqual([]);
    // Nothing running any more: cancel says so.
    const nothing = await call(server, 'POST', '/api/workspaces/discover/cancel', {
      token: tenant.admin.token,
    });
    expect(nothing.body).toMatchObject({ cancelled: false, run_ids: [] });
  });

  it('stops the work when the client disconnects', async () => {
    await workspaceFor(tenant, { schemas: ['slow'] });
    let runId = '';
    const { events } = await stream(tenant.admin.token, {}, (e) => {
      if (e.type === 'started') runId = e.run_id;
      return e.type === 'table_profiled';
    });
    expect(events.at(-1)!.type).toBe('table_profiled');
    const row = await until(
      'discovery run',
      () => runRow(runId),
      (r) => r.status !== 'running',
    );
    expect(row).toMatchObject({ status: 'cancelled', reason: 'the client disconnected' });
    // It stopped well before profiling the six slow views (about a second each).
    expect((row.summary as { duration_ms: number }).duration_ms).toBeLessThan(5000);
    const mappings = await call(server, 'GET', '/api/mappings', { token: tenant.admin.token });
    expect(mappings.body.mappings ?? []).toEqual([]);
  });
});

describe('POST /api/workspaces/discover/cancel', () => {
  it('answers 401 without a token and 403 for a caller outside any organization', async () => {
    expect((await call(server, 'POST', '/api/workspaces/discover/cancel')).status).toBe(401);
    expect(
      (await call(server, 'POST', '/api/workspaces/discover/cancel', { token: superAdmin })).status,
    ).toBe(403);
    const malformed = await call(server, 'POST', '/api/workspaces/discover/cancel', {
      token: tenant.admin.token,
      body: '{',
    });
    expect(malformed.status).toBe(400);
  });
});

describe('discovery as a tRPC subscription', () => {
  it('delivers the same events through httpSubscriptionLink', async () => {
    await workspaceFor(tenant);
    const client = trpc(tenant.admin.token);
    const events: DiscoveryEvent[] = [];
    await new Promise<void>((resolve, reject) => {
      const sub = client.discovery.discover.subscribe(
        { tables: ['customers', 'orders'] },
        {
          onData: ({ data: e }) => {
            events.push(e);
            if (e.type === 'completed' || e.type === 'cancelled' || e.type === 'error') {
              sub.unsubscribe();
              resolve();
            }
          },
          onError: reject,
        },
      );
    });
    expect(events[0].type).toBe('started');
    expect(events.at(-1)!.type).toBe('completed');
    expect(events.filter((e) => e.type === 'table_profiled')).toHaveLength(2);
    expect(events.some((e) => e.type === 'suggestion' && e.source_field === 'crm.customers.email')).toBe(
      true,
    );
    // The rest of the API through the same client (httpLink side of the split).
    const status = await client.discovery.budgetStatus.query({});
    expect(status.period_start).toBeInstanceOf(Date);
  });

  it('an unsubscribe mid-run stops the work', async () => {
    await workspaceFor(tenant, { schemas: ['slow'] });
    const client = trpc(tenant.admin.token);
    let runId = '';
    await new Promise<void>((resolve, reject) => {
      const sub = client.discovery.discover.subscribe(
        {},
        {
          onData: ({ data: e }) => {
            if (e.type === 'started') runId = e.run_id;
            if (e.type === 'table_profiled') {
              sub.unsubscribe();
              resolve();
            }
          },
          onError: reject,
        },
      );
    });
    const row = await until(
      'discovery run',
      () => runRow(runId),
      (r) => r.status !== 'running',
    );
    expect(row).toMatchObject({ status: 'cancelled', reason: 'the client disconnected' });
  });

  it('runs to the end as a mutation and returns the last event', async () => {
    await workspaceFor(tenant);
    const last = await trpc(tenant.admin.token).discovery.run.mutate({ tables: ['customers'] });
    expect(last).toMatchObject({ type: 'completed', summary: { tables: 1 } });
  });
});

// ---------------------------------------------------------------- awkward sources

describe('discovery on sources with keyword names and array columns', () => {
  const target = (tables: unknown[]) => ({ name: 'awkward', tables });
  const customers = (extra: { name: string; type: string }[]) => ({
    name: 'customers',
    primary_key: ['customer_id'],
    columns: [
      { name: 'customer_id', type: 'text', nullable: false },
      { name: 'email', type: 'text' },
      { name: 'country_code', type: 'text' },
      ...extra,
    ],
  });

  /** Discovery over `schemas` of the scratch source, into `target_schema`; then the whole table's preview. */
  async function discoverAndPreview(schemas: string[], target_schema: unknown) {
    await createWorkspace(server, tenant.admin.token, {
      name: unique('disc'),
      source_config: sourceConfig(schemas),
      target_schema,
    });
    const { events } = await stream(tenant.admin.token);
    expect(events.at(-1), JSON.stringify(events.at(-1))).toMatchObject({ type: 'completed' });
    const mapping = await call(server, 'GET', '/api/mappings/customers', { token: tenant.admin.token });
    expect(mapping.status, JSON.stringify(mapping.body)).toBe(200);
    const preview = await call(server, 'POST', '/api/mappings/customers/preview-transformation', {
      token: tenant.admin.token,
      body: { limit: 100 },
    });
    expect(preview.status, JSON.stringify(preview.body)).toBe(200);
    return { events, mapping: mapping.body, rows: preview.body.rows as Record<string, unknown>[] };
  }

  it('quotes reserved-word and mixed-case names in proposed cleanings and joins', async () => {
    // `select` is a reserved word: written bare in an expression, PostgreSQL reads it as the keyword.
    await source.sql(`create schema "select";
      create table "select"."Mixed" ("Id" integer primary key, "Email" text, country text);
      create table "select"."order" ("Id" integer primary key references "select"."Mixed" ("Id"),
        loyalty_points integer);
      insert into "select"."Mixed"
        select g, ' User' || g || '@Example.COM', (array['France', 'Germany', 'United States'])[1 + g % 3]
          from generate_series(1, 30) g;
      insert into "select"."order" select g, g * 10 from generate_series(1, 30) g;`);
    const { mapping, rows } = await discoverAndPreview(
      ['select'],
      target([customers([{ name: 'loyalty_points', type: 'integer' }])]),
    );
    const suggested = Object.fromEntries(
      (mapping.connections as { source_field: string; target_field: string }[]).map((c) => [
        c.target_field,
        c.source_field,
      ]),
    );
    expect(suggested).toMatchObject({
      email: 'select.Mixed.Email',
      country_code: 'select.Mixed.country',
      loyalty_points: 'select.order.loyalty_points',
    });
    expect(mapping.transformations.email).toMatchObject({
      expression: 'lower(trim("select"."Mixed"."Email"))',
      proposed: { kind: 'email_normalised' },
    });
    expect(mapping.transformations.country_code).toMatchObject({ proposed: { kind: 'country_alpha2' } });
    expect(mapping.tables['select.order']).toMatchObject({
      relationship: 'join',
      join_on: '"select"."Mixed"."Id" = "select"."order"."Id"',
    });
    // They run as generated (preview masks personal values: their SQL on the source shows them).
    expect(rows).toHaveLength(30);
    const code = await call(server, 'GET', '/api/mappings/customers/transform-code', {
      token: tenant.admin.token,
    });
    expect(code.status, JSON.stringify(code.body)).toBe(200);
    const python = await call(server, 'POST', '/api/mappings/customers/generate-code', {
      token: tenant.admin.token,
    });
    expect(python.status, JSON.stringify(python.body)).toBe(200);
    const [row] = await source.sql(`select * from (${code.body.sql}) t where customer_id = '3'`);
    expect(row).toEqual({
      customer_id: '3',
      email: 'user3@example.com',
      country_code: 'FR',
      loyalty_points: 30,
    });
  });

  it('leaves out, and says so, tables and columns whose names hold a dot; the rest is discovered', async () => {
    // A name with a dot cannot be told apart from two names in a key: it failed the whole run.
    await source.sql(`create schema dotted;
      create table dotted.customers (id integer primary key, email text, "country.code" text);
      create table dotted."table.with.dots" (k integer, email text);
      insert into dotted.customers select g, 'user' || g || '@example.com', 'FR' from generate_series(1, 30) g;`);
    const { events, mapping } = await discoverAndPreview(['dotted'], target([customers([])]));
    const skipped = events.filter((e) => e.type === 'error' && e.code === 'NAME_WITH_DOT');
    expect(skipped).toEqual([
      expect.objectContaining({
        fatal: false,
        table: 'dotted.customers',
        message: expect.stringMatching(/country\.code/),
      }),
      expect.objectContaining({ fatal: false, table: 'dotted.table.with.dots' }),
    ]);
    const fields = (mapping.connections as { source_field: string }[]).map((c) => c.source_field);
    expect(fields).toContain('dotted.customers.email');
    expect(fields.filter((f) => f.includes('with.dots') || f.includes('country.code'))).toEqual([]);
  });

  it('does not connect an array column to a json or scalar field (no cast exists)', async () => {
    await source.sql(`create schema arr;
      create table arr.customers (id integer primary key, email text, tags text[], scores integer[]);
      insert into arr.customers
        select g, 'user' || g || '@example.com', array['vip', 'tag' || g], array[g, g + 1]
          from generate_series(1, 30) g;`);
    const { mapping, rows } = await discoverAndPreview(
      ['arr'],
      target([
        customers([
          { name: 'tags', type: 'json' },
          { name: 'scores', type: 'integer' },
        ]),
      ]),
    );
    const connections = mapping.connections as { source_field: string; target_field: string }[];
    expect(connections).toContainEqual(
      expect.objectContaining({ source_field: 'arr.customers.email', target_field: 'email' }),
    );
    // PostgreSQL has no cast from text[] to jsonb nor from integer[] to integer.
    expect(connections.filter((c) => ['tags', 'scores'].includes(c.target_field))).toEqual([]);
    expect(rows).toHaveLength(30);
  });
});

// ---------------------------------------------------------------- joins

describe('join proposals', () => {
  const table = (
    name: string,
    columns: string[],
    extra: Partial<IntrospectedTable> = {},
  ): IntrospectedTable => ({
    schema: 's',
    name,
    kind: 'table',
    description: null,
    estimated_rows: null,
    primary_key: [],
    foreign_keys: [],
    columns: columns.map((c, i) => ({
      name: c,
      type: 'text',
      base_type: 'text',
      nullable: true,
      default: null,
      generated: null,
      description: null,
      position: i,
    })),
    ...extra,
  });
  const customers = table('customers', ['id', 'email', 'account_code'], { primary_key: ['id'] });

  it('proposes only joins that keep one row per primary row', () => {
    const orders = table('orders', ['id', 'buyer', 'total'], {
      primary_key: ['id'],
      foreign_keys: [
        { name: 'fk', columns: ['buyer'], references: { schema: 's', table: 'customers', columns: ['id'] } },
      ],
    });
    // Orders refer to customers: one customer has many orders, so joining them would repeat customers.
    expect(proposeJoin(customers, orders)).toBeNull();
    const withFk = table('customers2', ['id', 'profile_id'], {
      primary_key: ['id'],
      foreign_keys: [
        {
          name: 'fk',
          columns: ['profile_id'],
          references: { schema: 's', table: 'profiles', columns: ['pid'] },
        },
      ],
    });
    expect(proposeJoin(withFk, table('profiles', ['pid', 'bio'], { primary_key: ['pid'] }))).toBe(
      '"s"."customers2"."profile_id" = "s"."profiles"."pid"',
    );
    // A one-to-one extension table keyed by the customer.
    const details = table('customer_details', ['customer_id', 'vip'], {
      primary_key: ['customer_id'],
      foreign_keys: [
        {
          name: 'fk',
          columns: ['customer_id'],
          references: { schema: 's', table: 'customers', columns: ['id'] },
        },
      ],
    });
    expect(proposeJoin(customers, details)).toBe(
      '"s"."customers"."id" = "s"."customer_details"."customer_id"',
    );
    expect(
      proposeJoin(
        customers,
        table('Billing Accounts', ['account_code', 'plan'], { primary_key: ['account_code'] }),
      ),
    ).toBe('"s"."customers"."account_code" = "s"."Billing Accounts"."account_code"');
    // The same identifier column that is not the other table's key relates many rows: no join.
    expect(proposeJoin(customers, table('Billing Accounts', ['account_code', 'plan']))).toBeNull();
    // A shared bare `id` relates nothing.
    expect(proposeJoin(customers, table('events', ['id', 'name']))).toBeNull();
  });

  it("prefers the primary table's own column among close candidates", () => {
    const sources = new Map([
      ['s.customers', customers],
      ['s.crm', table('crm', ['email'])],
    ]);
    const plan = planMapping(
      {
        target_table: 't',
        primary_table: 's.customers',
        fields: [
          {
            target_field: 'email',
            candidates: [],
            suggestion: null,
            ambiguity: null,
          },
        ],
        ambiguities: [
          {
            target_field: 'email',
            candidates: [
              { source_field: 's.crm.email', confidence: 0.999 },
              { source_field: 's.customers.email', confidence: 0.998 },
            ],
            reason: 'close',
          },
        ],
      } as never,
      sources,
    );
    expect(plan.connections).toEqual([
      { source_field: 's.customers.email', target_field: 'email', confidence: 0.998 },
    ]);
    expect(plan.ambiguities).toEqual([]);
  });

  it('turns suggestions from a table that cannot be joined into ambiguities', () => {
    const sources = new Map([
      ['s.customers', customers],
      ['s.events', table('events', ['id', 'name'])],
    ]);
    const plan = planMapping(
      {
        target_table: 't',
        primary_table: 's.customers',
        fields: [
          {
            target_field: 'email',
            candidates: [],
            suggestion: {
              source_field: 's.customers.email',
              confidence: 0.9,
              evidence: { name: 1, type: 1, pattern: 1 },
            },
            ambiguity: null,
          },
          {
            target_field: 'last_event',
            candidates: [],
            suggestion: {
              source_field: 's.events.name',
              confidence: 0.6,
              evidence: { name: 1, type: 1, pattern: 0 },
            },
            ambiguity: null,
          },
        ],
        ambiguities: [],
      },
      sources,
    );
    expect(plan.tables).toEqual({ 's.customers': { relationship: 'primary' } });
    expect(plan.connections).toEqual([
      { source_field: 's.customers.email', target_field: 'email', confidence: 0.9 },
    ]);
    expect(plan.ambiguities).toEqual([
      expect.objectContaining({
        target_field: 'last_event',
        reason: expect.stringMatching(/no one-to-one relation/),
      }),
    ]);
  });
});

// ---------------------------------------------------------------- openai mode

describe('openai mode', () => {
  const validAnswer = JSON.stringify({
    primary_table: 'crm.customers',
    mappings: [
      { target_field: 'customer_id', source_field: 'crm.customers.id', confidence: 0.97 },
      { target_field: 'email', source_field: 'crm.customers.email', confidence: 0.99 },
      { target_field: 'first_name', source_field: 'crm.customers.first_name', confidence: 0.95 },
      { target_field: 'loyalty_points', source_field: 'crm.loyalty.points_balance', confidence: 0.9 },
    ],
  });

  it('asks the endpoint with the workspace prompts, meters, falls back on a malformed answer and on a spent budget', async () => {
    const t = await createTenant(server);
    const name = await workspaceFor(t);
    const key = 'sk-test-0123456789abcdef';
    const params = await call(server, 'POST', '/api/admin/llm-parameters', {
      token: t.admin.token,
      body: {
        base_url: llmUrl,
        model: 'test-model',
        api_key: key,
        monthly_budget_usd: 100,
        price_per_1k_tokens: 1,
      },
    });
    expect(params.status, JSON.stringify(params.body)).toBe(200);
    const prompt = await call(server, 'PUT', `/api/workspaces/${name}/system-prompt`, {
      token: t.admin.token,
      body: { prompt: 'Prefer the CRM over the loyalty system. MARKER-SYSTEM' },
    });
    expect(prompt.status, JSON.stringify(prompt.body)).toBe(200);
    const criteria = await call(server, 'POST', `/api/workspaces/${name}/config`, {
      token: t.admin.token,
      body: { success_criteria_prompt: 'Every customer has an e-mail. MARKER-CRITERIA' },
    });
    expect(criteria.status, JSON.stringify(criteria.body)).toBe(200);
    const mode = await call(server, 'POST', '/api/admin/set-llm-mode', {
      token: superAdmin,
      body: { mode: 'openai' },
    });
    expect(mode.body).toMatchObject({ mode: 'openai', previous_mode: 'offline' });
    try {
      llmRequests.length = 0;
      llmQueue.push({ content: validAnswer }, { content: 'Sure! Here are the mappings: customer_id -> id' });
      const { events } = await stream(t.admin.token);
      expect(events[0]).toMatchObject({ type: 'started', mode: 'openai' });
      expect(events.at(-1)).toMatchObject({ type: 'completed', summary: { llm_calls: 2, llm_fallbacks: 1 } });
      expect(llmRequests).toHaveLength(2);
      expect(llmRequests[0].headers.authorization).toBe(`Bearer ${key}`);
      const system = llmRequests[0].body.messages[0].content as string;
      expect(system).toContain('MARKER-SYSTEM');
      expect(system).toContain('MARKER-CRITERIA');
      const user = JSON.parse(llmRequests[0].body.messages[1].content);
      expect(user.source_tables.map((s: { name: string }) => s.name)).toContain('crm.customers');
      expect(user.source_tables[0].columns[0]).toHaveProperty('null_rate');

      const openaiPicks = events.filter((e) => e.type === 'suggestion' && e.target_table === 'customers');
      // Provenance: the fields the model named are labelled openai with the model among their signals;
      // the others (last_name, phone, …) stay offline.
      const named = ['customer_id', 'email', 'first_name', 'loyalty_points'];
      for (const e of openaiPicks)
        if (e.type === 'suggestion')
          expect({ field: e.target_field, by: e.matched_by, model: e.signals.includes('model') }).toEqual({
            field: e.target_field,
            by: named.includes(e.target_field) ? 'openai' : 'offline',
            model: named.includes(e.target_field),
          });
      expect(openaiPicks.some((e) => e.type === 'suggestion' && e.matched_by === 'offline')).toBe(true);
      expect(
        openaiPicks.find((e) => e.type === 'suggestion' && e.target_field === 'loyalty_points'),
      ).toMatchObject({
        source_field: 'crm.loyalty.points_balance',
      });
      const fallback = events.find((e) => e.type === 'progress' && e.step === 'llm_fallback');
      expect(fallback).toMatchObject({ table: 'orders', reason: 'invalid_answer' });
      expect(
        events.some(
          (e) => e.type === 'suggestion' && e.target_table === 'orders' && e.matched_by === 'offline',
        ),
      ).toBe(true);
      // The join the model's pick needs was proposed.
      const mapping = await call(server, 'GET', '/api/mappings/customers', { token: t.admin.token });
      expect(mapping.body.tables['crm.loyalty']).toMatchObject({ relationship: 'join' });

      const spent = await call(server, 'GET', '/api/analytics/budget/status', { token: t.admin.token });
      expect(spent.status).toBe(200);
      expect(spent.body).toMatchObject({
        calls: 2,
        total_tokens: 3000,
        spent_usd: 3,
        remaining_usd: 97,
        exceeded: false,
        llm_mode: 'openai',
      });

      // A budget below what is spent: customers is answered from the llm_responses cache (no call, no
      // cost); orders would need a call and is refused; the endpoint is not called.
      await call(server, 'POST', '/api/admin/llm-parameters', {
        token: t.admin.token,
        body: { monthly_budget_usd: 2 },
      });
      llmRequests.length = 0;
      const poor = await stream(t.admin.token);
      expect(llmRequests).toHaveLength(0);
      const fallbacks = poor.events.filter((e) => e.type === 'progress' && e.step === 'llm_fallback');
      expect(fallbacks).toEqual([
        expect.objectContaining({
          table: 'orders',
          reason: 'budget_exceeded',
          message: expect.stringMatching(/budget/),
        }),
      ]);
      expect(poor.events.at(-1)).toMatchObject({
        type: 'completed',
        summary: { llm_calls: 0, llm_fallbacks: 1, llm_cached: 1, introspection_cached: true },
      });
      const after = await call(server, 'GET', '/api/analytics/budget/status', { token: t.admin.token });
      expect(after.body).toMatchObject({ exceeded: true, remaining_usd: 0, monthly_budget_usd: 2 });

      // With llm_matching off for the organization, discovery stays offline and says so.
      const off = await call(server, 'POST', '/api/admin/feature-settings', {
        token: t.admin.token,
        body: { features: { llm_matching: false } },
      });
      expect(off.status, JSON.stringify(off.body)).toBe(200);
      const offline = await stream(t.admin.token, { tables: ['customers'] });
      expect(offline.events[0]).toMatchObject({ mode: 'offline' });
      expect(offline.events.some((e) => e.type === 'progress' && e.step === 'llm_disabled')).toBe(true);
    } finally {
      await call(server, 'POST', '/api/admin/set-llm-mode', { token: superAdmin, body: { mode: 'offline' } });
    }
  });
});

describe('caches: introspection and llm_responses', () => {
  const answer = JSON.stringify({
    primary_table: 'crm.customers',
    mappings: [{ target_field: 'email', source_field: 'crm.customers.email', confidence: 0.99 }],
  });

  it('serves the second discovery from cache, empties it on a source config change, and obeys the cache switch, TTL and size', async () => {
    const t = await createTenant(server);
    const name = await workspaceFor(t);
    await call(server, 'POST', '/api/admin/llm-parameters', {
      token: t.admin.token,
      body: { base_url: llmUrl, model: 'test-model', monthly_budget_usd: 100 },
    });
    await call(server, 'POST', '/api/admin/set-llm-mode', { token: superAdmin, body: { mode: 'openai' } });
    const run = async () => {
      const { events } = await stream(t.admin.token, { target_tables: ['customers'] });
      const last = events.at(-1);
      expect(last?.type, JSON.stringify(last)).toBe('completed');
      return { events, summary: last?.type === 'completed' ? last.summary : null };
    };
    try {
      llmRequests.length = 0;
      llmQueue.push({ content: answer }, { content: answer }, { content: answer }, { content: answer });
      const first = await run();
      expect(first.summary).toMatchObject({ llm_calls: 1, llm_cached: 0, introspection_cached: false });
      expect(llmRequests).toHaveLength(1);

      const second = await run();
      expect(llmRequests).toHaveLength(1);
      expect(second.summary).toMatchObject({ llm_calls: 0, llm_cached: 1, introspection_cached: true });
      expect(second.events.find((e) => e.type === 'suggestion' && e.target_field === 'email')).toMatchObject({
        source_field: 'crm.customers.email',
        matched_by: 'openai',
      });

      // Saving the source config empties both caches of the workspace.
      const saved = await call(server, 'POST', `/api/workspaces/${name}/config`, {
        token: t.admin.token,
        body: { source_config: sourceConfig(['crm']) },
      });
      expect(saved.status, JSON.stringify(saved.body)).toBe(200);
      const third = await run();
      expect(llmRequests).toHaveLength(2);
      expect(third.summary).toMatchObject({ llm_calls: 1, llm_cached: 0, introspection_cached: false });

      // Switched off in the organization's cache settings: every run calls and introspects again.
      const off = await call(server, 'POST', '/api/admin/cache-settings', {
        token: t.admin.token,
        body: { caches: { llm_responses: { enabled: false }, introspection: { enabled: false } } },
      });
      expect(off.status, JSON.stringify(off.body)).toBe(200);
      const fourth = await run();
      expect(llmRequests).toHaveLength(3);
      expect(fourth.summary).toMatchObject({ llm_calls: 1, llm_cached: 0, introspection_cached: false });

      // Back on: held answers expire at the TTL in force when they are read.
      const settings = (caches: unknown) =>
        call(server, 'POST', '/api/admin/cache-settings', { token: t.admin.token, body: { caches } });
      llmQueue.push({ content: answer }, { content: answer }, { content: answer }, { content: answer });
      expect((await settings({ llm_responses: { enabled: true } })).status).toBe(200);
      expect((await run()).summary).toMatchObject({ llm_calls: 1, llm_cached: 0 });
      expect((await run()).summary).toMatchObject({ llm_calls: 0, llm_cached: 1 });
      expect(llmRequests).toHaveLength(4);
      await settings({ llm_responses: { ttl_seconds: 1 } });
      await new Promise((resolve) => setTimeout(resolve, 1100));
      expect((await run()).summary).toMatchObject({ llm_calls: 1, llm_cached: 0 });
      expect(llmRequests).toHaveLength(5);
      // max_entries 0: nothing is held, whatever the TTL.
      await settings({ llm_responses: { ttl_seconds: 3600, max_entries: 0 } });
      expect((await run()).summary).toMatchObject({ llm_calls: 1, llm_cached: 0 });
      expect((await run()).summary).toMatchObject({ llm_calls: 1, llm_cached: 0 });
      expect(llmRequests).toHaveLength(7);
    } finally {
      llmQueue.length = 0;
      await call(server, 'POST', '/api/admin/set-llm-mode', { token: superAdmin, body: { mode: 'offline' } });
    }
  });
});

describe('openai mode: a hanging endpoint', () => {
  it('costs one timeout: the rest of the run switches to the offline matcher at once, and the stream says so', async () => {
    const t = await createTenant(server);
    await workspaceFor(t);
    const saved = await call(server, 'POST', '/api/admin/llm-parameters', {
      token: t.admin.token,
      body: { base_url: llmUrl, model: 'test-model', timeout_seconds: 1, monthly_budget_usd: 100 },
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    await call(server, 'POST', '/api/admin/set-llm-mode', { token: superAdmin, body: { mode: 'openai' } });
    try {
      llmRequests.length = 0;
      llmQueue.push(
        { content: '{"mappings": []}', delayMs: 5000 },
        { content: '{"mappings": []}', delayMs: 5000 },
      );
      const started = performance.now();
      const { events } = await stream(t.admin.token);
      const took = performance.now() - started;
      expect(llmRequests).toHaveLength(1);
      expect(took).toBeLessThan(4000);
      const fallbacks = events.filter((e) => e.type === 'progress' && e.step === 'llm_fallback');
      expect(fallbacks).toEqual([
        expect.objectContaining({
          table: 'customers',
          reason: 'llm_error',
          message: expect.stringMatching(
            /timed out.*remaining 1 target table\(s\) of this run use the offline matcher/,
          ),
        }),
      ]);
      expect(events.at(-1)).toMatchObject({ type: 'completed', summary: { llm_calls: 0, llm_fallbacks: 1 } });
      expect(events.some((e) => e.type === 'suggestion' && e.target_table === 'orders')).toBe(true);
    } finally {
      llmQueue.length = 0;
      await call(server, 'POST', '/api/admin/set-llm-mode', { token: superAdmin, body: { mode: 'offline' } });
    }
  });
});

describe('GET /api/analytics/budget/status', () => {
  it('reports an untouched budget, and guards', async () => {
    const t = await createTenant(server);
    const res = await call(server, 'GET', '/api/analytics/budget/status', { token: t.admin.token });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      spent_usd: 0,
      calls: 0,
      monthly_budget_usd: 20,
      remaining_usd: 20,
      exceeded: false,
    });
    expect(new Date(res.body.period_start).getUTCDate()).toBe(1);
    expect((await call(server, 'GET', '/api/analytics/budget/status')).status).toBe(401);
    const nobody = await t.addUserWithoutPermissions();
    expect((await call(server, 'GET', '/api/analytics/budget/status', { token: nobody.token })).status).toBe(
      403,
    );
    expect((await call(server, 'GET', '/api/analytics/budget/status', { token: superAdmin })).status).toBe(
      403,
    );
  });
});

// ---------------------------------------------------------------- the stream as a client relies on it

describe('the event stream protocol', () => {
  it('names each event, ids it <run_id>:<seq>, and sends heartbeats at SSE_HEARTBEAT_MS', async () => {
    const beating = await startTestServer({ SSE_HEARTBEAT_MS: '100' });
    try {
      const owner = await createTenant(beating);
      await workspaceFor(owner, { schemas: ['slow'] }, beating);
      const fast = await stream(owner.admin.token, {}, undefined, beating);
      expect(fast.status).toBe(200);
      expect(fast.names).toEqual(fast.events.map((e) => e.type));
      const runId = (fast.events[0] as { run_id: string }).run_id;
      expect(fast.ids).toEqual(fast.events.map((e) => `${runId}:${e.seq}`));
      // The slow views take seconds: several heartbeats went by.
      expect(fast.comments.filter((c) => c.trim() === 'heartbeat').length).toBeGreaterThan(3);
    } finally {
      await beating.close();
    }
    // At the default (15 s) the same few seconds pass without one.
    await workspaceFor(tenant, { schemas: ['slow'] });
    const quiet = await stream(tenant.admin.token);
    expect(quiet.events.at(-1)!.type).toBe('completed');
    expect(quiet.comments).toEqual([]);
  });

  it('Last-Event-ID resumes a stream: the missed events come from the stored run, to its end', async () => {
    await workspaceFor(tenant, { schemas: ['slow'] });
    let resumed: Promise<Awaited<ReturnType<typeof stream>>> | undefined;
    // The first connection reads on; a second one, as after a network cut, resumes from event 1.
    const first = await stream(tenant.admin.token, {}, (_e, ids) => {
      resumed ??= stream(tenant.admin.token, {}, undefined, server, { 'last-event-id': ids[0] });
    });
    const second = await resumed!;
    expect(first.events.at(-1)!.type).toBe('completed');
    expect(second.status).toBe(200);
    expect(second.events).toEqual(first.events.slice(1));
    expect(second.ids).toEqual(first.ids.slice(1));
    // Resumed once the run is over: from any point, up to the last event.
    const late = await stream(tenant.admin.token, {}, undefined, server, { 'last-event-id': first.ids[3] });
    expect(late.events).toEqual(first.events.slice(4));
  });

  it('a client that lost the stream finds how the run ended', async () => {
    await workspaceFor(tenant, { schemas: ['slow'] });
    let lastId = '';
    const cut = await stream(tenant.admin.token, {}, (e, ids) => {
      lastId = ids.at(-1)!;
      return e.type === 'table_profiled';
    });
    const runId = (cut.events[0] as { run_id: string }).run_id;
    await until(
      'discovery run',
      () => runRow(runId),
      (r) => r.status !== 'running',
    );
    const after = await stream(tenant.admin.token, {}, undefined, server, { 'last-event-id': lastId });
    expect(after.events[0].seq).toBe(cut.events.at(-1)!.seq + 1);
    expect(after.events.at(-1)).toMatchObject({ type: 'cancelled', run_id: runId });
    expect((after.events.at(-1) as { message: string }).message).toMatch(/client disconnected/);
  });

  it('refuses a malformed Last-Event-ID (400) and another tenant’s run (404)', async () => {
    const bad = await stream(tenant.admin.token, {}, undefined, server, { 'last-event-id': 'nonsense' });
    expect(bad.status).toBe(400);
    expect(bad.error).toMatchObject({ code: 'BAD_REQUEST', issues: [{ path: ['last_event_id'] }] });
    await workspaceFor(tenant);
    const mine = await stream(tenant.admin.token, { tables: ['customers'] });
    const other = await createTenant(server);
    const foreign = await stream(other.admin.token, {}, undefined, server, { 'last-event-id': mine.ids[0] });
    expect(foreign.status).toBe(404);
    expect(foreign.events).toEqual([]);
  });

  it('the tRPC subscription resumes from lastEventId (tracked events)', async () => {
    await workspaceFor(tenant);
    const full = await stream(tenant.admin.token, { tables: ['customers', 'orders'] });
    const client = trpc(tenant.admin.token);
    const replayed: { id: string; seq: number }[] = [];
    await new Promise<void>((resolve, reject) => {
      const sub = client.discovery.discover.subscribe(
        { lastEventId: full.ids[1] },
        {
          onData: ({ id, data }) => {
            replayed.push({ id, seq: data.seq });
            if (data.type === 'completed') {
              sub.unsubscribe();
              resolve();
            }
          },
          onError: reject,
        },
      );
    });
    expect(replayed.map((r) => r.id)).toEqual(full.ids.slice(2));
  });

  it('cancel answers how each run really ended', async () => {
    await workspaceFor(tenant, { schemas: ['slow'] });
    let cancel: Awaited<ReturnType<typeof call>> | undefined;
    const { events } = await stream(tenant.admin.token, {}, async (e) => {
      if (e.type === 'table_profiled' && !cancel)
        cancel = await call(server, 'POST', '/api/workspaces/discover/cancel', { token: tenant.admin.token });
    });
    const runId = (events[0] as { run_id: string }).run_id;
    // The answer came after the run stopped, and says what the run row says.
    expect((cancel!.body as { runs: unknown }).runs).toEqual([
      { run_id: runId, status: 'cancelled', reason: 'cancel requested' },
    ]);
    expect(((await runRow(runId)) as { status: string }).status).toBe('cancelled');
  });
});
