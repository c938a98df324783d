import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

/*
 * A webhook batch holds batch_size rows and at most 4 MiB of their JSON: wide rows go in several
 * requests although batch_size would take them all in one, a row larger than that alone. Through the
 * real server and a local receiver: every row arrives once and whole, in order, each request with its
 * length; a rerun after a refused batch cuts the rows alike and continues after the acknowledged ones.
 */
const warehouse = scratchDatabase('aud_bytes');
const BATCH_BYTES = 4 * 2 ** 20;
/** 30 rows of 300 kB of text and, as row 5, one of 5 MiB: 14 MB in all, one batch by batch_size. */
const ROWS = 30;
const WIDE = 150_000;
const HUGE_ROW = 5;
const HUGE = 2.5 * 2 ** 20;
const noteLength = (id: number) => (id === HUGE_ROW ? HUGE : WIDE);
const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

let server: TestServer;
let tenant: Tenant;
let audienceId: string;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/api/audiences',
);

interface Received {
  batch: number;
  ids: number[];
  noteLengths: number[];
  rowsJsonBytes: number;
  contentLength: string | undefined;
  bodyBytes: number;
  status: number;
}

/** A receiver that refuses the batches `refused` names (422) while they are in it, and acknowledges the others. */
async function receiver(refused: Set<number>) {
  const requests: Received[] = [];
  const hook: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const payload = JSON.parse(body.toString('utf8')) as {
        batch_index: number;
        rows: { id: number; note: string }[];
      };
      const status = refused.has(payload.batch_index) ? 422 : 200;
      requests.push({
        batch: payload.batch_index,
        ids: payload.rows.map((r) => r.id),
        noteLengths: payload.rows.map((r) => r.note.length),
        rowsJsonBytes: Buffer.byteLength(JSON.stringify(payload.rows)) - 2,
        contentLength: req.headers['content-length'],
        bodyBytes: body.length,
        status,
      });
      res.writeHead(status, { 'content-type': 'text/plain' }).end(status === 200 ? 'ok' : 'refused');
    });
  });
  hook.listen(0, '127.0.0.1');
  await new Promise((resolve) => hook.once('listening', resolve));
  return {
    requests,
    acknowledged: () => requests.filter((r) => r.status === 200),
    url: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/in`,
    close: () => new Promise((resolve) => hook.close(resolve)),
  };
}

async function finished(id: string, runId: string) {
  return until(
    `export ${id} run ${runId}`,
    async () => (await api('GET', `/${audienceId}/exports`)).body.exports.find((e: any) => e.id === id),
    (e) => e?.last_run?.run_id === runId && ['succeeded', 'failed', 'cancelled'].includes(e.last_run.status),
    90_000,
  );
}

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema crm`);
  await warehouse.sql(`create table crm.customers (customer_id integer primary key, note text)`);
  // Characters of two UTF-8 bytes in every note: the bound counts bytes, not characters.
  await warehouse.sql(`insert into crm.customers
     select i, repeat('é', case when i = ${HUGE_ROW} then ${HUGE} else ${WIDE} end)
       from generate_series(1, ${ROWS}) i`);
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: unique('aud_bytes'),
    target_config: pgConfig(warehouse.name, { schemas: ['crm'] }),
    target_schema: {
      name: 'crm',
      version: '1.0.0',
      tables: [
        {
          name: 'customers',
          primary_key: ['customer_id'],
          columns: [
            { name: 'customer_id', type: 'integer', nullable: false },
            { name: 'note', type: 'text' },
          ],
        },
      ],
    },
  });
  const created = await api('POST', '', {
    body: {
      name: 'wide rows',
      target_table: 'customers',
      definition: { type: 'rules', rules: { all: [] } },
      attribute_columns: ['note'],
    },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  audienceId = created.body.id;
  const run = await api('POST', `/${audienceId}/materialize`);
  expect(run.status, JSON.stringify(run.body)).toBe(200);
  const done = await until(
    'materialize',
    async () => (await api('GET', `/${audienceId}`)).body,
    (a) =>
      a.materialization.run_id === run.body.run_id &&
      ['succeeded', 'failed'].includes(a.materialization.status),
    90_000,
  );
  expect(done.materialization.status, done.materialization.error).toBe('succeeded');
}, 180_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('a webhook batch is bounded by bytes as well as rows', () => {
  it('sends wide rows in several requests of at most 4 MiB of rows (a larger row alone), each row once and whole; a rerun continues the same cut', async () => {
    const refused = new Set([2]);
    const hook = await receiver(refused);
    try {
      const created = await api('POST', '/exports', {
        body: {
          audience_id: audienceId,
          destination: { type: 'webhook', url: hook.url, batch_size: 100, max_retries: 0 },
          field_mapping: [
            { source: 'customer_id', destination: 'id' },
            { source: 'note', destination: 'note' },
          ],
        },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const id = created.body.export.id as string;
      const first = await finished(id, created.body.run.run_id);
      expect(first.last_run.status).toBe('failed');
      expect(first.last_run.error).toContain('the webhook answered 422');
      expect(first.last_run.progress).toMatchObject({ batches_sent: 2 });
      const refusal = hook.requests.find((r) => r.status === 422)!;

      refused.clear();
      const rerun = await api('PUT', `/exports/${id}`, { body: { run: true } });
      expect(rerun.status, JSON.stringify(rerun.body)).toBe(200);
      const second = await finished(id, rerun.body.run.run_id);
      expect(second.last_run.status, second.last_run.error).toBe('succeeded');
      expect(second.last_run.progress).toMatchObject({ resumed_from_batch: 2, rows_exported: ROWS });
      expect(second.rows_exported).toBe(ROWS);

      const acknowledged = hook.acknowledged();
      // Every row once, in order, whole; batch_size alone would have sent them in one request.
      expect(acknowledged.flatMap((r) => r.ids)).toEqual(range(1, ROWS));
      expect(acknowledged.flatMap((r) => r.noteLengths)).toEqual(range(1, ROWS).map(noteLength));
      expect(acknowledged.map((r) => r.batch)).toEqual(range(0, acknowledged.length - 1));
      expect(acknowledged.length).toBeGreaterThanOrEqual(4);
      expect(second.last_run.progress.batches_sent).toBe(acknowledged.length);
      for (const request of acknowledged) {
        if (request.ids.length > 1) expect(request.rowsJsonBytes).toBeLessThanOrEqual(BATCH_BYTES);
        expect(request.contentLength).toBe(String(request.bodyBytes));
      }
      expect(acknowledged.find((r) => r.ids.includes(HUGE_ROW))!.ids).toEqual([HUGE_ROW]);
      // The rerun cut the rows as the first run had: its batch 2 is the one refused before.
      expect(acknowledged.find((r) => r.batch === 2)!.ids).toEqual(refusal.ids);
    } finally {
      await hook.close();
    }
  }, 120_000);
});
