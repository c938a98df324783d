import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createParser } from 'eventsource-parser';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, createWorkspace, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.ts';
import type { DiscoveryEvent } from '../src/modules/discovery/discovery.schemas.ts';

/*
 * Every suggestion explains itself: discovery over a real PostgreSQL source shaped like the demo
 * (a shop with products, a CRM with contacts, a mailing list whose country column is named "cc"),
 * read through the REST event stream and the mapping view. The target warehouse is a database of its
 * own, reached through a relay that records what dimas sends it.
 */
const source = scratchDatabase('evid');
const target = scratchDatabase('evidt');
const customer360 = JSON.parse(
  readFileSync(join(import.meta.dirname, '..', 'seeds', 'schemas', 'customer-360.json'), 'utf8'),
) as { tables: { name: string }[] };

let server: TestServer;
let tenant: Tenant;
let targetRelay: TcpProxy;

type Suggestion = Extract<DiscoveryEvent, { type: 'suggestion' }>;

async function discover(token: string): Promise<DiscoveryEvent[]> {
  const res = await fetch(`${server.url}/api/workspaces/discover`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ target_tables: ['customers'] }),
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
  await source.sql(`create schema crm; create schema shop;
     create table crm.crm_contacts (contact_id integer primary key, full_name text, email text,
       phone text, cc text, created bigint);
     insert into crm.crm_contacts
       select g, 'Person ' || g, 'p' || g || '@example.com', '+49 30 555 ' || lpad(g::text, 4, '0'),
              (array['DE','FR','US','ES'])[1 + g % 4], 1600000000 + g * 86400
         from generate_series(1, 30) g;
     create table shop.products (id integer primary key, name text, price numeric(10,2));
     insert into shop.products select g, 'Product ' || g, g * 2.5 from generate_series(1, 20) g;`);
  // The target schema exists; its customers table does not yet.
  await target.create();
  await target.sql('create schema c360');
  targetRelay = await startTcpProxy(new URL(target.url), { record: true });
  const relayed = new URL(targetRelay.url);
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: unique('evid'),
    source_config: pgConfig(source.name, { schemas: ['crm', 'shop'] }),
    target_config: pgConfig(target.name, {
      host: relayed.hostname,
      port: Number(relayed.port),
      schemas: ['c360'],
    }),
    target_schema: { name: 'c360', tables: customer360.tables.filter((t) => t.name === 'customers') },
  });
});

afterAll(async () => {
  await server?.close();
  await targetRelay?.close();
  await source.drop();
  await target.drop();
});

describe('every suggestion explains itself', () => {
  it('in the stream and in the mapping, the same evidence; a rerun keeps it and the version', async () => {
    const events = await discover(tenant.admin.token);
    expect(events.at(-1)!.type).toBe('completed');
    const suggestions = events.filter((e): e is Suggestion => e.type === 'suggestion');
    const byField = new Map(suggestions.map((s) => [s.target_field, s]));

    // A name and values that agree: every signal, the value pattern named.
    expect(byField.get('email')).toMatchObject({
      source_field: 'crm.crm_contacts.email',
      matched_by: 'offline',
      evidence: { name: 1, type: 1, pattern: 1, value_pattern: 'email', llm: false, matched_by: 'offline' },
    });
    expect(byField.get('email')!.evidence.signals).toEqual(['name', 'type', 'pattern']);
    // A name that says nothing ("cc"), lifted by ISO country codes in its values.
    const country = byField.get('country_code')!;
    expect(country.source_field).toBe('crm.crm_contacts.cc');
    expect(country.evidence).toMatchObject({ name: 0, value_pattern: 'country_code' });
    expect(country.evidence.signals).toEqual(['type', 'pattern']);
    // Epoch seconds in "created" are a creation time.
    expect(byField.get('created_at')?.source_field).toBe('crm.crm_contacts.created');
    expect(byField.get('created_at')!.evidence.value_pattern).toBe('timestamp');
    // The product's name is no person's name.
    expect(byField.get('full_name')?.source_field).toBe('crm.crm_contacts.full_name');
    for (const e of events)
      if (e.type === 'ambiguity')
        expect(e.candidates.map((c) => c.source_field)).not.toContain('shop.products.name');
    // No target table yet: nothing to overlap with, and no signal claims otherwise.
    for (const s of suggestions) {
      expect(s.evidence.overlap, s.target_field).toBeNull();
      expect(s.signals).not.toContain('overlap');
    }
    for (const e of events)
      if (e.type === 'ambiguity')
        for (const c of e.candidates) expect(c.evidence?.overlap ?? null).toBeNull();

    const view = await call(server, 'GET', '/api/mappings/customers', { token: tenant.admin.token });
    expect(view.status, JSON.stringify(view.body)).toBe(200);
    for (const s of suggestions) {
      const stored = view.body.connections.find(
        (c: { target_field: string }) => c.target_field === s.target_field,
      );
      expect(stored, s.target_field).toMatchObject({
        source_field: s.source_field,
        confidence: s.confidence,
        evidence: s.evidence,
      });
      expect(stored.evidence).toHaveProperty('overlap', null);
    }
    const version = view.body.version;

    // Rediscovery finds the same: same version, nothing uncommitted beyond what was, evidence kept.
    await discover(tenant.admin.token);
    const again = await call(server, 'GET', '/api/mappings/customers', { token: tenant.admin.token });
    expect(again.body.version).toBe(version);
    expect(again.body.connections).toEqual(view.body.connections);
  });

  it('confirming a suggestion keeps its evidence; a connection made by hand has none', async () => {
    const confirm = await call(server, 'POST', '/api/mappings/customers/connection', {
      token: tenant.admin.token,
      body: {
        connection: { source_field: 'crm.crm_contacts.email', target_field: 'email', status: 'confirmed' },
      },
    });
    expect(confirm.status, JSON.stringify(confirm.body)).toBe(200);
    const email = confirm.body.connections.find((c: { target_field: string }) => c.target_field === 'email');
    expect(email).toMatchObject({
      status: 'confirmed',
      evidence: { value_pattern: 'email', signals: ['name', 'type', 'pattern'] },
    });

    const byHand = await call(server, 'POST', '/api/mappings/customers/connection', {
      token: tenant.admin.token,
      body: {
        connection: {
          source_field: 'crm.crm_contacts.phone',
          target_field: 'external_id',
          status: 'confirmed',
        },
      },
    });
    expect(byHand.status, JSON.stringify(byHand.body)).toBe(200);
    const hand = byHand.body.connections.find(
      (c: { target_field: string }) => c.target_field === 'external_id',
    );
    expect(hand).toMatchObject({ source_field: 'crm.crm_contacts.phone' });
    expect(hand).not.toHaveProperty('evidence');
  });

  it('sample overlap: the share of sampled source values the target column already holds', async () => {
    // An empty target table has nothing to compare with either.
    await target.sql(`create table c360.customers (customer_id text primary key, email text,
       full_name text, country_code text)`);
    const empty = (await discover(tenant.admin.token)).filter(
      (e): e is Suggestion => e.type === 'suggestion',
    );
    expect(empty.length).toBeGreaterThan(0);
    for (const s of empty) expect(s.evidence.overlap, s.target_field).toBeNull();
    const before = await call(server, 'GET', '/api/mappings/customers', { token: tenant.admin.token });

    // Every contact's e-mail, in other case and padding; three of the four countries (the source has
    // DE, FR, US, ES), also in other case; names no contact has. created_at is no column of this table.
    await target.sql(`insert into c360.customers
       select 'c' || g, '  P' || g || '@EXAMPLE.COM ', 'Somebody ' || g,
              case g when 1 then 'de' when 2 then ' FR' when 3 then 'US' when 4 then 'IT' end
         from generate_series(1, 30) g`);
    const sentBefore = targetRelay.sent().length;
    const events = await discover(tenant.admin.token);
    expect(events.at(-1)!.type).toBe('completed');
    const byField = new Map(
      events.filter((e): e is Suggestion => e.type === 'suggestion').map((s) => [s.target_field, s]),
    );
    const country = byField.get('country_code')!;
    expect(country.source_field).toBe('crm.crm_contacts.cc');
    expect(country.evidence.overlap).toBe(0.75);
    expect(country.signals).toEqual(['type', 'pattern', 'overlap']);
    expect(country.evidence.signals).toEqual(country.signals);
    const name = byField.get('full_name')!;
    expect(name.source_field).toBe('crm.crm_contacts.full_name');
    expect(name.evidence.overlap).toBe(0);
    expect(name.signals).not.toContain('overlap');
    expect(byField.get('created_at')!.evidence.overlap).toBeNull();

    const view = await call(server, 'GET', '/api/mappings/customers', { token: tenant.admin.token });
    const stored = (field: string) =>
      view.body.connections.find((c: { target_field: string }) => c.target_field === field);
    expect(stored('country_code').evidence).toEqual(country.evidence);
    // The confirmed e-mail (a proposal confirmed earlier) is explained anew: all sampled e-mails are there.
    expect(stored('email')).toMatchObject({
      status: 'confirmed',
      evidence: { overlap: 1, signals: ['name', 'type', 'pattern', 'overlap'] },
    });
    // The connection made by hand stays without evidence.
    expect(stored('external_id')).not.toHaveProperty('evidence');
    // Evidence explains; it does not change the mapping.
    expect(view.body.version).toBe(before.body.version);

    // Compared in the process: dimas read the target's values, it sent none of the source's there.
    const sent = targetRelay.sent();
    expect(sent.length).toBeGreaterThan(sentBefore);
    // One read of the target table per discovery.
    expect(sent.slice(sentBefore).split('from "c360"."customers"').length - 1).toBe(1);
    for (const value of ['example.com', 'EXAMPLE.COM', 'Person ', '+49 30 555'])
      expect(sent).not.toContain(value);
  });

  it('shows nothing to a caller without a token or from another organization', async () => {
    expect((await call(server, 'GET', '/api/mappings/customers')).status).toBe(401);
    const other = await createTenant(server);
    const res = await call(server, 'GET', '/api/mappings/customers', { token: other.admin.token });
    // The other organization has no workspace selected, let alone this one.
    expect([400, 404, 409]).toContain(res.status);
    expect(JSON.stringify(res.body)).not.toContain('crm_contacts');
  });
});
