import { z } from 'zod';
import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import * as s from './schemas.schemas.ts';
import * as schemas from './schemas.service.ts';

const tag = 'schemas';
const read = permissionProcedure('workspace.read');
const write = permissionProcedure('workspace.write');
const none = z.object({});

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
    .input(none)
    .output(s.allSchemasOutput)
    .query(({ ctx }) => schemas.listAllSchemas(ctx)),

  workspaceGet: read
    .meta(
      rest(
        'GET',
        '/api/schemas/workspace',
        'Content of the workspace schema.json (404 when there is none)',
        tag,
      ),
    )
    .input(none)
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
    .input(none)
    .output(s.saveSchemaOutput)
    .mutation(({ ctx }) => schemas.deleteWorkspaceSchema(ctx)),

  templates: read
    .meta(rest('GET', '/api/schemas/templates', 'List the library schema templates', tag))
    .input(none)
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
