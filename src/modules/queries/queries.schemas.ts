import { z } from 'zod';
import { pageInput, timestamp } from '../../trpc/common-schemas.ts';
import { QUERY_VISIBILITIES } from './queries.entity.ts';

const name = z.string().trim().min(1).max(200);
const description = z.string().max(5000);
const sql = z
  .string()
  .min(1)
  .max(100_000)
  .describe('One read-only statement (SELECT / WITH / VALUES / EXPLAIN), checked on save');
const schemaIdentifier = z
  .string()
  .trim()
  .min(1)
  .max(200)
  .describe('The schema the query targets, e.g. the target schema name "customer_360"');
const visibility = z
  .enum(QUERY_VISIBILITIES)
  .describe('private: the owner only; shared: every member of the organization (read-only for them)');

export const queryIdInput = z.object({ query_id: z.string().min(1).max(64) });

export const listQueriesInput = z.object({
  schema_identifier: schemaIdentifier.optional().describe('Only queries targeting this schema'),
  ...pageInput,
});

export const createQueryInput = z.object({
  name,
  description: description.default(''),
  sql,
  schema_identifier: schemaIdentifier.nullable().optional(),
  visibility: visibility.default('private'),
});

export const updateQueryInput = queryIdInput.extend({
  name: name.optional(),
  description: description.optional(),
  sql: sql.optional(),
  schema_identifier: schemaIdentifier.nullable().optional(),
  visibility: visibility.optional(),
});

export const queryOutput = z.object({
  id: z.string(),
  name: z.string(),
  description: z.string(),
  sql: z.string(),
  schema_identifier: z.string().nullable(),
  visibility: visibility,
  owner: z.object({ id: z.string(), name: z.string() }),
  is_owner: z.boolean().describe('The caller owns the query'),
  can_edit: z.boolean().describe('The caller may update or delete it (owner or org.admin)'),
  created_at: timestamp,
  updated_at: timestamp,
});

export const listQueriesOutput = z.object({
  queries: z.array(queryOutput),
  total: z.number().int(),
  limit: z.number().int(),
  offset: z.number().int(),
});
