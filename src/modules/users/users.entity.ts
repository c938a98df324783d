import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';

// Organizations, their people and their roles: what sign-in (auth) and administration (admin) share.

export const Organization = defineEntity({
  name: 'Organization',
  tableName: 'organizations',
  properties: {
    id: uuidPrimaryKey(),
    name: p.string(),
    domain: p.string().unique(),
    ...timestamps(),
  },
  // Names are compared regardless of case (names.ts); migration case_insensitive_organization_and_account_names.
  uniques: [
    {
      name: 'organizations_lower_name_unique',
      expression: 'create unique index "organizations_lower_name_unique" on "organizations" (lower("name"))',
    },
  ],
});

/** A person who signs in. Super admins belong to no organization. */
export const User = defineEntity({
  name: 'User',
  tableName: 'users',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).nullable().deleteRule('cascade'),
    username: p.string(),
    email: p.string().nullable(),
    passwordHash: p.text().hidden(),
    isSuperAdmin: p.boolean().default(false),
    mustChangePassword: p.boolean().default(false),
    isActive: p.boolean().default(true),
    preferences: p.json<Record<string, unknown>>().onCreate(() => ({})),
    lastLoginAt: p.datetime().nullable(),
    roles: () => p.manyToMany(Role).pivotTable('user_roles'),
    ...timestamps(),
  },
  // Usernames are compared regardless of case (names.ts); migration case_insensitive_names.
  uniques: [
    {
      name: 'users_organization_id_lower_username_unique',
      expression:
        'create unique index "users_organization_id_lower_username_unique" on "users" ("organization_id", lower("username")) where "organization_id" is not null',
    },
    {
      name: 'users_super_admin_lower_username_unique',
      expression:
        'create unique index "users_super_admin_lower_username_unique" on "users" (lower("username")) where "organization_id" is null',
    },
  ],
});

/** A named set of permissions inside one organization; built-in roles cannot be deleted. */
export const Role = defineEntity({
  name: 'Role',
  tableName: 'roles',
  properties: {
    id: p.integer().primary().autoincrement(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    name: p.string(),
    description: p.text().default(''),
    permissions: p.array(),
    isBuiltin: p.boolean().default(false),
    ...timestamps(),
  },
  uniques: [
    {
      name: 'roles_organization_id_lower_name_unique',
      expression:
        'create unique index "roles_organization_id_lower_name_unique" on "roles" ("organization_id", lower("name"))',
    },
  ],
});

export type RoleEntity = InferEntity<typeof Role>;

export type OrganizationEntity = InferEntity<typeof Organization>;

export type UserEntity = InferEntity<typeof User>;
