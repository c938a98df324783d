import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError } from '../../app-error.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import type { AppDeps, CallerScope } from '../../deps.ts';
import {
  failOnceWhenDeterministic,
  PermanentJobError,
  type JobContext,
  type JobRunView,
} from '../../jobs/queue.ts';
import {
  extractLoad,
  rawSchemaConflict,
  rawSchemaOf,
  type LoadMode,
  type RawSchemaLoader,
} from '../../warehouse/mysql-load.ts';
import { MysqlWarehouse } from '../../warehouse/mysql.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';
import {
  connectionConfig,
  currentWorkspace,
  type WorkspaceEntity,
} from '../workspaces/workspaces.service.ts';

/** Extract–load of a MySQL / MariaDB source into the raw schema of the workspace's target warehouse. */
const SOURCE_LOAD_KIND = 'source-load';

interface SourceLoadPayload extends Record<string, unknown> {
  workspace_id: string;
  mode: LoadMode;
}

async function runLoad(deps: AppDeps, payload: SourceLoadPayload, context: JobContext) {
  const em = deps.orm.em.fork() as EntityManager;
  const workspace = await em.findOne(Workspace, {
    id: payload.workspace_id,
    organization: context.organizationId,
  });
  if (!workspace) return { skipped: 'the workspace was deleted' };
  const scope = { em, deps };
  const sourceConfig = connectionConfig(scope, workspace, 'source');
  const targetConfig = connectionConfig(scope, workspace, 'target');
  if (sourceConfig?.type !== 'mysql') return { skipped: 'the source is no longer a MySQL database' };
  if (!targetConfig) throw new Error(`Workspace ${workspace.name} has no target warehouse configured`);
  const source = await warehouses(deps).open(sourceConfig, `${workspace.id}:source`);
  const target = await warehouses(deps).open(targetConfig, `${workspace.id}:target`);
  if (!(source instanceof MysqlWarehouse)) throw new Error('a mysql config opened a non-MySQL warehouse');
  const started = performance.now();
  await context.progress({ phase: 'loading', rows_loaded: 0 });
  const result = await extractLoad(source, target, {
    mode: payload.mode,
    loader: loaderOf(workspace),
    signal: context.signal,
    onProgress: (p) => context.progress({ phase: 'loading', ...p }),
  });
  return { ...result, duration_ms: Math.round(performance.now() - started) };
}

/** The sources area's job kind (a MySQL source's extract–load). */
export async function registerSourceJobs(deps: AppDeps): Promise<void> {
  await deps.jobs.register<SourceLoadPayload>(
    SOURCE_LOAD_KIND,
    (payload, context) =>
      runLoad(deps, payload, context).catch((error: unknown) => {
        // Another source's copy in the raw schema stays there until someone changes a config.
        if (error instanceof AppError && error.details.reason === 'RAW_SCHEMA_TAKEN')
          throw new PermanentJobError(error.message, { cause: error });
        return failOnceWhenDeterministic(error);
      }),
    {
      // A retry (after a crash or a transient failure) loads again; each table is one transaction,
      // so nothing half-loaded stays. A value PostgreSQL refuses fails at once: a retry reloads every
      // table before it only to fail the same way.
      retryLimit: 2,
      retryDelaySeconds: 2,
      retryBackoff: true,
      timeoutSeconds: 6 * 3600,
    },
  );
}

export interface SourceLoadStart {
  run_id: string;
  status: JobRunView['status'];
  created: boolean;
  mode: LoadMode;
  raw_schema: string;
}

const loaderOf = (workspace: WorkspaceEntity): RawSchemaLoader => ({
  workspace_id: workspace.id,
  workspace_name: workspace.name,
  organization_id: workspace.organization.id,
});

/** Queues a load of the current workspace's MySQL source (one at a time per workspace). */
export async function startSourceLoad(scope: CallerScope, mode: LoadMode): Promise<SourceLoadStart> {
  const workspace = await currentWorkspace(scope);
  const source = connectionConfig(scope, workspace, 'source');
  if (!source)
    throw new AppError('CONFLICT', `Workspace ${workspace.name} has no source database configured`, {
      reason: 'NO_SOURCE_CONFIG',
    });
  if (source.type !== 'mysql')
    throw new AppError(
      'BAD_REQUEST',
      'load_source applies to MySQL / MariaDB sources; a PostgreSQL source is read where it is',
      { reason: 'NOT_A_LOADED_SOURCE' },
    );
  const targetConfig = connectionConfig(scope, workspace, 'target');
  if (!targetConfig)
    throw new AppError(
      'CONFLICT',
      `Workspace ${workspace.name} has no target warehouse to load the source into`,
      {
        reason: 'NO_TARGET_CONFIG',
      },
    );
  const target = await warehouses(scope.deps).open(targetConfig, `${workspace.id}:target`);
  // A source that cannot be opened now is the load's to report (it checks the raw schema again).
  const sourceWarehouse = await warehouses(scope.deps)
    .open(source, `${workspace.id}:source`)
    .catch(() => null);
  const conflict =
    sourceWarehouse instanceof MysqlWarehouse
      ? await rawSchemaConflict(target, sourceWarehouse, loaderOf(workspace))
      : null;
  if (conflict) throw conflict;
  const { run, created } = await scope.deps.jobs.enqueue(
    SOURCE_LOAD_KIND,
    { workspace_id: workspace.id, mode },
    {
      organizationId: organizationOf(scope.principal),
      workspaceId: workspace.id,
      singletonKey: workspace.id,
    },
  );
  return { run_id: run.id, status: run.status, created, mode, raw_schema: rawSchemaOf(source) };
}

/** The workspace's latest load run, for the sync status. */
export async function sourceLoadView(scope: CallerScope, workspaceId: string) {
  const [run] = await scope.deps.jobs.listRuns(
    organizationOf(scope.principal),
    { workspaceId, kind: SOURCE_LOAD_KIND, limit: 1 },
    scope.em,
  );
  if (!run) return null;
  return {
    run_id: run.id,
    status: run.status,
    mode: (run.payload.mode as LoadMode) ?? 'incremental',
    progress: run.progress,
    result: run.result,
    error: run.error,
    started_at: run.started_at,
    finished_at: run.finished_at,
  };
}
