import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope, Scope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import {
  connectionConfigSchema,
  maskConnectionConfig,
  type ConnectionConfig,
} from '../../warehouse/config.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import { User } from '../users/users.entity.ts';
import { libraryTemplate, libraryTemplates } from '../schemas/schema-library.ts';
import type { TargetSchema } from '../schemas/schemas.schemas.ts';
import { invalidateSourceCaches, invalidateWorkspaceCaches, selectionCache } from './workspaces-cache.ts';
import {
  Workspace,
  type StoredConnectionConfig,
  type WorkflowTaskState,
  type WorkspaceEntity,
} from './workspaces.entity.ts';
import {
  RESERVED_WORKSPACE_NAMES,
  WORKFLOW_TASKS,
  type ConnectionConfigInput,
} from './workspaces.schemas.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';
import { isMaskedSecret } from '../../auth/secret-box.ts';

export type { TargetSchema } from '../schemas/schemas.schemas.ts';
export type { WorkspaceEntity } from './workspaces.entity.ts';

const CURRENT_KEY = 'current_workspace';
const LAST_USED_KEY = 'workspace_last_used';
export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

// ---- the contract other areas code against ----

/** The caller's selected workspace; none (or a deleted one) → 409 telling how to select one. */
export async function currentWorkspace(scope: CallerScope): Promise<WorkspaceEntity> {
  const organization = organizationOf(scope.principal);
  const id = await selectedWorkspaceIdOrFail(scope);
  const workspace = await scope.em.findOne(Workspace, { id, organization });
  if (!workspace) throw selectedWorkspaceGone(scope);
  return workspace;
}

/**
 * The selected workspace's id, from the selection cache when it holds it, without reading the
 * workspace: for reads that join the workspace into their own statement (one statement, one
 * transaction under row-level security). None selected → 409; when the statement then finds no
 * workspace row, answer `selectedWorkspaceGone`.
 */
export async function selectedWorkspaceIdOrFail(scope: CallerScope): Promise<string> {
  const id = await selectedWorkspaceId(scope);
  if (!id)
    throw new AppError('CONFLICT', 'No workspace selected: select one first', {
      reason: 'NO_WORKSPACE_SELECTED',
    });
  return id;
}

/** The selected workspace was deleted: the cached selection goes, the caller is told to select another. */
export function selectedWorkspaceGone(scope: CallerScope): AppError {
  selectionCache.forget(scope);
  return new AppError('CONFLICT', 'The selected workspace no longer exists: select another', {
    reason: 'NO_WORKSPACE_SELECTED',
  });
}

/** A workspace of the caller's organization; unknown and foreign names alike → 404. */
export async function workspaceByName(scope: CallerScope, name: string): Promise<WorkspaceEntity> {
  const workspace = await scope.em.findOne(Workspace, {
    organization: organizationOf(scope.principal),
    name,
  });
  if (!workspace) throw notFound(`Workspace ${name}`);
  return workspace;
}

/** The stored config with its password decrypted, for connecting; never return it to a client. */
export function connectionConfig(
  scope: Scope,
  workspace: WorkspaceEntity,
  side: 'source' | 'target',
): ConnectionConfig | null {
  const stored = side === 'source' ? workspace.sourceConfig : workspace.targetConfig;
  if (!stored) return null;
  const { password, ...rest } = stored;
  return connectionConfigSchema.parse({
    ...rest,
    ...(password ? { password: scope.deps.secrets.decrypt(password) } : {}),
  });
}

/** The workspace's source or target connection, or the one refusal every area answers without it. */
export function requiredConnectionConfig(
  scope: Scope,
  workspace: WorkspaceEntity,
  side: 'source' | 'target',
): ConnectionConfig {
  const config = connectionConfig(scope, workspace, side);
  if (config) return config;
  throw new AppError(
    'CONFLICT',
    side === 'source'
      ? `Workspace ${workspace.name} has no source database configured`
      : `Workspace ${workspace.name} has no target warehouse configured`,
    { reason: side === 'source' ? 'NO_SOURCE_CONFIG' : 'NO_TARGET_CONFIG' },
  );
}

export function targetSchemaOf(workspace: WorkspaceEntity): TargetSchema | null {
  return (workspace.targetSchema as TargetSchema | null) ?? null;
}

// ---- selection ----

async function selectedWorkspaceId(scope: CallerScope): Promise<string | null> {
  const { principal } = scope;
  const cached = await selectionCache.get(scope);
  if (cached !== undefined) return cached;
  const [row] =
    principal.kind === 'user'
      ? await scope.em.execute(`select preferences->>'${CURRENT_KEY}' as id from users where id = ?`, [
          principal.id,
        ])
      : await scope.em.execute('select current_workspace_id as id from service_accounts where id = ?', [
          principal.id,
        ]);
  const id = typeof row?.id === 'string' && UUID.test(row.id) ? row.id : null;
  await selectionCache.set(scope, id);
  return id;
}

interface Usage {
  currentId: string | null;
  lastUsed: Record<string, string>;
}

async function usageOf(scope: CallerScope): Promise<Usage> {
  const currentId = await selectedWorkspaceId(scope);
  if (scope.principal.kind !== 'user') return { currentId, lastUsed: {} };
  const [row] = await scope.em.execute(
    `select preferences->'${LAST_USED_KEY}' as last_used from users where id = ?`,
    [scope.principal.id],
  );
  const lastUsed = row?.last_used && typeof row.last_used === 'object' ? row.last_used : {};
  return { currentId, lastUsed };
}

async function storeSelection(scope: CallerScope, workspaceId: string | null): Promise<void> {
  const { principal } = scope;
  if (principal.kind === 'user') {
    const user = await scope.em.findOne(User, { id: principal.id });
    if (!user) throw new AppError('UNAUTHORIZED', 'The account no longer exists');
    const preferences: Record<string, unknown> = { ...user.preferences };
    if (workspaceId) {
      preferences[CURRENT_KEY] = workspaceId;
      const lastUsed = { ...(preferences[LAST_USED_KEY] as Record<string, string> | undefined) };
      lastUsed[workspaceId] = new Date().toISOString();
      // Keep the newest 100: the map lives in a row read on every request that needs it.
      preferences[LAST_USED_KEY] = Object.fromEntries(
        Object.entries(lastUsed)
          .sort((a, b) => b[1].localeCompare(a[1]))
          .slice(0, 100),
      );
    } else delete preferences[CURRENT_KEY];
    user.preferences = preferences;
    await scope.em.flush();
  } else {
    await scope.em.execute(
      'update service_accounts set current_workspace_id = ? where id = ? and organization_id = ?',
      [workspaceId, principal.id, organizationOf(principal)],
    );
  }
  await selectionCache.set(scope, workspaceId);
}

export async function selectWorkspace(scope: CallerScope, name: string) {
  const workspace = await workspaceByName(scope, name);
  await storeSelection(scope, workspace.id);
  return { success: true as const, workspace: await workspaceDetail(scope, workspace) };
}

// ---- views ----

/** What the list shows of a workspace: whether its parts are set, not their contents. */
interface WorkspaceSummary {
  id: string;
  name: string;
  description: string;
  sourceConfigured: boolean;
  targetConfigured: boolean;
  schemaAssigned: boolean;
  schemaTemplate: string | null | undefined;
  createdAt: Date;
  updatedAt: Date;
}

const summaryOf = (workspace: WorkspaceEntity): WorkspaceSummary => ({
  id: workspace.id,
  name: workspace.name,
  description: workspace.description,
  sourceConfigured: !!workspace.sourceConfig,
  targetConfigured: !!workspace.targetConfig,
  schemaAssigned: !!workspace.targetSchema,
  schemaTemplate: workspace.schemaTemplate,
  createdAt: workspace.createdAt,
  updatedAt: workspace.updatedAt,
});

function workspaceView(workspace: WorkspaceSummary, usage: Usage) {
  return {
    id: workspace.id,
    name: workspace.name,
    description: workspace.description,
    is_current: usage.currentId === workspace.id,
    last_used_at: usage.lastUsed[workspace.id] ? new Date(usage.lastUsed[workspace.id]) : null,
    source_configured: workspace.sourceConfigured,
    target_configured: workspace.targetConfigured,
    schema_assigned: workspace.schemaAssigned,
    schema_template: workspace.schemaTemplate ?? null,
    created_at: workspace.createdAt,
    updated_at: workspace.updatedAt,
  };
}

export function maskedConfig(workspace: WorkspaceEntity, side: 'source' | 'target') {
  const stored = side === 'source' ? workspace.sourceConfig : workspace.targetConfig;
  if (!stored) return null;
  // No decryption: only whether a password is stored is shown. The sealed value is longer than a
  // password may be, so it stays out of the validation.
  const { password, ...rest } = stored;
  return maskConnectionConfig({
    ...connectionConfigSchema.parse(rest),
    password: password ? '*' : undefined,
  });
}

/**
 * Warnings about the roles of the workspace's connections (superuser, bypasses RLS) as their last
 * identity check saw them: nothing connects, so a config not used since the server started has none yet.
 */
export function connectionWarnings(
  scope: Scope,
  workspace: WorkspaceEntity,
  sides: ('source' | 'target')[] = ['source', 'target'],
) {
  return sides.flatMap((side) => {
    const stored = side === 'source' ? workspace.sourceConfig : workspace.targetConfig;
    if (!stored) return [];
    return warehouses(scope.deps)
      .warningsFor(stored as Pick<ConnectionConfig, 'host' | 'port' | 'database' | 'user'>)
      .map((warning) => ({ side, ...warning }));
  });
}

export function workflowStateOf(workspace: WorkspaceEntity): Record<string, WorkflowTaskState> {
  const state: Record<string, WorkflowTaskState> = {};
  for (const task of WORKFLOW_TASKS)
    state[task] = workspace.workflowState[task] ?? { completed: false, completed_at: null, data: {} };
  return state;
}

export async function workspaceDetail(scope: CallerScope, workspace: WorkspaceEntity, usage?: Usage) {
  const schema = targetSchemaOf(workspace);
  return {
    ...workspaceView(summaryOf(workspace), usage ?? (await usageOf(scope))),
    source_config: maskedConfig(workspace, 'source'),
    target_config: maskedConfig(workspace, 'target'),
    schema_customized: workspace.schemaCustomized,
    warnings: connectionWarnings(scope, workspace),
    table_count: schema?.tables.length ?? 0,
    workflow_state: workflowStateOf(workspace),
  };
}

// ---- CRUD ----

/**
 * One statement on rows (they only pass through to the answer): the page, the total, and the caller's
 * last-used map. The selected workspace's name is taken from the page, or looked up when it is not on it.
 */
export async function listWorkspaces(scope: CallerScope, page: { limit: number; offset: number }) {
  const organization = organizationOf(scope.principal);
  const currentId = await selectedWorkspaceId(scope);
  const isUser = scope.principal.kind === 'user';
  const rows: WorkspaceListRow[] = await scope.em.execute(
    `select w.id, w.name, w.description, w.source_config is not null as source_configured,
        w.target_config is not null as target_configured, w.target_schema is not null as schema_assigned,
        w.schema_template, w.created_at, w.updated_at, count(*) over () as total,
        ${isUser ? `(select u.preferences->'${LAST_USED_KEY}' from users u where u.id = ?)` : 'null'} as last_used,
        ${currentId ? '(select c.name from workspaces c where c.id = ? and c.organization_id = w.organization_id)' : 'null'} as current_name
      from workspaces w where w.organization_id = ? order by w.name asc limit ? offset ?`,
    [
      ...(isUser ? [scope.principal.id] : []),
      ...(currentId ? [currentId] : []),
      organization,
      page.limit,
      page.offset,
    ],
  );
  // A page past the end has no rows to carry the total and the selected name.
  if (!rows.length && page.offset > 0) {
    const [counted] = await scope.em.execute(
      `select count(*) as total, (select c.name from workspaces c where c.id = ? and c.organization_id = ?)
          as current_name
        from workspaces where organization_id = ?`,
      [currentId, organization, organization],
    );
    return { workspaces: [], current_workspace: counted.current_name ?? null, total: Number(counted.total) };
  }
  const lastUsed = rows[0]?.last_used && typeof rows[0].last_used === 'object' ? rows[0].last_used : {};
  const usage: Usage = { currentId, lastUsed };
  return {
    workspaces: rows.map((w) =>
      workspaceView(
        {
          id: w.id,
          name: w.name,
          description: w.description,
          sourceConfigured: w.source_configured,
          targetConfigured: w.target_configured,
          schemaAssigned: w.schema_assigned,
          schemaTemplate: w.schema_template,
          createdAt: new Date(w.created_at),
          updatedAt: new Date(w.updated_at),
        },
        usage,
      ),
    ),
    current_workspace: rows[0]?.current_name ?? null,
    total: rows.length ? Number(rows[0].total) : 0,
  };
}

interface WorkspaceListRow {
  id: string;
  name: string;
  description: string;
  source_configured: boolean;
  target_configured: boolean;
  schema_assigned: boolean;
  schema_template: string | null;
  created_at: string;
  updated_at: string;
  total: string;
  last_used: Record<string, string> | null;
  current_name: string | null;
}

export async function getWorkspace(scope: CallerScope, name: string) {
  return workspaceDetail(scope, await workspaceByName(scope, name));
}

export async function getCurrentWorkspace(scope: CallerScope) {
  return workspaceDetail(scope, await currentWorkspace(scope));
}

async function assertNameAvailable(scope: CallerScope, name: string, exceptId?: string) {
  const lower = name.toLowerCase();
  if ((RESERVED_WORKSPACE_NAMES as readonly string[]).includes(lower))
    // No `issues` here: the REST adapter would replace this message with a generic one.
    throw new AppError(
      'BAD_REQUEST',
      `The workspace name ${name} is reserved: /api/workspaces/${lower} is a route of its own (reserved: ${RESERVED_WORKSPACE_NAMES.join(', ')})`,
    );
  const [row] = await scope.em.execute(
    'select id, name from workspaces where organization_id = ? and lower(name) = ?',
    [organizationOf(scope.principal), lower],
  );
  if (row && row.id !== exceptId)
    throw new AppError('CONFLICT', `A workspace named ${row.name} already exists in this organization`);
}

/** Seals the password; a masked config sent back keeps the stored one (DESIGN §4, secrets). */
export function storeConnectionConfig(
  scope: Scope,
  input: ConnectionConfigInput,
  previous: StoredConnectionConfig | null | undefined,
): StoredConnectionConfig {
  const { password_set: passwordSet, password, ...config } = input;
  let sealed: string | undefined;
  if (password && !isMaskedSecret(password)) sealed = scope.deps.secrets.encrypt(password);
  else if (passwordSet !== false && previous?.password) sealed = previous.password;
  return sealed ? { ...config, password: sealed } : { ...config };
}

export async function createWorkspace(
  scope: CallerScope,
  input: {
    name: string;
    description?: string;
    source_config?: ConnectionConfigInput;
    target_config?: ConnectionConfigInput;
    template_name?: string;
    select: boolean;
  },
) {
  const organization = organizationOf(scope.principal);
  await assertNameAvailable(scope, input.name);
  let schema: TargetSchema | null = null;
  if (input.template_name) {
    schema = await libraryTemplate(input.template_name);
    if (!schema)
      throw new AppError('BAD_REQUEST', `Unknown library template ${input.template_name}`, {
        issues: [
          {
            path: ['template_name'],
            message: `one of ${[...(await libraryTemplates()).keys()].join(', ')}`,
          },
        ],
      });
  }
  const workspace = scope.em.create(Workspace, {
    organization,
    name: input.name,
    description: input.description ?? '',
    sourceConfig: input.source_config ? storeConnectionConfig(scope, input.source_config, null) : null,
    targetConfig: input.target_config ? storeConnectionConfig(scope, input.target_config, null) : null,
    targetSchema: schema,
    schemaTemplate: schema ? input.template_name : null,
    schemaCustomized: false,
    settings: {},
    workflowState: {},
  });
  await scope.em.flush();
  if (input.select) await storeSelection(scope, workspace.id);
  return workspaceDetail(scope, workspace);
}

export const updateWorkspace = concurrentEdit(async function updateWorkspace(
  scope: CallerScope,
  input: { workspace_name: string; name?: string; description?: string },
) {
  const workspace = await workspaceByName(scope, input.workspace_name);
  if (input.name !== undefined && input.name !== workspace.name) {
    await assertNameAvailable(scope, input.name, workspace.id);
    workspace.name = input.name;
  }
  if (input.description !== undefined) workspace.description = input.description;
  await scope.em.flush();
  return workspaceDetail(scope, workspace);
});

/** Everything in it goes too: every table of a workspace references it with on delete cascade. */
export async function deleteWorkspace(scope: CallerScope, name: string) {
  const workspace = await workspaceByName(scope, name);
  const organization = organizationOf(scope.principal);
  await scope.em.remove(workspace).flush();
  // Users who had it selected keep a dangling id, which currentWorkspace answers with 409.
  await scope.em.execute(
    `update users set preferences = (preferences - '${CURRENT_KEY}') where organization_id = ? and preferences->>'${CURRENT_KEY}' = ?`,
    [organization, workspace.id],
  );
  // Cached selections of it fall through to currentWorkspace's 409 (and are dropped there).
  invalidateWorkspaceCaches(organization, workspace.id);
  return { success: true as const, message: `Workspace ${name} deleted` };
}

// ---- source configuration ----

export async function getSourceConfig(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const config = maskedConfig(workspace, 'source');
  return {
    workspace_name: workspace.name,
    configured: !!config,
    source_config: config,
    warnings: connectionWarnings(scope, workspace, ['source']),
  };
}

export const saveSourceConfig = concurrentEdit(async function saveSourceConfig(
  scope: CallerScope,
  input: ConnectionConfigInput,
) {
  const workspace = await currentWorkspace(scope);
  workspace.sourceConfig = storeConnectionConfig(scope, input, workspace.sourceConfig);
  await scope.em.flush();
  invalidateSourceCaches(workspace.organization.id, workspace.id);
  invalidateWorkspaceCaches(workspace.organization.id, workspace.id);
  return {
    workspace_name: workspace.name,
    configured: true,
    source_config: maskedConfig(workspace, 'source'),
    warnings: connectionWarnings(scope, workspace, ['source']),
  };
});
