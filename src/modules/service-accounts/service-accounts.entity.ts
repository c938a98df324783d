import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization, User } from '../users/users.entity.ts';
import { Role } from '../users/users.entity.ts';

/**
 * A non-human caller with roles like a user. Its key is `dms_<prefix>_<secret>`: the prefix finds the
 * row, sha256 of the whole key proves it. During a rotation's grace period the previous hash still works.
 */
export const ServiceAccount = defineEntity({
  name: 'ServiceAccount',
  tableName: 'service_accounts',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    name: p.string(),
    description: p.text().default(''),
    isActive: p.boolean().default(true),
    keyPrefix: p.string().unique(),
    keyHash: p.string().hidden(),
    keyCreatedAt: p.datetime(),
    keyExpiresAt: p.datetime().nullable(),
    previousKeyPrefix: p.string().nullable().index(),
    previousKeyHash: p.string().nullable().hidden(),
    previousKeyExpiresAt: p.datetime().nullable(),
    lastUsedAt: p.datetime().nullable(),
    createdBy: () => p.manyToOne(User).nullable().deleteRule('set null'),
    roles: () => p.manyToMany(Role).pivotTable('service_account_roles'),
    ...timestamps(),
  },
  // Names are compared regardless of case (users/names.ts).
  uniques: [
    {
      name: 'service_accounts_organization_id_lower_name_unique',
      expression:
        'create unique index "service_accounts_organization_id_lower_name_unique" on "service_accounts" ("organization_id", lower("name"))',
    },
  ],
});

export type ServiceAccountEntity = InferEntity<typeof ServiceAccount>;
