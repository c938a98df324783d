import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import pg from 'pg';
import autocannon from 'autocannon';
import type { EntityManager } from '@mikro-orm/postgresql';
import { openDatabase } from '../src/db/orm.ts';
import { createOrganizationRecord } from '../src/modules/auth/auth.service.ts';
import { createUser } from '../src/modules/users/users.service.ts';
import type { Scope } from '../src/deps.ts';

export interface LoadResult {
  label: string;
  requestsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  requests: number;
  /** CPU time of the serving thread per request: unlike throughput, barely moved by other load on the machine. */
  cpuMicrosPerRequest: number;
}

export interface LoadOptions {
  url: string;
  method?: string;
  body?: string;
  headers?: Record<string, string>;
  connections?: number;
  durationSeconds?: number;
}

/**
 * One autocannon run in a worker thread, so that the load generator does not share the event loop
 * of the servers it measures. A run with errors or non-2xx answers is a failed benchmark, not a
 * fast one (a 401 is cheaper than a real answer).
 */
export async function load(label: string, options: LoadOptions): Promise<LoadResult> {
  // The servers run on this thread; the load generator runs on its own (workers: 1).
  const cpuBefore = process.threadCpuUsage();
  const result = await autocannon({
    url: options.url,
    // autocannon refuses an explicit undefined method: GET unless one is given.
    method: (options.method ?? 'GET') as 'GET',
    ...(options.body === undefined ? {} : { body: options.body }),
    headers: options.headers,
    connections: options.connections ?? 50,
    duration: options.durationSeconds ?? 10,
    workers: 1,
  });
  if (result.errors || result.timeouts || result.non2xx)
    throw new Error(
      `${label}: ${result.errors} errors, ${result.timeouts} timeouts, ${result.non2xx} non-2xx answers`,
    );
  const cpu = process.threadCpuUsage(cpuBefore);
  return {
    label,
    cpuMicrosPerRequest: (cpu.user + cpu.system) / Math.max(1, result.requests.total),
    requestsPerSecond: result.requests.average,
    p50Ms: result.latency.p50,
    p99Ms: result.latency.p99,
    requests: result.requests.total,
  };
}

export function formatResult(r: LoadResult): string {
  return `${r.label.padEnd(34)} ${r.requestsPerSecond.toFixed(0).padStart(7)} req/s   p50 ${r.p50Ms
    .toFixed(1)
    .padStart(
      5,
    )} ms   p99 ${r.p99Ms.toFixed(1).padStart(6)} ms   ${r.cpuMicrosPerRequest.toFixed(0).padStart(5)} µs CPU/request   (${r.requests} requests)`;
}

export const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};

/** The PostgreSQL server on which benchmarks create their scratch databases. */
export function benchDatabaseUrl(): string {
  return (
    process.env.BENCH_DATABASE_URL ??
    process.env.TEST_DATABASE_URL ??
    'postgresql://postgres@127.0.0.1:5432/postgres'
  );
}

export function urlFor(base: string, database: string): string {
  const url = new URL(base);
  url.pathname = `/${database}`;
  return url.toString();
}

export async function withClient<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

export function rssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+)/.exec(status)![1]) / 1024;
}

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

/**
 * `npm start` (`[VAR=value …] node [node options] src/main.ts`) run directly by this process's Node
 * with the same variables: the same server with the same V8 and allocator options, without npm's
 * and the shell's processes in between, so that the child's pid is the server's own.
 */
function startCommand(): { args: string[]; env: Record<string, string> } {
  const start: string = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).scripts.start;
  const words = start.trim().split(/\s+/);
  const env: Record<string, string> = {};
  while (/^[A-Z_][A-Z0-9_]*=/.test(words[0] ?? '')) {
    const [name, ...value] = words.shift()!.split('=');
    env[name] = value.join('=');
  }
  const [launcher, ...args] = words;
  if (launcher !== 'node' || !args.length) throw new Error(`unexpected start script: ${start}`);
  return { args, env };
}

/** The dimas server as a child process (so its memory is measured alone), resolved once it listens. */
export function startServer(env: Record<string, string>): Promise<{ child: ChildProcess; url: string }> {
  const command = startCommand();
  const child = spawn(process.execPath, command.args, {
    cwd: root,
    env: { ...process.env, ...command.env, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (chunk) => {
      out += chunk;
      const match = /listening on (http:\/\/\S+)/.exec(out);
      if (match) resolve({ child, url: match[1] });
    });
    child.once('exit', (code) => reject(new Error(`the server exited with ${code}: ${out}`)));
  });
}

/** The environment of a benchmark's child server over the control-plane database `databaseUrl`. */
export function serverEnv(databaseUrl: string, dataDir: string): Record<string, string> {
  return {
    DATABASE_URL: databaseUrl,
    PORT: '0',
    HOST: '127.0.0.1',
    DIMAS_DATA_DIR: dataDir,
    DIMAS_SECRET_KEY: '1f'.repeat(32),
    SUPERADMIN_PASSWORD: 'timing-root-password',
    SEED_DEMO: 'false',
    LOG_LEVEL: 'warn',
  };
}

/** Stops a child server and waits for it to exit (SIGKILL for a crash). */
export async function stopServer(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill(signal);
  await exited;
}

export interface Admin {
  domain: string;
  username: string;
  password: string;
}

/** An organization with one admin, written with `em` (an in-process server's, or one opened for it). */
export async function addAdmin(em: EntityManager, admin: Admin) {
  const org = await createOrganizationRecord(em, { name: admin.domain, domain: admin.domain });
  await createUser({ em } as Scope, {
    organizationId: org.id,
    isSuperAdmin: false,
    username: admin.username,
    password: admin.password,
    roles: ['admin'],
    must_change_password: false,
  });
  return org;
}

/** An organization with one admin, written straight into the control plane a child server migrated. */
export async function createAdmin(databaseUrl: string, admin: Admin): Promise<void> {
  const db = await openDatabase({ databaseUrl });
  try {
    await addAdmin(db.orm.em.fork() as EntityManager, admin);
  } finally {
    await db.close();
  }
}

export type JsonApi = (method: string, path: string, body?: unknown) => Promise<Record<string, any>>;

/** A REST client signed in as `admin`; any answer but 200 throws with the status and the body. */
export async function signIn(baseUrl: string, admin: Admin): Promise<{ api: JsonApi; token: string }> {
  let token = '';
  const api: JsonApi = async (method, path, body) => {
    const res = await fetch(new URL(path, baseUrl), {
      method,
      headers: {
        'content-type': 'application/json',
        ...(token ? { authorization: `Bearer ${token}` } : {}),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const json = (await res.json()) as Record<string, any>;
    if (res.status !== 200)
      throw new Error(`${method} ${path} answered ${res.status}: ${JSON.stringify(json)}`);
    return json;
  };
  token = (await api('POST', '/api/auth/login', admin)).token;
  return { api, token };
}

/** A workspace connection config naming `database` on the server of `baseUrl`. */
export function postgresConfig(baseUrl: string, database: string, schemas: string[]) {
  const url = new URL(baseUrl);
  return {
    type: 'postgres',
    host: url.hostname,
    port: Number(url.port || 5432),
    database,
    user: decodeURIComponent(url.username) || 'postgres',
    password: decodeURIComponent(url.password) || 'unused',
    schemas,
  };
}

export interface MappedColumn {
  name: string;
  type: string;
  nullable?: boolean;
  /** Copied from this source field (`table.column`)… */
  sourceField?: string;
  /** …or computed by this SQL expression. */
  expression?: string;
}

/**
 * A selected workspace whose one target table is mapped from one source table and committed, ready
 * to materialize. Returns the committed SQL.
 */
export async function setUpMapping(
  api: JsonApi,
  options: {
    workspace: string;
    sourceConfig: Record<string, unknown>;
    targetConfig: Record<string, unknown>;
    table: string;
    primaryKey: string[];
    sourceTable: string;
    columns: MappedColumn[];
  },
): Promise<string> {
  await api('POST', '/api/workspaces/create', { name: options.workspace, select: true });
  await api('POST', `/api/workspaces/${options.workspace}/config`, {
    source_config: options.sourceConfig,
    target_config: options.targetConfig,
    target_schema: {
      name: options.workspace,
      tables: [
        {
          name: options.table,
          primary_key: options.primaryKey,
          columns: options.columns.map(({ name, type, nullable }) => ({ name, type, nullable })),
        },
      ],
    },
  });
  return mapTable(api, options.table, options.sourceTable, options.columns);
}

/** Maps a target table of the selected workspace from one source table and commits it: its SQL. */
export async function mapTable(
  api: JsonApi,
  table: string,
  sourceTable: string,
  columns: MappedColumn[],
): Promise<string> {
  const mapping = `/api/mappings/${table}`;
  await api('POST', `${mapping}/tables`, { source_table: sourceTable, relationship: 'primary' });
  for (const column of columns) {
    if (column.sourceField)
      await api('POST', `${mapping}/connection`, {
        connection: { source_field: column.sourceField, target_field: column.name },
      });
    else if (column.expression)
      await api('POST', `${mapping}/transformation`, {
        transformation: { target_field: column.name, expression: column.expression },
      });
  }
  return (await api('POST', `${mapping}/commit-transformation`, { message: 'bench' })).sql;
}

/** Queues a materialization of `table` and polls its mapping until the run ends; a failed run throws. */
export async function materialize(
  api: JsonApi,
  table: string,
): Promise<{ runId: string; result: Record<string, unknown> }> {
  const { run_id: runId } = await api('POST', `/api/mappings/${table}/materialize`, {});
  for (;;) {
    const run = (await api('GET', `/api/mappings/${table}`)).materialization.last_run;
    if (run?.run_id === runId && run.status === 'succeeded') return { runId, result: run.result };
    if (run?.run_id === runId && ['failed', 'cancelled'].includes(run.status))
      throw new Error(`run ${run.status}: ${run.error}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * Runs a benchmark's `main` when its file is the entry point (`node bench/x.ts`, bench/run.ts), not
 * when it is imported. Exits 1 when `main` throws or answers false (a missed target), else 0: handles
 * a benchmark leaves open (pools, sockets) must not keep the process alive.
 */
export function runIfMain(importMetaUrl: string, main: () => Promise<boolean | void>): void {
  if (importMetaUrl !== pathToFileURL(process.argv[1] ?? '').href) return;
  main().then(
    (passed) => process.exit(passed === false ? 1 : 0),
    (error) => {
      console.error(error);
      process.exit(1);
    },
  );
}

/**
 * What a benchmark's webhook receiver counted: per export, the rows and batches it acknowledged and
 * the batches that came again (the same idempotency key twice); the largest request body.
 */
export interface WebhookTally {
  exports: Record<string, { rows: number; batches: number; repeated: number }>;
  requests: number;
  maxBodyBytes: number;
}

// Plain JavaScript run by `node -e` in a process of its own: the receiver's memory and CPU are not
// the benchmark's, and its parse of every body checks what the server sent.
const WEBHOOK_RECEIVER = `
const http = require('node:http');
const tally = { exports: {}, requests: 0, maxBodyBytes: 0 };
const keys = new Set();
const server = http.createServer((req, res) => {
  if (req.method === 'GET') return void res.end(JSON.stringify(tally));
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    const raw = Buffer.concat(chunks);
    tally.requests++;
    tally.maxBodyBytes = Math.max(tally.maxBodyBytes, raw.length);
    const body = JSON.parse(raw.toString('utf8'));
    const seen = (tally.exports[body.export_id] ??= { rows: 0, batches: 0, repeated: 0 });
    if (keys.has(body.idempotency_key)) seen.repeated++;
    else {
      keys.add(body.idempotency_key);
      seen.rows += body.rows.length;
      seen.batches++;
    }
    res.end('ok');
  });
});
server.listen(0, '127.0.0.1', () => console.log('listening on ' + server.address().port));
`;

/** A webhook receiver in a child process that acknowledges every batch and counts what it got. */
export function startWebhookReceiver(): Promise<{
  url: string;
  tally(): Promise<WebhookTally>;
  stop(): Promise<void>;
}> {
  const child = spawn(process.execPath, ['-e', WEBHOOK_RECEIVER], { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (chunk) => {
      out += chunk;
      const match = /listening on (\d+)/.exec(out);
      if (!match) return;
      const base = `http://127.0.0.1:${match[1]}`;
      resolve({
        url: `${base}/hook`,
        tally: async () => (await (await fetch(base)).json()) as WebhookTally,
        stop: () => stopServer(child),
      });
    });
    child.once('exit', (code) => reject(new Error(`the webhook receiver exited with ${code}: ${out}`)));
  });
}
