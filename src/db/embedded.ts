import { fork } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type { PGlite, Results, types as pgliteTypes } from '@electric-sql/pglite';
import { PostgresDialect } from 'kysely';
import { createPostgreSqlTypeParsers } from '@mikro-orm/sql';

/**
 * The embedded database: real PostgreSQL compiled to WASM, in-process. It answers one query at a
 * time, so everything that reaches it goes through one mutex; a Kysely transaction holds the mutex
 * from BEGIN to COMMIT, which is exactly the isolation a single connection gives.
 */
export async function openEmbeddedPostgres(dataDir?: string, loadDataDir?: Blob): Promise<PGlite> {
  if (dataDir && !loadDataDir) await createDataDirInChildProcess(dataDir);
  // Loaded here rather than imported: a server-mode process never pays for PGlite's module.
  const { PGlite, types } = await import('@electric-sql/pglite');
  return PGlite.create(dataDir, {
    ...(await embeddedInstanceOptions()),
    parsers: embeddedParsers(types),
    loadDataDir,
  });
}

/**
 * What every PGlite of the process (the control plane and the demo warehouse) starts with. A PGlite's
 * WASM memory never shrinks, so whatever PostgreSQL touches once stays resident: 16 MB of
 * `shared_buffers` instead of the default 128 MB keeps each instance's buffer cache from growing
 * into its full default size (README, "Memory", has the figures and what it costs the test suite).
 */
export async function embeddedInstanceOptions() {
  const { PGlite } = await import('@electric-sql/pglite');
  return {
    pgliteWasmModule: await pgliteWasmModule(),
    startParams: [...PGlite.defaultStartParams, '-c', 'shared_buffers=16MB'],
  };
}

/**
 * Runs initdb for a new data directory in a short-lived child process, as PostgreSQL itself does.
 * In this process initdb left about 120 MB of freed but fragmented C heap that the server would
 * have carried for the rest of its life (README, "Memory").
 */
export async function createDataDirInChildProcess(dataDir: string): Promise<void> {
  if (existsSync(join(dataDir, 'PG_VERSION'))) return;
  mkdirSync(dataDir, { recursive: true });
  // Plain Node runs the TypeScript file (type stripping); none of this process's flags or loaders.
  const child = fork(new URL('./embedded-initdb.ts', import.meta.url), [dataDir], {
    execArgv: [],
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
  });
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-4000)));
  const code = await new Promise<number | null>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', resolve);
  });
  if (code !== 0) throw new Error(`initdb of ${dataDir} failed (exit ${code}): ${stderr.trim()}`);
}

let compiledPostgres: Promise<WebAssembly.Module> | undefined;

/**
 * PostgreSQL's WASM module, compiled once per process and shared by every PGlite of it (the control
 * plane and the demo warehouse): left to itself, each PGlite compiles its own copy, and the machine
 * code of one is about 200 MB of resident memory (two instances at rest: 532 MB, shared: 269 MB).
 * initdb's module (300 KB) is left to PGlite: the server's instances never run initdb in-process.
 */
function pgliteWasmModule(): Promise<WebAssembly.Module> {
  compiledPostgres ??= (async () => {
    const require = createRequire(import.meta.url);
    const dist = dirname(require.resolve('@electric-sql/pglite'));
    return WebAssembly.compile(await readFile(join(dist, 'pglite.wasm')));
  })();
  return compiledPostgres;
}

/** Parse values the way `pg` does against a real server, so both modes return the same shapes. */
function embeddedParsers(types: typeof pgliteTypes) {
  const asText = (value: string) => value;
  return {
    ...createPostgreSqlTypeParsers((value: string) => types.arrayParser(value, asText, 0)),
    [types.INT8]: asText,
    [types.NUMERIC]: asText,
  };
}

class Mutex {
  #tail: Promise<void> = Promise.resolve();

  acquire(): Promise<() => void> {
    let release!: () => void;
    const next = new Promise<void>((resolve) => (release = resolve));
    const ready = this.#tail.then(() => release);
    this.#tail = this.#tail.then(() => next);
    return ready;
  }
}

interface PgLikeResult {
  command: string;
  rowCount: number;
  rows: unknown[];
  fields: { name: string; dataTypeID: number }[];
}

const MUTATING = /^\s*(insert|update|delete|merge)\b/i;

function toPgResult(sql: string, result: Results): PgLikeResult {
  const affected = result.affectedRows ?? 0;
  return {
    command: affected > 0 || MUTATING.test(sql) ? 'UPDATE' : 'SELECT',
    rowCount: affected || result.rows.length,
    rows: result.rows,
    fields: result.fields,
  };
}

/**
 * PGlite answers within the caller's turn of the event loop (its promises settle as microtasks), so
 * a chain of statements — a job's thousands — held every request, timer and socket of the process
 * until it ended: 3,000 statements ran 0.7 s without one timer firing. After this long without a
 * turn, the next statement waits for one.
 */
const EVENT_LOOP_TURN_MS = 20;
let lastTurn = performance.now();

async function letTheEventLoopTurn() {
  if (performance.now() - lastTurn < EVENT_LOOP_TURN_MS) return;
  await new Promise((resolve) => setImmediate(resolve));
  lastTurn = performance.now();
}

/** Parameterless SQL may hold several statements, which only the simple protocol (`exec`) accepts. */
async function run(pg: PGlite, sql: string, params: readonly unknown[] = []): Promise<PgLikeResult> {
  await letTheEventLoopTurn();
  if (params.length > 0) return toPgResult(sql, await pg.query(sql, [...params]));
  const results = await pg.exec(sql);
  const last = results.filter((r) => r.fields.length > 0).at(-1) ?? results.at(-1);
  const affected = results.reduce((sum, r) => sum + (r.affectedRows ?? 0), 0);
  return toPgResult(sql, { rows: last?.rows ?? [], fields: last?.fields ?? [], affectedRows: affected });
}

/** The cursor Kysely asks for when streaming; PGlite lives in this process, so reading ahead is cheap. */
class EmbeddedCursor {
  pg?: PGlite;
  #rows?: unknown[];
  #offset = 0;

  readonly sql: string;
  readonly params: unknown[];

  constructor(sql: string, params: unknown[]) {
    this.sql = sql;
    this.params = params;
  }

  async read(count: number): Promise<unknown[]> {
    this.#rows ??= (await run(this.pg!, this.sql, this.params)).rows;
    const chunk = this.#rows.slice(this.#offset, this.#offset + count);
    this.#offset += count;
    return chunk;
  }

  async close(): Promise<void> {
    this.#rows = undefined;
  }
}

/** One mutex per PGlite instance: every pool over it (MikroORM's, the job queue's) must take turns. */
const mutexes = new WeakMap<PGlite, Mutex>();

/** A pg-Pool look-alike over one PGlite instance, for Kysely's PostgresDialect (and so MikroORM). */
export function createEmbeddedPool(pg: PGlite) {
  let mutex = mutexes.get(pg);
  if (!mutex) mutexes.set(pg, (mutex = new Mutex()));
  return {
    async connect() {
      const release = await mutex.acquire();
      return {
        query(sql: string | EmbeddedCursor, params?: readonly unknown[]) {
          if (sql instanceof EmbeddedCursor) {
            sql.pg = pg;
            return sql;
          }
          return run(pg, sql, params);
        },
        release,
      };
    },
    async end() {},
  };
}

export function createEmbeddedDialect(pg: PGlite): PostgresDialect {
  return new PostgresDialect({ pool: createEmbeddedPool(pg) as never, cursor: EmbeddedCursor as never });
}
