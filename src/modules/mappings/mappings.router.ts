import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import * as s from './mappings.schemas.ts';
import * as mappings from './mappings.service.ts';
import * as reads from './mappings-read.ts';
import * as code from './mappings-code.service.ts';
import * as tables from './mappings-tables.service.ts';
import * as wildcard from './mappings-wildcard.ts';
// Registers the mappings' part of the workspace files, facts and schema reconciliation.
import './mappings-files.ts';

const tag = 'mappings';
const read = permissionProcedure('workspace.read');
const write = permissionProcedure('workspace.write');
const run = permissionProcedure('pipeline.run');
const base = '/api/mappings';

/* Static paths (batch/transform-code, resolve-ambiguity, clear-all) come before /{table_name}. */
export const mappingsRouter = router({
  list: read
    .meta(rest('GET', base, 'All mapping files of the current workspace', tag))
    .input(s.listInput)
    .output(s.listOutput)
    .query(({ ctx, input }) => reads.listMappings(ctx, input)),

  batchTransformCode: write
    .meta(
      rest(
        'POST',
        `${base}/batch/transform-code`,
        'Generated transformation SQL for several tables in one call',
        tag,
      ),
    )
    .input(s.batchInput)
    .output(s.batchOutput)
    .mutation(({ ctx, input }) => code.batchTransformCode(ctx, input)),

  resolveAmbiguity: write
    .meta(
      rest(
        'POST',
        `${base}/resolve-ambiguity`,
        'Resolve an ambiguity in the mapping: the chosen candidate (or none) becomes a confirmed connection',
        tag,
      ),
    )
    .input(s.resolveInput)
    .output(s.mappingOutput)
    .mutation(({ ctx, input }) => mappings.resolveAmbiguity(ctx, input)),

  clearAll: write
    .meta(
      rest(
        'DELETE',
        `${base}/clear-all`,
        'Clear all mappings of the current workspace; confirm_workspace_name must repeat the workspace name',
        tag,
      ),
    )
    .input(s.clearAllInput)
    .output(s.clearAllOutput)
    .mutation(({ ctx, input }) => mappings.clearAll(ctx, input)),

  get: read
    .meta(
      rest(
        'GET',
        `${base}/{table_name}`,
        'Complete mapping file of a table with transformations and metadata',
        tag,
      ),
    )
    .input(s.tableNameParam)
    .output(s.mappingOutput)
    .query(({ ctx, input }) => reads.getMapping(ctx, input.table_name)),

  transformCode: read
    .meta(
      rest('GET', `${base}/{table_name}/transform-code`, 'Generated transformation SQL for the table', tag),
    )
    .input(s.tableNameParam)
    .output(s.transformCodeOutput)
    .query(({ ctx, input }) => code.transformCode(ctx, input.table_name)),

  fieldTransform: read
    .meta(
      rest(
        'GET',
        `${base}/{table_name}/field-transform/{target_field}`,
        'Current SQL expression of one field',
        tag,
      ),
    )
    .input(s.fieldParam)
    .output(s.fieldTransformOutput)
    .query(({ ctx, input }) => code.fieldTransform(ctx, input)),

  tables: read
    .meta(rest('GET', `${base}/{table_name}/tables`, 'All table relationships of a mapping', tag))
    .input(s.tableNameParam)
    .output(s.tablesOutput)
    .query(({ ctx, input }) => tables.getTables(ctx, input.table_name)),

  setTable: write
    .meta(
      rest(
        'POST',
        `${base}/{table_name}/tables`,
        'Add or update a table relationship (primary, or a join with type and ON expression)',
        tag,
      ),
    )
    .input(s.tableInput)
    .output(s.tablesOutput)
    .mutation(({ ctx, input }) => tables.setTable(ctx, input)),

  validateTables: write
    .meta(
      rest(
        'POST',
        `${base}/{table_name}/tables/validate`,
        'Validate table relationships: every problem, not only the first',
        tag,
      ),
    )
    .input(s.tableNameParam)
    .output(s.validateOutput)
    .mutation(({ ctx, input }) => tables.validateTables(ctx, input.table_name)),

  removeTable: write
    .meta(
      rest(
        'DELETE',
        `${base}/{table_name}/tables/{source_table}`,
        'Remove a table relationship and the connections from that table',
        tag,
      ),
    )
    .input(s.sourceTableParam)
    .output(s.removeTableOutput)
    .mutation(({ ctx, input }) => tables.removeTable(ctx, input)),

  wildcardEffective: read
    .meta(
      rest(
        'GET',
        `${base}/{table_name}/wildcard/effective`,
        'Effective field mappings of a wildcard table-to-table mapping (explicit connections win)',
        tag,
      ),
    )
    .input(s.tableNameParam)
    .output(s.wildcardOutput)
    .query(({ ctx, input }) => wildcard.effectiveWildcard(ctx, input.table_name)),

  generateCode: write
    .meta(
      rest(
        'POST',
        `${base}/{table_name}/generate-code`,
        'Generate Python mapping code (standard library, CSV in and out) for the table',
        tag,
      ),
    )
    .input(s.tableNameParam)
    .output(s.generateCodeOutput)
    .mutation(({ ctx, input }) => code.generateCode(ctx, input.table_name)),

  setConnection: write
    .meta(
      rest(
        'POST',
        `${base}/{table_name}/connection`,
        'Create or update a connection between a source field and a target field',
        tag,
      ),
    )
    .input(s.connectionInput)
    .output(s.mappingOutput)
    .mutation(({ ctx, input }) => mappings.addConnection(ctx, input)),

  deleteConnection: write
    .meta(rest('DELETE', `${base}/{table_name}/connection`, 'Delete a field connection', tag))
    .input(s.deleteConnectionInput)
    .output(s.mappingOutput)
    .mutation(({ ctx, input }) => mappings.deleteConnection(ctx, input)),

  setTransformation: write
    .meta(
      rest(
        'POST',
        `${base}/{table_name}/transformation`,
        'Add or update the SQL expression of a target field',
        tag,
      ),
    )
    .input(s.transformationInput)
    .output(s.mappingOutput)
    .mutation(({ ctx, input }) => mappings.setTransformation(ctx, input)),

  deleteTransformation: write
    .meta(
      rest(
        'DELETE',
        `${base}/{table_name}/transformation/{target_field}`,
        'Delete the transformation of a field',
        tag,
      ),
    )
    .input(s.fieldParam)
    .output(s.mappingOutput)
    .mutation(({ ctx, input }) => mappings.deleteTransformation(ctx, input)),

  preview: write
    .meta(
      rest(
        'POST',
        `${base}/{table_name}/preview-transformation`,
        'Run the SQL of one field (or of the whole table) on a sample of source rows',
        tag,
      ),
    )
    .input(s.previewInput)
    .output(s.previewOutput)
    .mutation(({ ctx, input }) => code.previewTransformation(ctx, input)),

  diff: write
    .meta(
      rest(
        'POST',
        `${base}/{table_name}/transformation-diff`,
        'What a commit would change: unified SQL diff and a data diff on a sample',
        tag,
      ),
    )
    .input(s.diffInput)
    .output(s.diffOutput)
    .mutation(({ ctx, input }) => code.transformationDiff(ctx, input)),

  commit: write
    .meta(
      rest(
        'POST',
        `${base}/{table_name}/commit-transformation`,
        'Commit the transformation: a new committed version, in the workspace files and git-diff',
        tag,
      ),
    )
    .input(s.commitInput)
    .output(s.commitOutput)
    .mutation(({ ctx, input }) => code.commitTransformation(ctx, input)),

  materialize: run
    .meta(
      rest(
        'POST',
        `${base}/{table_name}/materialize`,
        'Materialize the committed transformation into the target table (a job: run_id and status at once)',
        tag,
      ),
    )
    .input(s.tableNameParam)
    .output(s.materializeOutput)
    .mutation(({ ctx, input }) => code.materialize(ctx, input.table_name)),
});
