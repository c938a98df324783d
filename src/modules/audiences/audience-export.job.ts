import { createHash } from 'node:crypto';
import { mkdir, open, rename, rm, stat } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import { ReadableStream } from 'node:stream/web';
import { setTimeout as sleep } from 'node:timers/promises';
import { dirname, join } from 'node:path';
import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../../deps.ts';
import { AppError } from '../../app-error.ts';
import {
  JobCancelledError,
  PermanentJobError,
  failOnceWhenDeterministic,
  isRunActive,
} from '../../jobs/job-types.ts';
import { laterRunOfItsKey, type JobContext } from '../../jobs/queue.ts';
import { isFeatureEnabledFor } from '../../features.ts';
import {
  hasUrlCredentials,
  maskUrlSecrets,
  outboundFailure,
  outboundHttp,
  retryAfterMs,
  urlQueryValues,
  type OutboundHttp,
} from '../../outbound-http.ts';
import { quoteIdent, warehouses } from '../../warehouse/postgres.ts';
import { portableFamily } from '../../warehouse/types.ts';
import { pipeCopyText, type Warehouse } from '../../warehouse/warehouse.ts';
import {
  Audience,
  AudienceExport,
  isStale,
  staleReason,
  type AudienceEntity,
  type AudienceExportEntity,
} from './audiences.entity.ts';
import { csvLine, exportSelect, qualifiedName } from './audiences-sql.ts';
import { audienceTarget, enqueueMaterialization } from './audience-materialize.job.ts';
import { SECRET_MASK } from '../../auth/secret-box.ts';

export const EXPORT_KIND = 'audience-export';

interface ExportPayload extends Record<string, unknown> {
  export_id: string;
  /** Set by the scheduler (when the run was due): such a run sends the audience as it is then. */
  scheduled_at?: string;
}

/**
 * Rows read from the cursor at a time. A batch stays alive while its text is written, across the
 * file's awaits, so the young generation's collections promote it: with 5,000 rows four exports at
 * once grew the server to 492 MB of old garbage, with 500 to 270 MB, and faster (bench/audiences.ts).
 */
const STREAM_BATCH = 500;
/**
 * CSV text is written in pieces of about this many characters. A string above 128 kB would be
 * allocated in V8's large-object space, which only a full collection frees: a batch as one string
 * piled up there between full collections.
 */
const WRITE_CHUNK_CHARS = 32 * 1024;
/**
 * The most bytes of rows' JSON a webhook request carries, whatever its batch_size: a batch of
 * batch_size rows that would be larger ends early and the next batch takes the rest. A request's body
 * is in memory while it is sent and retried: this bounds an export's memory whatever the width of its
 * rows (10,000 rows of 2 kB were 20 MB a request).
 */
const WEBHOOK_BATCH_BYTES = 4 * 2 ** 20;
/** Progress is written at most this often: every write is a control-plane statement. */
const PROGRESS_EVERY_MS = 1000;
const MAX_PARAMS = 60_000;

/** Where a CSV export's file lives; one file per export, replaced by each successful run. */
export function exportFilePath(deps: AppDeps, organizationId: string, exportId: string): string {
  return join(deps.env.dataDir, 'audience-exports', organizationId, `${exportId}.csv`);
}

/** Where a run writes its CSV file until the file is complete and moves into place. */
const partialFilePath = (deps: AppDeps, organizationId: string, exportId: string, runId: string) =>
  `${exportFilePath(deps, organizationId, exportId)}.${runId}.part`;

interface Source {
  warehouse: Warehouse;
  sql: string;
  /** The embedded demo warehouse: one PGlite backend behind every connection to it. */
  demo: boolean;
  /** Columns in destination names with the audience's column types. */
  columns: { name: string; type: string }[];
}

type Progress = (rows: number, extra?: Record<string, unknown>, force?: boolean) => Promise<void>;

/**
 * Records a complete CSV run and its file together, just before the file moves into place. Whether
 * the file was moved: not when the export names a newer run (see `record`).
 */
type CompleteCsv = (
  rows: number,
  file: { filePath: string; fileSize: number },
  place: () => Promise<void>,
) => Promise<boolean>;

/** Errors of a file move that a retry meets again: the path is a directory, or the server may not write it. */
const UNMOVABLE = new Set(['EISDIR', 'ENOTEMPTY', 'ENOTDIR', 'EEXIST', 'EACCES', 'EPERM', 'EROFS']);

async function writeCsv(
  deps: AppDeps,
  exp: AudienceExportEntity,
  source: Source,
  context: JobContext,
  progress: Progress,
  complete: CompleteCsv,
) {
  const config = exp.destinationConfig as {
    delimiter?: string;
    include_header?: boolean;
    escape_formulas?: boolean;
  };
  const delimiter = config.delimiter ?? ',';
  const escapeFormulas = config.escape_formulas === true;
  const path = exportFilePath(deps, exp.organization.id, exp.id);
  const partial = partialFilePath(deps, exp.organization.id, exp.id, context.runId);
  await mkdir(dirname(path), { recursive: true });
  let rows = 0;
  async function* chunks() {
    if (config.include_header !== false)
      yield csvLine(
        source.columns.map((c) => c.name),
        delimiter,
      );
    for await (const batch of source.warehouse.stream(source.sql, { batchSize: STREAM_BATCH })) {
      let chunk = '';
      for (const row of batch) {
        chunk += csvLine(Object.values(row), delimiter, escapeFormulas);
        if (chunk.length >= WRITE_CHUNK_CHARS) {
          yield chunk;
          chunk = '';
        }
      }
      if (chunk) yield chunk;
      rows += batch.length;
      await progress(rows);
    }
  }
  // The file exists before the first write, so removing it below cannot race the stream's own open.
  const file = await open(partial, 'w');
  try {
    // pipeline owns every stream's errors and destroys them all on the first failure or on abort
    // (pause, cancellation): a stream destroyed with a write pending must never be left to emit an
    // 'error' that nothing listens to, which would end the whole process. It also applies backpressure.
    await pipeline(chunks(), file.createWriteStream(), { signal: context.signal });
    const written = { filePath: path, fileSize: (await stat(partial)).size };
    // The file moves into place inside the transaction that records the run's success: a reader sees
    // `succeeded` only with the new file in place, and a move that fails leaves the run unrecorded
    // (it fails as any error does; the previous file and figures stay). A commit failing after the
    // move leaves the new file under the previous figures until the retry writes it again.
    const placed = await complete(rows, written, () =>
      rename(partial, path).catch((error: unknown) => {
        const code = (error as { code?: unknown }).code;
        if (typeof code === 'string' && UNMOVABLE.has(code))
          throw new PermanentJobError(
            `The export file cannot be moved into place: ${(error as Error).message}`,
            {
              cause: error,
            },
          );
        throw error;
      }),
    );
    // Past the point of no return nothing may fail the run: the file is not looked at again, and a
    // partial file left behind only takes disk space.
    if (!placed) await rm(partial, { force: true }).catch(() => undefined);
    return { rows, ...(placed ? written : {}) };
  } catch (error) {
    await file.close().catch(() => undefined);
    await rm(partial, { force: true });
    throw error;
  }
}

async function writePostgres(deps: AppDeps, exp: AudienceExportEntity, source: Source, progress: Progress) {
  const c = exp.destinationConfig as Record<string, any>;
  const destination = await warehouses(deps).open({
    type: 'postgres',
    host: c.host,
    port: c.port,
    database: c.database,
    user: c.user,
    password: c.password ? deps.secrets.decrypt(c.password) : undefined,
    ssl: !!c.ssl,
    schemas: [c.schema],
  });
  const table = qualifiedName(c.schema, c.table);
  const names = source.columns.map((col) => quoteIdent(col.name));
  // PGlite runs one transaction at a time for all its connections: while the destination's
  // transaction is open, a second connection reading the source waits for it, and it for the rows.
  const sameBackend = source.demo && isDemoWarehouse(deps, c);
  const perStatement = Math.max(1, Math.floor(MAX_PARAMS / names.length));
  let rows = 0;
  // One transaction: a failed run leaves the destination table as it was.
  await destination
    .transaction(async (tx) => {
      await tx.query(`create schema if not exists ${quoteIdent(c.schema)}`);
      const definitions = source.columns.map(
        (col) =>
          `${quoteIdent(col.name)} ${portableFamily(col.type).startsWith('other:') ? 'text' : col.type}`,
      );
      await tx.query(`create table if not exists ${table} (${definitions.join(', ')})`);
      if (c.mode !== 'append') await tx.query(`truncate table ${table}`);
      if (sameBackend) {
        // The rows never leave the database: one statement on the destination's own connection.
        const copied = await tx.query(
          `insert into ${table} (${names.join(', ')}) select * from (${source.sql}) as export_rows`,
        );
        rows = copied.rowCount;
        await progress(rows);
        return;
      }
      // The demo warehouse (PGlite) cannot take COPY … FROM STDIN over its socket: rows go as inserts.
      if (source.warehouse.copyOut && !isDemoWarehouse(deps, c)) {
        // The source's COPY text goes into the destination's COPY as it comes: no row is built here.
        const into = tx.copyFrom(`copy ${table} (${names.join(', ')}) from stdin`);
        await pipeCopyText(source.warehouse, source.sql, into, async (chunkRows) => {
          rows += chunkRows;
          await progress(rows);
        });
        return;
      }
      for await (const batch of source.warehouse.stream(source.sql, { batchSize: STREAM_BATCH })) {
        for (let start = 0; start < batch.length; start += perStatement) {
          const slice = batch.slice(start, start + perStatement);
          const params: unknown[] = [];
          const tuples = slice.map((row) => {
            const values = Object.values(row);
            return `(${values.map((v) => {
              params.push(
                v !== null && typeof v === 'object' && !(v instanceof Date) ? JSON.stringify(v) : v,
              );
              return `$${params.length}`;
            })})`;
          });
          await tx.query(`insert into ${table} (${names.join(', ')}) values ${tuples.join(', ')}`, params);
        }
        rows += batch.length;
        await progress(rows);
      }
    })
    .catch((error: unknown) => {
      // The destination's own verdict (a SQLSTATE: columns that do not fit the table, a missing
      // privilege) repeats on every attempt; an error without one (a dropped connection) may not.
      const code = (error as { code?: unknown }).code;
      if (typeof code === 'string' || error instanceof AppError) failOnceWhenDeterministic(error);
      throw error;
    });
  return { rows };
}

/** Whether a PostgreSQL destination is the embedded demo warehouse (any loopback name of its port). */
function isDemoWarehouse(deps: AppDeps, config: { host?: unknown; port?: unknown }): boolean {
  const demo = deps.demoWarehouse;
  if (!demo) return false;
  const host = String(config.host ?? '')
    .toLowerCase()
    .replace(/^\[(.*)\]$/, '$1');
  const loopback = host === 'localhost' || host === '::1' || /^127\./.test(host);
  return loopback && Number(config.port ?? 5432) === demo.port;
}

/** An HTTP header name (RFC 9110 token). */
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** A header value fetch can send: visible Latin-1 and inner spaces or tabs, never CR, LF or NUL. */
const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

/**
 * What is wrong with a webhook header, naming the header and never repeating the value (a header is
 * where a webhook's secret lives); null when it can be sent.
 */
export function headerProblem(name: string, value: string): string | null {
  if (!HEADER_NAME.test(name))
    return `Header name ${JSON.stringify(name.replace(/[^\x21-\x7e]/g, '?'))} is not a valid HTTP header name`;
  if (!HEADER_VALUE.test(value))
    return `The value of header ${name} is not a valid HTTP header value (line breaks, control or non-Latin-1 characters)`;
  return null;
}

/**
 * The error with every secret of the destination (header values, the URL's query values and
 * credentials) masked: run errors are shown in the export's last run and logged, and fetch and the
 * receiver may repeat what they got. A new error without its cause, so a log that prints causes
 * cannot bring the secret back.
 */
function redacted(error: unknown, secrets: string[]): Error {
  let message = error instanceof Error ? error.message : String(error);
  for (const secret of secrets.filter((v) => v.length >= 3).sort((a, b) => b.length - a.length))
    message = message.split(secret).join(SECRET_MASK);
  message = maskUrlSecrets(message);
  return error instanceof PermanentJobError ? new PermanentJobError(message) : new Error(message);
}

/** How much of a refusing webhook's answer its error quotes (secrets masked: see `redacted`). */
const RESPONSE_EXCERPT_CHARS = 500;
/** The longest a batch waits when its receiver asks to (`Retry-After`) before trying again. */
const MAX_RETRY_AFTER_MS = 5 * 60_000;
const RETRYABLE = (status: number) => status === 408 || status === 425 || status === 429 || status >= 500;

/** From this size on, a webhook body goes to fetch as a stream of itself rather than as bytes. */
const STREAMED_BODY_BYTES = 2 ** 20;

/**
 * fetch's headers and body for a request body. fetch copies a body given as bytes, and the copies
 * wait for the collector: four exports at once of 10,000 rows a batch grew the server by 60 MB of
 * them, and took 1.7× as long. A large body goes as a stream of itself instead, with its length (not
 * chunked); a small one (batch_size's default of 500 rows) as bytes, which cost less per request than
 * a stream (4 exports at once: 340 against 410 MB).
 */
function bodyInit(headers: Record<string, string>, body: Uint8Array) {
  if (body.byteLength < STREAMED_BODY_BYTES) return { headers, body };
  return {
    headers: { ...headers, 'content-length': String(body.byteLength) },
    body: new ReadableStream({
      start(controller) {
        controller.enqueue(body);
        controller.close();
      },
    }),
    duplex: 'half' as const,
  };
}

async function postBatch(
  outbound: OutboundHttp,
  url: string,
  headers: Record<string, string>,
  body: Uint8Array,
  options: { maxRetries: number; timeoutMs: number; signal: AbortSignal },
): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    let reason: string;
    let askedWaitMs = 0;
    try {
      const res = await outbound.fetch(url, {
        method: 'POST',
        ...bodyInit(headers, body),
        // A redirect is never followed: a 301/302 would turn the POST into a bodiless GET that
        // "succeeds" with no rows delivered, and any redirect would take the secret headers (and,
        // with 307/308, the rows) to wherever the Location points.
        redirect: 'manual',
        signal: AbortSignal.any([options.signal, AbortSignal.timeout(options.timeoutMs)]),
      });
      if (res.ok) {
        await res.arrayBuffer().catch(() => undefined);
        return;
      }
      const answered = `the webhook answered ${res.status}${res.statusText ? ` ${res.statusText}` : ''}`;
      if (res.status >= 300 && res.status < 400) {
        await res.arrayBuffer().catch(() => undefined);
        const location = res.headers.get('location');
        throw new PermanentJobError(
          `${answered}${location ? ` with Location ${location}` : ''}: webhooks are not redirected, set the export's URL to the final address`,
        );
      }
      const text = (await res.text().catch(() => '')).trim();
      reason = text ? `${answered}: ${text.slice(0, RESPONSE_EXCERPT_CHARS)}` : answered;
      // The receiver refused this request as such (4xx): sending it again gets the same answer.
      if (!RETRYABLE(res.status)) throw new PermanentJobError(reason);
      askedWaitMs = Math.min(MAX_RETRY_AFTER_MS, retryAfterMs(res.headers.get('retry-after')));
    } catch (error) {
      if (options.signal.aborted || error instanceof PermanentJobError) throw error;
      const failure = outboundFailure(error);
      // A refused address stays refused: retrying would only repeat the refusal.
      if (failure.blocked) throw new PermanentJobError(failure.message);
      reason = `the webhook could not be reached: ${failure.message}`;
    }
    if (attempt >= options.maxRetries) throw new Error(`${reason} (after ${attempt + 1} attempts)`);
    // A pause or cancellation ends the wait: a receiver may ask for minutes.
    await sleep(Math.max(askedWaitMs, Math.min(5000, 200 * 2 ** attempt)), undefined, {
      signal: options.signal,
    });
  }
}

/**
 * What a webhook delivery sends, as the middle of its idempotency keys: the materialized table (the
 * audience's data: every materialization writes a new one) and a digest of how it is cut and where it
 * goes (field mapping, batch size and the bytes a batch may hold, the URL without its query, whose
 * values may be secrets). Runs with the same id send the same batches under the same keys; any change
 * gives new keys.
 */
function deliveryId(table: string, exp: AudienceExportEntity): string {
  const c = exp.destinationConfig as Record<string, unknown>;
  const data =
    /_(v\d+_[0-9a-f]+)$/.exec(table)?.[1] ?? createHash('sha256').update(table).digest('hex').slice(0, 12);
  const url = new URL(String(c.url));
  const shape = createHash('sha256')
    .update(
      JSON.stringify([
        exp.fieldMapping.map((m) => [m.source, m.destination]),
        c.batch_size ?? 500,
        url.origin + url.pathname,
        WEBHOOK_BATCH_BYTES,
      ]),
    )
    .digest('hex')
    .slice(0, 8);
  return `${data}.${shape}`;
}

/** The latest record of a webhook delivery of this export: what it sent, how far the receiver acknowledged. */
interface Checkpoint {
  runId: string;
  /** An earlier attempt of the current run. */
  sameRun: boolean;
  status: string;
  deliveryId: string;
  sourceTable: string | null;
  batches: number;
  /** The rows of those batches. */
  rows: number;
}

function checkpointOf(runId: string, status: string, progress: unknown, sameRun: boolean): Checkpoint | null {
  const p = (typeof progress === 'string' ? JSON.parse(progress) : progress) as Record<
    string,
    unknown
  > | null;
  if (typeof p?.delivery_id !== 'string') return null;
  return {
    runId,
    sameRun,
    status,
    deliveryId: p.delivery_id,
    sourceTable: typeof p.source_table === 'string' ? p.source_table : null,
    batches: Number(p.batches_sent ?? 0),
    rows: Number(p.rows_exported ?? 0),
  };
}

/**
 * The export's latest delivery: an earlier attempt of this run, else the latest earlier run that got
 * as far as delivering (a run that failed before, e.g. on a refused materialization, says nothing
 * about the receiver). The kind's `retain` keeps that run past JOB_RUNS_RETENTION_DAYS, so a rerun
 * however much later still finds it.
 */
async function lastDelivery(
  deps: AppDeps,
  em: EntityManager,
  exp: AudienceExportEntity,
  context: JobContext,
): Promise<Checkpoint | null> {
  if (context.attempt > 1) {
    const own = await deps.jobs.getRun(context.runId, context.organizationId);
    const mine = own && checkpointOf(own.id, own.status, own.progress, true);
    if (mine) return mine;
  }
  const [row] = (await em.execute(
    `select id, status, progress from job_runs
      where organization_id = ? and kind = ? and singleton_key = ? and id <> ?
        and progress->>'delivery_id' is not null
      order by created_at desc limit 1`,
    [context.organizationId, EXPORT_KIND, exp.id, context.runId],
  )) as { id: string; status: string; progress: unknown }[];
  return row ? checkpointOf(String(row.id), row.status, row.progress, false) : null;
}

/**
 * Where a webhook run starts: after the batches the receiver acknowledged to the latest delivery of
 * the same data (this run's earlier attempt or an earlier run that failed, was cancelled or paused),
 * else at the start, saying why when a previous delivery could not be continued.
 */
function resumePoint(
  last: Checkpoint | null,
  id: string,
  table: string,
): { from: number; rows: number; runId: string | null; because: string | null } {
  if (!last) return { from: 0, rows: 0, runId: null, because: null };
  const who = last.sameRun ? 'an earlier attempt of this run' : `run ${last.runId}`;
  const sent = `${last.batches} batch${last.batches === 1 ? '' : 'es'}`;
  if (last.deliveryId === id) {
    if (last.status === 'succeeded' && !last.sameRun)
      return {
        from: 0,
        rows: 0,
        runId: null,
        because: `${who} delivered this materialization completely: it is sent again under the same idempotency keys`,
      };
    return last.batches > 0
      ? { from: last.batches, rows: last.rows, runId: last.runId, because: null }
      : { from: 0, rows: 0, runId: null, because: null };
  }
  return {
    from: 0,
    rows: 0,
    runId: null,
    because:
      last.sourceTable && last.sourceTable !== table
        ? `the audience was materialized again after ${who} sent ${sent} of ${last.sourceTable}: this run sends ${table} from the start, under new idempotency keys`
        : `the export's URL, field mapping or batch size changed after ${who} sent ${sent} (or how dimas cuts batches by bytes did): this run sends from the start, under new idempotency keys`,
  };
}

/**
 * A webhook run's request bodies, written in place one after the other into one buffer sized for the
 * largest: memory is given to its pages only as they are written. A body is written once the previous
 * one was acknowledged, which the receiver does after reading it, and a retry sends the same bytes.
 * Bodies built otherwise (one string; a Blob of text pieces; a buffer doubled as rows came) left tens
 * to hundreds of MB to the collector and the allocator, four webhook exports at once
 * (bench/audiences.ts).
 */
class RequestBodies {
  #bytes = Buffer.allocUnsafeSlow(WEBHOOK_BATCH_BYTES + 64 * 1024);
  #length = 0;

  /** Starts the next body: the previous one's bytes are written over. */
  restart() {
    this.#length = 0;
  }

  write(text: string) {
    const needed = this.#length + Buffer.byteLength(text);
    // Only a single row larger than WEBHOOK_BATCH_BYTES gets here.
    if (needed > this.#bytes.length) {
      const larger = Buffer.allocUnsafeSlow(needed);
      this.#bytes.copy(larger, 0, 0, this.#length);
      this.#bytes = larger;
    }
    this.#length += this.#bytes.write(text, this.#length);
  }

  /** The current body: valid until the next `restart`. */
  get bytes(): Uint8Array {
    return this.#bytes.subarray(0, this.#length);
  }
}

/**
 * A webhook's batches, each the complete body of its request (`head(index)` then the rows): up to
 * `batchSize` rows, fewer when their JSON would pass WEBHOOK_BATCH_BYTES (a row larger than that goes
 * alone). The cut depends only on the rows, so every run cuts a delivery alike. A batch's body is
 * valid until the next one is asked for. Rows are read STREAM_BATCH at a time and written out as text
 * at once: a request's awaits hold no batch_size rows as objects nor its body as one string, which
 * V8's young collections would promote.
 */
async function* webhookBatches(
  source: Source,
  batchSize: number,
  head: (index: number) => string,
): AsyncGenerator<{ rows: number; body: Uint8Array }> {
  const body = new RequestBodies();
  let index = 0;
  let text = '';
  let rows = 0;
  let rowBytes = 0;
  const start = () => {
    body.restart();
    body.write(head(index));
    text = '';
    rows = 0;
    rowBytes = 0;
  };
  const end = () => {
    body.write(`${text}]}`);
    index++;
    return { rows, body: body.bytes };
  };
  start();
  for await (const read of source.warehouse.stream(source.sql, { batchSize: STREAM_BATCH })) {
    for (const row of read) {
      const json = JSON.stringify(row);
      const bytes = Buffer.byteLength(json);
      if (rows && (rows === batchSize || rowBytes + 1 + bytes > WEBHOOK_BATCH_BYTES)) {
        yield end();
        start();
      }
      text += rows ? `,${json}` : json;
      rowBytes += rows ? bytes + 1 : bytes;
      rows++;
      if (text.length >= WRITE_CHUNK_CHARS) {
        body.write(text);
        text = '';
      }
    }
  }
  if (rows) yield end();
}

/**
 * Batches in a stable order, each with the idempotency key `<export>:<delivery>:<batch>`: the key
 * names the data, not the run, so a batch sent again (a lost answer, a retried attempt, a rerun) comes
 * with the key the receiver saw. The number of batches the webhook acknowledged is saved after each
 * one, and a run starts after those of the latest delivery of the same data (`resumePoint`): no
 * acknowledged batch is sent again by a retried attempt, nor by a rerun of a failed or paused run.
 */
async function sendWebhook(
  deps: AppDeps,
  exp: AudienceExportEntity,
  source: Source,
  context: JobContext,
  delivery: { id: string; from: number },
  progress: Progress,
  delivered: Delivered,
) {
  const c = exp.destinationConfig as Record<string, any>;
  const headers: Record<string, string> = {};
  for (const [name, sealed] of Object.entries((c.headers ?? {}) as Record<string, string>))
    headers[name] = deps.secrets.decrypt(sealed);
  // The URL with its query values, sealed like the headers (`url` holds them masked); an export saved
  // before they were sealed has them in `url`.
  const url = c.sealed_url ? deps.secrets.decrypt(c.sealed_url as string) : String(c.url);
  // Saved before these were refused: every attempt would fail the same way. A URL with credentials
  // stops here, before any request, so its user and password never reach an error.
  if (hasUrlCredentials(url))
    throw new PermanentJobError('The webhook URL contains credentials: give them as a header instead');
  const secrets = [...Object.values(headers), ...urlQueryValues(url)];
  for (const [name, value] of Object.entries(headers)) {
    const problem = headerProblem(name, value);
    if (problem) throw new PermanentJobError(problem);
  }
  let batchIndex = 0;
  let rows = 0;
  const keyOf = (index: number) => `${exp.id}:${delivery.id}:${index}`;
  // The body's start, up to its rows: the fields of JSON.stringify({ …, rows }) before them.
  const headOf = (index: number) => {
    const head = JSON.stringify({
      export_id: exp.id,
      run_id: context.runId,
      batch_index: index,
      idempotency_key: keyOf(index),
    });
    return `${head.slice(0, -1)},"rows":[`;
  };
  for await (const batch of webhookBatches(source, c.batch_size ?? 500, headOf)) {
    // Acknowledged before (already counted in `delivered`): a failure while they are read again
    // must not record fewer.
    if (batchIndex < delivery.from) {
      batchIndex++;
      rows += batch.rows;
      continue;
    }
    const key = keyOf(batchIndex);
    try {
      await postBatch(
        outboundHttp(deps.env),
        url,
        {
          ...headers,
          'content-type': 'application/json',
          'idempotency-key': key,
          'user-agent': 'dimas-audience-export',
        },
        batch.body,
        { maxRetries: c.max_retries ?? 3, timeoutMs: c.timeout_ms ?? 10_000, signal: context.signal },
      );
    } catch (error) {
      if (context.signal.aborted) throw error;
      throw redacted(error, secrets);
    }
    batchIndex++;
    rows += batch.rows;
    // Counted before it is written: a pause refuses the write, and the receiver has the batch anyway.
    Object.assign(delivered, { rows, batches: batchIndex });
    await progress(rows, { batches_sent: batchIndex }, true);
  }
  return { rows, batches: batchIndex };
}

/** What the receiver of a webhook delivery acknowledged so far, resumed batches included. */
interface Delivered {
  rows: number;
  batches: number;
}

/**
 * The export's `rows_exported` after a run that did not succeed: the rows the destination holds from
 * it when it holds any (`reached`: a webhook's acknowledged batches, a file or table in place), else
 * the figure as it was before the run, which is what the destination still holds. A CSV file's record
 * changes only with the file in place (the success transaction moves it), so it is left as it is.
 */
function exportedAfterFailure(
  exp: AudienceExportEntity,
  reached: { rows: number } | null,
): Partial<AudienceExportEntity> {
  return { rowsExported: reached ? reached.rows : (exp.rowsExported ?? null) };
}

/**
 * What an export run whose worker died left at its destination, from the last progress it recorded
 * (a running count), as its handler records it on failure: a webhook's receiver holds the batches
 * it acknowledged (each recorded once acknowledged, with `batches_sent`), which the export shows when
 * there are any; a CSV run's partial file is never moved into place and a PostgreSQL run's
 * transaction died with its connection, so they hold none of the rows counted and the export keeps
 * its figure. A run that had not started to write (still materializing first) keeps its progress.
 */
function abandonedDelivery(progress: Record<string, unknown>): {
  progress: Record<string, unknown> | undefined;
  acknowledged: number | null;
} {
  if (typeof progress.rows_exported !== 'number') return { progress: undefined, acknowledged: null };
  if (progress.batches_sent !== undefined)
    return {
      progress: undefined,
      acknowledged: Number(progress.batches_sent) > 0 ? progress.rows_exported : null,
    };
  return {
    progress: { ...progress, rows_exported: 0, percent: progress.total_rows ? 0 : null },
    acknowledged: null,
  };
}

/**
 * Writes what run `runId` did (status, error, figures, file) on its export while the export still
 * names that run as its last, as `onAbandoned` does; whether it wrote. A run names itself when it
 * starts, holding the export's singleton key; once that key is free (a CSV run past its point of no
 * return, a run cancelled while its handler winds down) a newer run can be enqueued, and the scheduler
 * names it at once: what the older handler writes on its way out would overwrite the newer run's.
 */
async function record(
  em: EntityManager,
  exportId: string,
  organizationId: string,
  runId: string,
  changes: Partial<AudienceExportEntity>,
): Promise<boolean> {
  const changed = await em.nativeUpdate(
    AudienceExport,
    { id: exportId, organization: organizationId, lastRunId: runId },
    { ...changes, updatedAt: new Date() },
  );
  return changed > 0;
}

/**
 * Why a scheduled run materializes the audience before it sends, or null: a scheduled sync sends the
 * audience as it is when the run is due (as Hightouch and Census run the model at every sync), so one
 * materialized after that (by another export due at the same time, or an earlier attempt of this run)
 * is used as it is.
 */
function refreshReason(audience: AudienceEntity, scheduledAt: Date): string | null {
  if (!audience.materializedTable) return 'the audience was never materialized';
  const stale = staleReason(audience);
  if (stale) return stale;
  if (!audience.materializedAt || audience.materializedAt < scheduledAt)
    return 'a scheduled run sends the audience as it is when the run is due';
  return null;
}

/**
 * Materializes the audience (or waits for the materialization under way) and returns it as it is
 * then. A materialization that fails fails the run once, before anything is sent: a scheduled run
 * sends current members or none.
 */
async function materializeFirst(
  deps: AppDeps,
  em: EntityManager,
  audience: AudienceEntity,
  reason: string,
  context: JobContext,
): Promise<{ audience: AudienceEntity; runId: string }> {
  const { run } = await enqueueMaterialization(deps, em, {
    audienceId: audience.id,
    organizationId: context.organizationId,
    workspaceId: audience.workspace.id,
  });
  await context.progress({
    phase: 'materializing',
    materialize_run_id: run.id,
    materialized_because: reason,
  });
  let current = run;
  while (isRunActive(current.status)) {
    await sleep(500, undefined, { signal: context.signal });
    current = (await deps.jobs.getRun(run.id, context.organizationId)) ?? { ...current, status: 'cancelled' };
  }
  if (current.status !== 'succeeded')
    throw new PermanentJobError(
      `The audience could not be materialized before this scheduled run (${reason}): materialization run ${run.id} ${current.status}${current.error ? `: ${current.error}` : ''}. Nothing was sent`,
    );
  const fresh = await (em.fork() as EntityManager).findOne(
    Audience,
    { id: audience.id, organization: context.organizationId },
    { populate: ['workspace'] },
  );
  if (!fresh) throw new PermanentJobError('The audience was deleted');
  return { audience: fresh, runId: run.id };
}

/** Whether `error` (or its cause) is the warehouse saying `table` does not exist. */
function missingTable(error: unknown, table: string): boolean {
  for (
    let e = error as
      { details?: { reason?: unknown }; code?: unknown; message?: unknown; cause?: unknown } | undefined;
    e;
    e = e.cause as typeof e
  ) {
    const code = e.details?.reason ?? e.code;
    if (code === '42P01' && String(e.message).includes(table)) return true;
  }
  return false;
}

/**
 * The error for a source table that is gone, instead of the warehouse's `relation … does not exist`:
 * replaced by a newer materialization while this attempt started (the next attempt reads that one), or
 * dropped outside dimas (no attempt can read it).
 */
async function missingSourceError(em: EntityManager, audience: AudienceEntity, table: string) {
  const current = await (em.fork() as EntityManager).findOne(Audience, {
    id: audience.id,
    organization: audience.organization.id,
  });
  const schema = audience.materializedSchema;
  if (current?.materializedTable && current.materializedTable !== table)
    return new Error(
      `The audience was materialized again while this run started (${schema}.${table} was replaced by ${schema}.${current.materializedTable}): the next attempt sends the new materialization`,
    );
  return new PermanentJobError(
    `The audience's materialized table ${schema}.${table} no longer exists in the warehouse: materialize the audience again`,
  );
}

/** Whether the run sends an audience whose definition changed since it was materialized, and the dates. */
const staleness = (audience: AudienceEntity) => ({
  audience_stale: isStale(audience),
  audience_materialized_at: audience.materializedAt?.toISOString() ?? null,
  audience_definition_changed_at: audience.definitionChangedAt?.toISOString() ?? null,
});

async function runAudienceExport(deps: AppDeps, payload: ExportPayload, context: JobContext) {
  const em = deps.orm.em.fork() as EntityManager;
  const exp = await em.findOne(
    AudienceExport,
    { id: payload.export_id, organization: context.organizationId },
    { populate: ['audience', 'audience.workspace'] },
  );
  if (!exp) return { skipped: 'the export was deleted' };
  if (exp.status === 'paused') {
    // Recorded only while the export names this run (the trigger or the schedule named it when it
    // queued it; a pause cancels such a run before it starts, so this is a pause that came later).
    await record(em, exp.id, context.organizationId, context.runId, {
      lastRunStatus: 'cancelled',
      lastError: 'paused before it ran',
    });
    return { skipped: 'the export is paused' };
  }
  const startedAt = new Date();
  // Unconditional: the run holds the export's singleton key, so no newer run of it exists.
  await em.nativeUpdate(
    AudienceExport,
    { id: exp.id, organization: context.organizationId },
    { lastRunId: context.runId, lastRunStatus: 'running', lastRunAt: startedAt, updatedAt: startedAt },
  );
  let audience = exp.audience;
  let table: string | null = null;
  let delivered: Delivered | null = null;
  /** A CSV or PostgreSQL run's rows once the destination holds them (file in place, transaction committed). */
  let landed: { rows: number } | null = null;
  /** The run's progress at a row count, from the first report on. */
  let progressAt: ((rows: number, extra?: Record<string, unknown>) => Record<string, unknown>) | null = null;
  try {
    if (!(await isFeatureEnabledFor(em, context.organizationId, 'audience_exports')))
      throw new Error('Audience exports are disabled for this organization (feature audience_exports)');
    const base: Record<string, unknown> = {};
    const reason = payload.scheduled_at ? refreshReason(audience, new Date(payload.scheduled_at)) : null;
    if (reason) {
      const refreshed = await materializeFirst(deps, em, audience, reason, context);
      audience = refreshed.audience;
      Object.assign(base, { materialize_run_id: refreshed.runId, materialized_because: reason });
    }
    // Every attempt reads the audience's current materialization: the one an earlier attempt read
    // is dropped once a newer one is swapped in (the delivery's resume point says what that changes).
    table = audience.materializedTable ?? null;
    if (!table || !audience.materializedSchema)
      throw new PermanentJobError(
        `Audience ${audience.name} has not been materialized yet: materialize it before exporting it`,
      );
    const target = audienceTarget(deps, em, audience);
    const warehouse = await warehouses(deps).open(target, `${audience.workspace.id}:target`);
    // A destination is created with base types: the domains of the target database are not there.
    const types = new Map(
      (audience.materializedColumns ?? []).map((col) => [col.name, col.base_type ?? col.type]),
    );
    const source: Source = {
      warehouse,
      demo: target.type === 'postgres' && isDemoWarehouse(deps, target),
      sql: exportSelect(
        { schema: audience.materializedSchema, name: table },
        exp.fieldMapping,
        audience.identifierColumns,
      ),
      columns: exp.fieldMapping.map((m) => ({ name: m.destination, type: types.get(m.source) ?? 'text' })),
    };
    const total = audience.rowCount;
    Object.assign(base, {
      total_rows: total,
      rows_without_identifier: audience.rowsWithoutIdentifier ?? null,
      rows_merged: audience.rowsMerged ?? null,
      source_table: table,
      ...staleness(audience),
    });
    let delivery: { id: string; from: number } | undefined;
    if (exp.destinationType === 'webhook') {
      const id = deliveryId(table, exp);
      const point = resumePoint(await lastDelivery(deps, em, exp, context), id, table);
      delivery = { id, from: point.from };
      // The receiver holds the resumed batches whatever this run does.
      delivered = { rows: point.rows, batches: point.from };
      Object.assign(base, {
        delivery_id: id,
        resumed_from_batch: point.from,
        resumed_from_run_id: point.runId,
        restarted_because: point.because,
      });
    }
    let lastWrite = 0;
    const progressOf = (rows: number, extra: Record<string, unknown> = {}) => ({
      rows_exported: rows,
      percent: total ? Math.min(100, Math.round((rows / total) * 100)) : null,
      ...base,
      ...extra,
    });
    progressAt = progressOf;
    const progress = async (rows: number, extra: Record<string, unknown> = {}, force = false) => {
      if (!force && Date.now() - lastWrite < PROGRESS_EVERY_MS) return;
      lastWrite = Date.now();
      await context.progress(progressOf(rows, extra));
    };
    const completeCsv: CompleteCsv = async (rows, file, place) => {
      let placed = false;
      await context.succeed({
        progress: progressOf(rows),
        alongside: async (tx) => {
          const recorded = await record(tx, exp.id, context.organizationId, context.runId, {
            lastRunStatus: 'succeeded',
            lastError: null,
            rowsExported: rows,
            ...file,
          });
          // The file is the export's record as much as its figures are: a newer run's stays.
          if (!recorded) return;
          await place();
          placed = true;
        },
      });
      return placed;
    };
    // The delivery and where it starts are recorded before the first batch: a run that fails before
    // sending one still hands the acknowledged batches on to the next.
    await progress(delivered?.rows ?? 0, delivery ? { batches_sent: delivery.from } : {}, true);
    let outcome: { rows: number; filePath?: string; fileSize?: number; batches?: number };
    if (exp.destinationType === 'csv')
      outcome = landed = await writeCsv(deps, exp, source, context, progress, completeCsv);
    else if (exp.destinationType === 'postgres')
      outcome = landed = await writePostgres(deps, exp, source, progress);
    else outcome = await sendWebhook(deps, exp, source, context, delivery!, progress, delivered!);
    const final = {
      rows_exported: outcome.rows,
      ...(outcome.batches !== undefined ? { batches_sent: outcome.batches } : {}),
    };
    await progress(outcome.rows, final, true);
    await record(em, exp.id, context.organizationId, context.runId, {
      lastRunStatus: 'succeeded',
      lastError: null,
      rowsExported: outcome.rows,
      ...(outcome.filePath ? { filePath: outcome.filePath, fileSize: outcome.fileSize } : {}),
    });
    return { ...final, ...base };
  } catch (caught) {
    // Paused or cancelled while it ran: the failure is only the abort, and 'failed' would overwrite
    // the 'cancelled' the pause recorded. An attempt aborted otherwise (taken over, queue stopping)
    // fails as before, for the queue to decide.
    const run = context.signal.aborted ? await deps.jobs.getRun(context.runId, context.organizationId) : null;
    // The run's progress says what the destination holds from it: the batches a webhook's receiver
    // acknowledged (a pause's included), a file or table only once in place; a removed partial file
    // or a rolled-back transaction holds none of the rows the run had counted. Best effort: the run's
    // own error is what must reach the run and the export.
    if (progressAt)
      await context
        .recordLastProgress(
          progressAt((delivered ?? landed)?.rows ?? 0, delivered ? { batches_sent: delivered.batches } : {}),
        )
        .catch(() => undefined);
    const exported = exportedAfterFailure(exp, landed ?? (delivered?.batches ? delivered : null));
    if (run?.status === 'cancelled') {
      await record(em, exp.id, context.organizationId, context.runId, {
        lastRunStatus: 'cancelled',
        lastError: 'cancelled while it ran',
        ...exported,
      });
      throw new JobCancelledError(context.runId);
    }
    const error =
      table && missingTable(caught, table) ? await missingSourceError(em, audience, table) : caught;
    await record(em, exp.id, context.organizationId, context.runId, {
      lastRunStatus: 'failed',
      lastError: error instanceof Error ? error.message : String(error),
      ...exported,
    });
    throw error;
  }
}

export async function registerExportJob(deps: AppDeps): Promise<void> {
  await deps.jobs.register<ExportPayload>(
    EXPORT_KIND,
    (payload, context) => runAudienceExport(deps, payload, context),
    {
      retryLimit: 2,
      retryDelaySeconds: 2,
      timeoutSeconds: 6 * 3600,
      retain: {
        namedBy: ['audience_exports'],
        // What `lastDelivery` reads: the latest finished run that got as far as delivering, which a
        // webhook rerun resumes after however long ago it ran.
        where: `run.progress->>'delivery_id' is not null and not ${laterRunOfItsKey(
          `later.status not in ('queued', 'running') and later.progress->>'delivery_id' is not null`,
        )}`,
      },
      // Its worker died on the last attempt: the export and the run record what its handler would
      // have, had it failed.
      async onAbandoned(run, em) {
        const exportId = String(run.payload.export_id);
        const reached = abandonedDelivery(run.progress);
        await em.nativeUpdate(
          AudienceExport,
          { id: exportId, organization: run.organizationId, lastRunId: run.runId, lastRunStatus: 'running' },
          {
            lastRunStatus: 'failed',
            lastError: run.error,
            ...(reached.acknowledged !== null ? { rowsExported: reached.acknowledged } : {}),
            updatedAt: new Date(),
          },
        );
        // Nobody else removes the dead attempt's partial file (a CSV export's only). One left behind
        // only takes disk space: the failure is recorded all the same.
        await rm(partialFilePath(deps, run.organizationId, exportId, run.runId), { force: true }).catch(
          () => undefined,
        );
        return reached.progress;
      },
    },
  );
}
