import { portableFamily, postgresType } from './types.ts';
import { AppError } from '../app-error.ts';
import { quoteIdent } from './postgres.ts';
import type { IntrospectedSchema, IntrospectedTable, Warehouse } from './warehouse.ts';

/*
 * schema.json (DESIGN §5) → PostgreSQL: DDL, the difference with what the target warehouse holds, and
 * a sync that creates and alters tables in one transaction. Only an explicit flag drops or retypes.
 */

/** The part of schema.json this file reads (the schemas area validates the whole document). */
export interface SchemaDocument {
  name: string;
  version?: string;
  tables: {
    name: string;
    description?: string;
    primary_key?: string[];
    columns: { name: string; type: string; nullable?: boolean; description?: string; pii?: boolean }[];
  }[];
}

const literal = (text: string) => `'${text.replaceAll("'", "''")}'`;
const tableName = (schema: string, table: string) => `${quoteIdent(schema)}.${quoteIdent(table)}`;

function columnDefinition(column: SchemaDocument['tables'][number]['columns'][number]): string {
  return `${quoteIdent(column.name)} ${postgresType(column.type)}${column.nullable === false ? ' not null' : ''}`;
}

function createTable(schema: string, table: SchemaDocument['tables'][number]): string[] {
  const lines = table.columns.map((c) => `  ${columnDefinition(c)}`);
  if (table.primary_key?.length)
    lines.push(`  primary key (${table.primary_key.map(quoteIdent).join(', ')})`);
  const statements = [
    `create table if not exists ${tableName(schema, table.name)} (\n${lines.join(',\n')}\n)`,
  ];
  if (table.description)
    statements.push(`comment on table ${tableName(schema, table.name)} is ${literal(table.description)}`);
  for (const c of table.columns) {
    const note = [c.description, c.pii ? '[PII]' : ''].filter(Boolean).join(' ');
    if (note)
      statements.push(
        `comment on column ${tableName(schema, table.name)}.${quoteIdent(c.name)} is ${literal(note)}`,
      );
  }
  return statements;
}

function grants(schema: string, tables: string[], user: string): string[] {
  return [
    `grant usage on schema ${quoteIdent(schema)} to ${quoteIdent(user)}`,
    ...tables.map(
      (t) => `grant select, insert, update, delete on ${tableName(schema, t)} to ${quoteIdent(user)}`,
    ),
  ];
}

export interface DdlOptions {
  /** The PostgreSQL schema the tables live in (the target config's first schema). */
  targetSchema: string;
  grantUser?: string;
}

/** Every statement that creates the target tables (idempotent: `if not exists`), GRANTs optional. */
export function generateDdl(document: SchemaDocument, options: DdlOptions): string[] {
  return [
    `create schema if not exists ${quoteIdent(options.targetSchema)}`,
    ...document.tables.flatMap((t) => createTable(options.targetSchema, t)),
    ...(options.grantUser
      ? grants(
          options.targetSchema,
          document.tables.map((t) => t.name),
          options.grantUser,
        )
      : []),
  ];
}

/** The statements as one script. */
export const ddlScript = (statements: string[]) => statements.map((s) => `${s};`).join('\n\n') + '\n';

export interface SchemaDiff {
  in_sync: boolean;
  missing_tables: string[];
  /** Tables of the target schema that schema.json does not describe (never touched by a sync). */
  extra_tables: string[];
  missing_columns: { table: string; column: string; type: string }[];
  extra_columns: { table: string; column: string; type: string }[];
  type_mismatches: { table: string; column: string; expected: string; actual: string }[];
  nullability_mismatches: {
    table: string;
    column: string;
    expected_nullable: boolean;
    actual_nullable: boolean;
  }[];
  primary_key_mismatches: { table: string; expected: string[]; actual: string[] }[];
}

/** schema.json against the introspected target schema. */
export function diffSchema(
  document: SchemaDocument,
  actual: IntrospectedSchema,
  targetSchema: string,
): SchemaDiff {
  const existing = new Map<string, IntrospectedTable>(
    actual.tables.filter((t) => t.schema === targetSchema).map((t) => [t.name, t]),
  );
  const diff: SchemaDiff = {
    in_sync: true,
    missing_tables: [],
    extra_tables: [],
    missing_columns: [],
    extra_columns: [],
    type_mismatches: [],
    nullability_mismatches: [],
    primary_key_mismatches: [],
  };
  const described = new Set(document.tables.map((t) => t.name));
  for (const table of document.tables) {
    const found = existing.get(table.name);
    if (!found) {
      diff.missing_tables.push(table.name);
      continue;
    }
    const columns = new Map(found.columns.map((c) => [c.name, c]));
    for (const column of table.columns) {
      const have = columns.get(column.name);
      if (!have) {
        diff.missing_columns.push({ table: table.name, column: column.name, type: column.type });
        continue;
      }
      // A domain holds its base type's values: a domain over text is a text column of the schema.
      if (portableFamily(have.base_type) !== column.type.toLowerCase())
        diff.type_mismatches.push({
          table: table.name,
          column: column.name,
          expected: column.type,
          actual: have.type,
        });
      const expectedNullable = column.nullable !== false;
      if (expectedNullable !== have.nullable)
        diff.nullability_mismatches.push({
          table: table.name,
          column: column.name,
          expected_nullable: expectedNullable,
          actual_nullable: have.nullable,
        });
    }
    const wanted = new Set(table.columns.map((c) => c.name));
    for (const have of found.columns)
      if (!wanted.has(have.name))
        diff.extra_columns.push({ table: table.name, column: have.name, type: have.type });
    const expectedKey = table.primary_key ?? [];
    if (expectedKey.join(',') !== found.primary_key.join(','))
      diff.primary_key_mismatches.push({
        table: table.name,
        expected: expectedKey,
        actual: found.primary_key,
      });
  }
  for (const name of existing.keys()) if (!described.has(name)) diff.extra_tables.push(name);
  diff.in_sync =
    !diff.missing_tables.length &&
    !diff.missing_columns.length &&
    !diff.extra_columns.length &&
    !diff.type_mismatches.length &&
    !diff.nullability_mismatches.length;
  return diff;
}

export interface SyncOptions extends DdlOptions {
  /** Drop columns schema.json no longer has and change column types (both can lose data). */
  allowDestructive?: boolean;
  /** Compute the statements without running them. */
  dryRun?: boolean;
}

export interface SyncResult {
  applied: boolean;
  statements: string[];
  /** Differences a sync without allowDestructive leaves in place. */
  skipped: string[];
  before: SchemaDiff;
  after: SchemaDiff;
}

/** The statements that take the target schema from `diff` to schema.json. */
export function syncStatements(document: SchemaDocument, diff: SchemaDiff, options: SyncOptions) {
  const statements = [`create schema if not exists ${quoteIdent(options.targetSchema)}`];
  const skipped: string[] = [];
  const byName = new Map(document.tables.map((t) => [t.name, t]));
  for (const name of diff.missing_tables)
    statements.push(...createTable(options.targetSchema, byName.get(name)!));
  for (const m of diff.missing_columns) {
    const column = byName.get(m.table)!.columns.find((c) => c.name === m.column)!;
    statements.push(
      `alter table ${tableName(options.targetSchema, m.table)} add column ${columnDefinition(column)}`,
    );
  }
  for (const m of diff.nullability_mismatches)
    statements.push(
      `alter table ${tableName(options.targetSchema, m.table)} alter column ${quoteIdent(m.column)} ${m.expected_nullable ? 'drop' : 'set'} not null`,
    );
  for (const m of diff.type_mismatches) {
    if (!options.allowDestructive) {
      skipped.push(`type of ${m.table}.${m.column} stays ${m.actual} (schema.json says ${m.expected})`);
      continue;
    }
    const type = postgresType(m.expected);
    statements.push(
      `alter table ${tableName(options.targetSchema, m.table)} alter column ${quoteIdent(m.column)} type ${type} using ${quoteIdent(m.column)}::${type}`,
    );
  }
  for (const m of diff.extra_columns) {
    if (!options.allowDestructive) {
      skipped.push(`column ${m.table}.${m.column} is kept (not in schema.json)`);
      continue;
    }
    statements.push(
      `alter table ${tableName(options.targetSchema, m.table)} drop column ${quoteIdent(m.column)}`,
    );
  }
  if (options.grantUser)
    statements.push(
      ...grants(
        options.targetSchema,
        document.tables.map((t) => t.name),
        options.grantUser,
      ),
    );
  return { statements, skipped };
}

/** Creates or alters the target tables to match schema.json, all in one transaction. */
export async function syncSchema(
  warehouse: Warehouse,
  document: SchemaDocument,
  options: SyncOptions,
): Promise<SyncResult> {
  const introspectTarget = () => warehouse.introspect({ schemas: [options.targetSchema], tables: [] });
  const before = diffSchema(document, await introspectTarget(), options.targetSchema);
  const { statements, skipped } = syncStatements(document, before, options);
  if (options.dryRun) return { applied: false, statements, skipped, before, after: before };
  try {
    await warehouse.transaction(async (tx) => {
      for (const statement of statements) await tx.query(statement);
    });
  } catch (error) {
    // The data in place refused a change (e.g. NOT NULL over existing nulls): nothing was applied.
    if (error instanceof AppError && error.code === 'BAD_REQUEST')
      throw new AppError(
        'CONFLICT',
        `Schema sync rolled back, nothing changed: ${error.message}`,
        error.details,
      );
    throw error;
  }
  const after = diffSchema(document, await introspectTarget(), options.targetSchema);
  return { applied: true, statements, skipped, before, after };
}
