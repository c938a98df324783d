import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, unique, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { runDueExports } from '../src/modules/audiences/audiences-exports.service.ts';
import { AudienceExport } from '../src/modules/audiences/audiences.entity.ts';

/*
 * Audience exports across reruns and re-materializations, through the real server and a real local
 * HTTP receiver: what the receiver got (each acknowledged batch once, under keys naming the data) and
 * what the API shows (where a run resumed or why it started over, a stale audience, masked URLs).
 */
const warehouse = scratchDatabase('aud_rerun');
const CUSTOMERS = 95;
const BATCH = 10;

let server: TestServer;
let tenant: Tenant;
let audienceId: string;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/api/audiences',
);

interface Received {
  url: string;
  headers: IncomingMessage['headers'];
  key: string;
  batch: number;
  rows: Record<string, unknown>[];
  status: number;
}

type Answer = (
  request: Received,
  req: IncomingMessage,
) => { status: number; body?: string; headers?: object };

/** A local webhook receiver: `answer` decides each response; `requests` is everything it got. */
async function receiver(answer: Answer = () => ({ status: 200 })) {
  const requests: Received[] = [];
  const hook: Server = createServer((req, res: ServerResponse) => {
    let body = '';
    req.on('data', (chunk) => (body += chunk));
    req.on('end', () => {
      const payload = body ? JSON.parse(body) : {};
      const request: Received = {
        url: req.url!,
        headers: req.headers,
        key: String(req.headers['idempotency-key']),
        batch: payload.batch_index,
        rows: payload.rows ?? [],
        status: 0,
      };
      const reply = answer(request, req);
      request.status = reply.status;
      requests.push(request);
      res.writeHead(reply.status, { 'content-type': 'text/plain', ...reply.headers }).end(reply.body ?? '');
    });
  });
  hook.listen(0, '127.0.0.1');
  await new Promise((resolve) => hook.once('listening', resolve));
  return {
    requests,
    /** The requests it acknowledged (2xx). */
    acknowledged: () => requests.filter((r) => r.status < 300),
    url: (path = '/') => `http://127.0.0.1:${(hook.address() as AddressInfo).port}${path}`,
    close: () => new Promise((resolve) => hook.close(resolve)),
  };
}

async function exportOf(id: string, audience = audienceId) {
  return (await api('GET', `/${audience}/exports`)).body.exports.find((e: any) => e.id === id);
}

async function finished(id: string, runId: string, audience = audienceId) {
  return until(
    `export ${id} run ${runId}`,
    () => exportOf(id, audience),
    (e) => e?.last_run?.run_id === runId && ['succeeded', 'failed', 'cancelled'].includes(e.last_run.status),
    90_000,
  );
}

async function rerun(id: string, audience = audienceId) {
  const res = await api('PUT', `/exports/${id}`, { body: { run: true } });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return finished(id, res.body.run.run_id, audience);
}

async function materialize(id = audienceId) {
  const run = await api('POST', `/${id}/materialize`);
  expect(run.status, JSON.stringify(run.body)).toBe(200);
  const done = await until(
    'materialize',
    async () => (await api('GET', `/${id}`)).body,
    (a) =>
      a.materialization.run_id === run.body.run_id &&
      ['succeeded', 'failed'].includes(a.materialization.status),
    90_000,
  );
  expect(done.materialization.status, done.materialization.error).toBe('succeeded');
  return done.materialization;
}

async function webhookExport(url: string, extra: Record<string, unknown> = {}, audience = audienceId) {
  const created = await api('POST', '/exports', {
    body: {
      audience_id: audience,
      destination: { type: 'webhook', url, batch_size: BATCH, max_retries: 0, ...extra },
      field_mapping: [
        { source: 'customer_id', destination: 'id' },
        { source: 'email', destination: 'email' },
      ],
    },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  return {
    id: created.body.export.id as string,
    run: await finished(created.body.export.id, created.body.run.run_id, audience),
  };
}

const keysOf = (exportId: string, delivery: string, batches: number[]) =>
  batches.map((b) => `${exportId}:${delivery}:${b}`);
const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);
const BATCHES = Math.ceil(CUSTOMERS / BATCH);

beforeAll(async () => {
  await warehouse.create();
  await warehouse.sql(`create schema crm`);
  await warehouse.sql(`create table crm.customers (customer_id integer primary key, email text)`);
  await warehouse.sql(`insert into crm.customers
     select i, 'user' || i || '@example.com' from generate_series(1, ${CUSTOMERS}) i`);
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    name: unique('aud_rerun'),
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
      attribute_columns: ['email'],
    },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  audienceId = created.body.id;
  await materialize();
}, 180_000);

afterAll(async () => {
  await server?.close();
  await warehouse.drop();
});

describe('D1: a rerun sends no acknowledged batch twice', () => {
  it('resumes after the batches a failed run delivered, under keys naming the export, the data and the batch', async () => {
    let refuse: number | null = 4;
    const hook = await receiver((r) =>
      r.batch === refuse ? { status: 422, body: 'batch refused' } : { status: 200 },
    );
    try {
      const first = await webhookExport(hook.url('/in'));
      const id = first.id;
      expect(first.run.last_run.status).toBe('failed');
      expect(first.run.last_run.error).toContain('the webhook answered 422');
      const delivery = first.run.last_run.progress.delivery_id;
      expect(first.run.last_run.progress).toMatchObject({ batches_sent: 4, resumed_from_batch: 0 });
      expect(hook.acknowledged().map((r) => r.key)).toEqual(keysOf(id, delivery, range(0, 4)));

      // The receiver takes batch 4 now: a new run over the same materialization continues there.
      refuse = null;
      const before = hook.requests.length;
      const second = await rerun(id);
      expect(second.last_run.status, second.last_run.error).toBe('succeeded');
      expect(second.last_run.progress).toMatchObject({
        delivery_id: delivery,
        resumed_from_batch: 4,
        resumed_from_run_id: first.run.last_run.run_id,
        restarted_because: null,
        batches_sent: BATCHES,
        rows_exported: CUSTOMERS,
        percent: 100,
      });
      expect(second.rows_exported).toBe(CUSTOMERS);
      expect(hook.requests.slice(before).map((r) => r.key)).toEqual(keysOf(id, delivery, range(4, BATCHES)));
      // Every member reached the receiver exactly once, in the preview's order.
      const preview = await api('GET', `/${audienceId}/exports/${id}/preview`, { query: { limit: 1000 } });
      const delivered = hook.acknowledged().flatMap((r) => r.rows.map((row) => row.id));
      expect(delivered).toEqual(preview.body.rows.map((row: any) => row.id));
      expect(new Set(hook.acknowledged().map((r) => r.key)).size).toBe(BATCHES);
      // The run's result says the same.
      const result = (await server.deps.jobs.getRun(second.last_run.run_id, tenant.organization.id))?.result;
      expect(result).toMatchObject({ resumed_from_batch: 4, resumed_from_run_id: first.run.last_run.run_id });

      // A run after a complete delivery of the same data sends it again under the same keys (a receiver
      // that honours them ignores it), and says so.
      const again = await rerun(id);
      expect(again.last_run.status, again.last_run.error).toBe('succeeded');
      expect(again.last_run.progress.resumed_from_batch).toBe(0);
      expect(again.last_run.progress.restarted_because).toMatch(/delivered this materialization completely/);
      expect(hook.requests.slice(-BATCHES).map((r) => r.key)).toEqual(
        keysOf(id, delivery, range(0, BATCHES)),
      );
    } finally {
      await hook.close();
    }
  });

  it('starts over under new keys when the audience was materialized again in between, and says why', async () => {
    let refuse: number | null = 2;
    const hook = await receiver((r) => (r.batch === refuse ? { status: 422 } : { status: 200 }));
    try {
      const first = await webhookExport(hook.url('/members'));
      expect(first.run.last_run.status).toBe('failed');
      const oldTable = first.run.last_run.progress.source_table;
      const oldDelivery = first.run.last_run.progress.delivery_id;
      const materialized = await materialize();
      refuse = null;
      const before = hook.requests.length;
      const second = await rerun(first.id);
      expect(second.last_run.status, second.last_run.error).toBe('succeeded');
      const progress = second.last_run.progress;
      expect(`dimas_audiences.${progress.source_table}`).toBe(materialized.versioned_table);
      expect(progress.source_table).not.toBe(oldTable);
      expect(progress.delivery_id).not.toBe(oldDelivery);
      expect(progress.resumed_from_batch).toBe(0);
      expect(progress.restarted_because).toBe(
        `the audience was materialized again after run ${first.run.last_run.run_id} sent 2 batches of ${oldTable}: this run sends ${progress.source_table} from the start, under new idempotency keys`,
      );
      expect(hook.requests.slice(before).map((r) => r.key)).toEqual(
        keysOf(first.id, progress.delivery_id, range(0, BATCHES)),
      );
    } finally {
      await hook.close();
    }
  });

  it('a changed batch size is a new delivery: no batch of the old cut is skipped', async () => {
    let refuse: number | null = 3;
    const hook = await receiver((r) => (r.batch === refuse ? { status: 422 } : { status: 200 }));
    try {
      const first = await webhookExport(hook.url('/cut'));
      expect(first.run.last_run.progress.batches_sent).toBe(3);
      refuse = null;
      const changed = await api('PUT', `/exports/${first.id}`, {
        body: { destination: { type: 'webhook', url: hook.url('/cut'), batch_size: 25, max_retries: 0 } },
      });
      expect(changed.status, JSON.stringify(changed.body)).toBe(200);
      const before = hook.requests.length;
      const second = await rerun(first.id);
      expect(second.last_run.status, second.last_run.error).toBe('succeeded');
      expect(second.last_run.progress.restarted_because).toMatch(
        /batch size changed after run .* sent 3 batches/,
      );
      expect(hook.requests.slice(before).map((r) => r.batch)).toEqual([0, 1, 2, 3]);
      expect(hook.requests.slice(before).flatMap((r) => r.rows)).toHaveLength(CUSTOMERS);
    } finally {
      await hook.close();
    }
  });
});

describe('D1: the batches of one materialization are the same at every read', () => {
  it('rows sharing an identifier keep their order when the table is read in another physical order', async () => {
    // Members identified by an e-mail five customers share each, and their id (by the e-mail alone,
    // the rows sharing it would be one member).
    const created = await api('POST', '', {
      body: {
        name: 'shared e-mails',
        target_table: 'customers',
        definition: {
          type: 'sql',
          sql: "select customer_id, 'shared' || (customer_id % 5) as email from crm.customers",
        },
        identifier_columns: ['email', 'customer_id'],
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const audience = created.body.id;
    const materialized = await materialize(audience);
    let refuse: number | null = 4;
    const hook = await receiver((r) => (r.batch === refuse ? { status: 422 } : { status: 200 }));
    try {
      const first = await webhookExport(hook.url('/shared'), {}, audience);
      expect(first.run.last_run.progress.batches_sent).toBe(4);
      // The same table read in another order (as a synchronized scan or a parallel sort can): rows
      // rewritten move to its end.
      await warehouse.sql(
        `update ${materialized.versioned_table} set customer_id = customer_id where customer_id % 3 = 0`,
      );
      refuse = null;
      const second = await rerun(first.id, audience);
      expect(second.last_run.progress).toMatchObject({ resumed_from_batch: 4, batches_sent: BATCHES });
      const ids = hook.acknowledged().flatMap((r) => r.rows.map((row) => row.id));
      expect([...ids].sort((a: any, b: any) => a - b)).toEqual(range(1, CUSTOMERS + 1));
    } finally {
      await hook.close();
    }
  });
});

describe('D2: a retried attempt after a re-materialization', () => {
  it('sends the current materialization from the start, saying why, without a database error', async () => {
    let refused = false;
    let rematerialized: Promise<unknown> | null = null;
    const hook = await receiver((r) => {
      if (r.batch === 2 && !refused) {
        refused = true;
        // The attempt fails (503, no retries within it); the audience is materialized again before
        // the run's next attempt, which drops the table this attempt read.
        rematerialized = materialize();
        return { status: 503 };
      }
      return { status: 200 };
    });
    try {
      const { id, run } = await webhookExport(hook.url('/retry'));
      await rematerialized;
      expect(run.last_run.status, run.last_run.error).toBe('succeeded');
      const progress = run.last_run.progress;
      const audience = (await api('GET', `/${audienceId}`)).body.materialization;
      expect(`dimas_audiences.${progress.source_table}`).toBe(audience.versioned_table);
      expect(progress.restarted_because).toMatch(
        /^the audience was materialized again after an earlier attempt of this run sent 2 batches of a_\w+: this run sends a_\w+ from the start, under new idempotency keys$/,
      );
      expect(progress).toMatchObject({
        resumed_from_batch: 0,
        batches_sent: BATCHES,
        rows_exported: CUSTOMERS,
      });
      const firstAttempt = hook.requests.slice(0, 3);
      const after = hook.requests.slice(3);
      expect(firstAttempt.map((r) => r.batch)).toEqual([0, 1, 2]);
      expect(after.map((r) => r.key).slice(-BATCHES)).toEqual(
        keysOf(id, progress.delivery_id, range(0, BATCHES)),
      );
      expect(firstAttempt[0].key).not.toBe(after.at(-BATCHES)!.key);
      const job = await server.deps.jobs.getRun(run.last_run.run_id, tenant.organization.id);
      expect(job?.retry_count).toBeGreaterThanOrEqual(1);
      expect(JSON.stringify(await exportOf(id))).not.toMatch(/does not exist/);
    } finally {
      await hook.close();
    }
  });

  it('a materialized table dropped outside dimas fails the run once, saying what to do', async () => {
    const hook = await receiver();
    try {
      const audience = (await api('GET', `/${audienceId}`)).body.materialization;
      await warehouse.sql(`drop table ${audience.versioned_table} cascade`);
      const { id, run } = await webhookExport(hook.url('/gone'));
      expect(run.last_run.status).toBe('failed');
      expect(run.last_run.error).toBe(
        `The audience's materialized table ${audience.versioned_table} no longer exists in the warehouse: materialize the audience again`,
      );
      const job = await server.deps.jobs.getRun(run.last_run.run_id, tenant.organization.id);
      expect(job?.retry_count).toBe(0);
      expect(hook.requests).toHaveLength(0);
      await materialize();
      const fixed = await rerun(id);
      expect(fixed.last_run.status, fixed.last_run.error).toBe('succeeded');
    } finally {
      await hook.close();
    }
  });
});

describe('D3: a stale audience', () => {
  it('is shown stale on the export and its manual run; a scheduled run materializes first and sends current members', async () => {
    const created = await api('POST', '', {
      body: {
        name: 'stale one',
        target_table: 'customers',
        definition: { type: 'rules', rules: { all: [] } },
        attribute_columns: ['email'],
      },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const audience = created.body.id;
    const first = await materialize(audience);
    const hook = await receiver();
    try {
      const { id, run } = await webhookExport(hook.url('/stale'), {}, audience);
      expect(run.last_run.status, run.last_run.error).toBe('succeeded');
      expect(run.audience_stale).toBe(false);
      expect(run.last_run.progress.audience_stale).toBe(false);

      const changed = await api('PUT', `/${audience}`, {
        body: {
          definition: { type: 'rules', rules: { all: [{ field: 'customer_id', op: '<=', value: 30 }] } },
        },
      });
      expect(changed.status, JSON.stringify(changed.body)).toBe(200);
      const view = await exportOf(id, audience);
      expect(view.audience_stale).toBe(true);
      expect(view.audience_materialized_at).toBe(first.materialized_at);
      expect(new Date(view.audience_definition_changed_at).getTime()).toBeGreaterThan(
        new Date(view.audience_materialized_at).getTime(),
      );

      // Run by hand: it sends what was materialized (the previous definition's members), visibly.
      let before = hook.requests.length;
      const manual = await rerun(id, audience);
      expect(manual.last_run.status, manual.last_run.error).toBe('succeeded');
      expect(manual.last_run.progress).toMatchObject({
        audience_stale: true,
        audience_materialized_at: view.audience_materialized_at,
        audience_definition_changed_at: view.audience_definition_changed_at,
      });
      expect(manual.last_run.progress.materialize_run_id).toBeUndefined();
      expect(hook.requests.slice(before).flatMap((r) => r.rows)).toHaveLength(CUSTOMERS);

      // On a schedule: the run materializes the new definition first and sends its members.
      const scheduled = await api('PUT', `/exports/${id}`, { body: { schedule: 'hourly' } });
      expect(scheduled.status, JSON.stringify(scheduled.body)).toBe(200);
      const due = async (hoursAhead: number) => {
        const started = await runDueExports(server.deps, new Date(Date.now() + hoursAhead * 3600_000));
        expect(started.started).toContain(id);
        const runId = (await exportOf(id, audience)).last_run.run_id;
        return finished(id, runId, audience);
      };
      before = hook.requests.length;
      const refreshed = await due(2);
      expect(refreshed.last_run.status, refreshed.last_run.error).toBe('succeeded');
      expect(refreshed.last_run.progress).toMatchObject({
        audience_stale: false,
        materialize_run_id: expect.any(String),
        materialized_because: 'its definition changed since it was materialized (version 1 → 2)',
      });
      expect(refreshed.audience_stale).toBe(false);
      const sent = hook.requests.slice(before).flatMap((r) => r.rows.map((row) => row.id));
      expect(sent).toEqual(range(1, 31));
      const now = (await api('GET', `/${audience}`)).body.materialization;
      expect(now).toMatchObject({
        stale: false,
        materialized_version: 2,
        run_id: refreshed.last_run.progress.materialize_run_id,
      });

      // Unchanged definition, changed data: the next scheduled run sends the data as it is then.
      await warehouse.sql(`update crm.customers set email = 'moved@example.com' where customer_id = 5`);
      before = hook.requests.length;
      const next = await due(4);
      expect(next.last_run.status, next.last_run.error).toBe('succeeded');
      expect(next.last_run.progress.materialized_because).toBe(
        'a scheduled run sends the audience as it is when the run is due',
      );
      expect(next.last_run.progress.delivery_id).not.toBe(refreshed.last_run.progress.delivery_id);
      const rows = hook.requests.slice(before).flatMap((r) => r.rows);
      expect(rows.find((row) => row.id === 5)?.email).toBe('moved@example.com');
    } finally {
      await hook.close();
    }
  });
});

describe('D4: a webhook URL with a query', () => {
  it('is sealed at rest, shown with every query value masked, and still sent whole', async () => {
    const hook = await receiver((r) =>
      r.url.includes('fail=')
        ? { status: 401, body: `token tok-SECRET-123 unknown at ${hookUrl}` }
        : { status: 200 },
    );
    const elsewhere = await receiver();
    const hookUrl = hook.url('/in?token=tok-SECRET-123&team=7');
    try {
      const { id, run } = await webhookExport(hookUrl, { headers: { 'X-Api-Key': 'HDR-SECRET' } });
      expect(run.last_run.status, run.last_run.error).toBe('succeeded');
      expect(run.destination.url).toBe(hook.url('/in?token=••••••&team=••••••'));
      expect(hook.requests.every((r) => r.url === '/in?token=tok-SECRET-123&team=7')).toBe(true);
      const em = server.deps.orm.em.fork();
      const stored = (await em.findOneOrFail(AudienceExport, id)).destinationConfig;
      expect(JSON.stringify(stored)).not.toContain('tok-SECRET');
      expect(server.deps.secrets.decrypt(String(stored.sealed_url))).toBe(hookUrl);

      // The form sent back as shown keeps the stored values on the same host…
      const kept = await api('PUT', `/exports/${id}`, {
        body: { destination: { ...run.destination, batch_size: 50 }, run: true },
      });
      expect(kept.status, JSON.stringify(kept.body)).toBe(200);
      expect((await finished(id, kept.body.run.run_id)).last_run.status).toBe('succeeded');
      expect(hook.requests.at(-1)!.url).toBe('/in?token=tok-SECRET-123&team=7');
      // …never on another one, nor for a parameter that has no stored value.
      const moved = await api('PUT', `/exports/${id}`, {
        body: { destination: { ...run.destination, url: elsewhere.url('/in?token=••••••') } },
      });
      expect(moved.status, JSON.stringify(moved.body)).toBe(400);
      expect(moved.body.message).toBe(
        'The destination moves to another host: give the value of query parameter token again',
      );
      const unknown = await api('PUT', `/exports/${id}`, {
        body: { destination: { ...run.destination, url: hook.url('/in?token=••••••&extra=••••••') } },
      });
      expect(unknown.status, JSON.stringify(unknown.body)).toBe(400);
      expect(unknown.body.message).toContain('query parameter extra');

      // A refusal quoting the token and the whole URL: the run's error masks both.
      const failing = await api('PUT', `/exports/${id}`, {
        body: {
          destination: { ...run.destination, url: hook.url('/in?token=••••••&team=••••••&fail=1') },
          run: true,
        },
      });
      expect(failing.status, JSON.stringify(failing.body)).toBe(200);
      const failed = await finished(id, failing.body.run.run_id);
      expect(failed.last_run.status).toBe('failed');
      expect(failed.last_run.error).toBe(
        `the webhook answered 401 Unauthorized: token •••••• unknown at ${hook.url('/in?token=••••••&team=••••••')}`,
      );
      // Nothing an API caller sees carries a query value or a header value.
      const shown = JSON.stringify([
        moved.body,
        unknown.body,
        failing.body,
        (await api('GET', `/${audienceId}/exports`)).body,
      ]);
      expect(shown).not.toMatch(/tok-SECRET|HDR-SECRET|team=7/);
    } finally {
      await hook.close();
      await elsewhere.close();
    }
  });

  it('masks a redirect Location query and the URL of an export saved before query values were sealed', async () => {
    const hook = await receiver(() => ({
      status: 302,
      headers: { location: 'https://elsewhere.example/x?sig=LOC-SECRET' },
    }));
    try {
      const { id, run } = await webhookExport(hook.url('/r?key=abc'));
      expect(run.last_run.status).toBe('failed');
      expect(run.last_run.error).toContain('with Location https://elsewhere.example/x?sig=••••••:');
      // As an earlier version stored it: the whole URL in `url`.
      const em = server.deps.orm.em.fork();
      const exp = await em.findOneOrFail(AudienceExport, id);
      const { sealed_url: _sealed, ...legacy } = exp.destinationConfig;
      exp.destinationConfig = { ...legacy, url: hook.url('/r?key=LEGACY-SECRET') };
      await em.flush();
      const view = await exportOf(id);
      expect(view.destination.url).toBe(hook.url('/r?key=••••••'));
      const again = await rerun(id);
      expect(again.last_run.status).toBe('failed');
      expect(hook.requests.at(-1)!.url).toBe('/r?key=LEGACY-SECRET');
      expect(JSON.stringify(await exportOf(id))).not.toContain('LEGACY-SECRET');
    } finally {
      await hook.close();
    }
  });
});
