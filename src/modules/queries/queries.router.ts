import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import { successOutput } from '../../trpc/common-schemas.ts';
import * as s from './queries.schemas.ts';
import * as queries from './queries.service.ts';

const tag = 'queries';
const read = permissionProcedure('workspace.read');
const write = permissionProcedure('workspace.write');
const base = '/api/queries';

export const queriesRouter = router({
  list: read
    .meta(rest('GET', base, 'List saved queries visible to the current user (own and shared)', tag))
    .input(s.listQueriesInput)
    .output(s.listQueriesOutput)
    .query(({ ctx, input }) => queries.listQueries(ctx, input)),

  create: write
    .meta(rest('POST', base, 'Create a saved query (the SQL is checked to be one read-only statement)', tag))
    .input(s.createQueryInput)
    .output(s.queryOutput)
    .mutation(({ ctx, input }) => queries.createQuery(ctx, input)),

  get: read
    .meta(rest('GET', `${base}/{query_id}`, 'Get a saved query', tag))
    .input(s.queryIdInput)
    .output(s.queryOutput)
    .query(({ ctx, input }) => queries.getQuery(ctx, input.query_id)),

  update: write
    .meta(rest('PUT', `${base}/{query_id}`, 'Update a saved query (owner or org.admin)', tag))
    .input(s.updateQueryInput)
    .output(s.queryOutput)
    .mutation(({ ctx, input }) => queries.updateQuery(ctx, input)),

  delete: write
    .meta(rest('DELETE', `${base}/{query_id}`, 'Delete a saved query (owner or org.admin)', tag))
    .input(s.queryIdInput)
    .output(successOutput)
    .mutation(({ ctx, input }) => queries.deleteQuery(ctx, input.query_id)),
});
