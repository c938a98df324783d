import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../users/users.entity.ts';

export const QUERY_VISIBILITIES = ['private', 'shared'] as const;
export type QueryVisibility = (typeof QUERY_VISIBILITIES)[number];

/**
 * A saved SQL query of an organization. The owner is a user or a service account (both are principals),
 * so it is kept as an id without a foreign key; the name is unique per owner.
 */
export const SavedQuery = defineEntity({
  name: 'SavedQuery',
  tableName: 'saved_queries',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    name: p.string(),
    description: p.text().default(''),
    sql: p.text(),
    schemaIdentifier: p.string().nullable(),
    ownerId: p.uuid(),
    ownerName: p.string(),
    visibility: p.enum(QUERY_VISIBILITIES).default('private'),
    ...timestamps(),
  },
  uniques: [{ properties: ['organization', 'ownerId', 'name'] }],
  indexes: [{ properties: ['organization', 'schemaIdentifier'] }],
});

export type SavedQueryEntity = InferEntity<typeof SavedQuery>;
