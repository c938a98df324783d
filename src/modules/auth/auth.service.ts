import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { sql } from '@mikro-orm/core';
import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope, ClientScope, Scope } from '../../deps.ts';
import { effectivePermissions } from '../../auth/permissions.ts';
import type { Principal } from '../../auth/principal.ts';
import {
  checkPassword,
  hashPassword,
  passwordPolicyError,
  passwordPolicyIssues,
} from '../../auth/password.ts';
import { createSession, deleteSession, deleteUserSessions } from '../../auth/session.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import {
  createBuiltinRoles,
  createUser,
  deleteUserOf,
  findOrganization,
  isCaller,
  updateUserOf,
  userView,
} from '../users/users.service.ts';
import { assertNameFree, flushNamed, ORGANIZATION_NAMES, violates } from '../users/names.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';
import { LoginFailure } from './auth.entity.ts';
import { Organization, User, type OrganizationEntity, type UserEntity } from '../users/users.entity.ts';

// ---- views ----

export function organizationView(org: OrganizationEntity) {
  return {
    id: org.id,
    name: org.name,
    domain: org.domain,
    created_at: org.createdAt,
    updated_at: org.updatedAt,
  };
}

function principalInfo(principal: Principal) {
  return {
    id: principal.id,
    username: principal.username,
    organization_id: principal.organizationId,
    is_super_admin: principal.isSuperAdmin,
    must_change_password: principal.mustChangePassword,
    permissions: effectivePermissions(principal.permissions),
  };
}

// ---- login ----

let dummyHash: Promise<string> | undefined;
/** Verifying against a throwaway hash keeps a wrong username as slow as a wrong password. */
const burnPasswordCheck = async (password: string) =>
  checkPassword(await (dummyHash ??= hashPassword('not-a-real-password-0')), password);

/** Whether `password` is the user's; a hash made before passwords were normalized is made again. */
async function passwordMatches(em: EntityManager, user: UserEntity, password: string): Promise<boolean> {
  const result = await checkPassword(user.passwordHash, password);
  if (result === 'match-unnormalized') {
    user.passwordHash = await hashPassword(password);
    await em.flush();
  }
  return result !== 'mismatch';
}

const INVALID_LOGIN = 'Invalid username, organization or password';

/** The expression of the unique indexes on users (migration case_insensitive_names), so they serve logins. */
const usernameLowered = () => sql.lower((alias) => `${alias}.username`);

async function assertNotThrottled(scope: ClientScope, key: string): Promise<void> {
  const { env } = scope.deps;
  const since = new Date(Date.now() - env.LOGIN_FAILURE_WINDOW_SECONDS * 1000);
  const [row] = await scope.em.execute(
    `select count(*) filter (where username = ?)::int as by_user, min(at) filter (where username = ?) as first_user,
            count(*) filter (where ip_address = ?)::int as by_address, min(at) filter (where ip_address = ?) as first_address
     from login_failures where at > ? and (username = ? or ip_address = ?)`,
    [key, key, scope.ipAddress, scope.ipAddress, since, key, scope.ipAddress],
  );
  const blockedSince =
    row.by_user >= env.LOGIN_MAX_FAILURES_PER_USER
      ? row.first_user
      : row.by_address >= env.LOGIN_MAX_FAILURES_PER_ADDRESS
        ? row.first_address
        : null;
  if (blockedSince) {
    const retryAfter = Math.max(
      1,
      Math.ceil(
        (new Date(blockedSince).getTime() + env.LOGIN_FAILURE_WINDOW_SECONDS * 1000 - Date.now()) / 1000,
      ),
    );
    throw new AppError('TOO_MANY_REQUESTS', `Too many failed logins; try again in ${retryAfter} s`, {
      retryAfter,
    });
  }
}

async function recordFailure(scope: ClientScope, key: string): Promise<never> {
  scope.em.create(LoginFailure, { username: key, ipAddress: scope.ipAddress });
  await scope.em.flush();
  throw new AppError('UNAUTHORIZED', INVALID_LOGIN);
}

async function completeLogin(scope: ClientScope, user: UserEntity, key: string) {
  const ttlMs = scope.deps.env.SESSION_TTL_HOURS * 3600_000;
  await scope.em.nativeDelete(LoginFailure, { username: key });
  user.lastLoginAt = new Date();
  const session = await createSession(scope.em, user.id, ttlMs, scope);
  const principal = await scope.deps.authenticator.authenticate(scope, session.token);
  return { token: session.token, expires_at: session.expiresAt, user: principalInfo(principal!) };
}

export async function login(
  scope: ClientScope,
  input: { username: string; domain: string; password: string },
) {
  const key = `${input.domain.trim().toLowerCase()}/${input.username.trim().toLowerCase()}`;
  await assertNotThrottled(scope, key);
  // Usernames are unique regardless of case (users.service): the case typed at login does not matter.
  const user = await scope.em.findOne(User, {
    [usernameLowered()]: input.username.trim().toLowerCase(),
    organization: { domain: input.domain.trim().toLowerCase() },
    isActive: true,
  });
  if (!user) {
    await burnPasswordCheck(input.password);
    return recordFailure(scope, key);
  }
  if (!(await passwordMatches(scope.em, user, input.password))) return recordFailure(scope, key);
  return completeLogin(scope, user, key);
}

export async function superAdminLogin(scope: ClientScope, input: { username: string; password: string }) {
  const key = `super-admin/${input.username.trim().toLowerCase()}`;
  await assertNotThrottled(scope, key);
  const user = await scope.em.findOne(User, {
    [usernameLowered()]: input.username.trim().toLowerCase(),
    organization: null,
    isSuperAdmin: true,
    isActive: true,
  });
  if (!user) {
    await burnPasswordCheck(input.password);
    return recordFailure(scope, key);
  }
  if (!(await passwordMatches(scope.em, user, input.password))) return recordFailure(scope, key);
  return completeLogin(scope, user, key);
}

/**
 * An API key has no session: answering 200 would let its caller believe the credential ended while it
 * keeps working. Nor does logout revoke the key: one key usually serves several processes, and revoking
 * or rotating it is an org.admin decision with its own routes (rotation can keep a grace period).
 */
const KEY_LOGOUT =
  'An API key has no session to end and stays valid: to end it, rotate the key of its service account ' +
  '(optionally with a grace period), disable the account or delete it (service-account routes, org.admin)';

export async function logout(scope: CallerScope) {
  if (scope.principal.kind !== 'user') throw new AppError('BAD_REQUEST', KEY_LOGOUT);
  if (scope.principal.sessionId) await deleteSession(scope.em, scope.principal.sessionId);
  scope.deps.authenticator.forget();
  return { success: true as const };
}

export function sessionInfo(principal: Principal) {
  return { kind: principal.kind, expires_at: principal.expiresAt, user: principalInfo(principal) };
}

export async function listSessions(scope: CallerScope, page: { limit: number; offset: number }) {
  const organization = organizationOf(scope.principal);
  const rows = await scope.em.execute(
    `select s.id, s.user_id, u.username, s.created_at, s.expires_at, s.ip_address, s.user_agent,
            count(*) over ()::int as total
     from sessions s join users u on u.id = s.user_id
     where u.organization_id = ? and s.expires_at > now()
     order by s.created_at desc limit ? offset ?`,
    [organization, page.limit, page.offset],
  );
  return {
    sessions: rows.map((r) => ({
      id: String(r.id).slice(0, 12),
      user_id: r.user_id,
      username: r.username,
      created_at: new Date(r.created_at),
      expires_at: new Date(r.expires_at),
      ip_address: r.ip_address,
      user_agent: r.user_agent,
    })),
    total: rows[0]?.total ?? 0,
  };
}

// ---- the caller's own account ----

async function ownUser(scope: CallerScope): Promise<UserEntity> {
  if (scope.principal.kind !== 'user')
    throw new AppError('BAD_REQUEST', 'Service accounts have no user account');
  const user = await scope.em.findOne(User, { id: scope.principal.id });
  if (!user) throw new AppError('UNAUTHORIZED', 'The account no longer exists');
  return user;
}

export async function getPreferences(scope: CallerScope) {
  if (scope.principal.kind !== 'user') return { preferences: {} };
  return { preferences: (await ownUser(scope)).preferences };
}

/** Merges the given keys into the stored preferences; a key set to null is removed. */
export async function mergePreferences(scope: CallerScope, patch: Record<string, unknown>) {
  const user = await ownUser(scope);
  const next: Record<string, unknown> = { ...user.preferences };
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete next[key];
    else next[key] = value;
  }
  if (JSON.stringify(next).length > 64 * 1024)
    throw new AppError('PAYLOAD_TOO_LARGE', 'Preferences exceed 64 KiB');
  user.preferences = next;
  await scope.em.flush();
  return { preferences: next };
}

export async function changePassword(
  scope: CallerScope,
  input: { current_password: string; new_password: string },
) {
  const user = await ownUser(scope);
  if (!(await passwordMatches(scope.em, user, input.current_password)))
    throw new AppError('BAD_REQUEST', 'The current password is wrong', {
      issues: [{ path: ['current_password'], message: 'does not match' }],
    });
  const organization = user.organization ? await findOrganization(scope.em, user.organization.id) : null;
  const account = { username: user.username, domain: organization?.domain };
  const issues = passwordPolicyIssues(account, input.new_password, 'new_password');
  // Compared as the hash compares them: the same password in another Unicode form is the same.
  if ((await checkPassword(user.passwordHash, input.new_password)) !== 'mismatch')
    issues.push({ path: ['new_password'], message: 'must differ from the current password' });
  if (issues.length) throw passwordPolicyError(issues, 'The new password');
  user.passwordHash = await hashPassword(input.new_password);
  user.mustChangePassword = false;
  await scope.em.flush();
  // Other sessions may belong to whoever knew the old password.
  await deleteUserSessions(scope.em, user.id, scope.principal.sessionId);
  scope.deps.authenticator.forget();
  return { success: true as const };
}

// ---- organizations (super admin) ----

export async function listPublicOrganizations(scope: Scope) {
  const orgs = await scope.em.find(Organization, {}, { orderBy: { name: 'asc' }, limit: 1000 });
  return { organizations: orgs.map((o) => ({ id: o.id, name: o.name, domain: o.domain })) };
}

export async function listOrganizations(scope: Scope, page: { limit: number; offset: number }) {
  const rows = await scope.em.execute(
    `select o.*, (select count(*) from users u where u.organization_id = o.id)::int as user_count,
            (select count(*) from workspaces w where w.organization_id = o.id)::int as workspace_count,
            count(*) over ()::int as total
     from organizations o order by o.name limit ? offset ?`,
    [page.limit, page.offset],
  );
  return {
    organizations: rows.map((r) => ({
      id: r.id,
      name: r.name,
      domain: r.domain,
      created_at: new Date(r.created_at),
      updated_at: new Date(r.updated_at),
      user_count: r.user_count,
      workspace_count: r.workspace_count,
    })),
    total: rows[0]?.total ?? 0,
  };
}

/**
 * Refuses (409) a domain or a name another organization holds; `except` is the organization being
 * changed. Names are compared as everywhere (users/names.ts): two organizations whose names differ only
 * by case would be two entries of the login page's list that nobody can tell apart.
 */
export async function assertOrganizationFree(
  em: EntityManager,
  input: { name?: string; domain?: string },
  except?: string,
): Promise<void> {
  if (
    input.domain !== undefined &&
    (await em.count(Organization, { domain: input.domain, ...(except ? { id: { $ne: except } } : {}) }))
  )
    throw domainTaken(input.domain);
  if (input.name !== undefined) await assertNameFree(em, ORGANIZATION_NAMES, input.name, { except });
}

const domainTaken = (domain: string) =>
  new AppError('CONFLICT', `An organization with domain ${domain} already exists`, {
    reason: 'DOMAIN_TAKEN',
  });

const DOMAIN_CONSTRAINT = new Set(['organizations_domain_unique']);

/** Writes an organization's name and domain: a request that took either since the check answers 409 too. */
async function flushOrganization(em: EntityManager, org: OrganizationEntity): Promise<void> {
  try {
    await flushNamed(em, ORGANIZATION_NAMES, org.name);
  } catch (error) {
    if (violates(error, DOMAIN_CONSTRAINT)) throw domainTaken(org.domain);
    throw error;
  }
}

/** An organization with its built-in roles: the one way an organization comes to exist. */
export async function createOrganizationRecord(em: EntityManager, input: { name: string; domain: string }) {
  await assertOrganizationFree(em, input);
  const org = em.create(Organization, { name: input.name, domain: input.domain });
  await flushOrganization(em, org);
  createBuiltinRoles(em, org.id);
  await em.flush();
  return org;
}

export async function createOrganization(
  scope: Scope,
  input: { name: string; domain: string; admin?: { username: string; email?: string; password?: string } },
) {
  return scope.em.transactional(async (em) => {
    const inner = { ...scope, em: em as EntityManager };
    const org = await createOrganizationRecord(inner.em, input);
    if (!input.admin) return { organization: organizationView(org) };
    const created = await createUser(inner, {
      ...input.admin,
      organizationId: org.id,
      isSuperAdmin: false,
      roles: ['admin'],
      must_change_password: true,
    });
    return {
      organization: organizationView(org),
      admin: {
        id: created.user.id,
        username: created.user.username,
        temporary_password: created.temporary_password,
      },
    };
  });
}

export async function updateOrganization(
  scope: Scope,
  input: { org_id: string; name?: string; domain?: string },
) {
  const org = await findOrganization(scope.em, input.org_id);
  const changed = {
    ...(input.domain && input.domain !== org.domain ? { domain: input.domain } : {}),
    ...(input.name && input.name !== org.name ? { name: input.name } : {}),
  };
  await assertOrganizationFree(scope.em, changed, org.id);
  Object.assign(org, changed);
  await flushOrganization(scope.em, org);
  return organizationView(org);
}

/** Deletes the organization and everything it owns (the foreign keys cascade). */
export async function deleteOrganization(scope: Scope, orgId: string) {
  const deleted = await scope.em.nativeDelete(Organization, { id: orgId });
  if (!deleted) throw notFound('Organization');
  scope.deps.authenticator.forget();
  return { success: true as const };
}

export async function listOrganizationWorkspaces(scope: Scope, orgId: string) {
  await findOrganization(scope.em, orgId);
  const workspaces = await scope.em.find(Workspace, { organization: orgId }, { orderBy: { name: 'asc' } });
  return {
    workspaces: workspaces.map((w) => ({
      id: w.id,
      name: w.name,
      description: w.description,
      created_at: w.createdAt,
      updated_at: w.updatedAt,
    })),
  };
}

export async function deleteOrganizationWorkspace(
  scope: Scope,
  input: { tenant_id: string; workspace_name: string },
) {
  const deleted = await scope.em.nativeDelete(Workspace, {
    organization: input.tenant_id,
    name: input.workspace_name,
  });
  if (!deleted) throw notFound('Workspace');
  return { success: true as const };
}

export async function listAllUsers(
  scope: Scope,
  input: { organization_id?: string; limit: number; offset: number },
) {
  const [users, total] = await scope.em.findAndCount(
    User,
    input.organization_id ? { organization: input.organization_id } : {},
    { populate: ['roles'], orderBy: { username: 'asc' }, limit: input.limit, offset: input.offset },
  );
  return { users: users.map(userView), total };
}

export async function superAdminUpdateUser(
  scope: CallerScope,
  input: {
    user_id: string;
    email?: string | null;
    is_active?: boolean;
    must_change_password?: boolean;
    roles?: string[];
  },
) {
  if (isCaller(scope, input.user_id) && input.is_active === false)
    throw new AppError('BAD_REQUEST', 'You cannot deactivate yourself');
  return updateUserOf(scope, null, input);
}

export async function superAdminDeleteUser(scope: CallerScope, userId: string) {
  if (isCaller(scope, userId)) throw new AppError('BAD_REQUEST', 'You cannot delete yourself');
  await deleteUserOf(scope, null, userId);
  return { success: true as const };
}

// ---- logs ----

function logDirectory(scope: Scope): string {
  return join(scope.deps.env.dataDir, 'logs');
}

export async function listLogFiles(scope: Scope) {
  const dir = logDirectory(scope);
  const names = await readdir(dir).catch(() => [] as string[]);
  const files = await Promise.all(
    names.map(async (name) => {
      const info = await stat(join(dir, name));
      return { name, size: info.size, modified_at: info.mtime, isFile: info.isFile() };
    }),
  );
  return { files: files.filter((f) => f.isFile).map(({ isFile: _, ...f }) => f) };
}
