import { AppError } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { User } from '../users/users.entity.ts';
import { Workspace, OrganizationSettings, type OrganizationSettingsEntity } from './workspaces.entity.ts';
import {
  ADMIN_SETTINGS_DEFAULTS,
  GLOBAL_SETTINGS_DEFAULTS,
  USER_PREFERENCES_DEFAULTS,
  adminSettingsFields,
  globalSettingsFields,
  userPreferencesFields,
  type AdminSettings,
  type UserPreferences,
} from './workspaces.schemas.ts';
import { UUID, workspaceByName } from './workspaces.service.ts';
import { maskSettingsSecrets, sealSettingsSecrets } from '../schemas/reverse-etl.service.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';

/*
 * One rule for every settings resource: POST replaces what is stored (missing keys fall back to the
 * default), PUT merges (a key set to null falls back to the default), DELETE resets to the defaults.
 */

type Stored = Record<string, unknown>;

/** Only known keys survive, so a stored document never carries what the schema no longer knows. */
function pick(values: Stored, fields: Record<string, unknown>): Stored {
  return Object.fromEntries(Object.entries(values).filter(([k, v]) => k in fields && v !== undefined));
}

function merge(stored: Stored, patch: Stored, fields: Record<string, unknown>): Stored {
  const next = { ...pick(stored, fields) };
  for (const [key, value] of Object.entries(pick(patch, fields))) {
    if (value === null && key in fields && !nullableByDesign(key)) delete next[key];
    else next[key] = value;
  }
  return next;
}

// auto_confirm_threshold: null (never auto-confirm) is a real value.
const NULLABLE_KEYS = new Set(['auto_confirm_threshold']);
export const nullableByDesign = (key: string) => NULLABLE_KEYS.has(key);

async function organizationSettings(
  scope: CallerScope,
  create: boolean,
): Promise<OrganizationSettingsEntity | null> {
  const organization = organizationOf(scope.principal);
  const found = await scope.em.findOne(OrganizationSettings, { organization });
  if (found || !create) return found;
  return scope.em.create(OrganizationSettings, { organization, globalSettings: {}, adminSettings: {} });
}

// ---- admin settings ----

async function adminView(scope: CallerScope, workspaceName: string | undefined) {
  const org = await organizationSettings(scope, false);
  const global = pick(org?.adminSettings ?? {}, adminSettingsFields);
  if (!workspaceName)
    return {
      workspace_name: null,
      scope: 'global' as const,
      settings: maskSettingsSecrets(global),
      effective: maskSettingsSecrets({ ...ADMIN_SETTINGS_DEFAULTS, ...global }) as AdminSettings,
      is_default: Object.keys(global).length === 0,
    };
  const workspace = await workspaceByName(scope, workspaceName);
  const own = pick(workspace.settings, adminSettingsFields);
  return {
    workspace_name: workspace.name,
    scope: 'workspace' as const,
    settings: maskSettingsSecrets(own),
    effective: maskSettingsSecrets({ ...ADMIN_SETTINGS_DEFAULTS, ...global, ...own }) as AdminSettings,
    is_default: Object.keys(own).length === 0,
  };
}

/** The settings a workspace runs with (defaults ← global ← workspace), for other areas. */
export async function effectiveAdminSettings(
  scope: CallerScope,
  workspaceName: string,
): Promise<AdminSettings> {
  return (await adminView(scope, workspaceName)).effective;
}

export const getAdminSettings = (scope: CallerScope, workspaceName?: string) =>
  adminView(scope, workspaceName);

export const writeAdminSettings = concurrentEdit(async function writeAdminSettings(
  scope: CallerScope,
  input: { workspace_name?: string } & Stored,
  mode: 'replace' | 'merge' | 'reset',
) {
  const { workspace_name: workspaceName, ...plain } = input;
  const next = (stored: Stored) => {
    // Reverse-ETL destination secrets are sealed before they are stored (masked ones keep the stored).
    const values = sealSettingsSecrets(scope, plain, stored);
    return mode === 'reset'
      ? {}
      : mode === 'replace'
        ? pick(values, adminSettingsFields)
        : merge(stored, values, adminSettingsFields);
  };
  if (workspaceName) {
    const workspace = await workspaceByName(scope, workspaceName);
    workspace.settings = next(workspace.settings);
  } else {
    const org = (await organizationSettings(scope, true))!;
    org.adminSettings = next(org.adminSettings);
  }
  await scope.em.flush();
  return adminView(scope, workspaceName);
});

// ---- global settings of the organization ----

export async function getGlobalSettings(scope: CallerScope) {
  const org = await organizationSettings(scope, false);
  return {
    settings: { ...GLOBAL_SETTINGS_DEFAULTS, ...pick(org?.globalSettings ?? {}, globalSettingsFields) },
    updated_at: org?.updatedAt ?? null,
  };
}

export const updateGlobalSettings = concurrentEdit(async function updateGlobalSettings(
  scope: CallerScope,
  patch: Stored,
) {
  const org = (await organizationSettings(scope, true))!;
  org.globalSettings = merge(org.globalSettings, patch, globalSettingsFields);
  await scope.em.flush();
  return getGlobalSettings(scope);
});

// ---- the caller's preferences ----

async function ownUser(scope: CallerScope) {
  if (scope.principal.kind !== 'user')
    throw new AppError('BAD_REQUEST', 'Service accounts have no user preferences');
  const user = await scope.em.findOne(User, { id: scope.principal.id });
  if (!user) throw new AppError('UNAUTHORIZED', 'The account no longer exists');
  return user;
}

export async function getUserPreferences(scope: CallerScope) {
  const stored = scope.principal.kind === 'user' ? (await ownUser(scope)).preferences : {};
  return preferencesView(scope, stored);
}

async function preferencesView(scope: CallerScope, stored: Stored) {
  const organization = organizationOf(scope.principal);
  const lastUsed = (stored.workspace_last_used ?? {}) as Record<string, string>;
  const ids = Object.keys(lastUsed);
  const workspaces = ids.length ? await scope.em.find(Workspace, { organization, id: { $in: ids } }) : [];
  const currentId = scope.principal.kind === 'user' ? stored.current_workspace : await saCurrent(scope);
  const current =
    typeof currentId === 'string' && UUID.test(currentId)
      ? await scope.em.findOne(Workspace, { organization, id: currentId })
      : null;
  return {
    preferences: { ...USER_PREFERENCES_DEFAULTS, ...pick(stored, userPreferencesFields) } as UserPreferences,
    current_workspace: current?.name ?? null,
    last_used: workspaces
      .map((w) => ({ workspace_name: w.name, last_used_at: new Date(lastUsed[w.id]) }))
      .sort((a, b) => b.last_used_at.getTime() - a.last_used_at.getTime()),
  };
}

async function saCurrent(scope: CallerScope): Promise<string | null> {
  const [row] = await scope.em.execute(
    'select current_workspace_id as id from service_accounts where id = ?',
    [scope.principal.id],
  );
  return row?.id ?? null;
}

/** Touches only the keys of the preference schema; other keys (selection, client keys) stay. */
export async function writeUserPreferences(
  scope: CallerScope,
  values: Stored,
  mode: 'replace' | 'merge' | 'reset',
) {
  const user = await ownUser(scope);
  const others = Object.fromEntries(
    Object.entries(user.preferences).filter(([k]) => !(k in userPreferencesFields)),
  );
  const own = pick(user.preferences, userPreferencesFields);
  const next =
    mode === 'reset'
      ? {}
      : mode === 'replace'
        ? pick(values, userPreferencesFields)
        : merge(own, values, userPreferencesFields);
  user.preferences = { ...others, ...next };
  await scope.em.flush();
  return preferencesView(scope, user.preferences);
}
