import { z } from 'zod';
import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import * as s from './pipelines.schemas.ts';
import * as pipelines from './pipelines.service.ts';

const tag = 'pipelines';
const read = permissionProcedure('workspace.read');
const run = permissionProcedure('pipeline.run');
const base = '/api/pipelines';

export const pipelinesRouter = router({
  generateProject: run
    .meta(
      rest(
        'POST',
        `${base}/generate-project`,
        'Generate the transformation project (dbt-compatible) from the committed mappings',
        tag,
      ),
    )
    .input(s.generateInput)
    .output(s.generateOutput)
    .mutation(({ ctx, input }) => pipelines.generateProject(ctx, input)),

  status: read
    .meta(rest('GET', `${base}/status`, 'Status of transformation project generation', tag))
    .input(z.object({}))
    .output(s.statusOutput)
    .query(({ ctx }) => pipelines.projectStatus(ctx)),

  model: read
    .meta(rest('GET', `${base}/model/{table_name}`, 'Model SQL of a table', tag))
    .input(s.modelInput)
    .output(s.modelOutput)
    .query(({ ctx, input }) => pipelines.modelSql(ctx, input.table_name)),

  driftStatus: read
    .meta(
      rest(
        'GET',
        `${base}/drift-status`,
        'Whether the project is out of sync with the committed mappings and the schema, and which tables changed',
        tag,
      ),
    )
    .input(z.object({}))
    .output(s.driftOutput)
    .query(({ ctx }) => pipelines.driftStatus(ctx)),

  testModel: run
    .meta(
      rest(
        'POST',
        `${base}/test-model`,
        'Run a model on sampled source rows into a temporary table and run its tests',
        tag,
      ),
    )
    .input(s.testModelInput)
    .output(s.testModelOutput)
    .mutation(({ ctx, input }) => pipelines.testModel(ctx, input)),

  deleteProject: run
    .meta(
      rest('DELETE', `${base}/project`, 'Delete the transformation project of the current workspace', tag),
    )
    .input(z.object({}))
    .output(s.deleteOutput)
    .mutation(({ ctx }) => pipelines.deleteProject(ctx)),
});
