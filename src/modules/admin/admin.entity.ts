import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization, User } from '../users/users.entity.ts';

// ---- organization settings: caches, feature flags, version control (issue 10) ----

/** The organization's cache settings: per cache name `{ enabled, ttl_seconds, max_entries }`; unset = default. */
export const CacheSettings = defineEntity({
  name: 'CacheSettings',
  tableName: 'cache_settings',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    caches: p.json<Record<string, Record<string, unknown>>>(),
    ...timestamps(),
  },
  uniques: [{ properties: ['organization'] }],
});

/** The organization's feature flags (name → on/off; unset = the catalogue default). */
export const FeatureSettings = defineEntity({
  name: 'FeatureSettings',
  tableName: 'feature_settings',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    features: p.json<Record<string, boolean>>(),
    allowUserOverrides: p.boolean().default(true),
    ...timestamps(),
  },
  uniques: [{ properties: ['organization'] }],
});

/** One user's overrides of overridable features; the organization is kept for the tenant filter. */
export const UserFeatureOverride = defineEntity({
  name: 'UserFeatureOverride',
  tableName: 'user_feature_overrides',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    user: () => p.manyToOne(User).deleteRule('cascade'),
    overrides: p.json<Record<string, boolean>>(),
    ...timestamps(),
  },
  uniques: [{ properties: ['user'] }],
});

/** The organization's git remote; the token is sealed by deps.secrets and never leaves the server. */
export const VcsConfig = defineEntity({
  name: 'VcsConfig',
  tableName: 'vcs_configs',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    enabled: p.boolean().default(true),
    url: p.text(),
    branch: p.string(),
    authorName: p.string(),
    authorEmail: p.string(),
    pathPrefix: p.text().default(''),
    username: p.string(),
    tokenEncrypted: p.text().nullable().hidden(),
    lastPushAt: p.datetime().nullable(),
    lastPushCommit: p.string().nullable(),
    lastPushError: p.text().nullable(),
    ...timestamps(),
  },
  uniques: [{ properties: ['organization'] }],
});

export type VcsConfigEntity = InferEntity<typeof VcsConfig>;
