import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Role } from '../admin/admin.entity.ts';

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
    preferences: p.json<Record<string, unknown>>().default('{}'),
    lastLoginAt: p.datetime().nullable(),
    roles: () => p.manyToMany(Role).pivotTable('user_roles'),
    ...timestamps(),
  },
  uniques: [{ properties: ['organization', 'username'] }],
});

/** Only sha256(token) is stored, so a leaked table cannot be replayed (the Lucia guide's scheme). */
export const Session = defineEntity({
  name: 'Session',
  tableName: 'sessions',
  properties: {
    id: p.string().primary(),
    user: () => p.manyToOne(User).deleteRule('cascade').index(),
    expiresAt: p.datetime(),
    createdAt: p.datetime().onCreate(() => new Date()),
    ipAddress: p.string().nullable(),
    userAgent: p.text().nullable(),
  },
});

/** Failed logins, counted per username and per address inside a sliding window. */
export const LoginFailure = defineEntity({
  name: 'LoginFailure',
  tableName: 'login_failures',
  properties: {
    id: p.bigint('number').primary().autoincrement(),
    username: p.string().index(),
    ipAddress: p.string().index(),
    at: p.datetime().onCreate(() => new Date()),
  },
});

export type OrganizationEntity = InferEntity<typeof Organization>;

export type UserEntity = InferEntity<typeof User>;

export type SessionEntity = InferEntity<typeof Session>;
