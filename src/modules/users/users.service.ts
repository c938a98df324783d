import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope, Scope } from '../../deps.ts';
import { BUILTIN_ROLES } from '../../auth/permissions.ts';
import { assertPasswordPolicy, generatePassword, hashPassword } from '../../auth/password.ts';
import { deleteUserSessions } from '../../auth/session.ts';
import { Organization, Role, User, type RoleEntity, type UserEntity } from './users.entity.ts';
import { assertNameFree, flushNamed, sameName, USERNAMES } from './names.ts';

// The one way users and roles come to exist and change, for sign-in (auth) and administration (admin).

export function userView(user: UserEntity) {
  return {
    id: user.id,
    username: user.username,
    email: user.email ?? null,
    organization_id: user.organization?.id ?? null,
    is_super_admin: user.isSuperAdmin,
    is_active: user.isActive,
    must_change_password: user.mustChangePassword,
    roles: user.roles.isInitialized() ? user.roles.getItems().map((r) => r.name) : [],
    last_login_at: user.lastLoginAt ?? null,
    created_at: user.createdAt,
    updated_at: user.updatedAt,
  };
}

export async function findOrganization(em: EntityManager, id: string) {
  const org = await em.findOne(Organization, { id });
  if (!org) throw notFound('Organization');
  return org;
}

export interface NewUser {
  organizationId?: string;
  isSuperAdmin: boolean;
  username: string;
  email?: string;
  password?: string;
  roles: string[];
  must_change_password: boolean;
}

/** The one way a user comes to exist: policy-checked password (or a generated temporary one), roles. */
export async function createUser(scope: Scope, input: NewUser) {
  const { em } = scope;
  if (input.isSuperAdmin === !!input.organizationId)
    throw new AppError('BAD_REQUEST', 'A user is either a super admin or belongs to an organization', {
      issues: [
        { path: ['organization_id'], message: 'required unless is_super_admin is true, and only then' },
      ],
    });
  const organization = input.organizationId ? await findOrganization(em, input.organizationId) : null;
  await assertNameFree(em, USERNAMES, input.username, { organizationId: input.organizationId ?? null });
  const account = { username: input.username, domain: organization?.domain };
  const temporary = input.password === undefined ? generatePassword(account) : undefined;
  const password = input.password ?? temporary!;
  assertPasswordPolicy(account, password);
  const roles = input.organizationId ? await resolveRoles(em, input.organizationId, input.roles) : [];
  const user = em.create(User, {
    organization: input.organizationId ?? null,
    username: input.username,
    email: input.email ?? null,
    passwordHash: await hashPassword(password),
    isSuperAdmin: input.isSuperAdmin,
    mustChangePassword: temporary ? true : input.must_change_password,
    preferences: {},
  });
  user.roles.set(roles);
  await flushNamed(em, USERNAMES, input.username);
  return { user: userView(user), ...(temporary ? { temporary_password: temporary } : {}) };
}

/** A user of the given organization (null = any: the super admin's reach). Others answer 404. */
async function findUser(em: EntityManager, organizationId: string | null, userId: string) {
  const user = await em.findOne(
    User,
    organizationId ? { id: userId, organization: organizationId } : { id: userId },
    { populate: ['roles'] },
  );
  if (!user) throw notFound('User');
  return user;
}

export async function updateUserOf(
  scope: Scope,
  organizationId: string | null,
  input: {
    user_id: string;
    email?: string | null;
    is_active?: boolean;
    must_change_password?: boolean;
    roles?: string[];
  },
) {
  const apply = async (tx: Scope) => {
    const user = await findUser(tx.em, organizationId, input.user_id);
    if (input.email !== undefined) user.email = input.email;
    if (input.is_active !== undefined) user.isActive = input.is_active;
    if (input.must_change_password !== undefined) user.mustChangePassword = input.must_change_password;
    if (input.roles) {
      if (!user.organization) throw new AppError('BAD_REQUEST', 'A super admin has no organization roles');
      user.roles.set(await resolveRoles(tx.em, user.organization.id, input.roles));
    }
    await tx.em.flush();
    if (input.is_active === false) await deleteUserSessions(tx.em, user.id);
    return user;
  };
  // Other changes cannot take org.admin or super-admin status from anyone: no lock for them.
  const mayDemote = input.roles !== undefined || input.is_active === false;
  const user = mayDemote
    ? await keeping(scope, await holdersAffected(scope, organizationId, input.user_id), apply)
    : await apply(scope);
  scope.deps.authenticator.forget();
  return userView(user);
}

export async function deleteUserOf(scope: Scope, organizationId: string | null, userId: string) {
  const apply = async (tx: Scope) => {
    const user = await findUser(tx.em, organizationId, userId);
    await tx.em.remove(user).flush();
  };
  await keeping(scope, await holdersAffected(scope, organizationId, userId), apply);
  scope.deps.authenticator.forget();
}

/**
 * Whether a user id given in a request names the caller. PostgreSQL reads a uuid in any case, with or
 * without hyphens or braces, so comparing the text as given let a caller name itself in capitals and pass
 * the rules about its own account; the ids are compared as PostgreSQL reads them.
 */
export function isCaller(scope: CallerScope, userId: string): boolean {
  return uuidDigits(userId) === uuidDigits(scope.principal.id);
}

const uuidDigits = (id: string) => id.replace(/[{}-]/g, '').toLowerCase();

/**
 * Who must remain after a change of this user: the administrators of its organization (the caller's, or
 * for the super admin, organizationId null, the user's own), or for a super admin (no organization) the
 * installation's super admins. 404 as findUser.
 */
async function holdersAffected(
  scope: Scope,
  organizationId: string | null,
  userId: string,
): Promise<Holders> {
  if (organizationId) return organizationAdministrators(organizationId);
  const [row] = await scope.em.execute('select organization_id from users where id = ?', [userId]);
  if (!row) throw notFound('User');
  return row.organization_id ? organizationAdministrators(row.organization_id) : SUPER_ADMINS;
}

// ---- an organization keeps an administrator, the installation a super admin ----

/**
 * People who must remain: counted under a lock, so that two changes at once run one after the other and
 * the second sees what the first left. A change that takes them from some to none is refused.
 */
interface Holders {
  lock: string;
  count: string;
  params: unknown[];
  refusal(): AppError;
}

/** Active people of the organization whose roles grant org.admin (service accounts are not people). */
const organizationAdministrators = (organizationId: string): Holders => ({
  lock: 'select id from organizations where id = ? for update',
  count: `select count(*)::int as n from users u
    where u.organization_id = ? and u.is_active and exists (
      select 1 from user_roles ur join roles r on r.id = ur.role_id
      where ur.user_id = u.id and 'org.admin' = any (r.permissions))`,
  params: [organizationId],
  refusal: () =>
    new AppError(
      'CONFLICT',
      'This change would leave the organization without an administrator: at least one active user must ' +
        'hold a role that grants org.admin. Give such a role to another user first.',
      { reason: 'LAST_ADMIN' },
    ),
});

/**
 * Active super admins: the users the super-admin login admits (createUser makes every user without an
 * organization one, and only those), so deleting an organization never removes one. The lock takes
 * their rows (in id order, so two requests cannot deadlock): a change that would deactivate or delete
 * one waits for another in flight, and then counts without the row the other took away.
 */
const ACTIVE_SUPER_ADMIN = 'organization_id is null and is_super_admin and is_active';
const SUPER_ADMINS: Holders = {
  lock: `select id from users where ${ACTIVE_SUPER_ADMIN} order by id for update`,
  count: `select count(*)::int as n from users where ${ACTIVE_SUPER_ADMIN}`,
  params: [],
  refusal: () =>
    new AppError(
      'CONFLICT',
      'This change would leave the installation without an active super admin: nobody could then create ' +
        'or administer organizations. Create another super admin first (POST /api/auth/admin/users with ' +
        'is_super_admin: true).',
      { reason: 'LAST_SUPER_ADMIN' },
    ),
};

/** Whether a role makes its holders administrators of their organization. */
export const grantsAdministration = (role: RoleEntity) => role.permissions.includes('org.admin');

/**
 * Runs a change that can take away who must remain and refuses it, changing nothing, when none would:
 * the rule is checked on the state the change produces, so no way of losing the last one needs a guard
 * of its own. Where there were none before (an organization made without an administrator), nothing is
 * held. `change` works through the scope it is given (the transaction's).
 */
async function keeping<S extends Scope, T>(
  scope: S,
  holders: Holders,
  change: (tx: S) => Promise<T>,
): Promise<T> {
  return scope.em.transactional(async (em) => {
    const tx = { ...scope, em: em as EntityManager } as S;
    const count = async () => Number((await tx.em.execute(holders.count, holders.params))[0].n);
    await tx.em.execute(holders.lock, holders.params);
    const before = await count();
    const result = await change(tx);
    await tx.em.flush();
    if (before > 0 && (await count()) === 0) throw holders.refusal();
    return result;
  });
}

/**
 * Runs a write that can change who administers an organization (role assignment, a role's permissions,
 * role deletion, deactivating or deleting a user; by the organization's admins, its service accounts or
 * the super admin) and refuses it with 409 LAST_ADMIN when it would leave the organization without an
 * active person holding org.admin: nobody could then administer it but the super admin. The
 * organization's row is the lock. Organization deletion is not held to it.
 */
export function keepingAnAdministrator<S extends Scope, T>(
  scope: S,
  organizationId: string,
  change: (tx: S) => Promise<T>,
): Promise<T> {
  return keeping(scope, organizationAdministrators(organizationId), change);
}

export async function setPassword(scope: Scope, userId: string, password: string, mustChange: boolean) {
  const user = await findUser(scope.em, null, userId);
  const organization = user.organization ? await findOrganization(scope.em, user.organization.id) : null;
  assertPasswordPolicy({ username: user.username, domain: organization?.domain }, password);
  user.passwordHash = await hashPassword(password);
  user.mustChangePassword = mustChange;
  await scope.em.flush();
  await deleteUserSessions(scope.em, user.id);
  scope.deps.authenticator.forget();
}

/** The built-in roles every organization starts with. */
export function createBuiltinRoles(em: EntityManager, organizationId: string): void {
  for (const role of BUILTIN_ROLES)
    em.create(Role, {
      organization: organizationId,
      ...role,
      permissions: [...role.permissions],
      isBuiltin: true,
    });
}

/**
 * Role names → roles of the organization, matched as names are compared everywhere (regardless of
 * case: `Admin` is the role admin); every unknown name is reported at once.
 */
export async function resolveRoles(
  em: EntityManager,
  organizationId: string,
  names: string[],
): Promise<RoleEntity[]> {
  const unique = [...new Set(names)];
  if (unique.length === 0) return [];
  const rows: { asked: string; id: number | null }[] = await em.execute(
    `select n.asked, r.id from jsonb_array_elements_text(?::jsonb) with ordinality as n(asked, at)
      left join roles r on r.organization_id = ? and ${sameName('r.name', 'n.asked')} order by n.at`,
    [JSON.stringify(unique), organizationId],
  );
  const missing = rows.filter((r) => r.id === null).map((r) => r.asked);
  if (missing.length)
    throw new AppError('BAD_REQUEST', `Unknown roles: ${missing.join(', ')}`, {
      issues: missing.map((name) => ({ path: ['roles'], message: `unknown role ${name}` })),
    });
  // Two spellings of one role are one role.
  const ids = [...new Set(rows.map((r) => r.id!))];
  return em.find(Role, { id: { $in: ids }, organization: organizationId });
}
