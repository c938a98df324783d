import { existsSync } from 'node:fs';
import { open as openFile } from 'node:fs/promises';
import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError, notFound } from '../../app-error.ts';
import type { AppDeps, CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { isFeatureEnabled, isFeatureEnabledFor } from '../../features.ts';
import {
  hasUrlCredentials,
  maskUrl,
  outboundHttp,
  restoreMaskedQuery,
  sameOrigin,
} from '../../outbound-http.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import { EXPORT_KIND, headerProblem } from './audience-export.job.ts';
import { isRunActive } from '../../jobs/queue.ts';
import { UUID, currentWorkspace, type WorkspaceEntity } from '../workspaces/workspaces.service.ts';
import { exportSelect } from './audiences-sql.ts';
import {
  AudienceExport,
  isStale,
  type AudienceEntity,
  type AudienceExportEntity,
  type ExportSchedule,
  type FieldMappingEntry,
} from './audiences.entity.ts';
import type { DestinationInput } from './audiences.schemas.ts';
import { audienceWarehouseConfig, findAudience } from './audiences.service.ts';
import { SECRET_MASK, isMaskedSecret } from '../../auth/secret-box.ts';

const SCHEDULE_MS: Record<ExportSchedule, number | null> = {
  manual: null,
  hourly: 3600_000,
  daily: 86_400_000,
  weekly: 7 * 86_400_000,
};

const nextRun = (schedule: ExportSchedule, from = Date.now()) =>
  SCHEDULE_MS[schedule] ? new Date(from + SCHEDULE_MS[schedule]!) : null;

const downloadUrl = (exportId: string) => `/api/api/audiences/exports/${exportId}/download`;

interface RunRow {
  id: string;
  status: string;
  progress: Record<string, unknown> | string | null;
  error: string | null;
  started_at: Date | string | null;
  finished_at: Date | string | null;
}

const asDate = (v: unknown) => (v == null ? null : v instanceof Date ? v : new Date(v as string));

function runView(row: RunRow | undefined) {
  if (!row) return null;
  const progress = typeof row.progress === 'string' ? JSON.parse(row.progress) : (row.progress ?? {});
  return {
    run_id: row.id,
    status: row.status,
    progress,
    error: row.error ?? null,
    started_at: asDate(row.started_at),
    finished_at: asDate(row.finished_at),
  };
}

/** The runs of several exports in one query. */
async function runsOf(
  em: EntityManager,
  organizationId: string,
  ids: string[],
): Promise<Map<string, RunRow>> {
  if (!ids.length) return new Map();
  const rows = (await em.execute(
    `select id, status, progress, error, started_at, finished_at from job_runs
        where organization_id = ? and id in (${ids.map(() => '?').join(', ')})`,
    [organizationId, ...ids],
  )) as RunRow[];
  return new Map(rows.map((r) => [String(r.id), r]));
}

function maskedDestination(exp: AudienceExportEntity): Record<string, unknown> {
  const {
    password,
    headers,
    sealed_url: _sealed,
    ...rest
  } = exp.destinationConfig as Record<string, unknown>;
  if (exp.destinationType === 'postgres') return { ...rest, password_set: !!password };
  if (exp.destinationType === 'webhook')
    return {
      ...rest,
      // Stored masked; an export saved before its query values were sealed has them in `url`.
      url: maskUrl(String(rest.url)),
      headers: Object.fromEntries(Object.keys((headers ?? {}) as object).map((k) => [k, SECRET_MASK])),
    };
  return rest;
}

/** The webhook URL a destination sends to, query values included (sealed at rest). */
function fullUrl(secrets: CallerScope['deps']['secrets'], config: Record<string, unknown>): string {
  return config.sealed_url ? secrets.decrypt(String(config.sealed_url)) : String(config.url);
}

/**
 * Exports beside their last runs. A run writes its outcome on the export before the queue marks the
 * run ended, and the export and its run are read by two statements: an ended run beside an export
 * still "running" means the export was read before that write, so it is read again (as the
 * hypothesis status does). Without this a client polling the list could see a succeeded run with no
 * rows exported.
 */
export async function exportViews(
  em: EntityManager,
  organizationId: string,
  exports: AudienceExportEntity[],
) {
  const runIds = (list: AudienceExportEntity[]) => list.map((e) => e.lastRunId).filter(Boolean) as string[];
  // A view shows whether its audience is stale (loaded already where the routes found the audience).
  await em.populate(exports, ['audience']);
  const runs = await runsOf(em, organizationId, runIds(exports));
  const ended = (e: AudienceExportEntity) => {
    const run = runs.get(e.lastRunId ?? '');
    return run !== undefined && !isRunActive(run.status);
  };
  const stale = exports.filter((e) => e.lastRunStatus === 'running' && ended(e));
  if (stale.length)
    await em.find(
      AudienceExport,
      { id: { $in: stale.map((e) => e.id) }, organization: organizationId },
      { refresh: true },
    );
  // Read again, an export may name a newer run than the one read.
  const newer = runIds(stale).filter((id) => !runs.has(id));
  for (const [id, row] of await runsOf(em, organizationId, newer)) runs.set(id, row);
  return exports.map((e) => exportView(e, runs.get(e.lastRunId ?? '')));
}

function exportView(exp: AudienceExportEntity, run?: RunRow) {
  const audience = exp.audience;
  return {
    id: exp.id,
    audience_id: audience.id,
    name: exp.name,
    destination_type: exp.destinationType,
    destination: maskedDestination(exp),
    field_mapping: exp.fieldMapping,
    schedule: exp.schedule,
    status: exp.status,
    next_run_at: exp.nextRunAt ?? null,
    last_run: runView(run),
    rows_exported: exp.rowsExported ?? null,
    // What a run would send now: a stale audience's members are those of its previous definition.
    audience_stale: isStale(audience),
    audience_materialized_at: audience.materializedAt ?? null,
    audience_definition_changed_at: audience.definitionChangedAt ?? null,
    file:
      exp.destinationType === 'csv' && exp.filePath
        ? { size: exp.fileSize ?? null, download_url: downloadUrl(exp.id) }
        : null,
    created_at: exp.createdAt,
    updated_at: exp.updatedAt,
  };
}

async function assertExportsEnabled(scope: CallerScope) {
  if (!(await isFeatureEnabled(scope, 'audience_exports')))
    throw new AppError(
      'FORBIDDEN',
      'Audience exports are disabled for this organization (feature audience_exports)',
      {
        reason: 'FEATURE_DISABLED',
      },
    );
}

function materializedColumns(audience: AudienceEntity) {
  if (!audience.materializedColumns?.length || !audience.materializedView)
    throw new AppError(
      'CONFLICT',
      `Audience ${audience.name} has not been materialized yet: POST /api/api/audiences/${audience.id}/materialize first`,
      { reason: 'NOT_MATERIALIZED' },
    );
  return audience.materializedColumns;
}

/** Sources must be materialized columns; destination names must be distinct. */
function checkMapping(
  audience: AudienceEntity,
  mapping: FieldMappingEntry[] | undefined,
): FieldMappingEntry[] {
  const columns = materializedColumns(audience).map((c) => c.name);
  if (!mapping) return columns.map((name) => ({ source: name, destination: name }));
  const issues: { path: (string | number)[]; message: string }[] = [];
  const seen = new Set<string>();
  mapping.forEach((entry, i) => {
    if (!columns.includes(entry.source))
      issues.push({
        path: ['field_mapping', i, 'source'],
        message: `Unknown audience column ${entry.source} (columns: ${columns.join(', ')})`,
      });
    if (seen.has(entry.destination.toLowerCase()))
      issues.push({
        path: ['field_mapping', i, 'destination'],
        message: `Destination field ${entry.destination} is mapped twice`,
      });
    seen.add(entry.destination.toLowerCase());
  });
  if (issues.length) throw new AppError('BAD_REQUEST', issues[0].message, { issues });
  return mapping.map((m) => ({ source: m.source, destination: m.destination }));
}

/** Refuses to keep a stored secret for a destination that now points elsewhere. */
function movedSecret(secret: string, path: (string | number)[]): AppError {
  const message = `The destination moves to another host: give the ${secret} again`;
  return new AppError('BAD_REQUEST', message, { issues: [{ path, message }] });
}

/**
 * The PostgreSQL server and account a stored password was given for. Database and user count too:
 * on a shared server, another database or role may belong to someone else (as the workspace's stored
 * target password is used only for the same host, port, database and user).
 */
const samePostgresAccount = (a: Record<string, unknown>, b: Record<string, unknown>) =>
  String(a.host).toLowerCase() === String(b.host).toLowerCase() &&
  Number(a.port ?? 5432) === Number(b.port ?? 5432) &&
  a.database === b.database &&
  a.user === b.user;

/**
 * Secrets sealed. A destination sent back with a secret masked (or, for PostgreSQL, without a
 * password) keeps the stored one only while it points where the secret was given for: an editor must
 * not be able to send an admin's saved secret to a server of their choosing.
 */
async function storedDestination(
  scope: CallerScope,
  input: DestinationInput,
  previous?: Record<string, unknown>,
): Promise<Record<string, unknown>> {
  if (input.type === 'postgres') {
    const { password, ...rest } = input;
    // Where it leads is checked when a run connects (the warehouse registry asks the server who it is).
    if (password && !isMaskedSecret(password))
      return { ...rest, password: scope.deps.secrets.encrypt(password) };
    // An empty password says "none": the way to move a destination that had one to a server without.
    const stored =
      previous?.type === 'postgres' && password !== '' ? (previous.password as string) : undefined;
    if (stored && !samePostgresAccount(previous!, rest))
      throw movedSecret('password', ['destination', 'password']);
    return stored ? { ...rest, password: stored } : rest;
  }
  if (input.type === 'webhook') {
    // Refused before the URL is looked at further: a refusal below would repeat it in its message.
    if (hasUrlCredentials(input.url)) {
      const message = 'The webhook URL must not contain credentials (user:password@): send them as a header';
      throw new AppError('BAD_REQUEST', message, { issues: [{ path: ['destination', 'url'], message }] });
    }
    for (const [name, value] of Object.entries(input.headers ?? {})) {
      const problem = isMaskedSecret(value) ? headerProblem(name, '') : headerProblem(name, value);
      if (problem)
        throw new AppError('BAD_REQUEST', problem, {
          issues: [{ path: ['destination', 'headers', name], message: problem }],
        });
    }
    await outboundHttp(scope.deps.env).checkDestination(input.url, 'The webhook URL');
    const oldHeaders = (previous?.type === 'webhook' ? previous.headers : {}) as Record<string, string>;
    const sameHost = previous?.type === 'webhook' && sameOrigin(String(previous.url), input.url);
    // Query values sent back masked keep the stored ones, on the same origin only (as headers do).
    const { url, restored, missing } = restoreMaskedQuery(
      input.url,
      previous?.type === 'webhook' ? fullUrl(scope.deps.secrets, previous) : null,
    );
    if (missing.length) {
      const message = `The webhook URL has no stored value for query parameter ${missing[0]}: give it again`;
      throw new AppError('BAD_REQUEST', message, { issues: [{ path: ['destination', 'url'], message }] });
    }
    if (restored.length && !sameHost)
      throw movedSecret(`value of query parameter ${restored[0]}`, ['destination', 'url']);
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(input.headers ?? {})) {
      if (isMaskedSecret(value) && oldHeaders[name]) {
        if (!sameHost) throw movedSecret(`value of header ${name}`, ['destination', 'headers', name]);
        headers[name] = oldHeaders[name];
      } else headers[name] = scope.deps.secrets.encrypt(value);
    }
    // Every query value may be a key (`?token=…`): the URL is kept sealed like the headers, and `url`
    // holds it masked, which is all an API caller is shown.
    const shown = maskUrl(url);
    return {
      ...input,
      url: shown,
      ...(shown !== url ? { sealed_url: scope.deps.secrets.encrypt(url) } : {}),
      headers,
    };
  }
  return { ...input };
}

async function findExport(scope: CallerScope, id: string, workspace?: WorkspaceEntity) {
  const ws = workspace ?? (await currentWorkspace(scope));
  if (!UUID.test(id)) throw notFound('Export');
  const exp = await scope.em.findOne(
    AudienceExport,
    { id, organization: organizationOf(scope.principal), workspace: ws.id },
    { populate: ['audience'] },
  );
  if (!exp) throw notFound('Export');
  return { exp, workspace: ws };
}

/**
 * Queues a run of the export and names it the export's last run at once, as the scheduler does: a
 * pause cancels the run the export names, so a run still queued when the export is paused never
 * runs (named only once it started, a queued run was left to start and skip itself).
 */
async function startRun(scope: CallerScope, exp: AudienceExportEntity) {
  const { run, created } = await scope.deps.jobs.enqueue(
    EXPORT_KIND,
    { export_id: exp.id },
    { organizationId: exp.organization.id, workspaceId: exp.workspace.id, singletonKey: exp.id },
  );
  exp.lastRunId = run.id;
  await scope.em.flush();
  return { run_id: run.id, status: run.status, created };
}

export async function createExport(
  scope: CallerScope,
  input: {
    audience_id: string;
    name?: string;
    destination: DestinationInput;
    field_mapping?: FieldMappingEntry[];
    schedule: ExportSchedule;
    run_now: boolean;
  },
) {
  await assertExportsEnabled(scope);
  const { audience, workspace } = await findAudience(scope, input.audience_id);
  const mapping = checkMapping(audience, input.field_mapping);
  const exp = scope.em.create(AudienceExport, {
    organization: organizationOf(scope.principal),
    workspace: workspace.id,
    audience,
    name: input.name ?? `${audience.name} → ${input.destination.type}`,
    destinationType: input.destination.type,
    destinationConfig: await storedDestination(scope, input.destination),
    fieldMapping: mapping,
    schedule: input.schedule,
    status: 'active',
    nextRunAt: nextRun(input.schedule),
    createdBy: scope.principal.kind === 'user' ? scope.principal.id : null,
  });
  await scope.em.flush();
  const run = input.run_now ? await startRun(scope, exp) : null;
  return { export: (await exportViews(scope.em, exp.organization.id, [exp]))[0], run };
}

export async function updateExport(
  scope: CallerScope,
  input: {
    export_id: string;
    name?: string;
    destination?: DestinationInput;
    field_mapping?: FieldMappingEntry[];
    schedule?: ExportSchedule;
    status?: 'active' | 'paused';
    run?: boolean;
  },
) {
  const { exp } = await findExport(scope, input.export_id);
  if (input.run || input.status === 'active') await assertExportsEnabled(scope);
  if (input.name !== undefined) exp.name = input.name;
  if (input.destination) {
    if (input.destination.type !== exp.destinationType) {
      const message = `The destination of this export is ${exp.destinationType}; create a new export for ${input.destination.type}`;
      throw new AppError('BAD_REQUEST', message, { issues: [{ path: ['destination', 'type'], message }] });
    }
    exp.destinationConfig = await storedDestination(scope, input.destination, exp.destinationConfig);
  }
  if (input.field_mapping) exp.fieldMapping = checkMapping(exp.audience, input.field_mapping);
  if (input.schedule !== undefined && input.schedule !== exp.schedule) {
    exp.schedule = input.schedule;
    exp.nextRunAt = nextRun(input.schedule);
  }
  let cancelled = false;
  if (input.status !== undefined && input.status !== exp.status) {
    exp.status = input.status;
    if (input.status === 'paused' && exp.lastRunId) {
      const run = await scope.deps.jobs.cancel(exp.lastRunId, exp.organization.id);
      cancelled = run?.status === 'cancelled';
    }
    if (input.status === 'active' && exp.schedule !== 'manual') exp.nextRunAt = nextRun(exp.schedule);
  }
  if (cancelled) exp.lastRunStatus = 'cancelled';
  await scope.em.flush();
  let run = null;
  if (input.run) {
    if (exp.status === 'paused')
      throw new AppError('CONFLICT', 'The export is paused: resume it ({ "status": "active" }) to run it', {
        reason: 'EXPORT_PAUSED',
      });
    materializedColumns(exp.audience);
    run = await startRun(scope, exp);
  }
  return { export: (await exportViews(scope.em, exp.organization.id, [exp]))[0], run };
}

export async function listExports(scope: CallerScope, audienceId: string) {
  const { audience, workspace } = await findAudience(scope, audienceId);
  const exports = await scope.em.find(
    AudienceExport,
    { audience: audience.id, organization: organizationOf(scope.principal), workspace: workspace.id },
    { orderBy: { createdAt: 'asc', id: 'asc' } },
  );
  return {
    audience_id: audience.id,
    exports: await exportViews(scope.em, organizationOf(scope.principal), exports),
  };
}

/** What a run would send, in the destination's field names and the run's order. */
export async function previewExport(
  scope: CallerScope,
  input: { audience_id: string; export_id: string; limit: number },
) {
  const { audience, workspace } = await findAudience(scope, input.audience_id);
  const { exp } = await findExport(scope, input.export_id, workspace);
  if (exp.audience.id !== audience.id) throw notFound('Export');
  materializedColumns(audience);
  const warehouse = await warehouses(scope.deps).open(
    audienceWarehouseConfig(scope, workspace, audience),
    `${workspace.id}:target`,
  );
  const result = await warehouse.readOnlyQuery(
    exportSelect(
      { schema: audience.materializedSchema!, name: audience.materializedView! },
      exp.fieldMapping,
      audience.identifierColumns,
      input.limit,
    ),
    { limit: input.limit },
  );
  return {
    audience_id: audience.id,
    export_id: exp.id,
    columns: exp.fieldMapping.map((m) => m.destination),
    rows: result.rows,
    row_count: result.row_count,
    total_rows: audience.rowCount ?? null,
    rows_without_identifier: audience.rowsWithoutIdentifier ?? null,
    rows_merged: audience.rowsMerged ?? null,
  };
}

/** The CSV file of an export (the download route streams it). */
export async function exportFile(scope: CallerScope, exportId: string) {
  const { exp } = await findExport(scope, exportId);
  if (exp.destinationType !== 'csv')
    throw new AppError('BAD_REQUEST', 'Only CSV exports have a file to download');
  if (!exp.filePath || !existsSync(exp.filePath))
    throw new AppError('NOT_FOUND', 'This export has no file yet: it has not completed a run');
  const safeName = exp.name.replace(/[^\w.-]+/g, '_').slice(0, 80) || 'audience';
  const config = exp.destinationConfig as { filename?: string };
  const path = exp.filePath;
  // An opener rather than the path: the file location never leaves the server. The size is the opened
  // file's own, not the record's: a run moving its new file into place while the download starts
  // would otherwise send one file under the other's length (a cut or hanging download).
  return {
    filename: config.filename ?? `${safeName}.csv`,
    open: async () => {
      const handle = await openFile(path).catch((error: unknown) => {
        if ((error as { code?: unknown }).code === 'ENOENT')
          throw new AppError('NOT_FOUND', 'This export has no file yet: it has not completed a run');
        throw error;
      });
      const { size } = await handle.stat();
      return { size, stream: handle.createReadStream() };
    },
  };
}

/**
 * Webhook URLs saved before query values were sealed keep them in `url` in plain text, and a
 * migration has no key to seal them with: the server seals them at start, once per export (an export
 * with `sealed_url`, or with no query value, is left alone; two servers starting together write the
 * same sealed URL, the later one left alone by the condition). Runs send to the sealed URL as before.
 */
export async function sealLegacyWebhookUrls(deps: AppDeps): Promise<number> {
  const em = deps.orm.em.fork() as EntityManager;
  const rows = (await em.execute(
    `select id, destination_config from audience_exports
      where destination_type = 'webhook' and destination_config->>'sealed_url' is null
        and destination_config->>'url' like '%?%'`,
  )) as { id: string; destination_config: Record<string, unknown> | string }[];
  let sealed = 0;
  for (const row of rows) {
    const config = (
      typeof row.destination_config === 'string' ? JSON.parse(row.destination_config) : row.destination_config
    ) as Record<string, unknown>;
    const url = String(config.url);
    const shown = maskUrl(url);
    if (shown === url) continue;
    const changed = await em.execute(
      `update audience_exports set destination_config = cast(? as jsonb)
        where id = ? and destination_config->>'sealed_url' is null`,
      [JSON.stringify({ ...config, url: shown, sealed_url: deps.secrets.encrypt(url) }), row.id],
      'run',
    );
    sealed += Number((changed as { affectedRows?: number }).affectedRows ?? 0);
  }
  return sealed;
}

// ---- schedules ----

/**
 * Starts every scheduled export that is due, across organizations, and moves its next run on. Safe
 * to call from several processes: the singleton key keeps one run per export.
 */
export async function runDueExports(deps: AppDeps, now = new Date()): Promise<{ started: string[] }> {
  const em = deps.orm.em.fork() as EntityManager;
  const due = await em.find(
    AudienceExport,
    { status: 'active', schedule: { $ne: 'manual' }, nextRunAt: { $lte: now } },
    { orderBy: { nextRunAt: 'asc' }, limit: 100 },
  );
  const started: string[] = [];
  if (!due.length) return { started };
  for (const exp of due) {
    exp.nextRunAt = nextRun(exp.schedule, now.getTime());
    if (!(await isFeatureEnabledFor(em, exp.organization.id, 'audience_exports'))) continue;
    const { run } = await deps.jobs.enqueue(
      EXPORT_KIND,
      // When the schedule started it (the clock, not `now`, which a caller may set ahead): the run
      // materializes the audience first unless it was materialized since.
      { export_id: exp.id, scheduled_at: new Date().toISOString() },
      { organizationId: exp.organization.id, workspaceId: exp.workspace.id, singletonKey: exp.id },
    );
    exp.lastRunId = run.id;
    started.push(exp.id);
  }
  await em.flush();
  return { started };
}
