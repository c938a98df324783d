import { isIP } from 'node:net';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { hasPermission } from '../../auth/permissions.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import {
  CACHE_CATALOGUE,
  CACHE_NAMES,
  applyCacheSettings,
  clearCache,
  namedCache,
  resolveCacheSettings,
  type CacheConfig,
  type CacheName,
} from '../../cache.ts';
import {
  FEATURES,
  FEATURE_NAMES,
  effectiveFeatures,
  loadFeatureState,
  type FeatureName,
  type FeatureState,
} from '../../features.ts';
import { hasUrlCredentials, outboundHttp, sameOrigin } from '../../outbound-http.ts';
import { checkRemote, normalizeRepoPath } from '../../vcs/git-remote.ts';
import { remoteOf } from '../../vcs/push-workspace.ts';
import { User } from '../users/users.entity.ts';
import {
  CacheSettings,
  FeatureSettings,
  UserFeatureOverride,
  VcsConfig,
  type VcsConfigEntity,
} from './admin.entity.ts';

// ---- cache settings ----

function cacheSettingsView(organizationId: string, stored: unknown, updatedAt: Date | null) {
  const settings = resolveCacheSettings(stored);
  return {
    caches: CACHE_NAMES.map((name) => ({
      name,
      description: CACHE_CATALOGUE[name].description,
      ...settings[name],
      defaults: { ...CACHE_CATALOGUE[name].defaults },
      entries: namedCache(name).size(organizationId),
    })),
    updated_at: updatedAt,
  };
}

export async function getCacheSettings(scope: CallerScope) {
  const organization = organizationOf(scope.principal);
  const row = await scope.em.findOne(CacheSettings, { organization });
  return cacheSettingsView(organization, row?.caches, row?.updatedAt ?? null);
}

/**
 * Merges the changes into the stored settings; a cache switched on or off is cleared (here at once,
 * in other API processes when they next refresh the settings), as are the caches named in `clear`.
 */
export async function saveCacheSettings(
  scope: CallerScope,
  input: { caches: Record<string, Partial<CacheConfig>>; clear: string[] },
) {
  const organization = organizationOf(scope.principal);
  let row = await scope.em.findOne(CacheSettings, { organization });
  const before = resolveCacheSettings(row?.caches);
  const merged: Record<string, Record<string, unknown>> = { ...(row?.caches ?? {}) };
  for (const [name, change] of Object.entries(input.caches)) merged[name] = { ...merged[name], ...change };
  const after = resolveCacheSettings(merged);
  if (row) row.caches = merged;
  else row = scope.em.create(CacheSettings, { organization, caches: merged });
  await scope.em.flush();

  const toggled = CACHE_NAMES.filter((n) => before[n].enabled !== after[n].enabled);
  for (const name of toggled) clearCache(name, organization);
  for (const name of input.clear as CacheName[]) clearCache(name, organization);
  applyCacheSettings(organization, after);
  const cleared = CACHE_NAMES.filter((n) => toggled.includes(n) || input.clear.includes(n));
  return { ...cacheSettingsView(organization, merged, row.updatedAt), cleared };
}

// ---- feature flags ----

function featureList(state: FeatureState, forUser: boolean) {
  const orgOnly = effectiveFeatures({ ...state, user: {} });
  const effective = effectiveFeatures(state);
  return FEATURE_NAMES.map((name) => ({
    name,
    description: FEATURES[name].description,
    default: FEATURES[name].default,
    user_overridable: FEATURES[name].user_overridable,
    organization_value: state.organization[name] ?? null,
    ...(forUser ? { user_value: state.user[name] ?? null } : {}),
    enabled: forUser ? effective[name] : orgOnly[name],
  }));
}

export async function getFeatureSettings(scope: CallerScope) {
  const organization = organizationOf(scope.principal);
  const row = await scope.em.findOne(FeatureSettings, { organization });
  const state = await loadFeatureState(scope.em, organization, null);
  return {
    features: featureList(state, false),
    allow_user_overrides: state.allowUserOverrides,
    updated_at: row?.updatedAt ?? null,
  };
}

export async function saveFeatureSettings(
  scope: CallerScope,
  input: { features: Record<string, boolean | null>; allow_user_overrides?: boolean },
) {
  const organization = organizationOf(scope.principal);
  let row = await scope.em.findOne(FeatureSettings, { organization });
  const features: Record<string, boolean> = { ...(row?.features ?? {}) };
  for (const [name, value] of Object.entries(input.features))
    if (value === null) delete features[name];
    else features[name] = value;
  if (row) {
    row.features = features;
    if (input.allow_user_overrides !== undefined) row.allowUserOverrides = input.allow_user_overrides;
  } else
    row = scope.em.create(FeatureSettings, {
      organization,
      features,
      allowUserOverrides: input.allow_user_overrides ?? true,
    });
  await scope.em.flush();
  return getFeatureSettings(scope);
}

// ---- user-level overrides ----

const OVERRIDABLE = FEATURE_NAMES.filter((n) => FEATURES[n].user_overridable);

export async function userFeatureAccess(scope: CallerScope) {
  const { principal } = scope;
  const base = { organization_id: principal.organizationId, overridable_features: OVERRIDABLE };
  if (!principal.organizationId)
    return { ...base, has_access: false, reason: 'Overrides belong to users of an organization' };
  if (principal.kind !== 'user')
    return { ...base, has_access: false, reason: 'Service accounts follow the organization settings' };
  const state = await loadFeatureState(scope.em, principal.organizationId, null);
  if (!state.allowUserOverrides)
    return { ...base, has_access: false, reason: 'Your organization does not allow user-level overrides' };
  return { ...base, has_access: true, reason: null };
}

/**
 * The user whose overrides are read or changed: the caller, or (with org.admin) another user of the
 * caller's organization. Naming another organization is refused; another organization's user is
 * answered like a missing one.
 */
async function overrideTarget(scope: CallerScope, input: { user_id?: string; organization_id?: string }) {
  const { principal } = scope;
  const organization = organizationOf(principal);
  if (input.organization_id !== undefined && input.organization_id !== organization)
    throw new AppError('FORBIDDEN', 'Feature overrides can only be managed inside your own organization');
  if (input.user_id === undefined || (principal.kind === 'user' && input.user_id === principal.id)) {
    if (principal.kind !== 'user')
      throw new AppError('FORBIDDEN', 'Service accounts have no user-level overrides; name a user_id');
    return { organization, userId: principal.id };
  }
  if (!hasPermission(principal.permissions, 'org.admin'))
    throw new AppError('FORBIDDEN', "Managing another user's overrides needs org.admin");
  const user = await scope.em.findOne(User, { id: input.user_id, organization }, { fields: ['id'] });
  if (!user) throw notFound('User');
  return { organization, userId: user.id };
}

async function overridesView(scope: CallerScope, organization: string, userId: string) {
  const state = await loadFeatureState(scope.em, organization, userId);
  const row = await scope.em.findOne(UserFeatureOverride, { user: userId, organization });
  return {
    user_id: userId,
    organization_id: organization,
    allow_user_overrides: state.allowUserOverrides,
    overrides: state.user as Record<string, boolean>,
    features: featureList(state, true) as (ReturnType<typeof featureList>[number] & {
      user_value: boolean | null;
    })[],
    updated_at: row?.updatedAt ?? null,
  };
}

export async function getUserFeatureOverrides(
  scope: CallerScope,
  input: { user_id?: string; organization_id?: string },
) {
  const { organization, userId } = await overrideTarget(scope, input);
  return overridesView(scope, organization, userId);
}

export async function saveUserFeatureOverrides(
  scope: CallerScope,
  input: { user_id?: string; organization_id?: string; overrides: Record<string, boolean | null> },
) {
  const { organization, userId } = await overrideTarget(scope, input);
  const state = await loadFeatureState(scope.em, organization, null);
  if (!state.allowUserOverrides)
    throw new AppError('FORBIDDEN', 'Your organization does not allow user-level feature overrides');
  const fixed = Object.keys(input.overrides).filter((n) => !FEATURES[n as FeatureName].user_overridable);
  if (fixed.length)
    throw new AppError('FORBIDDEN', `These features cannot be overridden by users: ${fixed.join(', ')}`, {
      reason: 'FEATURE_NOT_OVERRIDABLE',
    });
  let row = await scope.em.findOne(UserFeatureOverride, { user: userId, organization });
  const overrides: Record<string, boolean> = { ...(row?.overrides ?? {}) };
  for (const [name, value] of Object.entries(input.overrides))
    if (value === null) delete overrides[name];
    else overrides[name] = value;
  if (row) row.overrides = overrides;
  else row = scope.em.create(UserFeatureOverride, { organization, user: userId, overrides });
  await scope.em.flush();
  return overridesView(scope, organization, userId);
}

export async function clearUserFeatureOverrides(
  scope: CallerScope,
  input: { user_id?: string; organization_id?: string },
) {
  const { organization, userId } = await overrideTarget(scope, input);
  await scope.em.nativeDelete(UserFeatureOverride, { user: userId, organization });
  return overridesView(scope, organization, userId);
}

// ---- version control ----

const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]']);

/** HTTPS only (plain HTTP would expose the token), except to the machine itself; no inline credentials. */
function checkRemoteUrl(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new AppError('BAD_REQUEST', 'url is not a valid URL', {
      issues: [{ path: ['url'], message: 'invalid URL' }],
    });
  }
  const bad = (message: string) =>
    new AppError('BAD_REQUEST', message, { issues: [{ path: ['url'], message }] });
  const loopback =
    LOOPBACK.has(url.hostname) || (isIP(url.hostname) === 4 && url.hostname.startsWith('127.'));
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && loopback))
    throw bad('url must use https (plain http is accepted for loopback hosts only)');
  if (hasUrlCredentials(url)) throw bad('url must not contain credentials; use token and username');
  if (url.search || url.hash) throw bad('url must not contain a query or fragment');
  return url.toString();
}

function vcsView(config: VcsConfigEntity | null) {
  if (!config)
    return {
      configured: false,
      enabled: false,
      url: null,
      branch: 'main',
      author_name: 'dimas',
      author_email: 'dimas@noreply.invalid',
      path_prefix: '',
      username: 'x-access-token',
      token_set: false,
      last_push_at: null,
      last_push_commit: null,
      last_push_error: null,
      updated_at: null,
    };
  return {
    configured: true,
    enabled: config.enabled,
    url: config.url,
    branch: config.branch,
    author_name: config.authorName,
    author_email: config.authorEmail,
    path_prefix: config.pathPrefix,
    username: config.username,
    token_set: !!config.tokenEncrypted,
    last_push_at: config.lastPushAt ?? null,
    last_push_commit: config.lastPushCommit ?? null,
    last_push_error: config.lastPushError ?? null,
    updated_at: config.updatedAt,
  };
}

/**
 * The last push's outcome describes the remote it went to: another repository or branch has no push
 * history yet, and an error seen with other credentials says nothing about the new ones.
 */
function forgetStalePushState(
  scope: CallerScope,
  config: VcsConfigEntity,
  next: { url: string; branch: string; username: string; token?: string | null },
) {
  const newTarget = config.url !== next.url || config.branch !== next.branch;
  const storedToken = config.tokenEncrypted ? scope.deps.secrets.decrypt(config.tokenEncrypted) : null;
  const newCredentials =
    config.username !== next.username || (next.token !== undefined && (next.token || null) !== storedToken);
  if (newTarget) {
    config.lastPushAt = null;
    config.lastPushCommit = null;
  }
  if (newTarget || newCredentials) config.lastPushError = null;
}

export interface VcsConfigInput {
  enabled: boolean;
  url: string;
  branch: string;
  author_name: string;
  author_email: string;
  path_prefix: string;
  username: string;
  token?: string | null;
}

export async function getVcsConfig(scope: CallerScope) {
  const organization = organizationOf(scope.principal);
  return vcsView(await scope.em.findOne(VcsConfig, { organization }));
}

export async function saveVcsConfig(scope: CallerScope, input: VcsConfigInput) {
  const organization = organizationOf(scope.principal);
  const url = checkRemoteUrl(input.url);
  await outboundHttp(scope.deps.env).checkDestination(url, 'The repository URL');
  const pathPrefix = normalizeRepoPath(input.path_prefix, 'path_prefix').join('/');
  let config = await scope.em.findOne(VcsConfig, { organization });
  // A token kept for one host must not follow the configuration to another.
  if (config && input.token === undefined && config.tokenEncrypted && !sameOrigin(config.url, url))
    throw new AppError(
      'BAD_REQUEST',
      'The url moves to another host: give the token again (or null to remove it)',
      {
        issues: [{ path: ['token'], message: 'required when the host changes' }],
      },
    );
  const fields = {
    enabled: input.enabled,
    url,
    branch: input.branch,
    authorName: input.author_name,
    authorEmail: input.author_email,
    pathPrefix,
    username: input.username,
  };
  const tokenEncrypted =
    input.token === undefined
      ? (config?.tokenEncrypted ?? null)
      : input.token && scope.deps.secrets.encrypt(input.token);
  if (config) forgetStalePushState(scope, config, { ...input, url });
  if (config) Object.assign(config, fields, { tokenEncrypted });
  else config = scope.em.create(VcsConfig, { organization, ...fields, tokenEncrypted });
  await scope.em.flush();
  return vcsView(config);
}

/**
 * Tests the given settings against the real remote (see checkRemote). Without a token in the input,
 * the stored token is used, but only towards the host it was saved for.
 */
export async function testVcsConnection(scope: CallerScope, input: VcsConfigInput) {
  const organization = organizationOf(scope.principal);
  const url = checkRemoteUrl(input.url);
  normalizeRepoPath(input.path_prefix, 'path_prefix');
  let token: string | null = input.token ?? null;
  let tokenUsed: 'given' | 'stored' | 'none' = token ? 'given' : 'none';
  if (input.token === undefined) {
    const stored = await scope.em.findOne(VcsConfig, { organization });
    if (stored?.tokenEncrypted && sameOrigin(stored.url, url)) {
      token = remoteOf(scope, stored).token;
      tokenUsed = 'stored';
    }
  }
  const check = await checkRemote(
    {
      url,
      username: input.username,
      token,
      outbound: outboundHttp(scope.deps.env),
      timeoutMs: scope.deps.env.VCS_REMOTE_TIMEOUT_MS,
    },
    input.branch,
  );
  return {
    success: true as const,
    message: check.branch_exists
      ? `Connected: ${check.refs} refs, branch ${input.branch} exists, push access granted`
      : `Connected: ${check.refs} refs, push access granted; branch ${input.branch} will be created by the first push`,
    url,
    branch: input.branch,
    branch_exists: check.branch_exists,
    default_branch: check.default_branch,
    default_branch_note: check.default_branch_note,
    refs: check.refs,
    push_access: check.push_access,
    token_used: tokenUsed,
  };
}
