import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, createWorkspace, until, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { exportFilePath } from '../src/modules/audiences/audience-export.job.ts';

/*
 * What an audience export says it delivered after a run that failed: the run's progress and the
 * export's rows_exported count only rows the destination holds (a CSV file in place, a committed
 * PostgreSQL transaction, a webhook's acknowledged batches), never the rows of a removed partial file
 * or a rolled-back transaction; a run that left nothing keeps the export's figure as it was.
 *
 * The warehouse is reached through a relay that can stall and then cut every connection partway
 * through what the warehouse sends: each attempt of a run then fails after writing some rows, as a
 * network failure in the middle of a large export would. The cut waits until the test has seen the
 * run report those rows, so no attempt can fail before its progress was read, however slow the
 * machine.
 */
const warehouse = scratchDatabase('aud_fail');
const destination = scratchDatabase('aud_fail_dest');
const ROWS = 20_000;
const WEBHOOK_BATCH = 1000;
const ENDED = ['succeeded', 'failed', 'cancelled'];

interface Fault {
  /** Bytes a connection relays (counted from when the fault is set) before it is held once ... */
  stallAfter?: number;
  /** ... for this long: the run's next progress report is then written. */
  stallMs?: number;
  /** Bytes after which the connection is cut ... */
  cutAfter: number;
  /** ... once `release()` was called (or the fault replaced), when set; at once otherwise. */
  holdCut?: boolean;
}

/** A TCP relay to the PostgreSQL server whose connections fail as `fault` says, once it is set. */
async function faultyRelay(target: { host: string; port: number }) {
  let fault: Fault | null = null;
  let epoch = 0;
  /** Opens the gate that held cuts of the current fault wait for. */
  let release = () => {};
  let released = Promise.resolve();
  const sockets = new Set<Socket>();
  const relay = createTcpServer((client) => {
    const upstream = connect(target.port, target.host);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', () => {});
      s.on('close', () => {
        sockets.delete(s);
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream);
    let seen = { epoch: -1, bytes: 0, stalled: false };
    const cut = () => {
      client.destroy();
      upstream.destroy();
    };
    upstream.on('data', (chunk: Buffer) => {
      if (seen.epoch !== epoch) seen = { epoch, bytes: 0, stalled: false };
      const f = fault;
      if (!f) {
        client.write(chunk);
        return;
      }
      seen.bytes += chunk.length;
      if (seen.bytes > f.cutAfter) {
        upstream.pause();
        if (f.holdCut) void released.then(cut);
        else cut();
        return;
      }
      if (f.stallAfter !== undefined && !seen.stalled && seen.bytes > f.stallAfter) {
        seen.stalled = true;
        upstream.pause();
        setTimeout(() => {
          client.write(chunk);
          upstream.resume();
        }, f.stallMs ?? 0);
        return;
      }
      client.write(chunk);
    });
  });
  await new Promise<void>((resolve) => relay.listen(0, '127.0.0.1', resolve));
  return {
    port: (relay.address() as AddressInfo).port,
    fail(next: Fault | null) {
      // Connections held by the previous fault are cut, not left waiting on a gate nobody opens.
      release();
      released = new Promise<void>((resolve) => (release = resolve));
      fault = next;
      epoch++;
    },
    /** Lets the current fault's held connections (and those that reach it later) be cut. */
    release: () => release(),
    close() {
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => relay.close(resolve));
    },
  };
}

/**
 * Every connection fails partway through what the warehouse sends, after some rows were written and
 * reported (a CSV run reads batches of 500 rows, a PostgreSQL run COPY chunks):
 * the stall outlasts the progress writes' interval (1 s), so the first batch's rows are written, and
 * the cut waits for the test to see them (`run(id, true)` releases it).
 */
const MIDWAY: Fault = { stallAfter: 50_000, stallMs: 1200, cutAfter: 300_000, holdCut: true };

let server: TestServer;
let tenant: Tenant;
let audienceId: string;
let relay: Awaited<ReturnType<typeof faultyRelay>>;

const api = bindCall(
  () => server,
  () => tenant.admin.token,
  '/api/api/audiences',
);

const exportOf = async (id: string) =>
  (await api('GET', `/${audienceId}/exports`)).body.exports.find((e: any) => e.id === id);

/**
 * The export once its run's last attempt is over. An ended status is not enough: a CSV run reads
 * `succeeded` from its point of no return (`context.succeed`, just before its file moves into place),
 * and a file that cannot be moved then fails it. The attempt is over once the queue recorded its
 * outcome: the handler's result (a successful run returns one) or its error. The export is read after
 * that, so it holds what the attempt wrote on its way out.
 */
const finished = async (id: string, runId: string) => {
  await until(
    `export ${id} run ${runId}`,
    () => server.deps.jobs.getRun(runId, tenant.organization.id),
    (job) => !!job && ENDED.includes(job.status) && (job.status !== 'succeeded' || job.result !== null),
    120_000,
  );
  return exportOf(id);
};

/** Starts a run of the export and waits for its end, seeing it report rows on the way when `midway`. */
async function run(id: string, midway = false) {
  const started = await api('PUT', `/exports/${id}`, { body: { run: true } });
  expect(started.status, JSON.stringify(started.body)).toBe(200);
  const runId = started.body.run.run_id as string;
  if (midway)
    // The premise: the run wrote (and reported) rows before it failed.
    await until(
      'rows reported while the run is under way',
      () => exportOf(id),
      (e) => e.last_run?.run_id === runId && e.last_run.progress.rows_exported > 0,
      60_000,
      50,
    );
  relay.release();
  const done = await finished(id, runId);
  const job = await server.deps.jobs.getRun(runId, tenant.organization.id);
  return { done, job };
}

async function createExport(body: Record<string, unknown>) {
  const created = await api('POST', '/exports', {
    body: {
      audience_id: audienceId,
      field_mapping: [
        { source: 'customer_id', destination: 'id' },
        { source: 'email', destination: 'email' },
      ],
      run_now: false,
      ...body,
    },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  return created.body.export.id as string;
}

async function download(id: string) {
  const res = await fetch(`${server.url}/api/api/audiences/exports/${id}/download`, {
    headers: { authorization: `Bearer ${tenant.admin.token}` },
  });
  return { status: res.status, lines: (await res.text()).split('\n').filter(Boolean).length };
}

beforeAll(async () => {
  await warehouse.create();
  await destination.create();
  await warehouse.sql(`create schema crm`);
  await warehouse.sql(`create table crm.customers (customer_id integer primary key, email text)`);
  await warehouse.sql(`insert into crm.customers
     select i, 'user' || i || '@example.com' from generate_series(1, ${ROWS}) i`);
  const direct = pgConfig(warehouse.name, { schemas: ['crm'] });
  relay = await faultyRelay({ host: direct.host, port: direct.port });
  server = await startTestServer();
  tenant = await createTenant(server);
  await createWorkspace(server, tenant.admin.token, {
    target_config: { ...direct, host: '127.0.0.1', port: relay.port },
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
  const materialized = await api('POST', `/${audienceId}/materialize`);
  expect(materialized.status, JSON.stringify(materialized.body)).toBe(200);
  const done = await until(
    'materialize',
    async () => (await api('GET', `/${audienceId}`)).body,
    (a) => ['succeeded', 'failed'].includes(a.materialization.status),
    90_000,
  );
  expect(done.materialization.status, done.materialization.error).toBe('succeeded');
}, 180_000);

afterAll(async () => {
  relay?.fail(null);
  await server?.close();
  await relay?.close();
  await warehouse.drop();
  await destination.drop();
});

describe('a CSV run that fails midway', () => {
  it('reports 0 rows exported, leaves no file, and keeps the figure and file of the last successful run', async () => {
    const id = await createExport({ destination: { type: 'csv' } });
    const dir = dirname(exportFilePath(server.deps, tenant.organization.id, id));
    relay.fail(MIDWAY);
    try {
      const { done, job } = await run(id, true);
      expect(done.last_run.status).toBe('failed');
      // Every attempt failed the same way (a dropped connection is retried).
      expect(job?.retry_count).toBe(2);
      expect(done.last_run.progress).toMatchObject({ rows_exported: 0, percent: 0, total_rows: ROWS });
      expect(done.rows_exported).toBeNull();
      expect(done.file).toBeNull();
      expect((await download(id)).status).toBe(404);
      expect(existsSync(dir) ? readdirSync(dir).filter((f) => f.startsWith(id)) : []).toEqual([]);
    } finally {
      relay.fail(null);
    }

    const good = await run(id);
    expect(good.done.last_run.status, good.done.last_run.error).toBe('succeeded');
    expect(good.done.rows_exported).toBe(ROWS);
    expect(good.done.last_run.progress).toMatchObject({ rows_exported: ROWS, percent: 100 });
    const size = good.done.file.size;

    relay.fail(MIDWAY);
    try {
      const { done } = await run(id, true);
      expect(done.last_run.status).toBe('failed');
      expect(done.last_run.progress).toMatchObject({ rows_exported: 0, percent: 0 });
      // The file of the last successful run is what the destination holds, and what the export says.
      expect(done.rows_exported).toBe(ROWS);
      expect(done.file).toMatchObject({ size });
      expect(await download(id)).toEqual({ status: 200, lines: ROWS + 1 });
    } finally {
      relay.fail(null);
    }
  }, 240_000);

  it("serves a download with the length of the file it sends, not the export's record of it", async () => {
    const id = await createExport({ destination: { type: 'csv' } });
    const { done } = await run(id);
    expect(done.last_run.status).toBe('succeeded');
    const path = exportFilePath(server.deps, tenant.organization.id, id);
    // The file another run has just moved into place while the record still names the previous size
    // (the record and the file change in one transaction, but a download opens the file on its own).
    writeFileSync(path, 'id\n1\n2\n');
    const res = await fetch(`${server.url}/api/api/audiences/exports/${id}/download`, {
      headers: { authorization: `Bearer ${tenant.admin.token}` },
    });
    expect(res.status).toBe(200);
    const body = await res.text();
    expect(res.headers.get('content-length')).toBe(String(Buffer.byteLength(body)));
    expect(body).toBe('id\n1\n2\n');
  });

  it('a run whose file cannot be moved into place fails once, records no success and claims no rows', async () => {
    const id = await createExport({ destination: { type: 'csv' } });
    // A directory with something in it where the file goes: the finished file cannot replace it.
    const path = exportFilePath(server.deps, tenant.organization.id, id);
    mkdirSync(path, { recursive: true });
    writeFileSync(join(path, 'keep'), 'x');
    const { done, job } = await run(id);
    expect(done.last_run.status).toBe('failed');
    // The move is part of the success's transaction: it failed, so no success was ever recorded. A
    // path the server cannot write is met again by a retry: it fails once.
    expect(done.last_run.error).toMatch(/cannot be moved into place/);
    expect(job?.retry_count).toBe(0);
    expect(done.last_run.progress).toMatchObject({ rows_exported: 0, percent: 0 });
    expect(done.rows_exported).toBeNull();
    expect(done.file).toBeNull();
    expect((await download(id)).status).toBe(404);
    expect(readdirSync(dirname(path)).filter((f) => f.startsWith(id))).toEqual([`${id}.csv`]);
  }, 120_000);
});

describe('a PostgreSQL-destination run that fails after writing some batches', () => {
  /** The destination table's rows; null when it does not exist. */
  const table = async () => {
    const [{ found }] = await destination.sql<{ found: string | null }>(
      `select to_regclass('out.members')::text as found`,
    );
    if (!found) return null;
    return (await destination.sql<{ n: number }>(`select count(*)::int as n from out.members`))[0].n;
  };

  it('reports 0 rows exported and the table has none of its rows', async () => {
    const id = await createExport({
      destination: {
        ...pgConfig(destination.name),
        schema: 'out',
        table: 'members',
        // Appending: rows a failed run left behind would add to those of the successful run.
        mode: 'append',
      },
    });
    relay.fail(MIDWAY);
    try {
      const { done, job } = await run(id, true);
      expect(done.last_run.status).toBe('failed');
      expect(job?.retry_count).toBe(2);
      expect(done.last_run.progress).toMatchObject({ rows_exported: 0, percent: 0 });
      expect(done.rows_exported).toBeNull();
      // Created in the run's transaction, rolled back with it.
      expect(await table()).toBeNull();
    } finally {
      relay.fail(null);
    }

    const good = await run(id);
    expect(good.done.last_run.status, good.done.last_run.error).toBe('succeeded');
    expect(good.done.rows_exported).toBe(ROWS);
    expect(await table()).toBe(ROWS);

    relay.fail(MIDWAY);
    try {
      const { done } = await run(id, true);
      expect(done.last_run.status).toBe('failed');
      expect(done.last_run.progress).toMatchObject({ rows_exported: 0, percent: 0 });
      expect(done.rows_exported).toBe(ROWS);
      expect(await table()).toBe(ROWS);
    } finally {
      relay.fail(null);
    }
  }, 240_000);
});

describe('a webhook run that fails before its first batch', () => {
  it("keeps the export's figure and the acknowledged batches, for the run and the next one", async () => {
    let refuse: number | null = null;
    const batches: number[] = [];
    const hook: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
      let body = '';
      req.on('data', (chunk) => (body += chunk));
      req.on('end', () => {
        const batch = JSON.parse(body).batch_index as number;
        batches.push(batch);
        res.writeHead(batch === refuse ? 400 : 200).end(batch === refuse ? 'refused' : 'ok');
      });
    });
    hook.listen(0, '127.0.0.1');
    await new Promise((resolve) => hook.once('listening', resolve));
    try {
      const id = await createExport({
        destination: {
          type: 'webhook',
          url: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/in`,
          batch_size: WEBHOOK_BATCH,
          max_retries: 0,
        },
      });
      const all = ROWS / WEBHOOK_BATCH;
      const first = await run(id);
      expect(first.done.last_run.status, first.done.last_run.error).toBe('succeeded');
      expect(first.done.rows_exported).toBe(ROWS);

      // Refused at its first batch: the receiver still holds the rows of the last successful run.
      refuse = 0;
      const refused = await run(id);
      expect(refused.done.last_run.status).toBe('failed');
      expect(refused.done.last_run.error).toContain('400');
      expect(refused.done.last_run.progress).toMatchObject({ rows_exported: 0, batches_sent: 0, percent: 0 });
      expect(refused.done.rows_exported).toBe(ROWS);

      // Three batches acknowledged, then refused: the export shows what the receiver acknowledged.
      refuse = 3;
      const partial = await run(id);
      expect(partial.done.last_run.status).toBe('failed');
      expect(partial.done.last_run.progress).toMatchObject({
        rows_exported: 3 * WEBHOOK_BATCH,
        batches_sent: 3,
      });
      expect(partial.done.rows_exported).toBe(3 * WEBHOOK_BATCH);

      // The warehouse drops every connection before a batch is read: the run still says the receiver
      // has the three batches, on every attempt, and so does the export.
      refuse = null;
      relay.fail({ cutAfter: 0 });
      const sent = batches.length;
      try {
        const cut = await run(id);
        expect(cut.done.last_run.status).toBe('failed');
        expect(cut.job?.retry_count).toBe(2);
        expect(cut.done.last_run.progress).toMatchObject({
          rows_exported: 3 * WEBHOOK_BATCH,
          batches_sent: 3,
          resumed_from_batch: 3,
        });
        expect(cut.done.rows_exported).toBe(3 * WEBHOOK_BATCH);
        expect(batches.length).toBe(sent);
      } finally {
        relay.fail(null);
      }

      // So the next run sends only the batches the receiver does not have.
      const rest = await run(id);
      expect(rest.done.last_run.status, rest.done.last_run.error).toBe('succeeded');
      expect(rest.done.last_run.progress).toMatchObject({
        rows_exported: ROWS,
        batches_sent: all,
        resumed_from_batch: 3,
      });
      expect(batches.slice(sent)).toEqual(Array.from({ length: all - 3 }, (_, i) => i + 3));
      expect(rest.done.rows_exported).toBe(ROWS);
    } finally {
      await new Promise((resolve) => hook.close(resolve));
    }
  }, 240_000);
});
