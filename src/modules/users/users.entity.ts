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
  uniques: [{ properties: ['organization', 'username'] }],
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
  uniques: [{ properties: ['organization', 'name'] }],
});

export type RoleEntity = InferEntity<typeof Role>;

export type OrganizationEntity = InferEntity<typeof Organization>;

export type UserEntity = InferEntity<typeof User>;
