import { z } from 'zod';
import { timestamp } from '../../trpc/common-schemas.ts';
import { staleConnection } from './schemas.schemas.ts';
import { reverseEtlDestination } from './reverse-etl.schemas.ts';

const indicator = z
  .enum(['in_sync', 'pending', 'drifted', 'error'])
  .describe(
    'in_sync: the warehouse matches schema.json; pending: a sync would add what is missing; drifted: the warehouse has columns or types schema.json does not (a sync keeps them unless allow_destructive); error: it cannot be compared',
  );

const column = z.object({ table: z.string(), column: z.string(), type: z.string() });

const schemaDiff = z.object({
  in_sync: z.boolean(),
  missing_tables: z.array(z.string()),
  extra_tables: z
    .array(z.string())
    .describe('Tables of the target schema that schema.json does not describe'),
  missing_columns: z.array(column),
  extra_columns: z.array(column),
  type_mismatches: z.array(
    z.object({ table: z.string(), column: z.string(), expected: z.string(), actual: z.string() }),
  ),
  nullability_mismatches: z.array(
    z.object({
      table: z.string(),
      column: z.string(),
      expected_nullable: z.boolean(),
      actual_nullable: z.boolean(),
    }),
  ),
  primary_key_mismatches: z.array(
    z.object({ table: z.string(), expected: z.array(z.string()), actual: z.array(z.string()) }),
  ),
});

const sourceLoadRun = z
  .object({
    run_id: z.string(),
    status: z.string().describe('queued, running, completed, failed or cancelled'),
    mode: z.enum(['full', 'incremental']),
    progress: z.record(z.string(), z.unknown()).describe('table, tables_done, tables_total, rows_loaded'),
    result: z
      .record(z.string(), z.unknown())
      .nullable()
      .describe(
        'raw_schema, rows, refused (tables not loaded: schema, table, reason), unknown_cursor_tables (tables cursor_columns names that the source does not have), and per table: mode, full_because, rows, cursor_column, cursor_value, invalid_cursor_rows (rows whose cursor is a zero or invalid date, never a cursor position), without_primary_key',
      ),
    error: z.string().nullable(),
    started_at: timestamp.nullable(),
    finished_at: timestamp.nullable(),
  })
  .describe('The latest extract-load of a MySQL / MariaDB source into the raw schema of the target');

export const syncStatusOutput = z.object({
  workspace_name: z.string(),
  source_load: sourceLoadRun.nullable().describe('null unless the source is loaded (MySQL / MariaDB)'),
  status: indicator,
  message: z.string(),
  target_schema: z.string().nullable().describe('PostgreSQL schema of the target tables'),
  tables: z.array(
    z.object({
      table_name: z.string(),
      status: indicator,
      exists: z.boolean(),
      missing_columns: z.array(z.string()),
      extra_columns: z.array(z.string()),
      type_mismatches: z.array(z.string()),
    }),
  ),
  differences: schemaDiff.nullable(),
  pending_statements: z.array(z.string()).describe('What a sync without allow_destructive would run'),
  destructive_changes: z.array(z.string()).describe('What only a sync with allow_destructive changes'),
  last_synced_at: timestamp.nullable(),
  schema_changed_since_sync: z.boolean().nullable().describe('null when never synced'),
});

export const syncInput = z.object({
  allow_destructive: z
    .boolean()
    .default(false)
    .describe('Drop columns schema.json no longer has and change column types (can lose data)'),
  dry_run: z.boolean().default(false).describe('Only report the statements'),
  grant_user: z.string().min(1).max(63).optional().describe('Also grant usage and DML on the tables'),
  load_source: z
    .object({
      mode: z
        .enum(['incremental', 'full'])
        .default('incremental')
        .describe('incremental: rows past each table’s cursor column; full: every table rebuilt'),
    })
    .optional()
    .describe(
      'MySQL / MariaDB sources: also queue the extract-load of the selected tables into the raw schema (a job; follow it on GET /api/schemas/workspace/sync/status)',
    ),
});

export const syncOutput = z.object({
  workspace_name: z.string(),
  applied: z.boolean(),
  dry_run: z.boolean(),
  target_schema: z.string(),
  statements: z.array(z.string()),
  skipped: z.array(z.string()).describe('Destructive changes refused without allow_destructive'),
  status: indicator.describe('After the sync'),
  before: schemaDiff,
  after: schemaDiff,
  stale_connections: z
    .array(staleConnection)
    .describe('Mapping connections to fields that no longer exist; flagged, not dropped'),
  synced_at: timestamp.nullable(),
  source_load: z
    .object({
      run_id: z.string(),
      status: z.string(),
      created: z.boolean().describe('false: a load of this workspace was already under way and is returned'),
      mode: z.enum(['full', 'incremental']),
      raw_schema: z.string(),
    })
    .nullable()
    .describe('The queued load when load_source was given'),
});

export const ddlInput = z.object({
  grant_user: z
    .string()
    .min(1)
    .max(63)
    .optional()
    .describe('A role to grant usage on the schema and DML on every table'),
});

export const ddlOutput = z.object({
  workspace_name: z.string(),
  target_schema: z.string(),
  grant_user: z.string().nullable(),
  table_count: z.number().int(),
  statements: z.array(z.string()),
  ddl: z.string().describe('The statements as one script'),
});

// ---- reverse-ETL connections ----

export const connectionsOutput = z.object({
  workspace_name: z.string(),
  defined_in: z
    .enum(['workspace', 'global'])
    .describe('Admin settings level the destinations come from (key reverse_etl_connections)'),
  connections: z.array(reverseEtlDestination.extend({ assigned_tables: z.array(z.string()) })),
  assignments: z.array(
    z.object({
      table_name: z.string(),
      connection_name: z.string(),
      destination_table: z.string(),
      updated_at: timestamp,
      table_missing: z.boolean().describe('The table is no longer in schema.json'),
      connection_missing: z.boolean().describe('The connection is no longer defined in the settings'),
    }),
  ),
});

export const assignConnectionInput = z.object({
  table_name: z.string().min(1).max(63),
  connection_name: z
    .string()
    .min(1)
    .max(63)
    .nullable()
    .describe('A connection of GET /api/schemas/workspace/connections; null removes the assignment'),
  destination_table: z
    .string()
    .min(1)
    .max(255)
    .optional()
    .describe(
      "The table's copy in the connection's database (`table` in its schema, or `schema.table`), which monitoring measures; default the table name",
    ),
});

export const assignConnectionOutput = z.object({
  workspace_name: z.string(),
  table_name: z.string(),
  assigned: z.boolean(),
  connection: reverseEtlDestination.nullable(),
  destination_table: z.string().nullable(),
  updated_at: timestamp.nullable(),
});
