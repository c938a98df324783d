import { createParser } from 'eventsource-parser';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import type { DiscoveryEvent } from '../src/modules/discovery/discovery.schemas.ts';

/*
 * A field a person's hand-written transformation owns: discovery's ambiguity or suggestion for it
 * never reaches the SQL, so a rediscovery that finds them again changes nothing, and leaves the
 * version, the commit diff and the history as they were.
 */
const source = scratchDatabase('owned');

let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  await source.create();
  await source.sql(`create schema crm;
     create table crm.customers (id integer primary key, first_name text, email text, work_email text,
       city text);
     insert into crm.customers
       select g, 'name' || g, 'user' || g || '@example.com', 'u' || g || '@work.example',
              (array['Paris','Berlin','Austin'])[1 + g % 3]
         from generate_series(1, 30) g;`);
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: unique('owned'),
    source_config: pgConfig(source.name, { schemas: ['crm'] }),
    target_schema: {
      name: 'c360',
      tables: [
        {
          name: 'customers',
          primary_key: ['customer_id'],
          columns: [
            { name: 'customer_id', type: 'text', nullable: false },
            { name: 'email', type: 'text' },
            { name: 'first_name', type: 'text' },
            { name: 'city', type: 'text' },
          ],
        },
      ],
    },
  });
});

afterAll(async () => {
  await server?.close();
  await source.drop();
});

const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

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

const get = async (path: string) => {
  const res = await api('GET', path);
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
};
const diff = async () => {
  const res = await api('POST', '/api/mappings/customers/transformation-diff', { body: { limit: 20 } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
};
const setTransformation = async (target_field: string, expression: string) => {
  const res = await api('POST', '/api/mappings/customers/transformation', {
    body: { transformation: { target_field, expression } },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
};
const commit = async (message: string) => {
  const res = await api('POST', '/api/mappings/customers/commit-transformation', { body: { message } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
};

describe('rediscovery over a field a hand-written transformation owns', () => {
  it('leaves the version, the commit diff and the SQL as they were', async () => {
    await discover();
    const found = await get('/api/mappings/customers');
    // email and work_email both fit email; city has one suggestion.
    expect(found.ambiguities.map((a: { target_field: string }) => a.target_field)).toEqual(['email']);
    expect(found.connections).toContainEqual(
      expect.objectContaining({
        target_field: 'city',
        source_field: 'crm.customers.city',
        status: 'suggested',
      }),
    );

    await setTransformation('email', 'lower(crm.customers.work_email)');
    await setTransformation('city', 'upper(crm.customers.city)');
    const committed = await commit('email and city by hand');
    const mapping = await get('/api/mappings/customers');
    const sql = (await get('/api/mappings/customers/transform-code')).sql;
    expect(sql).toContain('lower(');
    expect(mapping.version).toBe(committed.version);
    expect(mapping.has_uncommitted_changes).toBe(false);

    for (let run = 0; run < 2; run++) {
      const events = await discover();
      expect(events.filter((e) => e.type === 'kept')).toEqual(
        expect.arrayContaining([
          expect.objectContaining({ target_field: 'email', decision: 'transformation' }),
          expect.objectContaining({ target_field: 'city', decision: 'transformation' }),
        ]),
      );
      const written = events.find((e) => e.type === 'progress' && e.step === 'written');
      expect(written).toMatchObject({
        message: expect.stringContaining(`unchanged at version ${committed.version}`),
      });
      const after = await get('/api/mappings/customers');
      expect(after.version).toBe(committed.version);
      expect(after.has_uncommitted_changes).toBe(false);
      expect(after.transformations.email).toMatchObject({ expression: 'lower(crm.customers.work_email)' });
      expect((await get('/api/mappings/customers/transform-code')).sql).toBe(sql);
      expect((await diff()).has_changes).toBe(false);
    }

    // Without the transformation the field is discovery's again: a change, which the next run fills.
    const removed = await api('DELETE', '/api/mappings/customers/transformation/city');
    expect(removed.status, JSON.stringify(removed.body)).toBe(200);
    expect(removed.body.has_uncommitted_changes).toBe(true);
    await discover();
    const refilled = await get('/api/mappings/customers');
    expect(refilled.version).toBe(removed.body.version + 1);
    expect(refilled.connections).toContainEqual(
      expect.objectContaining({
        target_field: 'city',
        source_field: 'crm.customers.city',
        status: 'suggested',
      }),
    );
  });
});
