import { z } from 'zod';
import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import * as s from './monitoring.schemas.ts';
import * as monitoring from './monitoring.service.ts';

const tag = 'monitoring';
const read = permissionProcedure('workspace.read');

export const monitoringRouter = router({
  workspaceMetrics: read
    .meta(
      rest(
        'GET',
        '/api/monitoring/metrics/workspace',
        "Data-quality metrics of the current workspace's target tables (one scan per table; stored for trends)",
        tag,
      ),
    )
    .input(s.workspaceMetricsInput)
    .output(s.metricsOutput)
    .query(({ ctx, input }) => monitoring.workspaceMetrics(ctx, input)),

  datasourceMetrics: read
    .meta(
      rest(
        'GET',
        '/api/monitoring/metrics/datasource/{config_name}',
        'Data-quality metrics of a data source: source, target or a reverse-ETL connection',
        tag,
      ),
    )
    .input(s.datasourceMetricsInput)
    .output(s.metricsOutput)
    .query(({ ctx, input }) => monitoring.datasourceMetrics(ctx, input.config_name)),

  identityGraph: read
    .meta(
      rest(
        'GET',
        '/api/monitoring/identity-graph/workspace',
        'Identity-graph statistics of the current workspace, or that it was never built',
        tag,
      ),
    )
    .input(s.identityGraphInput)
    .output(s.identityGraphOutput)
    .query(({ ctx, input }) => monitoring.identityGraphWorkspace(ctx, input)),

  createIdentitySchema: permissionProcedure('pipeline.run')
    .meta(
      rest(
        'POST',
        '/api/monitoring/identity-graph/create-schema',
        'Create the identity-resolution tables in the target warehouse (idempotent) and queue a build',
        tag,
      ),
    )
    .input(z.object({}))
    .output(s.createIdentitySchemaOutput)
    .mutation(({ ctx }) => monitoring.createIdentityGraphSchema(ctx)),
});
