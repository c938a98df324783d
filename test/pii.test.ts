import { readFileSync } from 'node:fs';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { fakeOpenAi } from './helpers/fake-openai.ts';
import {
  bindCall,
  call,
  createTenant,
  createWorkspace,
  superAdminToken,
  unique,
  type Tenant,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { demoSchemaSql, demoSourceStatements } from '../seeds/demo-source/generate.ts';

/*
 * What leaves the process: the demo shop's data in a scratch PostgreSQL source, discovery in openai
 * mode against a local OpenAI-compatible server whose requests are recorded and scanned for every
 * personal value of the demo (names, e-mails, phones, postal codes, birth dates, identifiers); the
 * sample-value and preview routes mask the same columns. Then mask_pii_in_samples off changes both.
 */
const source = scratchDatabase('pii');
const llm = fakeOpenAi({ model: 'test-model', whenEmpty: () => ({ content: '{"mappings": []}' }) });
const customer360 = JSON.parse(
  readFileSync(new URL('../seeds/schemas/customer-360.json', import.meta.url), 'utf8'),
);

let server: TestServer;
let tenant: Tenant;
let superAdmin: string;
let workspace: string;
/** Every personal value of the demo source, as the warehouse gives it as text. */
let personal: Set<string>;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

async function discoverAll(): Promise<unknown[]> {
  const res = await fetch(`${server.url}/api/workspaces/discover`, {
    method: 'POST',
    headers: { authorization: `Bearer ${tenant.admin.token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ target_tables: ['customers'] }),
  });
  expect(res.headers.get('content-type')).toMatch(/text\/event-stream/);
  const text = await res.text();
  const events = text
    .split('\n')
    .filter((l) => l.startsWith('data: '))
    .map((l) => JSON.parse(l.slice(6)));
  expect(events.at(-1), JSON.stringify(events.at(-1))).toMatchObject({ type: 'completed' });
  return events;
}

/** The personal values found in what was sent to the endpoint, as JSON strings of the prompt. */
function leaked(from: number): string[] {
  const sent = llm.requests
    .slice(from)
    .flatMap((r) => (r.body.messages as { content: string }[]).map((m) => m.content))
    .join('\n');
  return [...personal].filter((v) => sent.includes(JSON.stringify(v)));
}

beforeAll(async () => {
  await source.create();
  await source.sql(demoSchemaSql());
  for (const statement of demoSourceStatements()) await source.sql(statement);
  // Names in scripts without case (and with combining marks): letters all the same.
  await source.sql(`update shop.customers set last_name = (array['山田太郎', 'محمد', 'कुमार', 'ישראלי', 'สมชาย'])[customer_id]
    where customer_id <= 5`);
  const client = new pg.Client({ connectionString: source.url });
  await client.connect();
  const { rows } = await client.query(`
    select v from (
      select unnest(array[email, first_name, last_name, phone, postal_code, birth_date::text]) as v
        from shop.customers
      union all
      select unnest(array[contact_id, email, full_name, phone]) from shop.crm_contacts
      union all
      select unnest(array[session_id, anonymous_id]) from shop.web_events
    ) as p where v is not null and length(v) >= 3`);
  // Surrogate integer keys (customer_id 119) are not told apart from any other number: left out.
  await client.end();
  personal = new Set(rows.map((r) => String(r.v)));
  expect(personal.size).toBeGreaterThan(3000);

  const url = await llm.start();
  server = await startTestServer();
  tenant = await createTenant(server);
  superAdmin = await superAdminToken(server);
  workspace = unique('pii');
  await createWorkspace(server, tenant.admin.token, {
    name: workspace,
    source_config: pgConfig(source.name, { schemas: ['shop'] }),
    target_schema: customer360,
  });
  const params = await api('POST', '/api/admin/llm-parameters', {
    body: {
      base_url: url,
      model: 'test-model',
      monthly_budget_usd: 1000,
    },
  });
  expect(params.status, JSON.stringify(params.body)).toBe(200);
  const mode = await call(server, 'POST', '/api/admin/set-llm-mode', {
    token: superAdmin,
    body: { mode: 'openai' },
  });
  expect(mode.status).toBe(200);
}, 120_000);

afterAll(async () => {
  await call(server, 'POST', '/api/admin/set-llm-mode', { token: superAdmin, body: { mode: 'offline' } });
  await server?.close();
  await llm.close();
  await source.drop();
});

describe('mask_pii_in_samples', () => {
  it('on (the default): no personal value of the demo reaches the LLM; prompts carry patterns and statistics', async () => {
    const from = llm.requests.length;
    await discoverAll();
    expect(llm.requests.length).toBeGreaterThan(from);
    expect(leaked(from)).toEqual([]);
    const user = JSON.parse(llm.requests.at(-1)!.body.messages[1].content);
    const customers = user.source_tables.find((t: { name: string }) => t.name === 'shop.customers');
    const email = customers.columns.find((c: { name: string }) => c.name === 'email');
    expect(email).toMatchObject({
      personal: true,
      patterns: expect.arrayContaining([expect.objectContaining({ pattern: 'email' })]),
    });
    expect(email).toHaveProperty('null_rate');
    expect(email.samples).toBeUndefined();
    // Columns that are not personal still show samples.
    const optIn = customers.columns.find((c: { name: string }) => c.name === 'marketing_opt_in');
    expect(optIn?.samples?.length).toBeGreaterThan(0);
  });

  it('on: sample values and previews show the shape of personal values, not the values', async () => {
    const sample = await api('GET', '/api/sources/sample-values/customers/email', { query: { limit: 50 } });
    expect(sample.status, JSON.stringify(sample.body)).toBe(200);
    expect(sample.body.masked).toBe(true);
    expect(sample.body.values.length).toBeGreaterThan(0);
    for (const v of sample.body.values) {
      expect(personal.has(v.value)).toBe(false);
      expect(v.value).toMatch(/^[aA9._%+-]+@[aA9.-]+$/);
    }
    const names = await api('GET', '/api/sources/sample-values/customers/last_name', {
      query: { limit: 1000 },
    });
    expect(names.body.masked).toBe(true);
    const lastNames = names.body.values.map((v: { value: string }) => v.value);
    expect(lastNames.some((v: string) => personal.has(v))).toBe(false);
    expect(lastNames).toEqual(expect.arrayContaining(['aaaa', 'aaaaa', 'Aaaaa']));
    expect(lastNames.join('').replace(/[aA]/g, '')).not.toMatch(/\p{L}|\p{M}/u);
    const status = await api('GET', '/api/sources/sample-values/orders/status');
    expect(status.body.masked).toBe(false);
    expect(status.body.values.map((v: { value: string }) => v.value)).toContain('shipped');

    const preview = await api('POST', '/api/mappings/customers/preview-transformation', {
      body: { limit: 20 },
    });
    expect(preview.status, JSON.stringify(preview.body)).toBe(200);
    expect(preview.body.masked_columns).toEqual(expect.arrayContaining(['email', 'first_name', 'last_name']));
    const shown = JSON.stringify(preview.body.rows);
    expect([...personal].filter((v) => v.length >= 5 && shown.includes(JSON.stringify(v)))).toEqual([]);
  });

  it('off: the prompt carries sample values of personal columns, and the routes show them', async () => {
    const off = await api('PUT', '/api/workspaces/admin-settings', {
      body: {
        workspace_name: workspace,
        mask_pii_in_samples: false,
      },
    });
    expect(off.status, JSON.stringify(off.body)).toBe(200);
    try {
      const from = llm.requests.length;
      await discoverAll();
      expect(leaked(from).length).toBeGreaterThan(0);
      const sample = await api('GET', '/api/sources/sample-values/customers/email');
      expect(sample.body.masked).toBe(false);
      expect(sample.body.values.every((v: { value: string }) => personal.has(v.value))).toBe(true);
    } finally {
      await api('PUT', '/api/workspaces/admin-settings', {
        body: {
          workspace_name: workspace,
          mask_pii_in_samples: true,
        },
      });
    }
  });
});
