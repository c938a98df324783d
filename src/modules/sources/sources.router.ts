import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import { z } from 'zod';
import * as s from './sources.schemas.ts';
import * as sources from './sources.service.ts';

const tag = 'sources';
const read = permissionProcedure('workspace.read');
const base = '/api/sources';

export const sourcesRouter = router({
  unifiedSchema: read
    .meta(
      rest(
        'GET',
        `${base}/unified-schema`,
        'Unified source schema in a consistent format, CTEs listed first',
        tag,
      ),
    )
    .input(s.unifiedSchemaInput)
    .output(s.unifiedSchemaOutput)
    .query(({ ctx, input }) => sources.unifiedSchema(ctx, input)),

  sourceSchema: read
    .meta(rest('GET', `${base}/source-schema`, 'Source schema restricted to the selected tables', tag))
    .input(z.object({}))
    .output(s.sourceSchemaOutput)
    .query(({ ctx }) => sources.sourceSchema(ctx)),

  executeQuery: permissionProcedure('sql.execute')
    .meta(
      rest(
        'POST',
        `${base}/execute-query`,
        "Execute a read-only SQL query against the workspace's source database",
        tag,
      ),
    )
    .input(s.executeQueryInput)
    .output(s.executeQueryOutput)
    .mutation(({ ctx, input }) => sources.executeQuery(ctx, input)),

  sampleValues: read
    .meta(
      rest(
        'GET',
        `${base}/sample-values/{table_name}/{column_name}`,
        'Sample values of a column, most frequent first',
        tag,
      ),
    )
    .input(s.sampleValuesInput)
    .output(s.sampleValuesOutput)
    .query(({ ctx, input }) => sources.sampleValues(ctx, input)),
});
