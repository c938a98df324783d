import { execFileSync } from 'node:child_process';
import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope, Scope } from '../../deps.ts';
import { packageVersion } from '../../version.ts';
import { ALL_PERMISSIONS, PERMISSIONS, isPermission } from '../../auth/permissions.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import {
  createUser,
  deleteUserOf,
  grantsAdministration,
  isCaller,
  keepingAnAdministrator,
  resolveRoles,
  setPassword,
  updateUserOf,
} from '../users/users.service.ts';
import { assertNameFree, flushNamed, ROLE_NAMES } from '../users/names.ts';
import { Role, type RoleEntity } from '../users/users.entity.ts';

interface RoleHolders {
  users: number;
  service_accounts: number;
}

/** The one view of a role: every answer (list, create, update) counts its holders the same way. */
function roleView(role: RoleEntity, holders: RoleHolders | undefined) {
  return {
    id: role.id,
    name: role.name,
    description: role.description,
    permissions: role.permissions,
    is_builtin: role.isBuiltin,
    user_count: holders?.users ?? 0,
    service_account_count: holders?.service_accounts ?? 0,
    created_at: role.createdAt,
    updated_at: role.updatedAt,
  };
}

/** How many users and service accounts hold each role of the organization (or only the one given). */
async function roleHolders(
  em: EntityManager,
  organization: string,
  roleId?: number,
): Promise<Map<number, RoleHolders>> {
  const rows: ({ role_id: number } & RoleHolders)[] = await em.execute(
    `select r.id as role_id,
        (select count(*) from user_roles ur where ur.role_id = r.id)::int as users,
        (select count(*) from service_account_roles sr where sr.role_id = r.id)::int as service_accounts
      from roles r where r.organization_id = ?${roleId === undefined ? '' : ' and r.id = ?'}`,
    roleId === undefined ? [organization] : [organization, roleId],
  );
  return new Map(rows.map((r) => [r.role_id, r]));
}

async function roleAnswer(em: EntityManager, role: RoleEntity) {
  return roleView(role, (await roleHolders(em, role.organization.id, role.id)).get(role.id));
}

function validatePermissions(permissions: string[]): string[] {
  const unknown = permissions.filter((p) => !isPermission(p));
  if (unknown.length)
    throw new AppError('BAD_REQUEST', `Unknown permissions: ${unknown.join(', ')}`, {
      issues: unknown.map((p) => ({ path: ['permissions'], message: `unknown permission ${p}` })),
    });
  return [...new Set(permissions)];
}

export function listPermissions() {
  return { permissions: ALL_PERMISSIONS.map((name) => ({ name, description: PERMISSIONS[name] })) };
}

// ---- users of the caller's organization ----

/**
 * The rows pass straight through to the answer, so they are read as rows, not entities: hydrating 20
 * users with their role collections cost more CPU than the whole rest of the request (bench/routes.ts).
 * One statement answers the page, each user's role names and the total.
 */
export async function listUsers(scope: CallerScope, page: { limit: number; offset: number }) {
  const organization = organizationOf(scope.principal);
  const rows: UserRow[] = await scope.em.execute(
    `select u.id, u.username, u.email, u.organization_id, u.is_super_admin, u.is_active, u.must_change_password,
        u.last_login_at, u.created_at, u.updated_at, count(*) over () as total,
        coalesce((select array_agg(r.name order by r.id) from user_roles ur join roles r on r.id = ur.role_id
          where ur.user_id = u.id), '{}') as roles
      from users u where u.organization_id = ? order by u.username limit ? offset ?`,
    [organization, page.limit, page.offset],
  );
  const total = rows.length
    ? Number(rows[0].total)
    : Number(
        (
          await scope.em.execute('select count(*) as n from users where organization_id = ?', [organization])
        )[0].n,
      );
  return {
    users: rows.map((u) => ({
      id: u.id,
      username: u.username,
      email: u.email,
      organization_id: u.organization_id,
      is_super_admin: u.is_super_admin,
      is_active: u.is_active,
      must_change_password: u.must_change_password,
      roles: u.roles,
      last_login_at: u.last_login_at === null ? null : new Date(u.last_login_at),
      created_at: new Date(u.created_at),
      updated_at: new Date(u.updated_at),
    })),
    total,
  };
}

interface UserRow {
  id: string;
  username: string;
  email: string | null;
  organization_id: string | null;
  is_super_admin: boolean;
  is_active: boolean;
  must_change_password: boolean;
  /** Timestamps arrive as PostgreSQL's text (MikroORM's type parsers). */
  last_login_at: string | null;
  created_at: string;
  updated_at: string;
  total: string;
  roles: string[];
}

export async function createOrganizationUser(
  scope: CallerScope,
  input: {
    username: string;
    email?: string;
    password?: string;
    roles: string[];
    must_change_password: boolean;
  },
) {
  return createUser(scope, {
    ...input,
    organizationId: organizationOf(scope.principal),
    isSuperAdmin: false,
  });
}

export async function updateOrganizationUser(
  scope: CallerScope,
  input: { user_id: string; email?: string | null; is_active?: boolean; must_change_password?: boolean },
) {
  if (input.is_active === false && isCaller(scope, input.user_id))
    throw new AppError('BAD_REQUEST', 'You cannot deactivate yourself');
  return updateUserOf(scope, organizationOf(scope.principal), input);
}

export async function setUserRoles(scope: CallerScope, input: { user_id: string; roles: string[] }) {
  const organization = organizationOf(scope.principal);
  // Checked on what the roles grant, not their names: a custom role with org.admin counts, and
  // `admin` is only one of the roles that can grant it.
  if (
    isCaller(scope, input.user_id) &&
    !(await resolveRoles(scope.em, organization, input.roles)).some(grantsAdministration)
  )
    throw new AppError(
      'BAD_REQUEST',
      'You cannot take org.admin away from yourself: keep a role that grants it (another administrator can change your roles)',
    );
  return updateUserOf(scope, organization, { user_id: input.user_id, roles: input.roles });
}

export async function deleteOrganizationUser(scope: CallerScope, userId: string) {
  if (isCaller(scope, userId)) throw new AppError('BAD_REQUEST', 'You cannot delete yourself');
  await deleteUserOf(scope, organizationOf(scope.principal), userId);
  return { success: true as const };
}

/** Super admin: any user's password (the user must change it at next login unless told otherwise). */
export async function setUserPassword(
  scope: Scope,
  input: { user_id: string; password: string; must_change_password: boolean },
) {
  await setPassword(scope, input.user_id, input.password, input.must_change_password);
  return { success: true as const };
}

// ---- roles ----

async function findRole(scope: CallerScope, roleId: number): Promise<RoleEntity> {
  const role = await scope.em.findOne(Role, { id: roleId, organization: organizationOf(scope.principal) });
  if (!role) throw notFound('Role');
  return role;
}

export async function listRoles(scope: CallerScope) {
  const organization = organizationOf(scope.principal);
  const roles = await scope.em.find(Role, { organization }, { orderBy: { id: 'asc' } });
  const holders = await roleHolders(scope.em, organization);
  return { roles: roles.map((r) => roleView(r, holders.get(r.id))) };
}

export async function createRole(
  scope: CallerScope,
  input: { name: string; description?: string; permissions: string[] },
) {
  const organization = organizationOf(scope.principal);
  await assertNameFree(scope.em, ROLE_NAMES, input.name, { organizationId: organization });
  const role = scope.em.create(Role, {
    organization,
    name: input.name,
    description: input.description ?? '',
    permissions: validatePermissions(input.permissions),
    isBuiltin: false,
  });
  await flushNamed(scope.em, ROLE_NAMES, input.name);
  return roleView(role, undefined);
}

function assertEditable(role: RoleEntity) {
  if (role.isBuiltin) throw new AppError('BAD_REQUEST', `The built-in role ${role.name} cannot be changed`);
}

export async function updateRole(
  scope: CallerScope,
  input: { role_id: number; name?: string; description?: string },
) {
  const role = await findRole(scope, input.role_id);
  assertEditable(role);
  if (input.name && input.name !== role.name) {
    await assertNameFree(scope.em, ROLE_NAMES, input.name, {
      organizationId: role.organization.id,
      except: role.id,
    });
    role.name = input.name;
  }
  if (input.description !== undefined) role.description = input.description;
  await flushNamed(scope.em, ROLE_NAMES, role.name);
  return roleAnswer(scope.em, role);
}

export async function setRolePermissions(
  scope: CallerScope,
  input: { role_id: number; permissions: string[] },
) {
  const permissions = validatePermissions(input.permissions);
  const answer = await keepingAnAdministrator(scope, organizationOf(scope.principal), async (tx) => {
    const role = await findRole(tx, input.role_id);
    assertEditable(role);
    role.permissions = permissions;
    await tx.em.flush();
    return roleAnswer(tx.em, role);
  });
  scope.deps.authenticator.forget();
  return answer;
}

/** Names shown in the refusal to delete a role in use; the counts are always whole. */
const HOLDERS_NAMED = 5;

export async function deleteRole(scope: CallerScope, roleId: number) {
  await keepingAnAdministrator(scope, organizationOf(scope.principal), async (tx) => {
    const role = await findRole(tx, roleId);
    if (role.isBuiltin) throw new AppError('BAD_REQUEST', `The built-in role ${role.name} cannot be deleted`);
    // Deleting a role in use would take its permissions from its holders without a word; read under the
    // organization's lock, so an assignment cannot slip in between this count and the delete.
    const [held] = await tx.em.execute(
      `select (select count(*) from user_roles where role_id = ?)::int as users,
          (select count(*) from service_account_roles where role_id = ?)::int as service_accounts,
          array(select u.username from user_roles ur join users u on u.id = ur.user_id
            where ur.role_id = ? order by u.username limit ?) as user_names,
          array(select sa.name from service_account_roles sr join service_accounts sa on sa.id = sr.service_account_id
            where sr.role_id = ? order by sa.name limit ?) as service_account_names`,
      [role.id, role.id, role.id, HOLDERS_NAMED, role.id, HOLDERS_NAMED],
    );
    const holders = [
      holdersText(held.users, 'user', held.user_names),
      holdersText(held.service_accounts, 'service account', held.service_account_names),
    ].filter(Boolean);
    if (holders.length)
      throw new AppError(
        'CONFLICT',
        `The role ${role.name} is held by ${holders.join(' and ')}: take it from them first ` +
          '(PUT /api/admin/users/{user_id}/roles, PATCH /api/api/service-accounts/{account_id}), then delete it',
        { reason: 'ROLE_IN_USE' },
      );
    tx.em.remove(role);
  });
  scope.deps.authenticator.forget();
  return { success: true as const };
}

/** '2 users (ana, bo)', '7 users (ana, bo, cy, di, ed and 2 more)'; empty for none. */
function holdersText(count: number, noun: string, names: string[]): string {
  if (count === 0) return '';
  const more = count > names.length ? ` and ${count - names.length} more` : '';
  return `${count} ${noun}${count === 1 ? '' : 's'} (${names.join(', ')}${more})`;
}

// ---- system information ----

let gitCommit: string | null | undefined;
function deploymentCommit(configured?: string): string | null {
  if (configured) return configured;
  if (gitCommit === undefined) {
    try {
      gitCommit = execFileSync('git', ['rev-parse', 'HEAD'], { stdio: ['ignore', 'pipe', 'ignore'] })
        .toString()
        .trim();
    } catch {
      gitCommit = null;
    }
  }
  return gitCommit;
}

export async function systemInfo(scope: Scope) {
  const [row] = await scope.em.execute('select version() as version');
  return {
    version: packageVersion,
    git_commit: deploymentCommit(scope.deps.env.GIT_COMMIT),
    started_at: scope.deps.startedAt,
    uptime_seconds: Math.round((Date.now() - scope.deps.startedAt.getTime()) / 1000),
    database: { kind: scope.deps.dbKind, version: String(row.version) },
    node_version: process.version,
    platform: `${process.platform}-${process.arch}`,
  };
}
