import { execFileSync } from 'node:child_process';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope, Scope } from '../../deps.ts';
import { packageVersion } from '../../version.ts';
import { ALL_PERMISSIONS, PERMISSIONS, isPermission } from '../../auth/permissions.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { createUser, deleteUserOf, setPassword, updateUserOf, violates } from '../users/users.service.ts';
import { Role, type RoleEntity } from '../users/users.entity.ts';

function roleView(role: RoleEntity, userCount?: number) {
  return {
    id: role.id,
    name: role.name,
    description: role.description,
    permissions: role.permissions,
    is_builtin: role.isBuiltin,
    user_count: userCount ?? 0,
    created_at: role.createdAt,
    updated_at: role.updatedAt,
  };
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
  if (input.is_active === false && input.user_id === scope.principal.id)
    throw new AppError('BAD_REQUEST', 'You cannot deactivate yourself');
  return updateUserOf(scope, organizationOf(scope.principal), input);
}

export async function setUserRoles(scope: CallerScope, input: { user_id: string; roles: string[] }) {
  const organization = organizationOf(scope.principal);
  if (input.user_id === scope.principal.id && !input.roles.includes('admin'))
    throw new AppError('BAD_REQUEST', 'You cannot remove your own admin role');
  return updateUserOf(scope, organization, { user_id: input.user_id, roles: input.roles });
}

export async function deleteOrganizationUser(scope: CallerScope, userId: string) {
  if (userId === scope.principal.id) throw new AppError('BAD_REQUEST', 'You cannot delete yourself');
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
  const counts: { role_id: number; n: number }[] = await scope.em.execute(
    'select ur.role_id, count(*)::int as n from user_roles ur join roles r on r.id = ur.role_id where r.organization_id = ? group by ur.role_id',
    [organization],
  );
  const byRole = new Map(counts.map((c) => [c.role_id, c.n]));
  return { roles: roles.map((r) => roleView(r, byRole.get(r.id))) };
}

/**
 * Role names are one per organization whatever their case (built-in ones included), so `Admin` cannot
 * pass for `admin` in a user list; a unique index on lower(name) backs the check against concurrent
 * requests (migration case_insensitive_names).
 */
const ROLE_NAME_CONSTRAINTS = new Set([
  'roles_organization_id_name_unique',
  'roles_organization_id_lower_name_unique',
]);

const roleNameTaken = (name: string) =>
  new AppError(
    'CONFLICT',
    `A role named ${name} already exists (role names are compared regardless of case)`,
    {
      reason: 'ROLE_NAME_TAKEN',
    },
  );

async function assertRoleNameFree(scope: CallerScope, organization: string, name: string, except?: number) {
  const [{ taken }] = await scope.em.execute(
    'select exists (select 1 from roles where organization_id = ? and lower(name) = lower(?) and id <> ?) as taken',
    [organization, name, except ?? 0],
  );
  if (taken) throw roleNameTaken(name);
}

async function flushRole(scope: CallerScope, name: string) {
  try {
    await scope.em.flush();
  } catch (error) {
    // Another request took the name between the check and this write.
    if (violates(error, ROLE_NAME_CONSTRAINTS)) throw roleNameTaken(name);
    throw error;
  }
}

export async function createRole(
  scope: CallerScope,
  input: { name: string; description?: string; permissions: string[] },
) {
  const organization = organizationOf(scope.principal);
  await assertRoleNameFree(scope, organization, input.name);
  const role = scope.em.create(Role, {
    organization,
    name: input.name,
    description: input.description ?? '',
    permissions: validatePermissions(input.permissions),
    isBuiltin: false,
  });
  await flushRole(scope, input.name);
  return roleView(role);
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
    await assertRoleNameFree(scope, role.organization.id, input.name, role.id);
    role.name = input.name;
  }
  if (input.description !== undefined) role.description = input.description;
  await flushRole(scope, role.name);
  return roleView(role);
}

export async function setRolePermissions(
  scope: CallerScope,
  input: { role_id: number; permissions: string[] },
) {
  const role = await findRole(scope, input.role_id);
  assertEditable(role);
  role.permissions = validatePermissions(input.permissions);
  await scope.em.flush();
  scope.deps.authenticator.forget();
  return roleView(role);
}

export async function deleteRole(scope: CallerScope, roleId: number) {
  const role = await findRole(scope, roleId);
  if (role.isBuiltin) throw new AppError('BAD_REQUEST', `The built-in role ${role.name} cannot be deleted`);
  await scope.em.remove(role).flush();
  scope.deps.authenticator.forget();
  return { success: true as const };
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
