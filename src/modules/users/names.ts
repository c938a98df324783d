import { UniqueConstraintViolationException } from '@mikro-orm/core';
import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError } from '../../app-error.ts';

/**
 * The one identity of names: an organization's name (across the installation), a username (per
 * organization, and among super admins), a role's name and a service account's name (per organization)
 * are one name whatever their case. Two spellings of one name would be two rows a person cannot tell
 * apart (the login page's organization list, a user's roles) and, for usernames, one login for two people.
 *
 * Names are compared in SQL by lower(…), the expression of the unique indexes that back every rule
 * (migrations case_insensitive_names and case_insensitive_organization_and_account_names), never in
 * JavaScript, whose lowercasing differs from PostgreSQL's outside ASCII: a check, a lookup and the index
 * cannot disagree. Names arrive trimmed (the input schemas), so spaces around a name are no part of it.
 */
export interface NameRule {
  /** Where the names live: constants of this module, never input. */
  readonly table: string;
  readonly column: string;
  /** One per organization (organization_id; null: among rows without one), else one in the table. */
  readonly perOrganization: boolean;
  /** The unique indexes on lower(column): their violation means a concurrent request took the name. */
  readonly indexes: ReadonlySet<string>;
  taken(name: string): AppError;
}

/** The condition that a column holds a name: a parameter by default, or another column. */
export const sameName = (column: string, value = '?') => `lower(${column}) = lower(${value})`;

const compared = 'compared regardless of case';

export const ORGANIZATION_NAMES: NameRule = {
  table: 'organizations',
  column: 'name',
  perOrganization: false,
  indexes: new Set(['organizations_lower_name_unique']),
  taken: (name) =>
    new AppError(
      'CONFLICT',
      `An organization named ${name} already exists (organization names are ${compared})`,
      {
        reason: 'ORGANIZATION_NAME_TAKEN',
      },
    ),
};

/**
 * Login matches usernames regardless of case and the failed-login counter counts them lowercased, so two
 * spellings would be one person's lockout and another's login.
 */
export const USERNAMES: NameRule = {
  table: 'users',
  column: 'username',
  perOrganization: true,
  indexes: new Set([
    'users_organization_id_lower_username_unique',
    'users_super_admin_lower_username_unique',
  ]),
  taken: (name) =>
    new AppError('CONFLICT', `The username ${name} is taken (usernames are ${compared})`, {
      reason: 'USERNAME_TAKEN',
    }),
};

/** Built-in roles included: `Admin` cannot pass for `admin` in a user list. */
export const ROLE_NAMES: NameRule = {
  table: 'roles',
  column: 'name',
  perOrganization: true,
  indexes: new Set(['roles_organization_id_lower_name_unique']),
  taken: (name) =>
    new AppError('CONFLICT', `A role named ${name} already exists (role names are ${compared})`, {
      reason: 'ROLE_NAME_TAKEN',
    }),
};

export const SERVICE_ACCOUNT_NAMES: NameRule = {
  table: 'service_accounts',
  column: 'name',
  perOrganization: true,
  indexes: new Set(['service_accounts_organization_id_lower_name_unique']),
  taken: (name) =>
    new AppError(
      'CONFLICT',
      `A service account named ${name} already exists (service-account names are ${compared})`,
      { reason: 'SERVICE_ACCOUNT_NAME_TAKEN' },
    ),
};

/**
 * Whether another row of the rule's scope holds the name in any case; `except` is the row being
 * renamed, which may change the case of its own name.
 */
export async function nameTaken(
  em: EntityManager,
  rule: NameRule,
  name: string,
  where: { organizationId?: string | null; except?: string | number } = {},
): Promise<boolean> {
  const conditions = [sameName(rule.column)];
  const params: unknown[] = [name];
  if (rule.perOrganization) {
    if (where.organizationId) {
      conditions.push('organization_id = ?');
      params.push(where.organizationId);
    } else conditions.push('organization_id is null');
  }
  if (where.except !== undefined) {
    conditions.push('id <> ?');
    params.push(where.except);
  }
  const [{ taken }] = await em.execute(
    `select exists (select 1 from ${rule.table} where ${conditions.join(' and ')}) as taken`,
    params,
  );
  return Boolean(taken);
}

/** Refuses (409) a name another row holds in any case (see nameTaken). */
export async function assertNameFree(
  em: EntityManager,
  rule: NameRule,
  name: string,
  where: { organizationId?: string | null; except?: string | number } = {},
): Promise<void> {
  if (await nameTaken(em, rule, name, where)) throw rule.taken(name);
}

/** Flushes a write that sets a name: a request that took it since the check answers the same 409. */
export async function flushNamed(em: EntityManager, rule: NameRule, name: string): Promise<void> {
  try {
    await em.flush();
  } catch (error) {
    if (violates(error, rule.indexes)) throw rule.taken(name);
    throw error;
  }
}

/** A unique violation of one of the named constraints (the driver error carries PostgreSQL's name). */
export function violates(error: unknown, constraints: ReadonlySet<string>): boolean {
  return (
    error instanceof UniqueConstraintViolationException &&
    constraints.has(String((error as { constraint?: unknown }).constraint))
  );
}
