import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import * as s from './schemas.schemas.ts';
import * as schemas from './schemas.service.ts';
import * as q from './quality-configs.schemas.ts';
import * as quality from './quality-configs.service.ts';
import * as ss from './schema-sync.schemas.ts';
import * as sync from './schema-sync.service.ts';
import * as reverseEtl from './reverse-etl.service.ts';

const tag = 'schemas';
const read = permissionProcedure('workspace.read');
const write = permissionProcedure('workspace.write');
const config = '/api/api/schema/config';

export const schemasRouter = router({
  list: read
    .meta(
      rest(
        'GET',
        '/api/schemas',
        'All available schemas: the library and the workspace schemas of the organization',
        tag,
      ),
    )
    .output(s.allSchemasOutput)
    .query(({ ctx }) => schemas.listAllSchemas(ctx)),

  // ---- sync, DDL and reverse-ETL connections (static paths before the parametric ones) ----

  syncStatus: read
    .meta(
      rest(
        'GET',
        '/api/schemas/workspace/sync/status',
        'What differs between schema.json and the target warehouse, with UI indicators (in_sync, pending, drifted, error)',
        tag,
      ),
    )
    .output(ss.syncStatusOutput)
    .query(({ ctx }) => sync.syncStatus(ctx)),

  sync: permissionProcedure('pipeline.run')
    .meta(
      rest(
        'POST',
        '/api/schemas/workspace/sync',
        'Create or alter the target tables to match schema.json in one transaction (drops and retypes only with allow_destructive) and reconcile mappings',
        tag,
      ),
    )
    .input(ss.syncInput)
    .output(ss.syncOutput)
    .mutation(({ ctx, input }) => sync.syncWorkspaceSchema(ctx, input)),

  ddl: read
    .meta(
      rest(
        'GET',
        '/api/schemas/workspace/ddl',
        'DDL for every table of the workspace schema, with optional GRANTs to grant_user (identifiers quoted)',
        tag,
      ),
    )
    .input(ss.ddlInput)
    .output(ss.ddlOutput)
    .query(({ ctx, input }) => sync.workspaceDdl(ctx, input)),

  connections: read
    .meta(
      rest(
        'GET',
        '/api/schemas/workspace/connections',
        'Reverse-ETL connections of the workspace (admin settings key reverse_etl_connections; secrets masked) and the table assignments',
        tag,
      ),
    )
    .output(ss.connectionsOutput)
    .query(({ ctx }) => reverseEtl.listConnections(ctx)),

  assignConnection: write
    .meta(
      rest(
        'PUT',
        '/api/schemas/workspace/tables/{table_name}/connection',
        'Assign a reverse-ETL connection to a table of the workspace schema, or remove it (connection_name null)',
        tag,
      ),
    )
    .input(ss.assignConnectionInput)
    .output(ss.assignConnectionOutput)
    .mutation(({ ctx, input }) => reverseEtl.assignConnection(ctx, input)),

  // ---- column tests, column and table monitoring ----

  configSummary: read
    .meta(
      rest(
        'GET',
        `${config}/summary`,
        'Summary of all column test and monitoring configurations of the workspace',
        tag,
      ),
    )
    .output(q.qualityConfigsSummaryOutput)
    .query(({ ctx }) => quality.qualityConfigsSummary(ctx)),

  columnTestGet: read
    .meta(
      rest(
        'GET',
        `${config}/columns/{table_name}/{column_name}/test`,
        'Test configuration of a column of the target schema',
        tag,
      ),
    )
    .input(q.columnParams)
    .output(q.columnTestOutput)
    .query(({ ctx, input }) => quality.getColumnTest(ctx, input.table_name, input.column_name)),

  columnTestPut: write
    .meta(
      rest(
        'PUT',
        `${config}/columns/{table_name}/{column_name}/test`,
        'Set the tests of a column (not_null, unique, accepted_values, relationships, range, regex); stored on the schema.json column',
        tag,
      ),
    )
    .input(q.columnTestInput)
    .output(q.columnTestOutput)
    .mutation(({ ctx, input }) =>
      quality.putColumnTest(ctx, input.table_name, input.column_name, input.config),
    ),

  columnTestDelete: write
    .meta(
      rest(
        'DELETE',
        `${config}/columns/{table_name}/{column_name}/test`,
        'Delete the test configuration of a column',
        tag,
      ),
    )
    .input(q.columnParams)
    .output(q.columnTestOutput)
    .mutation(({ ctx, input }) => quality.deleteColumnTest(ctx, input.table_name, input.column_name)),

  columnMonitoringGet: read
    .meta(
      rest(
        'GET',
        `${config}/columns/{table_name}/{column_name}/monitoring`,
        'Monitoring configuration of a column (schema_type target or source)',
        tag,
      ),
    )
    .input(q.columnMonitoringParams)
    .output(q.columnMonitoringOutput)
    .query(({ ctx, input }) => quality.getColumnMonitoring(ctx, input)),

  columnMonitoringPut: write
    .meta(
      rest(
        'PUT',
        `${config}/columns/{table_name}/{column_name}/monitoring`,
        'Set the monitoring thresholds of a column (null_rate, distinct, range; each with a severity)',
        tag,
      ),
    )
    .input(q.columnMonitoringInput)
    .output(q.columnMonitoringOutput)
    .mutation(({ ctx, input }) => quality.putColumnMonitoring(ctx, input, input.config)),

  columnMonitoringDelete: write
    .meta(
      rest(
        'DELETE',
        `${config}/columns/{table_name}/{column_name}/monitoring`,
        'Delete the monitoring configuration of a column',
        tag,
      ),
    )
    .input(q.columnMonitoringParams)
    .output(q.columnMonitoringOutput)
    .mutation(({ ctx, input }) => quality.deleteColumnMonitoring(ctx, input)),

  tableMonitoringGet: read
    .meta(
      rest(
        'GET',
        `${config}/tables/{table_name}/monitoring`,
        'Monitoring configuration of a table (schema_type target or source)',
        tag,
      ),
    )
    .input(q.tableMonitoringParams)
    .output(q.tableMonitoringOutput)
    .query(({ ctx, input }) => quality.getTableMonitoring(ctx, input)),

  tableMonitoringPut: write
    .meta(
      rest(
        'PUT',
        `${config}/tables/{table_name}/monitoring`,
        'Set the monitoring thresholds of a table (freshness, volume; each with a severity)',
        tag,
      ),
    )
    .input(q.tableMonitoringInput)
    .output(q.tableMonitoringOutput)
    .mutation(({ ctx, input }) => quality.putTableMonitoring(ctx, input, input.config)),

  tableMonitoringDelete: write
    .meta(
      rest(
        'DELETE',
        `${config}/tables/{table_name}/monitoring`,
        'Delete the monitoring configuration of a table',
        tag,
      ),
    )
    .input(q.tableMonitoringParams)
    .output(q.tableMonitoringOutput)
    .mutation(({ ctx, input }) => quality.deleteTableMonitoring(ctx, input)),

  workspaceGet: read
    .meta(
      rest(
        'GET',
        '/api/schemas/workspace',
        'Content of the workspace schema.json (404 when there is none)',
        tag,
      ),
    )
    .output(s.workspaceSchemaOutput)
    .query(({ ctx }) => schemas.getWorkspaceSchema(ctx)),

  workspaceSave: write
    .meta(
      rest(
        'POST',
        '/api/schemas/workspace',
        'Save schema.json (validated: 400 lists every problem) and report mapping connections to vanished fields',
        tag,
      ),
    )
    .input(s.saveSchemaInput)
    .output(s.saveSchemaOutput)
    .mutation(({ ctx, input }) => schemas.saveWorkspaceSchema(ctx, input.schema)),

  workspaceDelete: write
    .meta(rest('DELETE', '/api/schemas/workspace', 'Delete the workspace schema.json', tag))
    .output(s.saveSchemaOutput)
    .mutation(({ ctx }) => schemas.deleteWorkspaceSchema(ctx)),

  templates: read
    .meta(rest('GET', '/api/schemas/templates', 'List the library schema templates', tag))
    .output(s.templatesOutput)
    .query(() => schemas.listTemplates()),

  template: read
    .meta(rest('GET', '/api/schemas/templates/{template_name}', 'A library schema template', tag))
    .input(s.templateNameParam)
    .output(s.templateOutput)
    .query(({ input }) => schemas.getTemplate(input.template_name)),

  assignTemplate: write
    .meta(
      rest(
        'POST',
        '/api/schemas/templates/{template_name}/assign',
        'Assign a library template to the current workspace as it is',
        tag,
      ),
    )
    .input(s.templateNameParam)
    .output(s.saveSchemaOutput)
    .mutation(({ ctx, input }) => schemas.assignTemplate(ctx, input.template_name)),

  copyFromLibrary: write
    .meta(
      rest(
        'POST',
        '/api/schemas/workspace/copy-from-library/{library_schema_name}',
        "Copy a library schema into the workspace's own, editable schema.json",
        tag,
      ),
    )
    .input(s.libraryNameParam)
    .output(s.saveSchemaOutput)
    .mutation(({ ctx, input }) => schemas.copyFromLibrary(ctx, input.library_schema_name)),

  addColumn: write
    .meta(
      rest(
        'POST',
        '/api/schemas/workspace/tables/{table_name}/columns',
        'Add a column to an existing table of the workspace schema',
        tag,
      ),
    )
    .input(s.addColumnInput)
    .output(s.saveSchemaOutput)
    .mutation(({ ctx, input }) => schemas.addColumn(ctx, input.table_name, input.column)),
});
