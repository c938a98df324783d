import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps } from '../../db/base-entity.ts';
import { Organization } from '../auth/auth.entity.ts';

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
