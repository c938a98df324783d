import { z } from 'zod';
import { timestamp } from '../../trpc/common-schemas.ts';
import { columnTestConfigSchema } from '../../quality/rules.ts';
import { PORTABLE_TYPES } from '../../warehouse/types.ts';

const SQL_IDENTIFIER = /^[a-zA-Z_][a-zA-Z0-9_]{0,62}$/;
const IDENTIFIER_RULE = 'must be a SQL identifier: a letter or _, then letters, digits or _, at most 63';

/*
 * Names and types are plain strings here and checked in one refinement over the whole document, so
 * that a save answers with every problem at once instead of stopping at the first bad column.
 */
const targetColumnSchema = z
  .looseObject({
    name: z.string().min(1).max(63),
    type: z.string().describe(`One of ${PORTABLE_TYPES.join(', ')}`),
    nullable: z.boolean().default(true),
    description: z.string().max(2000).default(''),
    pii: z.boolean().default(false),
  })
  .describe(
    'A column. tests: its column tests (as PUT …/columns/{table}/{column}/test stores them), run by monitoring and written into the transformation project. Monitoring thresholds are not set here but through …/columns/{table}/{column}/monitoring. Other extra keys are kept as given and read by nothing',
  );

const targetTableSchema = z.looseObject({
  name: z.string().min(1).max(63),
  description: z.string().max(4000).default(''),
  primary_key: z.array(z.string()).max(32).default([]),
  columns: z.array(targetColumnSchema).min(1).max(1000),
});

function checkTargetSchema(
  schema: { tables: { name: string; primary_key: string[]; columns: { name: string; type: string }[] }[] },
  ctx: z.RefinementCtx,
) {
  const issue = (path: (string | number)[], message: string) =>
    ctx.addIssue({ code: 'custom', path, message, input: undefined });
  const tableNames = new Set<string>();
  schema.tables.forEach((table, t) => {
    if (!SQL_IDENTIFIER.test(table.name))
      issue(['tables', t, 'name'], `Table name ${table.name}: ${IDENTIFIER_RULE}`);
    const lower = table.name.toLowerCase();
    if (tableNames.has(lower)) issue(['tables', t, 'name'], `Duplicate table name ${table.name}`);
    tableNames.add(lower);
    const columnNames = new Set<string>();
    table.columns.forEach((column, c) => {
      const at = ['tables', t, 'columns', c];
      if (!SQL_IDENTIFIER.test(column.name))
        issue([...at, 'name'], `Column ${table.name}.${column.name}: ${IDENTIFIER_RULE}`);
      const columnLower = column.name.toLowerCase();
      if (columnNames.has(columnLower))
        issue([...at, 'name'], `Duplicate column ${table.name}.${column.name}`);
      columnNames.add(columnLower);
      // Column tests (PUT …/columns/{table}/{column}/test) are stored here; a hand-written schema.json
      // must hold the same shape, since the quality runner and the dbt project read it as is.
      const tests = (column as { tests?: unknown }).tests;
      if (tests !== undefined) {
        const parsed = columnTestConfigSchema.strict().safeParse(tests);
        if (!parsed.success)
          for (const i of parsed.error.issues)
            issue(
              [...at, 'tests', ...(i.path as (string | number)[])],
              `Column tests of ${table.name}.${column.name}: ${i.message}`,
            );
      }
      if (!(PORTABLE_TYPES as readonly string[]).includes(column.type))
        issue(
          [...at, 'type'],
          `Column ${table.name}.${column.name}: unknown type ${column.type} (use one of ${PORTABLE_TYPES.join(', ')})`,
        );
    });
    const seenKeys = new Set<string>();
    table.primary_key.forEach((key, k) => {
      if (!columnNames.has(key.toLowerCase()))
        issue(['tables', t, 'primary_key', k], `Primary key of ${table.name} names a missing column ${key}`);
      if (seenKeys.has(key))
        issue(['tables', t, 'primary_key', k], `Primary key of ${table.name} repeats ${key}`);
      seenKeys.add(key);
    });
  });
}

/** schema.json (DESIGN §5). Validated on every write: types, duplicate names, primary keys. */
export const targetSchemaSchema = z
  .looseObject({
    name: z.string().min(1).max(100),
    version: z.string().min(1).max(50).default('1.0.0'),
    description: z.string().max(4000).optional(),
    tables: z.array(targetTableSchema).max(500),
  })
  .superRefine(checkTargetSchema);

export type TargetSchema = z.infer<typeof targetSchemaSchema>;
type TargetTable = TargetSchema['tables'][number];
export type TargetColumn = TargetTable['columns'][number];

// ---- routes ----

export const templateNameParam = z.object({ template_name: z.string().min(1).max(100) });
export const libraryNameParam = z.object({ library_schema_name: z.string().min(1).max(100) });

export const templateSummary = z.object({
  name: z.string(),
  version: z.string(),
  description: z.string(),
  table_count: z.number().int(),
  column_count: z.number().int(),
  tables: z.array(z.string()),
});
export const templatesOutput = z.object({ templates: z.array(templateSummary) });
export const templateOutput = z.object({ name: z.string(), schema: targetSchemaSchema });

export const allSchemasOutput = z.object({
  schemas: z.array(
    templateSummary.extend({
      source: z.enum(['library', 'workspace']),
      workspace_name: z.string().nullable(),
    }),
  ),
});

/** Where a workspace's schema came from and what it holds. */
export const workspaceSchemaOutput = z.object({
  workspace_name: z.string(),
  exists: z.boolean(),
  template_name: z.string().nullable(),
  customized: z.boolean(),
  schema: targetSchemaSchema.nullable(),
  updated_at: timestamp,
});

export const staleConnection = z.object({
  target_table: z.string(),
  target_field: z.string(),
  source_field: z.string().nullable(),
  reason: z.string(),
});

export const saveSchemaOutput = workspaceSchemaOutput.extend({
  stale_connections: z
    .array(staleConnection)
    .describe('Mapping connections to fields that no longer exist; they are flagged, not dropped'),
});

export const saveSchemaInput = z.object({ schema: targetSchemaSchema });

export const addColumnInput = z.object({
  table_name: z.string().min(1).max(63),
  column: targetColumnSchema,
});
