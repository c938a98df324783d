import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EntityManager } from '@mikro-orm/postgresql';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { parseCsv } from './helpers/csv.ts';

/*
 * Who an audience's members are: rows with an identifier value (NULL, empty and whitespace-only are
 * missing alike), one member per distinct combination of identifier values (rows sharing them are
 * merged, the lowest primary key standing for them), and conversions counted for members only.
 */
const warehouse = scratchDatabase('audmem');

const targetSchema = {
  name: 'crm',
  version: '1.0.0',
  tables: [
    {
      name: 'contacts',
      description: 'Contacts, with blank and shared identifiers',
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
    body: { name: unique('members'), target_table: 'contacts', ...body },
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

/**
 * Hand counts of the US contacts, a value being missing when trimming spaces, tabs and line breaks
 * leaves nothing: all of them, those with a value in any of `columns`, and their distinct values.
 */
async function handCounts(columns: string[]) {
  const clean = (c: string) => `case when trim(${c}, E' \\t\\r\\n') = '' then null else ${c} end as ${c}`;
  const any = columns.map((c) => `${c} is not null`).join(' or ');
  const [row] = await warehouse.sql<{ matched: number; identified: number; members: number }>(
    `with t as (select contact_id, ${columns.map(clean).join(', ')} from crm.contacts where country = 'US')
     select count(*)::int as matched,
            count(*) filter (where ${any})::int as identified,
            count(distinct (${columns.join(', ')})) filter (where ${any})::int as members
       from t`,
  );
  return { ...row, without: row.matched - row.identified, merged: row.identified - row.members };
}

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema crm`);
  await warehouse.sql(`create table crm.contacts (contact_id integer primary key, email text, phone text,
       country text, score integer)`);
  await warehouse.sql(`insert into crm.contacts values
       (1, 'a@x.org', '+1001', 'US', 10),
       (2, '', '+1002', 'US', 20),
       (3, '   ', null, 'US', 30),
       (4, E'\\t\\n', null, 'US', 40),
       (5, 'dup@x.org', '+1005', 'US', 50),
       (6, 'dup@x.org', null, 'US', 60),
       (7, 'dup@x.org', null, 'US', 70),
       (8, null, '  ', 'US', 80),
       (9, 'b@x.org', null, 'DE', 90),
       (10, 'c@x.org', '', 'US', 100)`);
  // 60 more: every 6th e-mail empty, every 6th (shifted) one of two shared ones, every 4th phone blank.
  await warehouse.sql(`insert into crm.contacts
     select i, case when i % 6 = 0 then '' when i % 6 = 3 then 'shared' || (i % 4) || '@x.org'
                    else 'u' || i || '@x.org' end,
            case when i % 4 = 0 then ' ' else '+1' || i end, 'US', i
       from generate_series(20, 79) i`);
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

describe('an identifier is missing when NULL or blank', () => {
  let byEmail: string;
  let table: string;

  it('leaves rows whose e-mail is empty or whitespace out of the members, and counts them', async () => {
    byEmail = await create({
      definition: { type: 'rules', rules: US },
      identifier_columns: ['email'],
      attribute_columns: ['contact_id', 'score'],
    });
    const done = await materialized(byEmail);
    table = done.materialization.table;
    const hand = await handCounts(['email']);
    // Contacts 2, 3, 4 and 8 and every 6th generated one have no e-mail worth the name.
    expect(hand.without).toBe(4 + 10);
    expect(done.materialization).toMatchObject({
      row_count: hand.members,
      rows_without_identifier: hand.without,
      rows_merged: hand.merged,
    });
    const size = (await api('GET', `/${byEmail}/size`)).body;
    expect(size).toMatchObject({
      row_count: hand.members,
      rows_without_identifier: hand.without,
      rows_merged: hand.merged,
    });
    expect(size.row_count + size.rows_without_identifier + size.rows_merged).toBe(hand.matched);
    const dashboard = (await api('GET', '/dashboard')).body.audiences.find((a: any) => a.id === byEmail);
    expect(dashboard).toMatchObject({
      size: hand.members,
      rows_without_identifier: hand.without,
      rows_merged: hand.merged,
    });

    const members = await warehouse.sql(`select contact_id, email from ${table}`);
    expect(members).toHaveLength(hand.members);
    expect(members.filter((m) => m.email === null || m.email.trim() === '')).toEqual([]);
    expect(members.map((m) => m.contact_id)).not.toEqual(expect.arrayContaining([2]));
    expect(members.map((m) => m.contact_id).filter((id) => [2, 3, 4, 8].includes(id))).toEqual([]);

    // A SQL definition counts the same way.
    const sql = await create({
      definition: { type: 'sql', sql: "select email, score from crm.contacts where country = 'US'" },
      identifier_columns: ['email'],
      attribute_columns: ['score'],
    });
    expect((await materialized(sql)).materialization).toMatchObject({
      row_count: hand.members,
      rows_without_identifier: hand.without,
      rows_merged: hand.merged,
    });
  });

  it('with e-mail and phone, a blank one reads as NULL and the other is enough', async () => {
    const id = await create({
      definition: { type: 'rules', rules: US },
      identifier_columns: ['email', 'phone'],
      attribute_columns: ['contact_id'],
    });
    const done = await materialized(id);
    const hand = await handCounts(['email', 'phone']);
    expect(done.materialization).toMatchObject({
      row_count: hand.members,
      rows_without_identifier: hand.without,
      rows_merged: hand.merged,
    });
    const rows = await warehouse.sql(
      `select contact_id, email, phone from ${done.materialization.table} where contact_id in (2, 3, 4, 8, 10)
        order by contact_id`,
    );
    expect(rows).toEqual([
      { contact_id: 2, email: null, phone: '+1002' },
      { contact_id: 10, email: 'c@x.org', phone: null },
    ]);
  });

  it('exports no blank identifier to a CSV file', async () => {
    const created = await api('POST', '/exports', {
      body: {
        audience_id: byEmail,
        destination: { type: 'csv' },
        field_mapping: [
          { source: 'contact_id', destination: 'id' },
          { source: 'email', destination: 'email' },
        ],
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const finished = await until(
      'csv export',
      async () =>
        (await api('GET', `/${byEmail}/exports`)).body.exports.find(
          (e: any) => e.id === created.body.export.id,
        ),
      (e) =>
        e?.last_run?.run_id === created.body.run.run_id &&
        e.last_run.status !== 'running' &&
        e.last_run.status !== 'queued',
    );
    expect(finished.last_run.status, finished.last_run.error).toBe('succeeded');
    const hand = await handCounts(['email']);
    // The run and the preview tell the rows merged beside those without an identifier.
    expect(finished.last_run.progress).toMatchObject({
      total_rows: hand.members,
      rows_without_identifier: hand.without,
      rows_merged: hand.merged,
    });
    const preview = await api('GET', `/${byEmail}/exports/${created.body.export.id}/preview`);
    expect(preview.body).toMatchObject({ total_rows: hand.members, rows_merged: hand.merged });
    const file = await fetch(`${server.url}${finished.file.download_url}`, {
      headers: { authorization: `Bearer ${tenant.admin.token}` },
    });
    const [header, ...rows] = parseCsv(await file.text());
    expect(header).toEqual(['id', 'email']);
    expect(rows).toHaveLength(hand.members);
    expect(rows.filter(([, email]) => email.trim() === '')).toEqual([]);
    // One line per e-mail: the shared ones are sent once.
    expect(new Set(rows.map(([, email]) => email)).size).toBe(rows.length);
  });
});

describe('rows sharing identifier values are one member', () => {
  it('keeps one row per e-mail, the lowest contact_id standing for it with its attributes', async () => {
    const id = await create({
      definition: { type: 'rules', rules: US },
      identifier_columns: ['email'],
      attribute_columns: ['contact_id', 'score'],
    });
    const done = await materialized(id);
    const hand = await handCounts(['email']);
    // dup@x.org three times; shared1@ and shared3@x.org on 10 rows (i % 6 = 3 is odd).
    expect(hand.merged).toBe(2 + 8);
    expect(done.materialization.rows_merged).toBe(hand.merged);
    const members = await warehouse.sql(
      `select email, contact_id, score from ${done.materialization.table} order by email`,
    );
    const winners = await warehouse.sql(
      `select c.email, c.contact_id, c.score from crm.contacts c
         join (select email, min(contact_id) as contact_id from crm.contacts
                where country = 'US' and trim(email, E' \\t\\r\\n') <> '' group by email) w
           on w.contact_id = c.contact_id
        order by c.email`,
    );
    expect(members).toEqual(winners);
    expect(members.find((m) => m.email === 'dup@x.org')).toEqual({
      email: 'dup@x.org',
      contact_id: 5,
      score: 50,
    });
  });

  it('with e-mail and phone, rows are merged only when both agree', async () => {
    const id = await create({
      definition: { type: 'rules', rules: US },
      identifier_columns: ['email', 'phone'],
      attribute_columns: ['contact_id'],
    });
    const done = await materialized(id);
    const hand = await handCounts(['email', 'phone']);
    // Contacts 6 and 7 share e-mail and no phone; 5 has a phone too.
    expect(hand.merged).toBe(1);
    expect(done.materialization).toMatchObject({ row_count: hand.members, rows_merged: 1 });
    const dup = await warehouse.sql(
      `select contact_id, phone from ${done.materialization.table} where email = 'dup@x.org' order by contact_id`,
    );
    expect(dup).toEqual([
      { contact_id: 5, phone: '+1005' },
      { contact_id: 6, phone: null },
    ]);
  });
});

describe('a table materialized by an earlier dimas', () => {
  it('reads stale until materialized again, naming why', async () => {
    const id = await create({ definition: { type: 'rules', rules: US }, identifier_columns: ['email'] });
    await materialized(id);
    const em = server.deps.orm.em.fork() as EntityManager;
    const size = async () => (await api('GET', `/${id}/size`)).body;
    expect(await size()).toMatchObject({ stale: false, message: 'Up to date' });
    // What a materialization made before members were distinct identifiers left: no rows_merged.
    await em.execute(`update audiences set rows_merged = null where id = ?`, [id]);
    const older = /^Stale: it was materialized by an earlier version of dimas/;
    expect(await size()).toMatchObject({ stale: true, message: expect.stringMatching(older) });
    expect((await api('GET', `/${id}`)).body.materialization.stale).toBe(true);
    await materialized(id);
    expect(await size()).toMatchObject({ stale: false, message: 'Up to date' });
    // And before domain columns were followed: no base type recorded for its columns.
    await em.execute(
      `update audiences set materialized_columns =
         (select jsonb_agg(c - 'base_type') from jsonb_array_elements(materialized_columns) c)
       where id = ?`,
      [id],
    );
    expect(await size()).toMatchObject({ stale: true, message: expect.stringMatching(older) });
    await materialized(id);
    expect((await api('GET', `/${id}`)).body.materialization.stale).toBe(false);
  });
});

describe('conversions are the members', () => {
  it('counts conversions of members, and keeps others apart as unmatched with a warning naming the id', async () => {
    const id = await create({
      definition: { type: 'rules', rules: US },
      identifier_columns: ['email', 'phone'],
      attribute_columns: ['contact_id'],
    });
    const done = await materialized(id);
    // Each identifier column is indexed for the look-up: a conversion reads no whole table.
    const indexes = await warehouse.sql(
      `select indexdef from pg_indexes where schemaname || '.' || tablename = $1`,
      [`${done.materialization.versioned_table}`],
    );
    expect(indexes.map((i) => i.indexdef)).toEqual([
      expect.stringContaining('btrim(email)'),
      expect.stringContaining('btrim(phone)'),
    ]);

    const post = (customer_id: string, value: number, extra: Record<string, unknown> = {}) =>
      api('POST', '/conversions', {
        body: {
          audience_id: id,
          customer_id,
          value,
          occurred_at: '2026-03-01T10:00:00Z',
          external_id: unique('order'),
          ad_platform: 'google',
          ...extra,
        },
      });
    const cases = [
      { customer: 'a@x.org', value: 10, member: true },
      { customer: '+1002', value: 20, member: true }, // contact 2: a phone, a blank e-mail
      { customer: 'dup@x.org', value: 30, member: true },
      { customer: 'nobody@x.org', value: 40, member: false },
      { customer: 'b@x.org', value: 50, member: false }, // a contact, not of the audience (DE)
    ];
    for (const c of cases) {
      const res = await post(c.customer, c.value);
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      expect(res.body.conversion).toMatchObject({ customer_id: c.customer, member: c.member });
      if (c.member) expect(res.body.warning).toBeNull();
      else expect(res.body.warning).toContain(`Customer ${c.customer} is not a member`);
    }
    // A whitespace id is no identifier either.
    expect((await post('   ', 1)).status).toBe(400);
    // Posted again, a conversion is the one recorded, with its warning.
    const again = await api('POST', '/conversions', {
      body: {
        audience_id: id,
        customer_id: 'nobody@x.org',
        value: 40,
        occurred_at: '2026-03-01T10:00:00Z',
        external_id: 'repeat-1',
      },
    });
    const repeat = await api('POST', '/conversions', {
      body: {
        audience_id: id,
        customer_id: 'nobody@x.org',
        value: 40,
        occurred_at: '2026-03-01T10:00:00Z',
        external_id: 'repeat-1',
      },
    });
    expect([again.body.created, repeat.body.created]).toEqual([true, false]);
    expect(repeat.body.conversion).toMatchObject({ id: again.body.conversion.id, member: false });
    expect(repeat.body.warning).toContain('nobody@x.org');

    const em = server.deps.orm.em.fork() as EntityManager;
    const stored = await em.execute(
      `select customer_id, member, value::float8 as value from audience_conversions where audience_id = ?
        order by customer_id`,
      [id],
    );
    expect(stored).toEqual(
      [
        ...cases.map((c) => ({ customer_id: c.customer, member: c.member, value: c.value })),
        { customer_id: 'nobody@x.org', member: false, value: 40 },
      ].sort((a, b) => (a.customer_id < b.customer_id ? -1 : a.customer_id > b.customer_id ? 1 : 0)),
    );

    const summary = (await api('GET', `/${id}/performance-summary`)).body;
    const matched = stored.filter((r: any) => r.member);
    const unmatched = stored.filter((r: any) => !r.member);
    const sum = (rows: any[]) => rows.reduce((s, r) => s + r.value, 0);
    expect(summary.overall).toMatchObject({
      recorded_conversions: matched.length,
      recorded_conversion_value: sum(matched),
      unmatched_conversions: unmatched.length,
      unmatched_conversion_value: sum(unmatched),
    });
    expect(summary.by_platform.find((p: any) => p.ad_platform === 'google')).toMatchObject({
      recorded_conversions: 3,
      unmatched_conversions: 2,
    });
    const dashboard = (await api('GET', '/dashboard')).body.audiences.find((a: any) => a.id === id);
    expect(dashboard.performance).toMatchObject({
      recorded_conversions: 3,
      recorded_conversion_value: 60,
      unmatched_conversions: 3,
      unmatched_conversion_value: 130,
    });
  });

  it('an audience never materialized has no member to match', async () => {
    const id = await create({ definition: { type: 'rules', rules: US }, identifier_columns: ['email'] });
    const res = await api('POST', '/conversions', {
      body: {
        audience_id: id,
        customer_id: 'a@x.org',
        occurred_at: '2026-03-01T10:00:00Z',
        external_id: unique('order'),
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.conversion.member).toBe(false);
    expect(res.body.warning).toMatch(/has not been materialized, so customer a@x\.org is no member/);
    const summary = (await api('GET', `/${id}/performance-summary`)).body;
    expect(summary.overall).toMatchObject({ recorded_conversions: 0, unmatched_conversions: 1 });
  });
});
