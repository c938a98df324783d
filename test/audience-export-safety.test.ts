import { existsSync, readdirSync, statSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { exportFilePath } from '../src/modules/audiences/audience-export.job.ts';
import { AudienceExport } from '../src/modules/audiences/audiences.entity.ts';

/*
 * What an audience export may never do, through the real server: crash the process when a run is
 * paused, take a saved secret to another host, accept or print credentials and invalid headers,
 * follow a webhook's redirect, or retry a failure that would repeat.
 */
const warehouse = scratchDatabase('aud_safe');
const destination = scratchDatabase('aud_safe_dest');
const ROWS = 150_000;

let server: TestServer;
let tenant: Tenant;
let audienceId: string;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/api/audiences',
);

async function exportFinished(exportId: string, runId: string) {
  return until(
    `export ${exportId}`,
    async () => (await api('GET', `/${audienceId}/exports`)).body.exports.find((e: any) => e.id === exportId),
    (e) => e?.last_run?.run_id === runId && ['succeeded', 'failed', 'cancelled'].includes(e.last_run.status),
    90_000,
  );
}

type Handler = (req: IncomingMessage, body: string, res: ServerResponse) => void;

/** A local HTTP receiver; `requests` records what reached it. */
async function receiver(handler: Handler) {
  const requests: { method: string; url: string; headers: IncomingMessage['headers']; body: string }[] = [];
  const hook: Server = createServer((req, res) => {
    let body = '';
    req.on('data', (chunk) => (body += chunk));
    req.on('end', () => {
      requests.push({ method: req.method!, url: req.url!, headers: req.headers, body });
      handler(req, body, res);
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

const ok: Handler = (_req, _body, res) =>
  res.writeHead(200, { 'content-type': 'application/json' }).end('{}');

beforeAll(async () => {
  await warehouse.create();
  await destination.create();
  await warehouse.sql(`create schema crm`);
  await warehouse.sql(`create table crm.customers (customer_id integer primary key, email text, notes text)`);
  await warehouse.sql(`insert into crm.customers
     select i, 'user' || i || '@example.com', repeat(md5(i::text), 12) from generate_series(1, ${ROWS}) i`);
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: unique('aud_safe'),
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
            { name: 'email', type: 'text' },
            { name: 'notes', type: 'text' },
          ],
        },
      ],
    },
  });
  const created = await api('POST', '', {
    body: {
      name: 'everyone',
      target_table: 'customers',
      definition: { type: 'rules', rules: { all: [] } },
      attribute_columns: ['email', 'notes'],
    },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  audienceId = created.body.id;
  const run = await api('POST', `/${audienceId}/materialize`);
  expect(run.status, JSON.stringify(run.body)).toBe(200);
  const done = await until(
    'materialize',
    async () => (await api('GET', `/${audienceId}`)).body,
    (a) => ['succeeded', 'failed'].includes(a.materialization.status),
    90_000,
  );
  expect(done.materialization.status, done.materialization.error).toBe('succeeded');
}, 180_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
  await destination.drop();
});

describe('C1: a paused or failing CSV run', () => {
  it('pausing a large CSV run cancels it, removes its .part file, and the server keeps answering', async () => {
    let cancelled = 0;
    for (let attempt = 0; attempt < 8 && cancelled < 3; attempt++) {
      const created = await api('POST', '/exports', {
        body: { audience_id: audienceId, destination: { type: 'csv' }, run_now: false },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const id = created.body.export.id;
      const started = await api('PUT', `/exports/${id}`, { body: { status: 'active', run: true } });
      expect(started.status, JSON.stringify(started.body)).toBe(200);
      const runId = started.body.run.run_id;
      // Paused while rows are being written, watched on the file itself (the run takes well under a
      // second on a quiet machine, less than its first progress report): once the partial file
      // exists, and once it holds a few megabytes. Writes are then pending on the file stream.
      const dir = dirname(exportFilePath(server.deps, tenant.organization.id, id));
      const partial = () =>
        existsSync(dir) ? readdirSync(dir).find((f) => f.startsWith(id) && f.endsWith('.part')) : undefined;
      const written = attempt % 2 === 0 ? 0 : 4 << 20;
      // A run that finished first (its file in place) is seen here too, and proves nothing below.
      await until(
        'rows written',
        async () => {
          const name = partial();
          const size = name ? (statSync(join(dir, name), { throwIfNoEntry: false })?.size ?? -1) : -1;
          return { size, finished: existsSync(join(dir, `${id}.csv`)) };
        },
        ({ size, finished }) => size >= written || finished,
        60_000,
        2,
      );
      const paused = await api('PUT', `/exports/${id}`, { body: { status: 'paused' } });
      expect(paused.status, JSON.stringify(paused.body)).toBe(200);
      const finished = await exportFinished(id, runId);
      // A run that ended before the pause reached it proves nothing: another one is started.
      if (finished.last_run.status === 'succeeded') continue;
      expect(finished.last_run.status).toBe('cancelled');
      cancelled++;
      expect(finished.status).toBe('paused');
      expect(finished.file).toBeNull();
      // The run's handler has ended once nothing is left in the directory but finished files.
      await until(
        '.part removed',
        async () => (existsSync(dir) ? readdirSync(dir) : []),
        (files) => !files.some((f) => f.startsWith(id) && f.endsWith('.part')),
        20_000,
      );
      await new Promise((resolve) => setTimeout(resolve, 300));
      const alive = await api('GET', `/${audienceId}/exports`);
      expect(alive.status).toBe(200);
    }
    expect(cancelled).toBeGreaterThanOrEqual(2);
  }, 240_000);
});

describe('S1: a saved secret stays with the host it was given for', () => {
  it('keeps masked webhook headers on the same host, and refuses them for another host', async () => {
    const home = await receiver(ok);
    const elsewhere = await receiver(ok);
    try {
      const created = await api('POST', '/exports', {
        body: {
          audience_id: audienceId,
          destination: { type: 'webhook', url: home.url('/in'), headers: { 'X-Api-Key': 'SECRET' } },
          field_mapping: [{ source: 'customer_id', destination: 'id' }],
          run_now: false,
        },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const id = created.body.export.id;
      const moved = await api('PUT', `/exports/${id}`, {
        body: {
          destination: { type: 'webhook', url: elsewhere.url('/steal'), headers: { 'X-Api-Key': '••••••' } },
          run: true,
        },
      });
      expect(moved.status, JSON.stringify(moved.body)).toBe(400);
      expect(moved.body.message).toMatch(/moves to another host: give the value of header X-Api-Key again/);
      expect(JSON.stringify(moved.body)).not.toContain('SECRET');
      // The same origin on another path keeps it; a new value is accepted anywhere.
      const samePlace = await api('PUT', `/exports/${id}`, {
        body: {
          destination: { type: 'webhook', url: home.url('/other'), headers: { 'X-Api-Key': '••••••' } },
        },
      });
      expect(samePlace.status, JSON.stringify(samePlace.body)).toBe(200);
      const renewed = await api('PUT', `/exports/${id}`, {
        body: {
          destination: { type: 'webhook', url: elsewhere.url('/ok'), headers: { 'X-Api-Key': 'NEW' } },
          run: true,
        },
      });
      expect(renewed.status, JSON.stringify(renewed.body)).toBe(200);
      const finished = await exportFinished(id, renewed.body.run.run_id);
      expect(finished.last_run.status, finished.last_run.error).toBe('succeeded');
      expect(elsewhere.requests.every((r) => r.headers['x-api-key'] === 'NEW')).toBe(true);
      expect(elsewhere.requests.some((r) => r.url === '/steal')).toBe(false);
    } finally {
      await home.close();
      await elsewhere.close();
    }
  });

  it('keeps a PostgreSQL password only for the same host, port, database and user', async () => {
    const base = {
      type: 'postgres',
      host: '127.0.0.1',
      port: 5432,
      database: destination.name,
      user: 'postgres',
    };
    const created = await api('POST', '/exports', {
      body: {
        audience_id: audienceId,
        destination: { ...base, password: 'pw-SECRET', table: 'members' },
        run_now: false,
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const id = created.body.export.id;
    for (const change of [
      { host: 'localhost' },
      { port: 5433 },
      { database: 'postgres' },
      { user: 'other' },
    ]) {
      const moved = await api('PUT', `/exports/${id}`, {
        body: { destination: { ...base, ...change, table: 'members' } },
      });
      expect(moved.status, `${JSON.stringify(change)} ${JSON.stringify(moved.body)}`).toBe(400);
      expect(moved.body.message).toMatch(/moves to another host: give the password again/);
    }
    const masked = await api('PUT', `/exports/${id}`, {
      body: { destination: { ...base, password: '••••••', table: 'members2' } },
    });
    expect(masked.status, JSON.stringify(masked.body)).toBe(200);
    expect(masked.body.export.destination.password_set).toBe(true);
    // An empty password moves it without one.
    const cleared = await api('PUT', `/exports/${id}`, {
      body: { destination: { ...base, port: 5433, password: '', table: 'members' } },
    });
    expect(cleared.status, JSON.stringify(cleared.body)).toBe(200);
    expect(cleared.body.export.destination.password_set).toBe(false);
  });
});

describe('S2: credentials in URLs and invalid headers', () => {
  it('refuses a webhook URL with credentials and invalid header names or values at save, never echoing them', async () => {
    const bodies = [
      { url: 'http://user:PW-SECRET@127.0.0.1:9/x?token=abc', headers: {} },
      { url: 'http://127.0.0.1:9/x', headers: { 'X\r\nInjected: 1': 'v' } },
      { url: 'http://127.0.0.1:9/x', headers: { 'X-Token': 'VALUE-SECRET\r\nInjected: 1' } },
      { url: 'http://127.0.0.1:9/x', headers: { 'X-Token': 'VALUE-SECRET\u0000' } },
    ];
    for (const destination of bodies) {
      const res = await api('POST', '/exports', {
        body: { audience_id: audienceId, destination: { type: 'webhook', ...destination }, run_now: false },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      // The header is named (with its control characters shown as ?), its value never.
      expect(JSON.stringify(res.body)).not.toContain('SECRET');
      expect(res.body.message).not.toMatch(/[\r\n\0]/);
      if (Object.keys(destination.headers).length) expect(res.body.message).toMatch(/header/);
      else expect(res.body.message).toMatch(/must not contain credentials/);
    }
    const named = await api('POST', '/exports', {
      body: {
        audience_id: audienceId,
        destination: { type: 'webhook', url: 'http://127.0.0.1:9/x', headers: { 'X-Token': 'a\nb' } },
        run_now: false,
      },
    });
    expect(named.body.message).toContain('X-Token');
  });

  it('fails a run saved before these checks once, masking the URL credentials and header values everywhere', async () => {
    const hook = await receiver(ok);
    try {
      const created = await api('POST', '/exports', {
        body: {
          audience_id: audienceId,
          destination: { type: 'webhook', url: hook.url('/x'), headers: { 'X-Token': 'fine' } },
          field_mapping: [{ source: 'customer_id', destination: 'id' }],
          run_now: false,
        },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const id = created.body.export.id;
      // As an export saved by an earlier version could be.
      for (const [url, headers] of [
        [hook.url('/x').replace('http://', 'http://user:PW-SECRET@'), { 'X-Token': 'fine' }],
        [hook.url('/x'), { 'X-Token': 'VALUE-SECRET\r\nInjected: 1' }],
      ] as const) {
        const em = server.deps.orm.em.fork();
        const exp = await em.findOneOrFail(AudienceExport, id);
        exp.destinationConfig = {
          ...exp.destinationConfig,
          url,
          headers: Object.fromEntries(
            Object.entries(headers).map(([k, v]) => [k, server.deps.secrets.encrypt(v)]),
          ),
        };
        await em.flush();
        const run = await api('PUT', `/exports/${id}`, { body: { run: true } });
        expect(run.status, JSON.stringify(run.body)).toBe(200);
        const finished = await exportFinished(id, run.body.run.run_id);
        expect(finished.last_run.status).toBe('failed');
        expect(JSON.stringify(finished)).not.toMatch(/SECRET|Injected/);
        const job = await server.deps.jobs.getRun(run.body.run.run_id, tenant.organization.id);
        expect(job?.retry_count).toBe(0);
      }
      expect(hook.requests).toHaveLength(0);
    } finally {
      await hook.close();
    }
  });
});

async function webhookRun(url: string, headers: Record<string, string> = { 'X-Api-Key': 'HDR-SECRET' }) {
  const created = await api('POST', '/exports', {
    body: {
      audience_id: audienceId,
      destination: { type: 'webhook', url, headers, batch_size: 10_000, max_retries: 3 },
      field_mapping: [{ source: 'customer_id', destination: 'id' }],
    },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  const finished = await exportFinished(created.body.export.id, created.body.run.run_id);
  const run = await server.deps.jobs.getRun(created.body.run.run_id, tenant.organization.id);
  return { finished, run };
}

describe('S3 + D1: webhook redirects are failed deliveries', () => {
  it('never follows a redirect: no secret or row goes to the Location, and the run fails once naming it', async () => {
    const target = await receiver(ok);
    for (const status of [301, 302, 307, 308]) {
      const hook = await receiver((_req, _body, res) =>
        res.writeHead(status, { location: target.url('/final') }).end(),
      );
      try {
        const { finished, run } = await webhookRun(hook.url('/start'));
        expect(finished.last_run.status, `${status}`).toBe('failed');
        expect(finished.last_run.error).toContain(`the webhook answered ${status}`);
        expect(finished.last_run.error).toContain(`with Location ${target.url('/final')}`);
        expect(finished.last_run.error).toContain("set the export's URL to the final address");
        expect(hook.requests).toHaveLength(1);
        expect(run?.retry_count).toBe(0);
      } finally {
        await hook.close();
      }
    }
    expect(target.requests).toHaveLength(0);
    await target.close();
  });
});

describe('P1: failures that would repeat fail once', () => {
  it('a webhook 4xx fails at once, quoting the start of its answer with secrets masked', async () => {
    const hook = await receiver((req, _body, res) =>
      res
        .writeHead(422, { 'content-type': 'text/plain' })
        .end(`field id unknown; you sent key ${req.headers['x-api-key']}; ${'x'.repeat(2000)}`),
    );
    try {
      const { finished, run } = await webhookRun(hook.url('/in'));
      expect(finished.last_run.status).toBe('failed');
      expect(finished.last_run.error).toContain(
        'the webhook answered 422 Unprocessable Entity: field id unknown',
      );
      expect(finished.last_run.error).not.toContain('HDR-SECRET');
      expect(finished.last_run.error.length).toBeLessThan(700);
      expect(hook.requests).toHaveLength(1);
      expect(run?.retry_count).toBe(0);
    } finally {
      await hook.close();
    }
  });

  it('a destination table whose columns do not fit fails at once', async () => {
    await destination.sql(`create table public.misfit (something_else integer)`);
    const created = await api('POST', '/exports', {
      body: {
        audience_id: audienceId,
        destination: {
          type: 'postgres',
          host: '127.0.0.1',
          port: 5432,
          database: destination.name,
          user: 'postgres',
          table: 'misfit',
          mode: 'append',
        },
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const finished = await exportFinished(created.body.export.id, created.body.run.run_id);
    expect(finished.last_run.status).toBe('failed');
    expect(finished.last_run.error).toMatch(/customer_id/);
    const run = await server.deps.jobs.getRun(created.body.run.run_id, tenant.organization.id);
    expect(run?.retry_count).toBe(0);
  });
});
