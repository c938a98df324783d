import { createParser } from 'eventsource-parser';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import type { DiscoveryEvent } from '../src/modules/discovery/discovery.schemas.ts';

/*
 * A person's decisions outrank discovery: rediscovery after manual edits, a version that moves
 * only when the mapping changes, and one "changed since the last commit" for the mapping view,
 * transformation-diff and drift status.
 */
const source = scratchDatabase('decide');

const targetSchema = (extra: { name: string; type: string }[] = []) => ({
  name: 'c360',
  tables: [
    {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'text', nullable: false },
        { name: 'email', type: 'text' },
        { name: 'first_name', type: 'text' },
        { name: 'last_name', type: 'text' },
        { name: 'phone', type: 'text' },
        { name: 'city', type: 'text' },
        { name: 'country_code', type: 'text' },
        ...extra,
      ],
    },
  ],
});

let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  await source.create();
  await source.sql(`create schema crm;
     create table crm.customers (id integer primary key, first_name text, last_name text, email text,
       work_email text, phone text, city text, country text);
     insert into crm.customers
       select g, 'name' || g, 'last' || g, 'user' || g || '@example.com', 'u' || g || '@work.example',
              '+1 415 555 ' || lpad(g::text, 4, '0'), (array['Paris','Berlin','Austin'])[1 + g % 3],
              (array['FR','DE','US'])[1 + g % 3]
         from generate_series(1, 30) g;`);
  server = await startTestServer();
  tenant = await createTenant(server);
});

afterAll(async () => {
  await server?.close();
  await source.drop();
});

const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

const workspace = () =>
  createWorkspace(server, tenant.admin.token, {
    name: unique('decide'),
    source_config: pgConfig(source.name, { schemas: ['crm'] }),
    target_schema: targetSchema(),
  });

async function discover(): Promise<DiscoveryEvent[]> {
  const res = await fetch(`${server.url}/api/workspaces/discover`, {
    method: 'POST',
    headers: { authorization: `Bearer ${tenant.admin.token}`, 'content-type': 'application/json' },
    body: '{}',
  });
  expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
  const events: DiscoveryEvent[] = [];
  const parser = createParser({ onEvent: (m) => events.push(JSON.parse(m.data)) });
  parser.feed(await res.text());
  expect(events.at(-1)?.type, JSON.stringify(events.at(-1))).toBe('completed');
  return events;
}

const mapping = async () => {
  const res = await api('GET', '/api/mappings/customers');
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
};
const diffChanged = async () => {
  const res = await api('POST', '/api/mappings/customers/transformation-diff', { body: { limit: 20 } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.has_changes as boolean;
};
const field = (m: any, target: string) =>
  m.connections.filter((c: { target_field: string }) => c.target_field === target);

describe('rediscovery', () => {
  it('leaves the version as it was when nothing changed, and one definition of "changed" holds', async () => {
    await workspace();
    await discover();
    const first = await mapping();
    expect(first.version).toBe(1);
    expect(first.has_uncommitted_changes).toBe(true);
    expect(await diffChanged()).toBe(true);

    const again = await discover();
    const written = again.find((e) => e.type === 'progress' && e.step === 'written');
    expect(written).toMatchObject({ message: expect.stringContaining('unchanged at version 1') });
    for (let i = 0; i < 2; i++) await discover();
    expect((await mapping()).version).toBe(1);

    const commit = await api('POST', '/api/mappings/customers/commit-transformation', {
      body: {
        message: 'first cut',
      },
    });
    expect(commit.status, JSON.stringify(commit.body)).toBe(200);
    await discover();
    const after = await mapping();
    expect(after.version).toBe(commit.body.version);
    expect(after.has_uncommitted_changes).toBe(false);
    expect(await diffChanged()).toBe(false);

    // An edit and its undo: the mapping equals the commit again, and every view agrees.
    const cityRes = await api('POST', '/api/mappings/customers/transformation', {
      body: {
        transformation: { target_field: 'city', expression: 'upper(crm.customers.city)' },
      },
    });
    expect(cityRes.status, JSON.stringify(cityRes.body)).toBe(200);
    expect(cityRes.body.has_uncommitted_changes).toBe(true);
    expect(await diffChanged()).toBe(true);
    const undo = await api('DELETE', '/api/mappings/customers/transformation/city');
    expect(undo.status, JSON.stringify(undo.body)).toBe(200);
    expect(undo.body.has_uncommitted_changes).toBe(false);
    expect(await diffChanged()).toBe(false);
  });

  it('keeps every decision of a person and says in its events what it left alone', async () => {
    await workspace();
    await discover();
    const found = await mapping();
    const suggested = (t: string) => field(found, t)[0]?.source_field as string | undefined;
    expect(suggested('city')).toBe('crm.customers.city');

    // 1. remove a suggestion, 2. confirm another source, 3. write a transformation, 4. answer "no source".
    expect(
      (
        await api(
          'DELETE',
          `/api/mappings/customers/connection?source_field=crm.customers.city&target_field=city`,
        )
      ).status,
    ).toBe(200);
    const confirm = await api('POST', '/api/mappings/customers/connection', {
      body: {
        connection: {
          source_field: 'crm.customers.last_name',
          target_field: 'first_name',
          status: 'confirmed',
        },
      },
    });
    expect(confirm.status, JSON.stringify(confirm.body)).toBe(200);
    const expr = await api('POST', '/api/mappings/customers/transformation', {
      body: {
        transformation: { target_field: 'country_code', expression: 'upper(crm.customers.country)' },
      },
    });
    expect(expr.status, JSON.stringify(expr.body)).toBe(200);
    // email and work_email both fit email: the person answers that neither feeds it.
    expect(found.ambiguities.map((a: { target_field: string }) => a.target_field)).toEqual(['email']);
    const resolved = await api('POST', '/api/mappings/resolve-ambiguity', {
      body: {
        resolve_input: { table_name: 'customers', target_field: 'email', source_field: null },
      },
    });
    expect(resolved.status, JSON.stringify(resolved.body)).toBe(200);
    expect(resolved.body.decisions).toContainEqual({ target_field: 'email', source_field: null });
    const edited = await mapping();
    expect(edited.decisions).toContainEqual({ target_field: 'city', source_field: 'crm.customers.city' });

    const events = await discover();
    const kept = events.filter((e) => e.type === 'kept');
    expect(kept).toEqual(
      expect.arrayContaining([
        expect.objectContaining({
          target_field: 'city',
          source_field: 'crm.customers.city',
          decision: 'rejected',
        }),
        expect.objectContaining({ target_field: 'first_name', decision: 'confirmed' }),
        expect.objectContaining({ target_field: 'email', decision: 'no_source' }),
        expect.objectContaining({ target_field: 'country_code', decision: 'transformation' }),
      ]),
    );
    expect(events.some((e) => e.type === 'suggestion' && e.target_field === 'city')).toBe(false);
    expect(events.some((e) => e.type === 'suggestion' && e.target_field === 'country_code')).toBe(false);
    const settled = await mapping();
    // The run drops the suggestions a decision overrides; the next run finds nothing to change.
    await discover();
    const after = await mapping();
    expect(after.version).toBe(settled.version);
    expect(field(after, 'city')).toEqual([]);
    expect(field(after, 'first_name')).toEqual([
      expect.objectContaining({ source_field: 'crm.customers.last_name', status: 'confirmed' }),
    ]);
    expect(field(after, 'email')).toEqual([]);
    expect(field(after, 'country_code')).toEqual([]);
    expect(after.transformations.country_code).toMatchObject({ expression: 'upper(crm.customers.country)' });
    expect(after.ambiguities).toEqual([]);

    // A schema change (reconcile) keeps them too.
    const name = (await api('GET', '/api/workspaces/current')).body.name;
    const reconfigured = await api('POST', `/api/workspaces/${name}/config`, {
      body: {
        target_schema: targetSchema([{ name: 'segment', type: 'text' }]),
      },
    });
    expect(reconfigured.status, JSON.stringify(reconfigured.body)).toBe(200);
    await discover();
    const reconciled = await mapping();
    expect(reconciled.decisions).toEqual(after.decisions);
    expect(reconciled.transformations.country_code).toMatchObject({
      expression: 'upper(crm.customers.country)',
    });
    expect(field(reconciled, 'first_name')).toEqual(field(after, 'first_name'));
    expect(field(reconciled, 'email')).toEqual([]);
    expect(reconciled.ambiguities).toEqual([]);
    expect(field(reconciled, 'city')).toEqual([]);

    // Confirming the refused source by hand lifts the refusal.
    const back = await api('POST', '/api/mappings/customers/connection', {
      body: {
        connection: { source_field: 'crm.customers.city', target_field: 'city', status: 'confirmed' },
      },
    });
    expect(back.status).toBe(200);
    expect(back.body.decisions).not.toContainEqual({
      target_field: 'city',
      source_field: 'crm.customers.city',
    });
  });
});
