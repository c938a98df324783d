import { mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { withClient } from './helpers/scratch-db.ts';
import { SUPERADMIN_PASSWORD, SUPERADMIN_USERNAME, TEST_SECRET_KEY } from './helpers/constants.ts';
import { loadEnv } from '../src/env.ts';
import { openDatabase } from '../src/db/orm.ts';
import { createLogger } from '../src/logger.ts';
import { startServer, type RunningServer } from '../src/server.ts';

/*
 * Audience exports: into the embedded demo warehouse itself, what a webhook run that failed or was
 * paused had delivered, and webhook URLs saved before their query values were sealed.
 */
const CUSTOMERS = 95;

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
