import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { parseCsv } from './helpers/csv.ts';

/*
 * An audience's members need an identifier: a row whose identifier columns are all NULL cannot be
 * matched or deduplicated by a destination, so it is left out of the size, previews and exports, and
 * counted apart as rows_without_identifier. A scratch warehouse holds contacts where e-mail and phone,
 * the identifiers, are often missing.
 */
const warehouse = scratchDatabase('audid');

const targetSchema = {
  name: 'crm',
  version: '1.0.0',
  tables: [
    {
      name: 'contacts',
      description: 'Contacts, not all reachable',
      primary_key: ['contact_id'],
      columns: [
        { name: 'contact_id', type: 'integer', nullable: false },
        { name: 'email', type: 'text', pii: true },
        { name: 'phone', type: 'text', pii: true },
        { name: 'country', type: 'text' },
        { name: 'score', type: 'integer' },
      ],
    },
  ],
};

let server: TestServer;
let tenant: Tenant;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/api/audiences',
);

const US = { all: [{ field: 'country', op: '=', value: 'US' }] };

async function create(body: Record<string, unknown>) {
  const res = await api('POST', '', {
    body: { name: `a${Math.random()}`, target_table: 'contacts', ...body },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.id as string;
}

async function materialized(id: string) {
  const run = await api('POST', `/${id}/materialize`);
  expect(run.status, JSON.stringify(run.body)).toBe(200);
  const done = await until(
    `materialize ${id}`,
    async () => (await api('GET', `/${id}`)).body,
    (a) =>
      ['succeeded', 'failed'].includes(a.materialization.status) &&
      a.materialization.run_id === run.body.run_id,
  );
  expect(done.materialization.status, done.materialization.error).toBe('succeeded');
  return done;
}

async function exportRun(audienceId: string, body: Record<string, unknown>) {
  const res = await api('POST', '/exports', { body: { audience_id: audienceId, ...body } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  const finished = await until(
    `export ${res.body.export.id}`,
    async () =>
      (await api('GET', `/${audienceId}/exports`)).body.exports.find((e: any) => e.id === res.body.export.id),
    (e) =>
      e?.last_run?.run_id === res.body.run.run_id &&
      ['succeeded', 'failed', 'cancelled'].includes(e.last_run.status),
  );
  expect(finished.last_run.status, finished.last_run.error).toBe('succeeded');
  return finished;
}

/**
 * Hand-written counts of the US contacts: all of them, those with a value in any of `columns`, and
 * their distinct values (rows sharing all of them are one member).
 */
async function handCounts(columns: string[]) {
  const any = columns.map((c) => `${c} is not null`).join(' or ');
  const [row] = await warehouse.sql<{ matched: number; identified: number; members: number }>(
    `select count(*)::int as matched, count(*) filter (where ${any})::int as identified,
            count(distinct (${columns.join(', ')})) filter (where ${any})::int as members
       from crm.contacts where country = 'US'`,
  );
  return { ...row, without: row.matched - row.identified, merged: row.identified - row.members };
}

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema crm`);
  await warehouse.sql(`create table crm.contacts (contact_id integer primary key, email text, phone text,
       country text, score integer)`);
  // Hand-picked rows (both identifiers, one of them, none, a shared e-mail, other countries), then 60
  // more where e-mail misses on every 4th and phone on every 3rd, so every 12th has neither.
  await warehouse.sql(`insert into crm.contacts values
       (1, 'a@x.org', '+15550001', 'US', 10),
       (2, 'b@x.org', null, 'US', 10),
       (3, null, '+15550003', 'US', 10),
       (4, null, null, 'US', 10),
       (5, null, null, 'US', 10),
       (6, 'dup@x.org', '+15550006', 'US', 10),
       (7, 'dup@x.org', null, 'US', 10),
       (8, null, null, 'DE', 10),
       (9, 'c@x.org', null, 'DE', 10)`);
  await warehouse.sql(`insert into crm.contacts
     select i, case when i % 4 = 0 then null else 'u' || i || '@x.org' end,
            case when i % 3 = 0 then null else '+1555' || lpad(i::text, 4, '0') end,
            'US', i
       from generate_series(11, 70) i`);
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    target_config: pgConfig(warehouse.name, { schemas: ['crm'] }),
    target_schema: targetSchema,
  });
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('members need an identifier', () => {
  let byEmail: string;
  let byEmailOrPhone: string;

  it('leaves rows whose one identifier column is NULL out of the size, and reports how many', async () => {
    byEmail = await create({
      definition: { type: 'rules', rules: US },
      identifier_columns: ['email'],
      attribute_columns: ['contact_id', 'phone'],
    });
    const done = await materialized(byEmail);
    const hand = await handCounts(['email']);
    expect(hand.without).toBeGreaterThan(2);
    expect(done.materialization).toMatchObject({
      row_count: hand.members,
      rows_without_identifier: hand.without,
    });
    const size = (await api('GET', `/${byEmail}/size`)).body;
    expect(size).toMatchObject({ row_count: hand.members, rows_without_identifier: hand.without });
    // Size, left-out and merged rows add up to a plain count of the rows the rules match.
    expect(size.row_count + size.rows_without_identifier + size.rows_merged).toBe(hand.matched);
    const dashboard = (await api('GET', '/dashboard')).body.audiences.find((a: any) => a.id === byEmail);
    expect(dashboard).toMatchObject({ size: hand.members, rows_without_identifier: hand.without });

    const members = await warehouse.sql(`select email, contact_id from ${done.materialization.table}`);
    expect(members).toHaveLength(hand.members);
    expect(members.filter((m) => m.email === null)).toEqual([]);
    // Two contacts sharing an e-mail are one member, the lower contact_id standing for it.
    expect(members.filter((m) => m.email === 'dup@x.org').map((m) => m.contact_id)).toEqual([6]);
  });

  it('with several identifier columns one value is enough; rows with none are left out (rules and SQL)', async () => {
    byEmailOrPhone = await create({
      definition: { type: 'rules', rules: US },
      identifier_columns: ['email', 'phone'],
      attribute_columns: ['contact_id'],
    });
    const done = await materialized(byEmailOrPhone);
    const hand = await handCounts(['email', 'phone']);
    expect(done.materialization).toMatchObject({
      row_count: hand.members,
      rows_without_identifier: hand.without,
    });
    const members = await warehouse.sql(`select contact_id, email, phone from ${done.materialization.table}`);
    // Contact 2 has only an e-mail and 3 only a phone: both are members; 4 and 5 have neither.
    expect(members.map((m) => m.contact_id)).toEqual(expect.arrayContaining([1, 2, 3]));
    expect(members.map((m) => m.contact_id)).not.toEqual(expect.arrayContaining([4]));
    expect(members.filter((m) => m.email === null && m.phone === null)).toEqual([]);

    const sql = await create({
      definition: { type: 'sql', sql: "select email, phone, score from crm.contacts where country = 'US'" },
      identifier_columns: ['email', 'phone'],
      attribute_columns: ['score'],
    });
    const ran = await materialized(sql);
    expect(ran.materialization).toMatchObject({
      row_count: hand.members,
      rows_without_identifier: hand.without,
    });
    expect((await api('GET', `/${sql}/size`)).body).toMatchObject({
      row_count: hand.members,
      rows_without_identifier: hand.without,
    });

    // Keyed by the primary key, every row has an identifier: nothing is left out.
    const byKey = await create({ definition: { type: 'rules', rules: US } });
    const keyed = await materialized(byKey);
    expect(keyed.materialization).toMatchObject({ row_count: hand.matched, rows_without_identifier: 0 });
  });

  it('previews and exports to CSV the members only, and the run says how many rows were left out', async () => {
    const hand = await handCounts(['email', 'phone']);
    const finished = await exportRun(byEmailOrPhone, {
      destination: { type: 'csv' },
      field_mapping: [
        { source: 'contact_id', destination: 'id' },
        { source: 'email', destination: 'email' },
        { source: 'phone', destination: 'phone' },
      ],
    });
    expect(finished.rows_exported).toBe(hand.members);
    expect(finished.last_run.progress).toMatchObject({
      rows_exported: hand.members,
      total_rows: hand.members,
      rows_without_identifier: hand.without,
      percent: 100,
    });

    const preview = (
      await api('GET', `/${byEmailOrPhone}/exports/${finished.id}/preview`, { query: { limit: 1000 } })
    ).body;
    expect(preview).toMatchObject({
      row_count: hand.members,
      total_rows: hand.members,
      rows_without_identifier: hand.without,
    });
    expect(preview.rows.filter((r: any) => r.email === null && r.phone === null)).toEqual([]);

    const file = await fetch(`${server.url}${finished.file.download_url}`, {
      headers: { authorization: `Bearer ${tenant.admin.token}` },
    });
    const [header, ...rows] = parseCsv(await file.text());
    expect(header).toEqual(['id', 'email', 'phone']);
    expect(rows).toHaveLength(hand.members);
    expect(rows.filter(([, email, phone]) => email === '' && phone === '')).toEqual([]);
    expect(rows.map((r) => r[0])).toEqual(preview.rows.map((r: any) => String(r.id)));
  });

  it('sends no row without an identifier to a webhook', async () => {
    const hand = await handCounts(['email']);
    const batches: { email: string | null }[][] = [];
    const hook: Server = createServer((req: IncomingMessage, res) => {
      let body = '';
      req.on('data', (chunk) => (body += chunk));
      req.on('end', () => {
        batches.push(JSON.parse(body).rows);
        res.writeHead(204).end();
      });
    });
    hook.listen(0, '127.0.0.1');
    await new Promise((resolve) => hook.once('listening', resolve));
    try {
      const finished = await exportRun(byEmail, {
        destination: {
          type: 'webhook',
          url: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/members`,
          batch_size: 7,
        },
        field_mapping: [
          { source: 'email', destination: 'email' },
          { source: 'phone', destination: 'phone' },
        ],
      });
      const rows = batches.flat();
      expect(rows).toHaveLength(hand.members);
      expect(rows.filter((r) => r.email === null)).toEqual([]);
      expect(batches).toHaveLength(Math.ceil(hand.members / 7));
      expect(finished.last_run.progress).toMatchObject({
        rows_exported: hand.members,
        rows_without_identifier: hand.without,
        batches_sent: batches.length,
      });
    } finally {
      hook.close();
    }
  });
});
