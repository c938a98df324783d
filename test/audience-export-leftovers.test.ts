import { mkdtempSync, readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase, withClient } from './helpers/scratch-db.ts';
import { SUPERADMIN_PASSWORD, SUPERADMIN_USERNAME, TEST_SECRET_KEY } from './helpers/constants.ts';
import { loadEnv } from '../src/env.ts';
import { openDatabase } from '../src/db/orm.ts';
import { createLogger } from '../src/logger.ts';
import { startServer, type RunningServer } from '../src/server.ts';
import { sealLegacyWebhookUrls } from '../src/modules/audiences/audiences-exports.service.ts';

/*
 * Audience exports: into the embedded demo warehouse itself, what a webhook run that failed or was
 * paused had delivered, and webhook URLs saved before their query values were sealed.
 */
const CUSTOMERS = 95;
const BATCH = 10;

const TARGET_SCHEMA = (schema: string) => ({
  name: schema,
  version: '1.0.0',
  tables: [
    {
      name: 'customers',
      primary_key: ['customer_id'],
      columns: [
        { name: 'customer_id', type: 'integer', nullable: false },
        { name: 'email', type: 'text' },
      ],
    },
  ],
});

const ENDED = ['succeeded', 'failed', 'cancelled'];

/** An audience of every customer of the caller's current workspace, materialized. */
async function everyone(api: ReturnType<typeof bindCall>) {
  const created = await api('POST', '', {
    body: {
      name: unique('everyone'),
      target_table: 'customers',
      definition: { type: 'rules', rules: { all: [] } },
      attribute_columns: ['email'],
    },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  const id = created.body.id as string;
  const run = await api('POST', `/${id}/materialize`);
  expect(run.status, JSON.stringify(run.body)).toBe(200);
  const done = await until(
    'materialize',
    async () => (await api('GET', `/${id}`)).body,
    (a) => a.materialization.run_id === run.body.run_id && ENDED.includes(a.materialization.status),
    90_000,
  );
  expect(done.materialization.status, done.materialization.error).toBe('succeeded');
  return id;
}

async function exportOf(api: ReturnType<typeof bindCall>, audience: string, id: string) {
  return (await api('GET', `/${audience}/exports`)).body.exports.find((e: any) => e.id === id);
}

describe('an export into the embedded demo warehouse itself', () => {
  let demo: RunningServer;
  let tenant: Tenant;
  const api = bindCall(
    () => demo,
    () => tenant.admin.token,
    '/api/api/audiences',
  );

  beforeAll(async () => {
    const env = loadEnv({
      PORT: '0',
      DIMAS_DATA_DIR: mkdtempSync(join(inject('scratchDir'), 'demo-export-')),
      DIMAS_SECRET_KEY: TEST_SECRET_KEY,
      SUPERADMIN_USERNAME,
      SUPERADMIN_PASSWORD,
      SEED_DEMO: 'true',
      LOG_LEVEL: 'silent',
      AUTH_CACHE_TTL_MS: '0',
    });
    // Embedded control plane whatever the test mode: that is where the demo warehouse lives.
    const template = inject('embeddedTemplate');
    const db = await openDatabase(template ? { loadDataDir: new Blob([readFileSync(template)]) } : {});
    demo = await startServer(env, { db, logger: createLogger({ level: 'silent' }) });
    tenant = await createTenant(demo);
  }, 180_000);

  afterAll(async () => demo?.close());

  it('completes at once, the rows copied inside the warehouse', async () => {
    const w = demo.deps.demoWarehouse!;
    const schema = unique('aud_demo');
    const url = `postgresql://${w.user}:${encodeURIComponent(w.password)}@${w.host}:${w.port}/${w.database}`;
    await withClient(url, async (client) => {
      await client.query(`create schema ${schema}`);
      await client.query(`create table ${schema}.customers (customer_id integer primary key, email text)`);
      await client.query(`insert into ${schema}.customers
         select i, 'user' || i || '@example.com' from generate_series(1, ${CUSTOMERS}) i`);
    });
    const target = { ...w.targetConfig, schemas: [schema] };
    await createWorkspace(demo, tenant.admin.token, {
      target_config: target,
      target_schema: TARGET_SCHEMA(schema),
    });
    const audience = await everyone(api);
    const started = Date.now();
    const created = await api('POST', '/exports', {
      body: {
        audience_id: audience,
        // As a user types it: another loopback name of the same warehouse.
        destination: {
          type: 'postgres',
          host: 'localhost',
          port: w.port,
          database: w.database,
          user: w.user,
          password: w.password,
          schema: `${schema}_out`,
          table: 'people',
        },
        field_mapping: [
          { source: 'customer_id', destination: 'id' },
          { source: 'email', destination: 'email' },
        ],
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    // Before, the destination's transaction and the source's read waited for each other until a
    // connection timed out (about 40 s).
    const done = await until(
      'export into the demo warehouse',
      () => exportOf(api, audience, created.body.export.id),
      (e) => e?.last_run?.run_id === created.body.run.run_id && ENDED.includes(e.last_run.status),
      20_000,
    );
    expect(done.last_run.status, done.last_run.error).toBe('succeeded');
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(done.rows_exported).toBe(CUSTOMERS);
    const copied = await withClient(
      url,
      async (client) =>
        (
          await client.query(
            `select count(*)::int as n, count(distinct email)::int as e from ${schema}_out.people`,
          )
        ).rows[0],
    );
    expect(copied).toEqual({ n: CUSTOMERS, e: CUSTOMERS });
  }, 120_000);
});

describe('webhook exports', () => {
  const warehouse = scratchDatabase('aud_left');
  let server: TestServer;
  let tenant: Tenant;
  let audience: string;
  const api = bindCall(
    () => server,
    () => tenant.admin.token,
    '/api/api/audiences',
  );

  interface Received {
    url: string;
    batch: number;
    status: number;
  }

  /** A local receiver; `answer` may answer a request itself (then returns nothing). */
  async function receiver(
    answer: (r: Received, res: ServerResponse) => Promise<number | void> | number | void = () => 200,
  ) {
    const requests: Received[] = [];
    const hook: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
      let body = '';
      req.on('data', (chunk) => (body += chunk));
      req.on('end', async () => {
        const request: Received = { url: req.url!, batch: JSON.parse(body).batch_index, status: 0 };
        requests.push(request);
        const status = await answer(request, res);
        if (typeof status === 'number') {
          request.status = status;
          res.writeHead(status, { 'content-type': 'text/plain' }).end(status < 300 ? 'ok' : 'refused');
        }
      });
    });
    hook.listen(0, '127.0.0.1');
    await new Promise((resolve) => hook.once('listening', resolve));
    return {
      requests,
      url: (path = '/') => `http://127.0.0.1:${(hook.address() as AddressInfo).port}${path}`,
      close: () => new Promise((resolve) => hook.close(resolve)),
    };
  }

  async function webhookExport(url: string) {
    const created = await api('POST', '/exports', {
      body: {
        audience_id: audience,
        destination: { type: 'webhook', url, batch_size: BATCH, max_retries: 0 },
        field_mapping: [
          { source: 'customer_id', destination: 'id' },
          { source: 'email', destination: 'email' },
        ],
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    return { id: created.body.export.id as string, runId: created.body.run.run_id as string };
  }

  const finished = (id: string, runId: string) =>
    until(
      `export ${id} run ${runId}`,
      () => exportOf(api, audience, id),
      (e) => e?.last_run?.run_id === runId && ENDED.includes(e.last_run.status),
      90_000,
    );

  beforeAll(async () => {
    await warehouse.create();
    await warehouse.sql(`create schema crm`);
    await warehouse.sql(`create table crm.customers (customer_id integer primary key, email text)`);
    await warehouse.sql(`insert into crm.customers
       select i, 'user' || i || '@example.com' from generate_series(1, ${CUSTOMERS}) i`);
    server = await startTestServer();
    tenant = await createTenant(server);
    await createWorkspace(server, tenant.admin.token, {
      target_config: pgConfig(warehouse.name, { schemas: ['crm'] }),
      target_schema: TARGET_SCHEMA('crm'),
    });
    audience = await everyone(api);
  }, 180_000);

  afterAll(async () => {
    await server?.close();
    await warehouse.drop();
  });

  it('a failed run shows the rows its receiver acknowledged, on the export and the run', async () => {
    const hook = await receiver((r) => (r.batch === 3 ? 400 : 200));
    try {
      const { id, runId } = await webhookExport(hook.url('/in'));
      const done = await finished(id, runId);
      expect(done.last_run.status).toBe('failed');
      expect(done.last_run.error).toContain('400');
      expect(done.rows_exported).toBe(3 * BATCH);
      expect(done.last_run.progress).toMatchObject({ rows_exported: 3 * BATCH, batches_sent: 3 });
    } finally {
      await hook.close();
    }
  }, 120_000);

  it('a paused run counts the batch its receiver acknowledged as the pause landed', async () => {
    let exportId = '';
    // Batch 2 is acknowledged (status line and headers), the pause lands, then its answer ends.
    const hook = await receiver(async (r, res) => {
      if (r.batch !== 2) return 200;
      r.status = 200;
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.flushHeaders();
      await new Promise((resolve) => setTimeout(resolve, 300));
      const paused = await api('PUT', `/exports/${exportId}`, { body: { status: 'paused' } });
      expect(paused.status, JSON.stringify(paused.body)).toBe(200);
      res.end('ok');
    });
    try {
      const started = webhookExport(hook.url('/in'));
      const { id, runId } = await started.then((e) => ((exportId = e.id), e));
      const cancelled = await finished(id, runId);
      expect(cancelled.last_run.status).toBe('cancelled');
      // The pause shows at once; the run's record of what was delivered follows as its attempt ends
      // (before, it stayed one batch behind).
      const done = await until(
        'the paused run records batch 2',
        () => exportOf(api, audience, id),
        (e) => e.last_run.progress.batches_sent === 3 && e.rows_exported !== null,
        10_000,
      );
      expect(hook.requests.map((r) => r.batch)).toEqual([0, 1, 2]);
      expect(done.last_run.progress).toMatchObject({
        rows_exported: 3 * BATCH,
        batches_sent: 3,
        percent: 32,
      });
      expect(done.rows_exported).toBe(3 * BATCH);
      // A rerun continues after the acknowledged batch instead of sending it again.
      expect((await api('PUT', `/exports/${id}`, { body: { status: 'active' } })).status).toBe(200);
      const again = await api('PUT', `/exports/${id}`, { body: { run: true } });
      expect(again.status, JSON.stringify(again.body)).toBe(200);
      const rerun = await finished(id, again.body.run.run_id);
      expect(rerun.last_run.status).toBe('succeeded');
      expect(rerun.last_run.progress.resumed_from_batch).toBe(3);
      expect(hook.requests.map((r) => r.batch).slice(3)).toEqual([3, 4, 5, 6, 7, 8, 9]);
    } finally {
      await hook.close();
    }
  }, 120_000);

  it('seals a webhook URL saved before query values were sealed, once, and still sends to it', async () => {
    const hook = await receiver();
    try {
      const { id, runId } = await webhookExport(hook.url('/in'));
      await finished(id, runId);
      const legacy = hook.url('/in?token=LEGACY-SECRET&x=1');
      // As an earlier version wrote it: the whole URL in `url`, no sealed_url.
      const em = server.deps.orm.em.fork();
      await em.execute(
        `update audience_exports set destination_config = (destination_config - 'sealed_url') || cast(? as jsonb)
          where id = ?`,
        [JSON.stringify({ url: legacy }), id],
      );
      const stored = async () =>
        (
          (await em.execute(`select destination_config from audience_exports where id = ?`, [id])) as {
            destination_config: Record<string, unknown>;
          }[]
        )[0].destination_config;
      if (inject('databaseUrl')) {
        // A server starting over the same database seals it.
        const restarted = await startTestServer();
        await restarted.close();
      } else expect(await sealLegacyWebhookUrls(server.deps)).toBeGreaterThanOrEqual(1);
      const sealed = await stored();
      expect(sealed.url).toBe(hook.url('/in?token=••••••&x=••••••'));
      expect(server.deps.secrets.decrypt(String(sealed.sealed_url))).toBe(legacy);
      expect(JSON.stringify(sealed)).not.toContain('LEGACY-SECRET');
      // Once: a second start leaves it as it is.
      await sealLegacyWebhookUrls(server.deps);
      expect(await stored()).toEqual(sealed);
      expect((await exportOf(api, audience, id)).destination.url).toBe(hook.url('/in?token=••••••&x=••••••'));
      const again = await api('PUT', `/exports/${id}`, { body: { run: true } });
      const rerun = await finished(id, again.body.run.run_id);
      expect(rerun.last_run.status, rerun.last_run.error).toBe('succeeded');
      expect(hook.requests.at(-1)!.url).toBe('/in?token=LEGACY-SECRET&x=1');
    } finally {
      await hook.close();
    }
  }, 120_000);
});
