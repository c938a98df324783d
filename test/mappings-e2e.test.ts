import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type pg from 'pg';
import type { EntityManager } from '@mikro-orm/postgresql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  bindCall,
  createTenant,
  createWorkspace,
  materializeMapping,
  unique,
  type Tenant,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase, withClient, type ScratchDatabase } from './helpers/scratch-db.ts';
import { parseCsv } from './helpers/csv.ts';
import { mappingView } from '../src/modules/mappings/mappings.service.ts';
import { TableMapping } from '../src/modules/mappings/mappings.entity.ts';
import { Workspace } from '../src/modules/workspaces/workspaces.entity.ts';

/*
 * The whole path over HTTP on a real PostgreSQL warehouse: a target table mapped from two joined
 * source tables with transformations → preview → diff → commit → materialize (same database, then
 * across databases) → the target table holds exactly the expected rows, and the generated Python
 * script gives the same rows from CSV exports.
 */
const run = promisify(execFile);
const source = scratchDatabase('e2e');
const otherTarget = scratchDatabase('e2e_tgt');
// Every value as PostgreSQL prints it, so SQL, Python and the expectations compare as text.
const rawText = { getTypeParser: () => (value: string) => value } as unknown as typeof pg.types;
const sql = (db: ScratchDatabase, text: string, params: unknown[] = []) =>
  withClient(db.url, (client) => client.query(text, params), { types: rawText });

const config = (database: string, schemas: string[]) => pgConfig(database, { schemas });

const schema = {
  name: 'crm',
  version: '1.0.0',
  tables: [
    {
      name: 'customer_profiles',
      description: 'One row per customer',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false },
        { name: 'email', type: 'text' },
        { name: 'phone', type: 'text' },
        { name: 'full_name', type: 'text' },
        { name: 'signup_date', type: 'date' },
        { name: 'loyalty_points', type: 'integer', nullable: false },
        { name: 'tier', type: 'text' },
        { name: 'notes', type: 'text' },
      ],
    },
  ],
};

const COLUMNS = schema.tables[0].columns.map((c) => c.name);
const digits = `regexp_replace(customers.phone, '[^0-9]', '', 'g')`;
const TRANSFORMATIONS: Record<string, string> = {
  email: 'lower(trim(customers.email))',
  phone: `CASE WHEN ${digits} ~ '^1?[0-9]{10}$' THEN '+1' || right(${digits}, 10) ELSE nullif(${digits}, '') END`,
  full_name: `initcap(concat_ws(' ', trim(customers.first_name), trim(customers.last_name)))`,
  signup_date: 'CAST(customers.signup AS date)',
  loyalty_points: 'COALESCE(loyalty.points::integer, 0)',
  tier: `upper(coalesce(nullif(trim(loyalty.tier), ''), 'basic'))`,
};

// What the mapping must produce, worked out by hand from the source rows below.
const EXPECTED = [
  ['1', 'john.doe@example.com', '+15551234567', 'John Doe', '2023-01-15', '250', 'GOLD', null],
  ['2', 'jane@example.com', '+15559876543', 'Jane Smith', '2023-02-01', '0', 'BASIC', null],
  ['3', 'bob@test.org', '442079460958', 'Bob', '2023-03-10', '15', 'BASIC', null],
  ['4', null, null, '', null, '0', 'BASIC', null],
];

let server: TestServer;
let tenant: Tenant;
let token: string;
let workDir: string;
const workspace = unique('e2e');

beforeAll(async () => {
  await source.create().catch(async () => {
    throw new Error('cannot create the scratch database');
  });
  await otherTarget.create();
  await sql(
    source,
    `create schema shop;
     create schema crm;
     create table shop.customers (id integer primary key, email text, phone text, first_name text, last_name text, signup text);
     create table shop.loyalty (customer_id integer, points text, tier text);
     insert into shop.customers values
       (1, '  John.Doe@Example.COM ', '(555) 123-4567', ' john', 'doe ', '2023-01-15'),
       (2, 'JANE@EXAMPLE.com', '555.987.6543', 'JANE', 'smith', '2023-02-01'),
       (3, 'bob@test.org  ', '+44 20 7946 0958', 'bob', null, '2023-03-10'),
       (4, null, '', null, null, null);
     insert into shop.loyalty values (1, '250', ' gold '), (2, null, ''), (3, ' 15 ', null), (99, '1', 'ghost');`,
  );
  server = await startTestServer({ LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'silent' });
  tenant = await createTenant(server);
  token = tenant.admin.token;
  workDir = mkdtempSync(join(tmpdir(), 'dimas-e2e-'));
  await createWorkspace(server, token, {
    name: workspace,
    source_config: config(source.name, ['shop']),
    target_config: config(source.name, ['crm']),
    target_schema: schema,
  });
});

afterAll(async () => {
  await server?.close();
  if (workDir) rmSync(workDir, { recursive: true, force: true });
  for (const db of [source, otherTarget]) await db.drop();
});

const api = bindCall(
  () => server,
  () => token,
);

async function materializeAndWait(table: string) {
  const { started, run, mapping } = await materializeMapping(server, token, table);
  expect(started).toMatchObject({ run_id: expect.any(String), status: 'queued', created: true });
  return { run, mapping };
}

async function targetRows(db: ScratchDatabase) {
  const res = await sql(db, `select ${COLUMNS.join(', ')} from crm.customer_profiles order by customer_id`);
  return res.rows.map((r) => COLUMNS.map((c) => r[c] as string | null));
}

describe('a mapping from two joined tables, end to end over HTTP', () => {
  it('builds the mapping through the routes', async () => {
    let res = await api('POST', '/api/mappings/customer_profiles/tables', {
      body: {
        source_table: 'customers',
        relationship: 'primary',
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    res = await api('POST', '/api/mappings/customer_profiles/tables', {
      body: {
        source_table: 'shop.loyalty',
        relationship: 'join',
        join_type: 'left',
        join_on: 'customers.id = loyalty.customer_id',
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({
      primary_table: 'shop.customers',
      tables: [
        { source_table: 'shop.customers', relationship: 'primary' },
        { source_table: 'shop.loyalty', relationship: 'join', join_type: 'left' },
      ],
    });
    res = await api('POST', '/api/mappings/customer_profiles/connection', {
      body: {
        connection: { source_field: 'customers.id', target_field: 'customer_id' },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    for (const [target_field, expression] of Object.entries(TRANSFORMATIONS)) {
      res = await api('POST', '/api/mappings/customer_profiles/transformation', {
        body: {
          transformation: { target_field, expression, description: `${target_field} cleaned` },
        },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
    }
    expect(res.body.version).toBe(9);
    expect(res.body.committed_version).toBeNull();
    const valid = await api('POST', '/api/mappings/customer_profiles/tables/validate', { body: {} });
    expect(valid.body).toEqual({
      table_name: 'customer_profiles',
      valid: true,
      problems: [],
      // Each customer has at most one loyalty row: one row per primary row.
      fan_out: [
        {
          source_table: 'shop.loyalty',
          join_on: 'customers.id = loyalty.customer_id',
          primary_rows: 4,
          joined_rows: 4,
          multiplied_rows: 0,
          max_rows_per_primary_row: 1,
          measured: true,
          accepted: false,
        },
      ],
    });
  });

  it('previews the whole table and one field on source rows', async () => {
    const whole = await api('POST', '/api/mappings/customer_profiles/preview-transformation', {
      body: { limit: 10 },
    });
    expect(whole.status, JSON.stringify(whole.body)).toBe(200);
    expect(whole.body.columns.map((c: { name: string }) => c.name)).toEqual(COLUMNS);
    expect(whole.body.row_count).toBe(4);
    const one = await api('POST', '/api/mappings/customer_profiles/preview-transformation', {
      body: {
        target_field: 'email',
        expression: 'upper(trim(customers.email))',
        limit: 2,
      },
    });
    expect(one.status, JSON.stringify(one.body)).toBe(200);
    // E-mail is personal: with mask_pii_in_samples on (the default) the preview shows its shape only.
    expect(one.body.masked_columns).toContain('email');
    expect(one.body.rows.map((r: { email: string }) => r.email).sort()).toEqual([
      'AAAA.AAA@AAAAAAA.AAA',
      'AAAA@AAAAAAA.AAA',
    ]);
    expect(one.body.truncated).toBe(true);
  });

  it('diffs against nothing, commits, and the workspace files reflect the commit', async () => {
    const diff = await api('POST', '/api/mappings/customer_profiles/transformation-diff', {
      body: { limit: 50 },
    });
    expect(diff.status, JSON.stringify(diff.body)).toBe(200);
    expect(diff.body).toMatchObject({ committed_version: null, has_changes: true });
    expect(diff.body.sql_diff).toContain('+SELECT');
    expect(diff.body.data_diff).toMatchObject({
      rows_before: null,
      rows_after: 4,
      added_rows: 4,
      key_columns: ['customer_id'],
    });

    let gitDiff = await api('GET', `/api/workspaces/${workspace}/git-diff`);
    expect(gitDiff.body.files.map((f: { path: string }) => f.path)).toContain(
      'mappings/customer_profiles.json',
    );

    const commit = await api('POST', '/api/mappings/customer_profiles/commit-transformation', {
      body: {
        message: 'first cut',
      },
    });
    expect(commit.status, JSON.stringify(commit.body)).toBe(200);
    expect(commit.body).toMatchObject({
      version: 9,
      committed_version: 9,
      author: tenant.admin.username,
      message: 'first cut',
    });
    expect(commit.body.vcs).toMatchObject({ pushed: false, reason: 'not_configured' });

    gitDiff = await api('GET', `/api/workspaces/${workspace}/git-diff`);
    const paths = gitDiff.body.files.map((f: { path: string }) => f.path);
    expect(paths).not.toContain('mappings/customer_profiles.json');
    expect(paths).not.toContain('mappings/customer_profiles.sql');
    expect(gitDiff.body.base_commit.message).toBe('customer_profiles v9: first cut');

    const again = await api('POST', '/api/mappings/customer_profiles/commit-transformation', {
      body: {
        message: 'same',
      },
    });
    expect(again.status).toBe(409);

    const download = await fetch(`${server.url}/api/workspaces/${workspace}/download`, {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(download.status).toBe(200);
    const zip = Buffer.from(await download.arrayBuffer()).toString('latin1');
    expect(zip).toContain('mappings/customer_profiles.sql');
    expect(zip).toContain('mappings/customer_profiles.json');
  });

  it('materializes inside the same database: exactly the expected rows', async () => {
    const { run, mapping } = await materializeAndWait('customer_profiles');
    expect(run.status, run.error).toBe('succeeded');
    expect(run.result).toMatchObject({
      rows_written: 4,
      mode: 'insert_select',
      target_table: 'crm.customer_profiles',
    });
    expect(mapping.materialization).toMatchObject({ materialized_version: 9, rows: 4 });
    expect(await targetRows(source)).toEqual(EXPECTED);
    // The primary key keeps its name run after run (it was named after each run's staging table).
    for (let i = 0; i < 2; i++) {
      if (i) expect((await materializeAndWait('customer_profiles')).run.status).toBe('succeeded');
      const { rows } = await sql(
        source,
        `select conname from pg_constraint where conrelid = 'crm.customer_profiles'::regclass and contype = 'p'`,
      );
      expect(rows).toEqual([{ conname: 'customer_profiles_pkey' }]);
    }
  });

  it('answers with the figures of a materialization that ended after the mapping was read', async () => {
    // An edit answers with the mapping it read, then the newest run: a run that ended in between
    // recorded its figures on the mapping after that read. Reproduced by an entity left as it was.
    const em = server.deps.orm.em.fork() as EntityManager;
    const ws = await em.findOneOrFail(Workspace, { name: workspace, organization: tenant.organization.id });
    const mapping = await em.findOneOrFail(TableMapping, {
      workspace: ws.id,
      tableName: 'customer_profiles',
    });
    expect(mapping.materializedRows).toBe(4);
    Object.assign(mapping, { materializedRows: null, materializedVersion: null, materializedAt: null });
    const view = await mappingView({ em, deps: server.deps }, ws, mapping);
    expect(view.materialization).toMatchObject({ materialized_version: 9, rows: 4 });
    expect(view.materialization.materialized_at).not.toBeNull();
    expect(view.materialization.last_run).toMatchObject({ status: 'succeeded' });
  });

  it('gives the same rows with the generated Python script', async () => {
    const code = await api('POST', '/api/mappings/customer_profiles/generate-code', { body: {} });
    expect(code.status, JSON.stringify(code.body)).toBe(200);
    writeFileSync(join(workDir, code.body.filename), code.body.code);
    for (const table of ['customers', 'loyalty']) {
      const res = await sql(source, `select * from shop.${table}`);
      const cell = (v: string | null) =>
        v === null ? '\\N' : /[",\n\r]/.test(v) ? `"${v.replaceAll('"', '""')}"` : v;
      const names = res.fields.map((f) => f.name);
      const lines = [names.join(','), ...res.rows.map((r) => names.map((n) => cell(r[n])).join(','))];
      writeFileSync(join(workDir, `shop.${table}.csv`), lines.join('\n') + '\n');
    }
    const out = join(workDir, 'out.csv');
    await run('python3', [
      join(workDir, code.body.filename),
      '--input-dir',
      workDir,
      '--null',
      '\\N',
      '--output',
      out,
    ]);
    const [header, ...rows] = readFileSync(out, 'utf8')
      .trimEnd()
      .split('\n')
      .map((line) => line.split(',').map((v) => (v === '\\N' ? null : v.replace(/^"(.*)"$/, '$1'))));
    expect(header).toEqual(COLUMNS);
    rows.sort((a, b) => Number(a[0]) - Number(b[0]));
    expect(rows).toEqual(await targetRows(source));
  });

  it('diffs a change on the data, and a failed run leaves the previous content', async () => {
    let res = await api('POST', '/api/mappings/customer_profiles/transformation', {
      body: {
        transformation: { target_field: 'notes', expression: `'points: ' || loyalty.points` },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const diff = await api('POST', '/api/mappings/customer_profiles/transformation-diff', { body: {} });
    expect(diff.body.data_diff).toMatchObject({
      rows_before: 4,
      rows_after: 4,
      changed_rows: 2,
      changed_columns: ['notes'],
    });
    expect(diff.body.sql_diff).toMatch(/^-\s+CAST\(NULL AS text\) AS "notes"$/m);

    // A cast the data refuses only fails when it runs: the run fails, the table stays as it was.
    res = await api('POST', '/api/mappings/customer_profiles/transformation', {
      body: {
        transformation: { target_field: 'loyalty_points', expression: 'COALESCE(loyalty.tier::integer, 0)' },
      },
    });
    expect(res.status).toBe(200);
    expect(
      (
        await api('POST', '/api/mappings/customer_profiles/commit-transformation', {
          body: { message: 'bad cast' },
        })
      ).status,
    ).toBe(200);
    const failed = await materializeAndWait('customer_profiles');
    expect(failed.run.status).toBe('failed');
    expect(failed.run.error).toMatch(/invalid input syntax for type integer/);
    expect(await targetRows(source)).toEqual(EXPECTED);
    const leftovers = await sql(
      source,
      `select tablename from pg_tables where schemaname = 'crm' and tablename <> 'customer_profiles'`,
    );
    expect(leftovers.rows).toEqual([]);
  });

  it('materializes across databases with a streamed copy', async () => {
    let res = await api('POST', '/api/mappings/customer_profiles/transformation', {
      body: {
        transformation: { target_field: 'loyalty_points', expression: TRANSFORMATIONS.loyalty_points },
      },
    });
    expect(res.status).toBe(200);
    res = await api('DELETE', '/api/mappings/customer_profiles/transformation/notes');
    expect(res.status).toBe(200);
    expect(
      (
        await api('POST', '/api/mappings/customer_profiles/commit-transformation', {
          body: { message: 'fixed' },
        })
      ).status,
    ).toBe(200);
    res = await api('POST', `/api/workspaces/${workspace}/config`, {
      body: {
        target_config: config(otherTarget.name, ['crm']),
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const { run } = await materializeAndWait('customer_profiles');
    expect(run.status, run.error).toBe('succeeded');
    expect(run.result).toMatchObject({ rows_written: 4, mode: 'streamed_copy' });
    expect(await targetRows(otherTarget)).toEqual(EXPECTED);
  });

  it('knows the target database by its identity, not by how its host is written', async () => {
    // The same server and database with the host spelled another way (a loopback name or address
    // written otherwise): compared as written, they were two databases and the rows went through a copy.
    const written = config(source.name, ['crm']);
    const otherSpelling = ['localhost', '127.0.0.1'].includes(written.host)
      ? { ...written, host: written.host === 'localhost' ? '127.0.0.1' : '127.1' }
      : null;
    if (!otherSpelling) return;
    let res = await api('POST', `/api/workspaces/${workspace}/config`, {
      body: { target_config: otherSpelling },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const { run } = await materializeAndWait('customer_profiles');
    expect(run.status, run.error).toBe('succeeded');
    expect(run.result).toMatchObject({ rows_written: 4, mode: 'insert_select' });
    expect(await targetRows(source)).toEqual(EXPECTED);
    res = await api('POST', `/api/workspaces/${workspace}/config`, {
      body: { target_config: config(otherTarget.name, ['crm']) },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
  });

  it('a run that fails at the swap reports no rows written and leaves the previous rows', async () => {
    // A table referencing one of the target's rows: the target cannot be dropped, and the in-place
    // replacement cannot delete the referenced row. The run fails after it had counted every row.
    await sql(
      otherTarget,
      `create table crm.profile_notes (customer_id integer references crm.customer_profiles (customer_id));
       insert into crm.profile_notes values (${EXPECTED[0][0]})`,
    );
    try {
      const { run } = await materializeAndWait('customer_profiles');
      expect(run.status).toBe('failed');
      expect(run.error).toMatch(/foreign key/);
      expect(run.progress).toMatchObject({ phase: 'rolled_back', rows_written: 0 });
      expect(await targetRows(otherTarget)).toEqual(EXPECTED);
    } finally {
      await sql(otherTarget, 'drop table crm.profile_notes');
    }
  });

  it("copies across databases every character COPY's text format escapes, and NULL apart from '\\N'", async () => {
    // Tab, line feed, carriage return, a backslash before N (text, not NULL) and two backslashes.
    const expression = `CASE WHEN customers.id < 4 THEN 'tab' || chr(9) || 'here' || chr(10) || 'line' || chr(13) || chr(92) || 'N ' || chr(92) || chr(92) || ' ü' END`;
    let res = await api('POST', '/api/mappings/customer_profiles/transformation', {
      body: { transformation: { target_field: 'notes', expression } },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    res = await api('POST', '/api/mappings/customer_profiles/commit-transformation', {
      body: { message: 'escapes' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const { run } = await materializeAndWait('customer_profiles');
    expect(run.status, run.error).toBe('succeeded');
    expect(run.result).toMatchObject({ rows_written: 4, mode: 'streamed_copy' });
    const notes = await sql(otherTarget, 'select customer_id, notes from crm.customer_profiles order by 1');
    const escaped = 'tab\there\nline\r\\N \\\\ ü';
    expect(notes.rows).toEqual([
      { customer_id: '1', notes: escaped },
      { customer_id: '2', notes: escaped },
      { customer_id: '3', notes: escaped },
      { customer_id: '4', notes: null },
    ]);
  });
});

describe('a source database that prints values in its own styles', () => {
  // Day-first dates with zone abbreviations, SQL-standard intervals, escaped bytea and fewer float
  // digits, set on the database as some deployments do: text read in those styles was parsed again by
  // the target of a streamed copy (days and months swapped, IST read as Israel time, digits cut).
  const styled = scratchDatabase('e2e_styles');
  const formatsTarget = scratchDatabase('e2e_styles_tgt');
  const eventColumns = ['id', 'day', 'at', 'at_tz', 'span', 'raw', 'ratio'];

  beforeAll(async () => {
    await styled.create();
    await formatsTarget.create();
    await sql(
      styled,
      `create schema app;
       create table app.events (id integer primary key, day date, at timestamp, at_tz timestamptz,
         span interval, raw bytea, ratio float8);
       insert into app.events values (1, '2024-01-02', '2024-03-04 05:06:07', '2024-01-01 00:00:00+00',
         '1 year 2 months 3 days 04:05:06.789', '\\xdeadbeef', 0.1::float8 + 0.2::float8);
       alter database ${styled.name} set datestyle = 'SQL, DMY';
       alter database ${styled.name} set timezone = 'Asia/Kolkata';
       alter database ${styled.name} set intervalstyle = 'sql_standard';
       alter database ${styled.name} set bytea_output = 'escape';
       alter database ${styled.name} set extra_float_digits = -15;`,
    );
    await createWorkspace(server, token, {
      name: unique('styles'),
      select: true,
      source_config: config(styled.name, ['app']),
      target_config: config(formatsTarget.name, ['mart']),
      target_schema: {
        name: 'mart',
        version: '1.0.0',
        tables: [
          {
            name: 'events',
            primary_key: ['id'],
            columns: [
              { name: 'id', type: 'integer', nullable: false },
              { name: 'day', type: 'date' },
              { name: 'at', type: 'timestamp' },
              { name: 'at_tz', type: 'timestamptz' },
              { name: 'span', type: 'text' },
              { name: 'raw', type: 'text' },
              { name: 'ratio', type: 'text' },
            ],
          },
        ],
      },
    });
  });

  afterAll(async () => {
    for (const db of [styled, formatsTarget]) await db.drop();
  });

  it('materializes the values the source holds, whatever its styles', async () => {
    let res = await api('POST', '/api/mappings/events/tables', {
      body: { source_table: 'app.events', relationship: 'primary' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    for (const column of eventColumns) {
      const expression = ['span', 'raw', 'ratio'].includes(column)
        ? `events.${column}::text`
        : `events.${column}`;
      res = await api('POST', '/api/mappings/events/transformation', {
        body: { transformation: { target_field: column, expression } },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
    }
    res = await api('POST', '/api/mappings/events/commit-transformation', { body: { message: 'events' } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const { run } = await materializeAndWait('events');
    expect(run.status, run.error).toBe('succeeded');
    expect(run.result).toMatchObject({ rows_written: 1, mode: 'streamed_copy' });
    const { rows } = await sql(
      formatsTarget,
      `select id, day, at, at_tz = '2024-01-01 00:00:00+00' as same_instant, span, raw, ratio from mart.events`,
    );
    expect(rows).toEqual([
      {
        id: '1',
        day: '2024-01-02',
        at: '2024-03-04 05:06:07',
        same_instant: 't',
        span: '1 year 2 mons 3 days 04:05:06.789',
        raw: '\\xdeadbeef',
        ratio: '0.30000000000000004',
      },
    ]);
  });

  it('shows ad-hoc results in ISO dates, whatever the source prints', async () => {
    const res = await api('POST', '/api/sources/execute-query', {
      body: { sql: 'select day, at from app.events' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.rows).toEqual([{ day: '2024-01-02', at: '2024-03-04 05:06:07' }]);
  });
});

describe('source names with spaces, capitals and symbols', () => {
  // Discovery writes such names as the catalog spells them; the routes refused every one, and a table
  // named in an expression in another case passed every check and then failed in the database.
  const spaced = scratchDatabase('e2e_spaced');

  beforeAll(async () => {
    await spaced.create();
    await sql(
      spaced,
      `create schema "Sales Data";
       create table "Sales Data"."Customer Orders" ("Order Id" integer primary key, "Amount $" numeric, "Status" text);
       insert into "Sales Data"."Customer Orders" values (1, 10.5, 'Open'), (2, 3, 'CLOSED');`,
    );
    await createWorkspace(server, token, {
      name: unique('spaced'),
      select: true,
      source_config: config(spaced.name, ['Sales Data']),
      target_config: config(spaced.name, ['mart']),
      target_schema: {
        name: 'mart',
        version: '1.0.0',
        tables: [
          {
            name: 'orders',
            primary_key: ['order_id'],
            columns: [
              { name: 'order_id', type: 'integer', nullable: false },
              { name: 'amount', type: 'numeric' },
              { name: 'status', type: 'text' },
            ],
          },
        ],
      },
    });
  });

  afterAll(async () => {
    await spaced.drop();
  });

  it('maps them through the routes, and refuses a table named in another case', async () => {
    let res = await api('POST', '/api/mappings/orders/tables', {
      body: { source_table: 'Sales Data.Customer Orders', relationship: 'primary' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    res = await api('POST', '/api/mappings/orders/connection', {
      body: { connection: { source_field: 'Sales Data.Customer Orders.Order Id', target_field: 'order_id' } },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    res = await api('POST', '/api/mappings/orders/transformation', {
      body: { transformation: { target_field: 'amount', expression: '"Customer Orders"."Amount $" * 2' } },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    res = await api('POST', '/api/mappings/orders/transformation', {
      body: { transformation: { target_field: 'status', expression: '"CUSTOMER ORDERS"."Status"' } },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/CUSTOMER ORDERS/);
    res = await api('POST', '/api/mappings/orders/transformation', {
      body: { transformation: { target_field: 'status', expression: 'lower("Customer Orders"."Status")' } },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const preview = await api('POST', '/api/mappings/orders/preview-transformation', { body: { limit: 10 } });
    expect(preview.status, JSON.stringify(preview.body)).toBe(200);
    expect(
      preview.body.rows.sort((a: { order_id: number }, b: { order_id: number }) => a.order_id - b.order_id),
    ).toEqual([
      { order_id: 1, amount: '21.0', status: 'open' },
      { order_id: 2, amount: '6', status: 'closed' },
    ]);
    res = await api(
      'DELETE',
      `/api/mappings/orders/connection?source_field=${encodeURIComponent('Sales Data.Customer Orders.Order Id')}&target_field=order_id`,
    );
    expect(res.status, JSON.stringify(res.body)).toBe(200);
  });
});

describe('a money source column in the Python export', () => {
  // COPY prints money in the session's lc_monetary ($1,234.56); the script read that text as numeric
  // and stopped where the SQL's CAST(amount AS numeric) went through.
  const billing = scratchDatabase('e2e_money');
  const COLUMNS = ['invoice_id', 'amount', 'amount_cents'];
  const EXPECTED = [
    ['1', '1234.56', '123456'],
    ['2', '-1234.56', '-123456'],
    ['3', '0.00', '0'],
    ['4', '92233720368547758.07', '9223372036854775807'],
    ['5', '-92233720368547758.08', '-9223372036854775808'],
    ['6', null, null],
  ];
  const csvOf = (res: pg.QueryResult) => {
    const cell = (v: string | null) =>
      v === null ? '\\N' : /[",\n\r\\]/.test(v) ? `"${v.replaceAll('"', '""')}"` : v;
    const names = res.fields.map((f) => f.name);
    return (
      [names.join(','), ...res.rows.map((r) => names.map((n) => cell(r[n])).join(','))].join('\n') + '\n'
    );
  };

  beforeAll(async () => {
    await billing.create();
    await sql(
      billing,
      `create schema billing;
       create table billing.invoices (id integer primary key, amount money, fee money, note text);
       insert into billing.invoices values
         (1, 1234.56, 1, 'plain'), (2, -1234.56, null, 'credit'), (3, 0, 0, 'zero'),
         (4, '92233720368547758.07', 2, 'largest'), (5, '-92233720368547758.08', 3, 'smallest'),
         (6, null, null, 'none');`,
    );
    await createWorkspace(server, token, {
      name: unique('money'),
      select: true,
      source_config: config(billing.name, ['billing']),
      target_config: config(billing.name, ['mart']),
      target_schema: {
        name: 'mart',
        version: '1.0.0',
        tables: [
          {
            name: 'invoices',
            primary_key: ['invoice_id'],
            columns: [
              { name: 'invoice_id', type: 'integer', nullable: false },
              { name: 'amount', type: 'numeric' },
              { name: 'amount_cents', type: 'bigint' },
            ],
          },
        ],
      },
    });
  });

  afterAll(async () => {
    await billing.drop();
  });

  it('gives the values of the materialized table, exported by the queries it lists', async () => {
    let res = await api('POST', '/api/mappings/invoices/tables', {
      body: { source_table: 'billing.invoices', relationship: 'primary' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    for (const [source, target] of [
      ['id', 'invoice_id'],
      ['amount', 'amount'],
    ]) {
      res = await api('POST', '/api/mappings/invoices/connection', {
        body: { connection: { source_field: `invoices.${source}`, target_field: target } },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
    }
    res = await api('POST', '/api/mappings/invoices/transformation', {
      body: {
        transformation: { target_field: 'amount_cents', expression: 'invoices.amount::numeric * 100' },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    res = await api('POST', '/api/mappings/invoices/commit-transformation', { body: { message: 'money' } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const { run: materialized } = await materializeAndWait('invoices');
    expect(materialized.status, materialized.error).toBe('succeeded');
    const target = await sql(billing, `select ${COLUMNS.join(', ')} from mart.invoices order by invoice_id`);
    const sqlRows = target.rows.map((r) => COLUMNS.map((c) => r[c] as string | null));
    expect(sqlRows).toEqual(EXPECTED);

    const code = await api('POST', '/api/mappings/invoices/generate-code', { body: {} });
    expect(code.status, JSON.stringify(code.body)).toBe(200);
    expect(code.body.inputs).toEqual([
      { source_table: 'billing.invoices', file: 'billing.invoices.csv', query: expect.any(String) },
    ]);
    const dir = mkdtempSync(join(workDir, 'money-'));
    const script = join(dir, code.body.filename);
    writeFileSync(script, code.body.code);
    const runScript = () =>
      run('python3', [script, '--input-dir', dir, '--null', '\\N', '--output', join(dir, 'out.csv')]);

    // Exported as the response says (the script's docstring gives the same \copy commands).
    for (const input of code.body.inputs)
      writeFileSync(join(dir, input.file), csvOf(await sql(billing, input.query)));
    await runScript();
    const [header, ...pyRows] = parseCsv(readFileSync(join(dir, 'out.csv'), 'utf8'), '\\N');
    expect(header).toEqual(COLUMNS);
    pyRows.sort((a, b) => Number(a[0]) - Number(b[0]));
    expect(pyRows).toEqual(sqlRows);

    // A plain export prints money for display, whose separators depend on the locale: refused, not guessed.
    writeFileSync(
      join(dir, 'billing.invoices.csv'),
      csvOf(await sql(billing, 'select * from billing.invoices')),
    );
    const failed = await runScript().catch((error: { stderr: string }) => error);
    expect((failed as { stderr: string }).stderr).toMatch(
      /billing\.invoices\.csv:2: column amount: money value "\$1,234\.56" is in a display format.*export the column as numeric/,
    );
  });
});
