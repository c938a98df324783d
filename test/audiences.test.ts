import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { EntityManager } from '@mikro-orm/postgresql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, call, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { csvCell } from '../src/modules/audiences/audiences-sql.ts';
import { exportViews, runDueExports } from '../src/modules/audiences/audiences-exports.service.ts';
import { AudienceExport } from '../src/modules/audiences/audiences.entity.ts';
import { parseCsv } from './helpers/csv.ts';
import { retryAfterMs } from '../src/outbound-http.ts';

/*
 * Audiences end to end over HTTP against a real PostgreSQL warehouse: a scratch database on
 * 127.0.0.1:5432 (never the control-plane database) holding the customer table, created here and
 * dropped at the end, in both test modes (embedded and server control plane).
 */
const warehouse = scratchDatabase('aud');
const destination = scratchDatabase('aud_dest');

const targetConfig = (db = warehouse.name) => pgConfig(db, { schemas: ['crm'] });

const targetSchema = {
  name: 'crm',
  version: '1.0.0',
  tables: [
    {
      name: 'customers',
      description: 'Customer profiles',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false },
        { name: 'email', type: 'text', pii: true },
        { name: 'country', type: 'text' },
        { name: 'age', type: 'integer' },
        { name: 'lifetime_value', type: 'numeric' },
        { name: 'is_subscribed', type: 'boolean' },
        { name: 'signup_date', type: 'date' },
        { name: 'last_seen_at', type: 'timestamptz' },
        { name: 'profile', type: 'json' },
      ],
    },
  ],
};

let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let viewerToken: string;
let workspaceName: string;
let otherAudienceId: string;
let otherExportId: string;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/api/audiences',
);

async function materialized(id: string, token = tenant.admin.token) {
  const run = await api('POST', `/${id}/materialize`, { token });
  expect(run.status, JSON.stringify(run.body)).toBe(200);
  return until(
    `materialize ${id}`,
    async () => (await api('GET', `/${id}`, { token })).body,
    (a) =>
      ['succeeded', 'failed'].includes(a.materialization.status) &&
      a.materialization.run_id === run.body.run_id,
  );
}

async function exportFinished(audienceId: string, exportId: string, runId: string) {
  return until(
    `export ${exportId}`,
    async () => (await api('GET', `/${audienceId}/exports`)).body.exports.find((e: any) => e.id === exportId),
    (e) => e?.last_run?.run_id === runId && ['succeeded', 'failed', 'cancelled'].includes(e.last_run.status),
  );
}

const HAND_COUNT_SQL = `select count(*)::int as n from crm.customers
  where country in ('US', 'DE') and age >= 30 and (lifetime_value > 500 or is_subscribed = true)
    and strpos(lower(email), 'example') > 0
    and last_seen_at between now() - interval '30 days' and now()`;

const RULES = {
  all: [
    { field: 'country', op: 'in', value: ['US', 'DE'] },
    { field: 'age', op: '>=', value: 30 },
    {
      any: [
        { field: 'lifetime_value', op: '>', value: 500 },
        { field: 'is_subscribed', op: '=', value: true },
      ],
    },
    { field: 'email', op: 'contains', value: 'EXAMPLE' },
    { field: 'last_seen_at', op: 'within last days', value: 30 },
  ],
};

beforeAll(async () => {
  await warehouse.create();
  await destination.create();
  await warehouse.sql(`create schema crm`);
  await warehouse.sql(`create table crm.customers (customer_id integer primary key, email text, country text, age integer,
       lifetime_value numeric(12,2), is_subscribed boolean, signup_date date, last_seen_at timestamptz, profile jsonb)`);
  // 600 deterministic customers; a few e-mails need CSV quoting (comma, quote).
  await warehouse.sql(`insert into crm.customers
     select i,
            case when i % 50 = 0 then 'odd,"name"' || i || '@example.com'
                 when i % 7 = 0 then 'user' || i || '@other.org'
                 else 'user' || i || '@example.com' end,
            (array['US','DE','FR','US','GB'])[1 + i % 5],
            18 + (i * 7) % 60,
            ((i * 37) % 1000)::numeric + 0.25,
            i % 3 = 0,
            date '2020-01-01' + (i % 900),
            now() - ((i % 60) || ' days')::interval - interval '1 hour',
            jsonb_build_object('i', i)
       from generate_series(1, 600) i`);
  server = await startTestServer();
  tenant = await createTenant(server);
  other = await createTenant(server);
  viewerToken = (await tenant.addUser(['viewer'])).token;
  workspaceName = unique('aud');
  for (const [t, name] of [
    [tenant, workspaceName],
    [other, unique('aud')],
  ] as const)
    await createWorkspace(server, t.admin.token, {
      name,
      target_config: targetConfig(),
      target_schema: targetSchema,
    });
  // The other tenant's audience and export: its ids must read as missing to this tenant.
  const created = await call(server, 'POST', '/api/api/audiences', {
    token: other.admin.token,
    body: { name: 'theirs', target_table: 'customers', definition: { type: 'rules', rules: { all: [] } } },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  otherAudienceId = created.body.id;
  await materialized(otherAudienceId, other.admin.token);
  const exp = await call(server, 'POST', '/api/api/audiences/exports', {
    token: other.admin.token,
    body: { audience_id: otherAudienceId, destination: { type: 'csv' }, run_now: false },
  });
  expect(exp.status, JSON.stringify(exp.body)).toBe(200);
  otherExportId = exp.body.export.id;
});

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
  await destination.drop();
});

describe('audience end to end', () => {
  let audienceId: string;
  let exportId: string;
  let preview: any;

  it('creates a rule audience, materializes it, and its size equals a hand-written count', async () => {
    const res = await api('POST', '', {
      body: {
        name: 'High value US/DE',
        description: 'Engaged customers',
        target_table: 'customers',
        definition: { type: 'rules', rules: RULES },
        attribute_columns: ['email', 'country', 'lifetime_value', 'signup_date', 'profile'],
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    audienceId = res.body.id;
    expect(res.body).toMatchObject({
      target_database: warehouse.name,
      target_schema: 'crm',
      target_table: 'customers',
      identifier_columns: ['customer_id'],
      definition_version: 1,
      materialization: { status: 'never', stale: false, row_count: null },
    });
    const never = await api('GET', `/${audienceId}/size`);
    expect(never.body).toMatchObject({ materialized: false, row_count: null, stale: false });
    expect(never.body.message).toMatch(/Never materialized/);

    const done = await materialized(audienceId);
    expect(done.materialization.status, done.materialization.error).toBe('succeeded');
    const [{ n }] = await warehouse.sql(HAND_COUNT_SQL);
    expect(n).toBeGreaterThan(20);
    const size = await api('GET', `/${audienceId}/size`);
    expect(size.body).toMatchObject({ row_count: n, materialized: true, stale: false, status: 'succeeded' });
    expect(done.materialization.duration_ms).toBeGreaterThanOrEqual(0);
    expect(done.materialization.columns.map((c: any) => c.name)).toEqual([
      'customer_id',
      'email',
      'country',
      'lifetime_value',
      'signup_date',
      'profile',
    ]);
    // The stable view and the versioned table in the warehouse hold exactly the members.
    const [view] = await warehouse.sql(`select count(*)::int as n from ${done.materialization.table}`);
    expect(view.n).toBe(n);
    const [table] = await warehouse.sql(
      `select count(*)::int as n from ${done.materialization.versioned_table}`,
    );
    expect(table.n).toBe(n);
  });

  it('a second materialization swaps in a new version and drops the old one', async () => {
    const before = (await api('GET', `/${audienceId}`)).body.materialization.versioned_table;
    const after = await materialized(audienceId);
    expect(after.materialization.versioned_table).not.toBe(before);
    const [old] = await warehouse.sql(`select to_regclass($1) as r`, [before]);
    expect(old.r).toBeNull();
    const tables = await warehouse.sql(
      `select count(*)::int as n from pg_tables where schemaname = 'dimas_audiences' and tablename like $1`,
      [`a_${audienceId.replaceAll('-', '')}%`],
    );
    expect(tables[0].n).toBe(1);
  });

  it('exports a CSV whose content equals the preview', async () => {
    const res = await api('POST', '/exports', {
      body: {
        audience_id: audienceId,
        name: 'crm file',
        destination: { type: 'csv' },
        field_mapping: [
          { source: 'customer_id', destination: 'id' },
          { source: 'email', destination: 'Email' },
          { source: 'lifetime_value', destination: 'ltv' },
          { source: 'signup_date', destination: 'signed_up' },
          { source: 'profile', destination: 'profile' },
        ],
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    exportId = res.body.export.id;
    expect(res.body.run).toMatchObject({ created: true });
    const finished = await exportFinished(audienceId, exportId, res.body.run.run_id);
    expect(finished.last_run.status, finished.last_run.error).toBe('succeeded');
    const size = (await api('GET', `/${audienceId}/size`)).body.row_count;
    expect(finished.rows_exported).toBe(size);
    expect(finished.last_run.progress).toMatchObject({ rows_exported: size, percent: 100 });
    expect(finished.file.download_url).toBe(`/api/api/audiences/exports/${exportId}/download`);

    preview = (await api('GET', `/${audienceId}/exports/${exportId}/preview`, { query: { limit: 1000 } }))
      .body;
    expect(preview.columns).toEqual(['id', 'Email', 'ltv', 'signed_up', 'profile']);
    expect(preview.row_count).toBe(size);
    const defaultPreview = await api('GET', `/${audienceId}/exports/${exportId}/preview`);
    expect(defaultPreview.body.row_count).toBe(Math.min(100, size));

    const base = server.url;
    {
      const url = `${base}/api/api/audiences/exports/${exportId}/download`;
      const download = await fetch(url, { headers: { authorization: `Bearer ${tenant.admin.token}` } });
      expect(download.status).toBe(200);
      expect(download.headers.get('content-type')).toMatch(/text\/csv/);
      const rows = parseCsv(await download.text());
      expect(rows[0]).toEqual(preview.columns);
      const expected = preview.rows.map((r: Record<string, unknown>) =>
        preview.columns.map((c: string) => parseCsv(`${csvCell(r[c])}\n`)[0][0]),
      );
      expect(rows.slice(1)).toEqual(expected);
      expect(rows.slice(1).some((r) => r[1].includes(','))).toBe(true);
      // Guards of the download: no token, another tenant, a missing file.
      expect((await fetch(url)).status).toBe(401);
      const foreign = await fetch(url, { headers: { authorization: `Bearer ${other.admin.token}` } });
      expect(foreign.status).toBe(404);
      const none = await fetch(`${base}/api/api/audiences/exports/${otherExportId}/download`, {
        headers: { authorization: `Bearer ${other.admin.token}` },
      });
      expect(none.status).toBe(404);
    }
  });

  it('exports into a table of another PostgreSQL database', async () => {
    const res = await api('POST', '/exports', {
      body: {
        audience_id: audienceId,
        destination: pgConfig(destination.name, {
          password: 'not-needed-with-trust',
          schema: 'marketing',
          table: 'audience_members',
        }),
        field_mapping: [
          { source: 'customer_id', destination: 'id' },
          { source: 'country', destination: 'country_code' },
          { source: 'profile', destination: 'profile' },
        ],
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.export.destination).toMatchObject({ password_set: true, table: 'audience_members' });
    expect(JSON.stringify(res.body)).not.toContain('not-needed-with-trust');
    const finished = await exportFinished(audienceId, res.body.export.id, res.body.run.run_id);
    expect(finished.last_run.status, finished.last_run.error).toBe('succeeded');
    const rows = await destination.sql(
      'select id, country_code, profile from marketing.audience_members order by id',
    );
    const source = await warehouse.sql(
      `select customer_id as id, country as country_code, profile from (${HAND_COUNT_SQL.replace('count(*)::int as n', '*')}) x order by 1`,
    );
    expect(rows).toEqual(source);
    // A second run replaces the table's content rather than appending.
    const again = await api('PUT', `/exports/${res.body.export.id}`, {
      body: { export_id: res.body.export.id, run: true },
    });
    expect(again.status, JSON.stringify(again.body)).toBe(200);
    await exportFinished(audienceId, res.body.export.id, again.body.run.run_id);
    const [count] = await destination.sql('select count(*)::int as n from marketing.audience_members');
    expect(count.n).toBe(source.length);
  });

  it('reads an export again when its run ended after the export was read (never a succeeded run with no rows)', async () => {
    // The list reads the export, then its run: an export read just before the run wrote its outcome,
    // beside the run marked ended just after, is what a loaded server can interleave. Reproduced here
    // by an entity read earlier and left as it was while the run was still going.
    const em = server.deps.orm.em.fork() as EntityManager;
    const exp = await em.findOneOrFail(AudienceExport, { id: exportId });
    const finished = { rows: exp.rowsExported, status: exp.lastRunStatus };
    expect(finished).toEqual({ rows: expect.any(Number), status: 'succeeded' });
    Object.assign(exp, { lastRunStatus: 'running', rowsExported: null });
    const [view] = await exportViews(em, tenant.organization.id, [exp]);
    expect(view.last_run?.status).toBe('succeeded');
    expect(view.rows_exported).toBe(finished.rows);
  });

  it('posts a webhook in batches with idempotency keys, resending nothing acknowledged after a failure', async () => {
    const received: { key: string; ids: number[] }[] = [];
    let failedOnce = false;
    const hook: Server = createServer((req: IncomingMessage, res) => {
      let body = '';
      req.on('data', (chunk) => (body += chunk));
      req.on('end', () => {
        const payload = JSON.parse(body);
        const key = String(req.headers['idempotency-key']);
        expect(req.headers['x-api-key']).toBe('s3cret');
        // The second batch fails once: the sender must retry it, with the same key.
        if (payload.batch_index === 1 && !failedOnce) {
          failedOnce = true;
          res.writeHead(503).end();
          return;
        }
        received.push({ key, ids: payload.rows.map((r: any) => r.member_id) });
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      });
    });
    hook.listen(0, '127.0.0.1');
    await new Promise((resolve) => hook.once('listening', resolve));
    try {
      const res = await api('POST', '/exports', {
        body: {
          audience_id: audienceId,
          destination: {
            type: 'webhook',
            url: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/members`,
            headers: { 'x-api-key': 's3cret' },
            batch_size: 10,
          },
          field_mapping: [{ source: 'customer_id', destination: 'member_id' }],
        },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      expect(res.body.export.destination.headers).toEqual({ 'x-api-key': '••••••' });
      const finished = await exportFinished(audienceId, res.body.export.id, res.body.run.run_id);
      expect(finished.last_run.status, finished.last_run.error).toBe('succeeded');
      const size = (await api('GET', `/${audienceId}/size`)).body.row_count;
      const keys = received.map((r) => r.key);
      expect(new Set(keys).size).toBe(keys.length);
      // The key names the export, the data it sends (its delivery) and the batch, not the run.
      const delivery = finished.last_run.progress.delivery_id;
      expect(keys).toEqual(
        Array.from({ length: Math.ceil(size / 10) }, (_, i) => `${res.body.export.id}:${delivery}:${i}`),
      );
      const ids = received.flatMap((r) => r.ids);
      expect(ids).toEqual(preview.rows.map((r: any) => r.id));
      expect(failedOnce).toBe(true);
    } finally {
      hook.close();
    }
  });

  it('resumes a failed webhook run after the acknowledged batches (a retried run sends no row twice)', async () => {
    const received: { key: string; attempt: number; ids: number[] }[] = [];
    let refused = 0;
    const hook: Server = createServer((req: IncomingMessage, res) => {
      let body = '';
      req.on('data', (chunk) => (body += chunk));
      req.on('end', () => {
        const payload = JSON.parse(body);
        // The third batch fails once with a 503 and no retries within the attempt, which fails the
        // whole attempt of the run (a 4xx would fail the run itself: it would repeat).
        if (payload.batch_index === 2 && refused === 0) {
          refused++;
          res.writeHead(503).end();
          return;
        }
        received.push({
          key: String(req.headers['idempotency-key']),
          attempt: refused,
          ids: payload.rows.map((r: any) => r.id),
        });
        res.writeHead(204).end();
      });
    });
    hook.listen(0, '127.0.0.1');
    await new Promise((resolve) => hook.once('listening', resolve));
    try {
      const res = await api('POST', '/exports', {
        body: {
          audience_id: audienceId,
          destination: {
            type: 'webhook',
            url: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/`,
            batch_size: 7,
            max_retries: 0,
          },
          field_mapping: [{ source: 'customer_id', destination: 'id' }],
        },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      const finished = await exportFinished(audienceId, res.body.export.id, res.body.run.run_id);
      expect(finished.last_run.status, finished.last_run.error).toBe('succeeded');
      expect(refused).toBe(1);
      // Batches 0 and 1 went out in the first attempt only; the retry started at batch 2.
      expect(received.filter((r) => r.attempt === 1).map((r) => r.key)[0]).toBe(
        `${res.body.export.id}:${finished.last_run.progress.delivery_id}:2`,
      );
      expect(finished.last_run.progress).toMatchObject({
        resumed_from_batch: 2,
        resumed_from_run_id: res.body.run.run_id,
        restarted_because: null,
      });
      const keys = received.map((r) => r.key);
      expect(new Set(keys).size).toBe(keys.length);
      expect(received.flatMap((r) => r.ids)).toEqual(preview.rows.map((r: any) => r.id));
    } finally {
      hook.close();
    }
  });

  it('counts metrics and conversions posted twice once, and the summary equals hand-computed figures', async () => {
    const metrics = [
      {
        ad_platform: 'google',
        campaign_id: 'c1',
        date: '2026-01-01',
        impressions: 1000,
        clicks: 50,
        spend: 100,
        conversions: 5,
        revenue: 400,
      },
      {
        ad_platform: 'google',
        campaign_id: 'c1',
        date: '2026-01-02',
        impressions: 2000,
        clicks: 70,
        spend: 150.5,
        conversions: 7,
        revenue: 500,
      },
      {
        ad_platform: 'meta',
        campaign_id: 'm9',
        date: '2026-01-01',
        impressions: 3000,
        clicks: 30,
        spend: 60,
        conversions: 0,
        revenue: 0,
      },
    ];
    for (const round of [1, 2])
      for (const m of metrics) {
        const res = await api('POST', '/performance-metrics', {
          body: { audience_segment_id: audienceId, ...m },
        });
        expect(res.status, JSON.stringify(res.body)).toBe(200);
        expect(res.body.created).toBe(round === 1);
      }
    // Conversions of members (customers 7, 8 and 9, posted here before, are none: they now count apart).
    const [c1, c2, c3] = (
      await warehouse.sql(`${HAND_COUNT_SQL.replace('count(*)::int as n', 'customer_id')} order by 1 limit 3`)
    ).map((r) => String(r.customer_id));
    const conversions = [
      {
        customer_id: c1,
        value: 120,
        occurred_at: '2026-01-01T10:00:00Z',
        external_id: unique('o'),
        ad_platform: 'google',
      },
      {
        customer_id: c2,
        value: 80.5,
        occurred_at: '2026-01-02T23:30:00+00:00',
        external_id: unique('o'),
        ad_platform: 'google',
      },
      { customer_id: c3, value: 30, occurred_at: '2026-01-02T08:00:00Z', external_id: unique('o') },
    ];
    for (const round of [1, 2])
      for (const c of conversions) {
        const res = await api('POST', '/conversions', {
          body: { audience_id: audienceId, event: 'purchase', ...c },
        });
        expect(res.status, JSON.stringify(res.body)).toBe(200);
        expect(res.body.created).toBe(round === 1);
      }
    const listed = await api('GET', '/performance-metrics', { query: { audience_segment_id: audienceId } });
    expect(listed.body.total).toBe(3);
    const filtered = await api('GET', '/performance-metrics', {
      query: { ad_platform: 'google', start_date: '2026-01-02', end_date: '2026-01-31' },
    });
    expect(filtered.body.metrics.map((m: any) => [m.campaign_id, m.date])).toEqual([['c1', '2026-01-02']]);

    const summary = (await api('GET', `/${audienceId}/performance-summary`)).body;
    const r6 = (x: number) => Math.round(x * 1e6) / 1e6;
    expect(summary.overall).toEqual({
      impressions: 6000,
      clicks: 150,
      spend: 310.5,
      conversions: 12,
      revenue: 900,
      ctr: r6(150 / 6000),
      cpc: r6(310.5 / 150),
      cpa: r6(310.5 / 12),
      conversion_rate: r6(12 / 150),
      roas: r6(900 / 310.5),
      recorded_conversions: 3,
      recorded_conversion_value: 230.5,
      unmatched_conversions: 0,
      unmatched_conversion_value: 0,
    });
    expect(summary.currencies).toEqual(['USD']);
    const google = summary.by_platform.find((p: any) => p.ad_platform === 'google');
    expect(google).toMatchObject({
      impressions: 3000,
      clicks: 120,
      spend: 250.5,
      recorded_conversions: 2,
      recorded_conversion_value: 200.5,
    });
    const meta = summary.by_platform.find((p: any) => p.ad_platform === 'meta');
    expect(meta).toMatchObject({ impressions: 3000, clicks: 30, conversions: 0, cpa: null, roas: 0 });
    expect(summary.by_platform.find((p: any) => p.ad_platform === null)).toMatchObject({
      recorded_conversions: 1,
      impressions: 0,
    });
    expect(summary.by_day.map((d: any) => [d.date, d.impressions, d.recorded_conversions])).toEqual([
      ['2026-01-01', 4000, 1],
      ['2026-01-02', 2000, 2],
    ]);

    const dash = (await api('GET', '/dashboard')).body;
    const row = dash.audiences.find((a: any) => a.id === audienceId);
    const size = (await api('GET', `/${audienceId}/size`)).body.row_count;
    expect(row).toMatchObject({
      size,
      stale: false,
      export_count: 4,
      materialization_status: 'succeeded',
      performance: { impressions: 6000, spend: 310.5, recorded_conversions: 3 },
    });
    expect(row.freshness_seconds).toBeGreaterThanOrEqual(0);
    expect(dash.audiences.some((a: any) => a.id === otherAudienceId)).toBe(false);
  });

  it('marks the audience stale when its definition changes, and lists exports with their runs', async () => {
    const res = await api('PUT', `/${audienceId}`, {
      body: {
        audience_id: audienceId,
        definition: { type: 'rules', rules: { all: [{ field: 'age', op: '>', value: 70 }] } },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.definition_version).toBe(2);
    expect(res.body.materialization.stale).toBe(true);
    const size = (await api('GET', `/${audienceId}/size`)).body;
    expect(size).toMatchObject({ stale: true, materialized: true });
    expect(size.message).toMatch(/Stale/);
    // A description change is not a definition change.
    const renamed = await api('PUT', `/${audienceId}`, {
      body: { audience_id: audienceId, description: 'x' },
    });
    expect(renamed.body.definition_version).toBe(2);
    const list = await api('GET', `/${audienceId}/exports`);
    expect(list.body.exports).toHaveLength(4);
    expect(list.body.exports.every((e: any) => e.last_run?.status === 'succeeded')).toBe(true);
  });

  it('updates an export: mapping, schedule, pause and resume; the scheduler starts due runs', async () => {
    let res = await api('PUT', `/exports/${exportId}`, {
      body: {
        export_id: exportId,
        schedule: 'hourly',
        field_mapping: [{ source: 'customer_id', destination: 'customer' }],
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.export).toMatchObject({
      schedule: 'hourly',
      field_mapping: [{ source: 'customer_id', destination: 'customer' }],
    });
    expect(new Date(res.body.export.next_run_at).getTime()).toBeGreaterThan(Date.now() + 3500_000);
    const preview = await api('GET', `/${audienceId}/exports/${exportId}/preview`, { query: { limit: 3 } });
    expect(preview.body.columns).toEqual(['customer']);
    expect(preview.body.rows).toHaveLength(3);

    res = await api('PUT', `/exports/${exportId}`, { body: { export_id: exportId, status: 'paused' } });
    expect(res.body.export.status).toBe('paused');
    const refused = await api('PUT', `/exports/${exportId}`, { body: { export_id: exportId, run: true } });
    expect(refused.status).toBe(409);
    const paused = await runDueExports(server.deps, new Date(Date.now() + 2 * 3600_000));
    expect(paused.started).not.toContain(exportId);

    res = await api('PUT', `/exports/${exportId}`, { body: { export_id: exportId, status: 'active' } });
    expect(res.body.export.status).toBe('active');
    const due = await runDueExports(server.deps, new Date(Date.now() + 2 * 3600_000));
    expect(due.started).toContain(exportId);
    const list = (await api('GET', `/${audienceId}/exports`)).body.exports;
    const runId = list.find((e: any) => e.id === exportId).last_run.run_id;
    const finished = await exportFinished(audienceId, exportId, runId);
    expect(finished.last_run.status, finished.last_run.error).toBe('succeeded');
  });

  it('obeys the audience_exports feature flag', async () => {
    const off = await call(server, 'POST', '/api/admin/feature-settings', {
      token: tenant.admin.token,
      body: { features: { audience_exports: false } },
    });
    expect(off.status).toBe(200);
    try {
      const res = await api('POST', '/exports', {
        body: { audience_id: audienceId, destination: { type: 'csv' } },
      });
      expect(res.status).toBe(403);
      expect(res.body.reason).toBe('FEATURE_DISABLED');
      const run = await api('PUT', `/exports/${exportId}`, { body: { export_id: exportId, run: true } });
      expect(run.status).toBe(403);
    } finally {
      await call(server, 'POST', '/api/admin/feature-settings', {
        token: tenant.admin.token,
        body: { features: { audience_exports: null } },
      });
    }
  });

  it('refuses a webhook in a blocked network when saved, and fails a run whose webhook redirects into one without following it or retrying', async () => {
    for (const url of [
      'http://169.254.169.254/latest/meta-data/',
      'http://[::ffff:a9fe:a9fe]/',
      'http://2852039166/',
    ]) {
      const res = await api('POST', '/exports', {
        body: { audience_id: audienceId, destination: { type: 'webhook', url } },
      });
      expect(res.status, `${url} ${JSON.stringify(res.body)}`).toBe(422);
      expect(res.body.reason).toBe('BLOCKED_NETWORK');
    }
    // An allowed host that answers with a redirect to the metadata address: checked per connection.
    let requests = 0;
    const hook: Server = createServer((_req, res) => {
      requests++;
      res.writeHead(307, { location: 'http://169.254.169.254/latest/meta-data/' }).end();
    });
    hook.listen(0, '127.0.0.1');
    await new Promise((resolve) => hook.once('listening', resolve));
    try {
      const res = await api('POST', '/exports', {
        body: {
          audience_id: audienceId,
          destination: { type: 'webhook', url: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/` },
          field_mapping: [{ source: 'customer_id', destination: 'id' }],
        },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      const finished = await exportFinished(audienceId, res.body.export.id, res.body.run.run_id);
      expect(finished.last_run.status).toBe('failed');
      // Webhooks never follow redirects: the Location is named, not requested.
      expect(finished.last_run.error).toContain(
        'the webhook answered 307 Temporary Redirect with Location http://169.254.169.254/latest/meta-data/',
      );
      expect(requests).toBe(1);
    } finally {
      hook.close();
    }
  });

  it("waits as long as a webhook's Retry-After asks, in seconds or as an HTTP date", async () => {
    expect(retryAfterMs('7')).toBe(7000);
    expect(retryAfterMs(new Date(Date.UTC(2030, 0, 1, 0, 0, 30)).toUTCString(), Date.UTC(2030, 0, 1))).toBe(
      30_000,
    );
    expect(retryAfterMs('Wed, 21 Oct 2015 07:28:00 GMT')).toBe(0);
    expect(retryAfterMs('soon')).toBe(0);
    expect(retryAfterMs(null)).toBe(0);
    const arrivals: number[] = [];
    const hook: Server = createServer((req: IncomingMessage, res) => {
      req.resume();
      req.on('end', () => {
        arrivals.push(Date.now());
        // The first answer asks, as a date (whole seconds), for at least two seconds' pause.
        if (arrivals.length === 1)
          res.writeHead(429, { 'retry-after': new Date(Date.now() + 3000).toUTCString() }).end();
        else res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      });
    });
    hook.listen(0, '127.0.0.1');
    await new Promise((resolve) => hook.once('listening', resolve));
    try {
      const res = await api('POST', '/exports', {
        body: {
          audience_id: audienceId,
          destination: {
            type: 'webhook',
            url: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/slow`,
            batch_size: 1000,
          },
          field_mapping: [{ source: 'customer_id', destination: 'member_id' }],
        },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      const finished = await exportFinished(audienceId, res.body.export.id, res.body.run.run_id);
      expect(finished.last_run.status, finished.last_run.error).toBe('succeeded');
      expect(arrivals).toHaveLength(2);
      // The backoff alone would have retried after 200 ms.
      expect(arrivals[1] - arrivals[0]).toBeGreaterThanOrEqual(1900);
    } finally {
      hook.close();
    }
  });

  it('deletes an audience and drops its materialized table and view', async () => {
    const audience = (await api('GET', `/${audienceId}`)).body;
    const res = await api('DELETE', `/${audienceId}`);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ success: true, warehouse_error: null });
    expect(res.body.dropped).toEqual([
      audience.materialization.table,
      audience.materialization.versioned_table,
    ]);
    for (const relation of res.body.dropped) {
      const [row] = await warehouse.sql(`select to_regclass($1) as r`, [relation]);
      expect(row.r).toBeNull();
    }
    expect((await api('GET', `/${audienceId}`)).status).toBe(404);
    expect((await api('GET', `/${audienceId}/exports`)).status).toBe(404);
  });
});

/** The message and every issue: validation errors found by services travel as issues on REST. */
const errorText = (res: { body: any }) =>
  [res.body.message, ...(res.body.issues ?? []).map((i: { message: string }) => i.message)].join(' | ');

describe('audience definitions', () => {
  const create = (body: Record<string, unknown>, token?: string) =>
    api('POST', '', { token, body: { name: unique('a'), target_table: 'customers', ...body } });

  it('refuses unknown fields and operators that do not fit the type, naming them', async () => {
    let res = await create({
      definition: { type: 'rules', rules: { all: [{ field: 'shoe_size', op: '=', value: 1 }] } },
    });
    expect(res.status).toBe(400);
    expect(errorText(res)).toMatch(/Unknown field shoe_size/);
    res = await create({
      definition: { type: 'rules', rules: { any: [{ field: 'age', op: 'contains', value: '3' }] } },
    });
    expect(res.status).toBe(400);
    expect(errorText(res)).toMatch(/contains does not fit field age of type integer/);
    res = await create({
      definition: { type: 'rules', rules: { all: [{ field: 'email', op: '>', value: 'a' }] } },
    });
    expect(res.status).toBe(400);
    expect(errorText(res)).toMatch(/> does not fit field email/);
    res = await create({
      definition: { type: 'rules', rules: { all: [{ field: 'profile', op: '=', value: 'x' }] } },
    });
    expect(res.status).toBe(400);
    res = await create({
      definition: { type: 'rules', rules: { all: [{ field: 'age', op: 'between', value: [1] }] } },
    });
    expect(res.status).toBe(400);
    expect(errorText(res)).toMatch(/age/);
    // Days that do not exist: Date.parse rolled some over and they failed only when materialized.
    for (const [field, value] of [
      ['signup_date', '2020-13-45'],
      ['signup_date', '2024-02-30'],
      ['signup_date', '0000-01-01'],
      ['last_seen_at', '2024-02-30T00:00:00Z'],
    ]) {
      res = await create({ definition: { type: 'rules', rules: { all: [{ field, op: '=', value }] } } });
      expect(res.status, `${field} = ${value}`).toBe(400);
      expect(errorText(res)).toMatch(new RegExp(field));
    }
    res = await create({
      definition: { type: 'rules', rules: { all: [{ field: 'signup_date', op: '=', value: '2024-02-29' }] } },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    res = await create({
      definition: { type: 'rules', rules: { all: [{ field: 'age', op: 'like', value: 1 }] } },
    });
    expect(res.status).toBe(400);
    expect(errorText(res)).toMatch(/Unknown operator like/);
    res = await create({ definition: { type: 'rules', rules: { every: [] } } });
    expect(res.status).toBe(400);
    res = await create({ target_table: 'orders', definition: { type: 'rules', rules: { all: [] } } });
    expect(res.status).toBe(400);
    expect(errorText(res)).toMatch(/Unknown target table orders/);
    res = await create({ definition: { type: 'rules', rules: { all: [] } }, attribute_columns: ['nope'] });
    expect(res.status).toBe(400);
    expect(errorText(res)).toMatch(/nope/);
    res = await create({ definition: { type: 'rules' } });
    expect(res.status).toBe(400);
    res = await create({ definition: { type: 'sql', sql: 'delete from crm.customers' } });
    expect(res.status).toBe(400);
    expect(errorText(res)).toMatch(/read-only/);
    res = await create({ definition: { type: 'sql', sql: 'select * from crm.customers where' } });
    expect(res.status).toBe(400);
    res = await create({ definition: { type: 'sql', sql: 'select 1; select 2' } });
    expect(res.status).toBe(400);
    res = await create({ name: '', definition: { type: 'rules', rules: { all: [] } } });
    expect(res.status).toBe(400);
  });

  it('materializes a SQL audience and every operator compiles and runs', async () => {
    const res = await create({
      // As pasted from an editor: a final semicolon and a comment after it.
      definition: {
        type: 'sql',
        sql: "select customer_id, country from crm.customers where country = 'FR'; -- French customers",
      },
      attribute_columns: ['country'],
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const done = await materialized(res.body.id);
    expect(done.materialization.status, done.materialization.error).toBe('succeeded');
    const [{ n }] = await warehouse.sql(`select count(*)::int as n from crm.customers where country = 'FR'`);
    expect(done.materialization.row_count).toBe(n);

    const conditions = [
      { field: 'customer_id', op: '!=', value: 3 },
      { field: 'age', op: 'between', value: [20, 70] },
      { field: 'country', op: 'not in', value: ['GB'] },
      { field: 'email', op: 'starts with', value: 'user' },
      { field: 'signup_date', op: '<=', value: '2030-01-01' },
      { field: 'signup_date', op: 'within last days', value: 36500 },
      { field: 'last_seen_at', op: '<', value: '2100-01-01T00:00:00Z' },
      { field: 'lifetime_value', op: '<', value: 1000.5 },
      { field: 'profile', op: 'is not null' },
      { field: 'is_subscribed', op: 'is not null' },
      { field: 'customer_id', op: 'in', value: [1, 2, 3, 4, 5, 6, 8, 9, 10] },
    ];
    const rules = await create({ definition: { type: 'rules', rules: { all: conditions } } });
    expect(rules.status, JSON.stringify(rules.body)).toBe(200);
    const ran = await materialized(rules.body.id);
    expect(ran.materialization.status, ran.materialization.error).toBe('succeeded');
    const [hand] =
      await warehouse.sql(`select count(*)::int as n from crm.customers where customer_id in (1,2,4,5,6,8,9,10) and age between 20 and 70
         and country <> 'GB' and email like 'user%'`);
    expect(ran.materialization.row_count).toBe(hand.n);

    // A SQL audience whose SELECT lacks the identifier column fails, and says why.
    const broken = await create({ definition: { type: 'sql', sql: 'select email from crm.customers' } });
    const failed = await materialized(broken.body.id);
    expect(failed.materialization.status).toBe('failed');
    expect(failed.materialization.error).toMatch(/customer_id/);
    expect((await api('GET', `/${broken.body.id}/size`)).body.message).toMatch(
      /Never materialized successfully/,
    );
  });

  it('escapes cells a spreadsheet would run as formulas when the CSV destination asks, never by default', async () => {
    const audience = await create({
      definition: {
        type: 'sql',
        sql: `select customer_id, '=HYPERLINK("http://x.example")' as country, '+15551234567' as email
          from crm.customers where customer_id <= 2`,
      },
      attribute_columns: ['country', 'email'],
    });
    expect(audience.status, JSON.stringify(audience.body)).toBe(200);
    expect((await materialized(audience.body.id)).materialization.status).toBe('succeeded');
    const download = async (escape_formulas?: boolean) => {
      const res = await api('POST', '/exports', {
        body: {
          audience_id: audience.body.id,
          destination: { type: 'csv', ...(escape_formulas === undefined ? {} : { escape_formulas }) },
          field_mapping: [
            { source: 'customer_id', destination: 'id' },
            { source: 'country', destination: 'cell' },
            { source: 'email', destination: 'phone' },
          ],
        },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      const done = await exportFinished(audience.body.id, res.body.export.id, res.body.run.run_id);
      expect(done.last_run.status, done.last_run.error).toBe('succeeded');
      const file = await fetch(`${server.url}${done.file.download_url}`, {
        headers: { authorization: `Bearer ${tenant.admin.token}` },
      });
      return parseCsv(await file.text()).slice(1);
    };
    // As stored by default: other systems read these values as they are.
    expect((await download())[0]).toEqual(['1', '=HYPERLINK("http://x.example")', '+15551234567']);
    expect((await download(true))[0]).toEqual(['1', `'=HYPERLINK("http://x.example")`, "'+15551234567"]);
  });

  it('lists the audiences of the current target database/schema only', async () => {
    const listed = await api('GET', '');
    expect(listed.status).toBe(200);
    expect(listed.body).toMatchObject({ target_database: warehouse.name, target_schema: 'crm' });
    expect(listed.body.total).toBeGreaterThan(0);
    expect(listed.body.audiences.some((a: any) => a.id === otherAudienceId)).toBe(false);
    // Pages in one order; the total holds on every page, past the last one too.
    const total = listed.body.total;
    const names = listed.body.audiences.map((a: any) => a.name);
    const second = await api('GET', '', { query: { limit: 1, offset: 1 } });
    expect(second.body).toMatchObject({ total, audiences: [{ name: names[1] }] });
    const past = await api('GET', '', { query: { limit: 5, offset: total + 3 } });
    expect(past.body).toMatchObject({ total, audiences: [] });
    const dup = await api('POST', '', {
      body: {
        name: listed.body.audiences[0].name,
        target_table: 'customers',
        definition: { type: 'rules', rules: { all: [] } },
      },
    });
    expect(dup.status).toBe(409);
    // Pointing the workspace at another database hides them.
    const moved = await call(server, 'POST', `/api/workspaces/${workspaceName}/config`, {
      token: tenant.admin.token,
      body: { target_config: targetConfig(destination.name) },
    });
    expect(moved.status).toBe(200);
    try {
      const hidden = await api('GET', '');
      expect(hidden.body).toMatchObject({ target_database: destination.name, total: 0, audiences: [] });
      const id = listed.body.audiences[0].id;
      expect((await api('POST', `/${id}/materialize`)).status).toBe(409);
    } finally {
      await call(server, 'POST', `/api/workspaces/${workspaceName}/config`, {
        token: tenant.admin.token,
        body: { target_config: targetConfig() },
      });
    }
  });
});

describe('guards, bad input and tenancy', () => {
  let mine: string;
  let myExport: string;

  beforeAll(async () => {
    const res = await api('POST', '', {
      body: {
        name: unique('g'),
        target_table: 'customers',
        definition: { type: 'rules', rules: { all: [] } },
      },
    });
    mine = res.body.id;
    await materialized(mine);
    const exp = await api('POST', '/exports', {
      body: { audience_id: mine, destination: { type: 'csv' }, run_now: false },
    });
    expect(exp.status, JSON.stringify(exp.body)).toBe(200);
    myExport = exp.body.export.id;
  });

  const routes = () => [
    ['GET', ''],
    ['POST', ''],
    ['GET', '/dashboard'],
    ['GET', '/performance-metrics'],
    ['POST', '/performance-metrics'],
    ['POST', '/exports'],
    ['PUT', `/exports/${myExport}`],
    ['POST', '/conversions'],
    ['GET', `/${mine}`],
    ['PUT', `/${mine}`],
    ['DELETE', `/${mine}`],
    ['POST', `/${mine}/materialize`],
    ['GET', `/${mine}/exports`],
    ['GET', `/${mine}/exports/${myExport}/preview`],
    ['GET', `/${mine}/performance-summary`],
    ['GET', `/${mine}/size`],
  ];

  it('answers 401 without a token on all 16 routes', async () => {
    for (const [method, path] of routes()) {
      const res = await call(server, method, `/api/api/audiences${path}`, {
        body: method === 'GET' || method === 'DELETE' ? undefined : {},
      });
      expect(res.status, `${method} ${path}`).toBe(401);
    }
  });

  it('refuses every write to a viewer with 403 and lets it read', async () => {
    for (const [method, path] of routes()) {
      const res = await call(server, method, `/api/api/audiences${path}`, {
        token: viewerToken,
        body: method === 'GET' || method === 'DELETE' ? undefined : {},
      });
      if (method === 'GET') expect(res.status, `${method} ${path}`).not.toBe(403);
      else expect(res.status, `${method} ${path}`).toBe(403);
    }
  });

  it("answers 404 for another organization's audience and export ids, exactly like missing ones", async () => {
    const missing = '00000000-0000-4000-8000-000000000000';
    for (const id of [otherAudienceId, missing, 'not-a-uuid']) {
      expect((await api('GET', `/${id}`)).status).toBe(404);
      expect((await api('PUT', `/${id}`, { body: { audience_id: id, description: 'x' } })).status).toBe(404);
      expect((await api('DELETE', `/${id}`)).status).toBe(404);
      expect((await api('POST', `/${id}/materialize`)).status).toBe(404);
      expect((await api('GET', `/${id}/size`)).status).toBe(404);
      expect((await api('GET', `/${id}/exports`)).status).toBe(404);
      expect((await api('GET', `/${id}/performance-summary`)).status).toBe(404);
      expect((await api('GET', `/${id}/exports/${myExport}/preview`)).status).toBe(404);
      const metric = {
        audience_segment_id: id,
        ad_platform: 'g',
        campaign_id: 'c',
        date: '2026-01-01',
        impressions: 1,
        clicks: 0,
        spend: 0,
      };
      expect((await api('POST', '/performance-metrics', { body: metric })).status).toBe(404);
      const conversion = {
        audience_id: id,
        customer_id: '1',
        occurred_at: '2026-01-01T00:00:00Z',
        external_id: unique('x'),
      };
      expect((await api('POST', '/conversions', { body: conversion })).status).toBe(404);
      expect(
        (await api('POST', '/exports', { body: { audience_id: id, destination: { type: 'csv' } } })).status,
      ).toBe(404);
    }
    for (const id of [otherExportId, 'not-a-uuid']) {
      expect((await api('PUT', `/exports/${id}`, { body: { export_id: id, status: 'paused' } })).status).toBe(
        404,
      );
      expect((await api('GET', `/${mine}/exports/${id}/preview`)).status).toBe(404);
    }
    // The other tenant's data is untouched and its metrics are not listed here.
    expect(
      (await call(server, 'GET', `/api/api/audiences/${otherAudienceId}`, { token: other.admin.token }))
        .status,
    ).toBe(200);
    const foreign = await api('GET', '/performance-metrics', {
      query: { audience_segment_id: otherAudienceId },
    });
    expect(foreign.body).toEqual({ total: 0, metrics: [] });
  });

  it('answers 400 for bad bodies and parameters', async () => {
    const metric = {
      audience_segment_id: mine,
      ad_platform: 'g',
      campaign_id: 'c',
      date: '2026-01-01',
      impressions: 10,
      clicks: 1,
      spend: 1,
    };
    for (const bad of [
      { ...metric, impressions: -1 },
      { ...metric, spend: -0.01 },
      { ...metric, date: '2026-02-30' },
      { ...metric, date: '01/02/2026' },
      { ...metric, clicks: 11 },
      { ...metric, currency: 'dollars' },
      { ...metric, ad_platform: undefined },
    ])
      expect((await api('POST', '/performance-metrics', { body: bad })).status, JSON.stringify(bad)).toBe(
        400,
      );
    const conversion = {
      audience_id: mine,
      customer_id: '1',
      occurred_at: '2026-01-01T00:00:00Z',
      external_id: unique('x'),
    };
    for (const bad of [
      { ...conversion, external_id: undefined },
      { ...conversion, occurred_at: 'yesterday' },
      { ...conversion, value: -5 },
    ])
      expect((await api('POST', '/conversions', { body: bad })).status, JSON.stringify(bad)).toBe(400);
    expect((await api('GET', '/performance-metrics', { query: { start_date: 'soon' } })).status).toBe(400);
    expect(
      (
        await api('GET', '/performance-metrics', {
          query: { start_date: '2026-02-01', end_date: '2026-01-01' },
        })
      ).status,
    ).toBe(400);
    const exp = { audience_id: mine, destination: { type: 'csv' } };
    for (const bad of [
      { ...exp, destination: { type: 'ftp' } },
      { ...exp, destination: { type: 'webhook', url: 'ftp://x' } },
      { ...exp, destination: { type: 'postgres', host: '127.0.0.1' } },
      { ...exp, field_mapping: [{ source: 'nope', destination: 'x' }] },
      {
        ...exp,
        field_mapping: [
          { source: 'customer_id', destination: 'x' },
          { source: 'customer_id', destination: 'X' },
        ],
      },
      { ...exp, schedule: 'every minute' },
    ])
      expect((await api('POST', '/exports', { body: bad })).status, JSON.stringify(bad)).toBe(400);
    expect(
      (await api('PUT', `/exports/${myExport}`, { body: { export_id: myExport, status: 'deleted' } })).status,
    ).toBe(400);
    expect(
      (
        await api('PUT', `/exports/${myExport}`, {
          body: { export_id: myExport, destination: { type: 'webhook', url: 'http://127.0.0.1:1/' } },
        })
      ).status,
    ).toBe(400);
    expect(
      (await api('GET', `/${mine}/exports/${myExport}/preview`, { query: { limit: 1001 } })).status,
    ).toBe(400);
    expect((await api('GET', `/${mine}/exports/${myExport}/preview`, { query: { limit: 0 } })).status).toBe(
      400,
    );
    expect((await api('PUT', `/${mine}`, { body: { audience_id: mine, target_table: 'nope' } })).status).toBe(
      400,
    );
    expect((await api('POST', '', { body: 'not json' })).status).toBe(400);
  });

  it('refuses an export of an audience that was never materialized with 409', async () => {
    const res = await api('POST', '', {
      body: {
        name: unique('n'),
        target_table: 'customers',
        definition: { type: 'rules', rules: { all: [] } },
      },
    });
    const exp = await api('POST', '/exports', {
      body: { audience_id: res.body.id, destination: { type: 'csv' } },
    });
    expect(exp.status).toBe(409);
    expect(exp.body.reason).toBe('NOT_MATERIALIZED');
  });
});
