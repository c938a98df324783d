import { mkdir, open, rename, rm, stat } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import { dirname, join } from 'node:path';
import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../../deps.ts';
import { AppError } from '../../app-error.ts';
import { JobCancelledError, PermanentJobError, failOnceWhenDeterministic } from '../../jobs/job-types.ts';
import type { JobContext } from '../../jobs/queue.ts';
import { isFeatureEnabledFor } from '../../features.ts';
import {
  hasUrlCredentials,
  maskUrlCredentials,
  outboundFailure,
  outboundHttp,
  type OutboundHttp,
} from '../../outbound-http.ts';
import { quoteIdent, warehouses } from '../../warehouse/postgres.ts';
import { portableFamily } from '../../warehouse/types.ts';
import type { Warehouse } from '../../warehouse/warehouse.ts';
import { AudienceExport, type AudienceExportEntity } from './audiences.entity.ts';
import { csvLine, exportSelect, qualifiedName } from './audiences-sql.ts';
import { audienceTarget } from './audience-materialize.job.ts';

export const EXPORT_KIND = 'audience-export';

interface ExportPayload extends Record<string, unknown> {
  export_id: string;
}

const STREAM_BATCH = 5000;
/**
 * CSV text is written in pieces of about this many characters. A string above 128 kB would be
 * allocated in V8's large-object space, which only a full collection frees: a batch as one string
 * piled up there between full collections.
 */
const WRITE_CHUNK_CHARS = 32 * 1024;
/** Progress is written at most this often: every write is a control-plane statement. */
const PROGRESS_EVERY_MS = 1000;
const MAX_PARAMS = 60_000;

/** Where a CSV export's file lives; one file per export, replaced by each successful run. */
export function exportFilePath(deps: AppDeps, organizationId: string, exportId: string): string {
  return join(deps.env.dataDir, 'audience-exports', organizationId, `${exportId}.csv`);
}

interface Source {
  warehouse: Warehouse;
  sql: string;
  /** Columns in destination names with the audience's column types. */
  columns: { name: string; type: string }[];
}

type Progress = (rows: number, extra?: Record<string, unknown>, force?: boolean) => Promise<void>;

async function writeCsv(
  deps: AppDeps,
  exp: AudienceExportEntity,
  source: Source,
  context: JobContext,
  progress: Progress,
) {
  const config = exp.destinationConfig as {
    delimiter?: string;
    include_header?: boolean;
    escape_formulas?: boolean;
  };
  const delimiter = config.delimiter ?? ',';
  const escapeFormulas = config.escape_formulas === true;
  const path = exportFilePath(deps, exp.organization.id, exp.id);
  const partial = `${path}.${context.runId}.part`;
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
    await rename(partial, path);
  } catch (error) {
    await file.close().catch(() => undefined);
    await rm(partial, { force: true });
    throw error;
  }
  return { rows, filePath: path, fileSize: (await stat(path)).size };
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
 * The error with every secret of the destination (header values, URL credentials) masked: run errors
 * are shown in the export's last run and logged, and fetch and the receiver may repeat what they got.
 * A new error without its cause, so a log that prints causes cannot bring the secret back.
 */
function redacted(error: unknown, secrets: string[]): Error {
  let message = error instanceof Error ? error.message : String(error);
  for (const secret of secrets.filter((v) => v.length >= 3).sort((a, b) => b.length - a.length))
    message = message.split(secret).join('••••••');
  message = maskUrlCredentials(message);
  return error instanceof PermanentJobError ? new PermanentJobError(message) : new Error(message);
}

/** How much of a refusing webhook's answer its error quotes (secrets masked: see `redacted`). */
const RESPONSE_EXCERPT_CHARS = 500;
const RETRYABLE = (status: number) => status === 408 || status === 425 || status === 429 || status >= 500;

async function postBatch(
  outbound: OutboundHttp,
  url: string,
  headers: Record<string, string>,
  body: string,
  options: { maxRetries: number; timeoutMs: number; signal: AbortSignal },
): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    let reason: string;
    let retryAfterMs = 0;
    try {
      const res = await outbound.fetch(url, {
        method: 'POST',
        headers,
        body,
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
      retryAfterMs = Math.min(30_000, Number(res.headers.get('retry-after') ?? 0) * 1000 || 0);
    } catch (error) {
      if (options.signal.aborted || error instanceof PermanentJobError) throw error;
      const failure = outboundFailure(error);
      // A refused address stays refused: retrying would only repeat the refusal.
      if (failure.blocked) throw new PermanentJobError(failure.message);
      reason = `the webhook could not be reached: ${failure.message}`;
    }
    if (attempt >= options.maxRetries) throw new Error(`${reason} (after ${attempt + 1} attempts)`);
    await new Promise((resolve) =>
      setTimeout(resolve, Math.max(retryAfterMs, Math.min(5000, 200 * 2 ** attempt))),
    );
  }
}

/**
 * Batches in a stable order, each with the idempotency key `<run>:<batch>`. The number of batches the
 * webhook acknowledged is saved after each one, so a retried attempt of the run resumes after them:
 * within a run no batch is sent again once acknowledged, and one whose answer was lost is resent with
 * the same key for the receiver to recognise.
 */
async function sendWebhook(
  deps: AppDeps,
  exp: AudienceExportEntity,
  source: Source,
  context: JobContext,
  resumeFrom: number,
  progress: Progress,
) {
  const c = exp.destinationConfig as Record<string, any>;
  const headers: Record<string, string> = {};
  for (const [name, sealed] of Object.entries((c.headers ?? {}) as Record<string, string>))
    headers[name] = deps.secrets.decrypt(sealed);
  // Saved before these were refused: every attempt would fail the same way. A URL with credentials
  // stops here, before any request, so the header values are the only secrets an error can repeat.
  if (hasUrlCredentials(c.url as string))
    throw new PermanentJobError('The webhook URL contains credentials: give them as a header instead');
  const secrets = Object.values(headers);
  for (const [name, value] of Object.entries(headers)) {
    const problem = headerProblem(name, value);
    if (problem) throw new PermanentJobError(problem);
  }
  let batchIndex = 0;
  let rows = 0;
  for await (const batch of source.warehouse.stream(source.sql, { batchSize: c.batch_size ?? 500 })) {
    if (batchIndex < resumeFrom) {
      batchIndex++;
      rows += batch.length;
      continue;
    }
    const key = `${context.runId}:${batchIndex}`;
    try {
      await postBatch(
        outboundHttp(deps.env),
        c.url,
        {
          ...headers,
          'content-type': 'application/json',
          'idempotency-key': key,
          'user-agent': 'dimas-audience-export',
        },
        JSON.stringify({
          export_id: exp.id,
          run_id: context.runId,
          batch_index: batchIndex,
          idempotency_key: key,
          rows: batch,
        }),
        { maxRetries: c.max_retries ?? 3, timeoutMs: c.timeout_ms ?? 10_000, signal: context.signal },
      );
    } catch (error) {
      if (context.signal.aborted) throw error;
      throw redacted(error, secrets);
    }
    batchIndex++;
    rows += batch.length;
    await progress(rows, { batches_sent: batchIndex }, true);
  }
  return { rows, batches: batchIndex };
}

async function record(
  em: EntityManager,
  id: string,
  organizationId: string,
  changes: Partial<AudienceExportEntity>,
) {
  const fresh = em.fork() as EntityManager;
  const row = await fresh.findOne(AudienceExport, { id, organization: organizationId });
  if (!row) return;
  Object.assign(row, changes);
  await fresh.flush();
}

async function runAudienceExport(deps: AppDeps, payload: ExportPayload, context: JobContext) {
  const em = deps.orm.em.fork() as EntityManager;
  const exp = await em.findOne(
    AudienceExport,
    { id: payload.export_id, organization: context.organizationId },
    { populate: ['audience', 'audience.workspace'] },
  );
  if (!exp) return { skipped: 'the export was deleted' };
  if (exp.status === 'paused') {
    await record(em, exp.id, context.organizationId, {
      lastRunStatus: 'cancelled',
      lastError: 'paused before it ran',
    });
    return { skipped: 'the export is paused' };
  }
  const startedAt = new Date();
  await record(em, exp.id, context.organizationId, {
    lastRunId: context.runId,
    lastRunStatus: 'running',
    lastRunAt: startedAt,
  });
  try {
    if (!(await isFeatureEnabledFor(em, context.organizationId, 'audience_exports')))
      throw new Error('Audience exports are disabled for this organization (feature audience_exports)');
    const audience = exp.audience;
    // A retried attempt reads the same versioned table as the first, even if a newer one was swapped in.
    const previous =
      context.attempt > 1
        ? (await deps.jobs.getRun(context.runId, context.organizationId))?.progress
        : undefined;
    const table = (previous?.source_table as string | undefined) ?? audience.materializedTable;
    if (!table || !audience.materializedSchema)
      throw new Error(`Audience ${audience.name} has not been materialized yet`);
    const warehouse = await warehouses(deps).open(
      audienceTarget(deps, em, audience),
      `${audience.workspace.id}:target`,
    );
    const types = new Map((audience.materializedColumns ?? []).map((col) => [col.name, col.type]));
    const source: Source = {
      warehouse,
      sql: exportSelect(
        { schema: audience.materializedSchema, name: table },
        exp.fieldMapping,
        audience.identifierColumns,
      ),
      columns: exp.fieldMapping.map((m) => ({ name: m.destination, type: types.get(m.source) ?? 'text' })),
    };
    const total = audience.rowCount;
    let lastWrite = 0;
    const progress = async (rows: number, extra: Record<string, unknown> = {}, force = false) => {
      if (!force && Date.now() - lastWrite < PROGRESS_EVERY_MS) return;
      lastWrite = Date.now();
      await context.progress({
        rows_exported: rows,
        total_rows: total,
        rows_without_identifier: audience.rowsWithoutIdentifier ?? null,
        percent: total ? Math.min(100, Math.round((rows / total) * 100)) : null,
        source_table: table,
        ...extra,
      });
    };
    let outcome: { rows: number; filePath?: string; fileSize?: number; batches?: number };
    if (exp.destinationType === 'csv') outcome = await writeCsv(deps, exp, source, context, progress);
    else if (exp.destinationType === 'postgres') outcome = await writePostgres(deps, exp, source, progress);
    else
      outcome = await sendWebhook(deps, exp, source, context, Number(previous?.batches_sent ?? 0), progress);
    await progress(
      outcome.rows,
      outcome.batches !== undefined ? { batches_sent: outcome.batches } : {},
      true,
    );
    await record(em, exp.id, context.organizationId, {
      lastRunStatus: 'succeeded',
      lastError: null,
      rowsExported: outcome.rows,
      ...(outcome.filePath ? { filePath: outcome.filePath, fileSize: outcome.fileSize } : {}),
    });
    return {
      rows_exported: outcome.rows,
      ...(outcome.batches !== undefined ? { batches_sent: outcome.batches } : {}),
    };
  } catch (error) {
    // Paused or cancelled while it ran: the failure is only the abort, and 'failed' would overwrite
    // the 'cancelled' the pause recorded. An attempt aborted otherwise (taken over, queue stopping)
    // fails as before, for the queue to decide.
    const run = context.signal.aborted ? await deps.jobs.getRun(context.runId, context.organizationId) : null;
    if (run?.status === 'cancelled') {
      await record(em, exp.id, context.organizationId, {
        lastRunStatus: 'cancelled',
        lastError: 'cancelled while it ran',
      });
      throw new JobCancelledError(context.runId);
    }
    await record(em, exp.id, context.organizationId, {
      lastRunStatus: 'failed',
      lastError: error instanceof Error ? error.message : String(error),
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
      // Its worker died on the last attempt: the export records the failure its handler would have.
      async onAbandoned(run) {
        await deps.orm.em.fork().nativeUpdate(
          AudienceExport,
          {
            id: String(run.payload.export_id),
            organization: run.organizationId,
            lastRunId: run.runId,
            lastRunStatus: 'running',
          },
          { lastRunStatus: 'failed', lastError: run.error, updatedAt: new Date() },
        );
      },
    },
  );
}
