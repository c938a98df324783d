import type { ConnectionConfig } from './config.ts';
import { tableFilter } from './introspect.ts';
import { type MysqlColumn, mysqlSchemas } from './mysql-connection.ts';
import { mapMysqlType, mayLoadAsNull } from './mysql-types.ts';
import type { IntrospectedSchema, IntrospectedTable, IntrospectOptions, TableRef } from './warehouse.ts';

/** One query on an open connection (inside the caller's read-only transaction). */
export type MysqlRows = <R>(sql: string, params?: unknown[]) => Promise<R[]>;

interface RawColumnRow {
  schema: string;
  table: string;
  name: string;
  position: number;
  column_type: string;
  nullable: string;
  default: string | null;
  generated: string | null;
  description: string;
  extra: string;
}

/** Columns with their MySQL types, for the loader (one catalog query for all the tables). */
export async function mysqlSourceColumns(
  rows: MysqlRows,
  mariadb: boolean,
  tables: TableRef[],
): Promise<Map<string, MysqlColumn[]>> {
  const schemas = [...new Set(tables.map((t) => t.schema))];
  const { columns, json } = await mysqlColumns(rows, mariadb, schemas);
  const wanted = new Set(tables.map((t) => `${t.schema}.${t.name}`));
  const out = new Map<string, MysqlColumn[]>();
  for (const col of columns) {
    const key = `${col.schema}.${col.table}`;
    if (!wanted.has(key)) continue;
    if (!out.has(key)) out.set(key, []);
    out.get(key)!.push({
      name: col.name,
      columnType: col.column_type,
      json: json.has(`${key}.${col.name}`),
      autoIncrement: /auto_increment/i.test(col.extra),
      nullable: col.nullable === 'YES',
    });
  }
  return out;
}

async function mysqlColumns(rows: MysqlRows, mariadb: boolean, schemas: string[]) {
  // Every column aliased: MySQL 8 names information_schema columns in capitals (COLUMN_TYPE), MariaDB as written.
  const columns = await rows<RawColumnRow>(
    `select table_schema as \`schema\`, table_name as \`table\`, column_name as name, ordinal_position as position,
            column_type as column_type, is_nullable as nullable, column_default as \`default\`,
            generation_expression as \`generated\`, column_comment as description, extra as extra
       from information_schema.columns where table_schema in (?)
      order by table_schema, table_name, ordinal_position`,
    [schemas],
  );
  // MariaDB's json is longtext with a json_valid() check named after the column.
  const json = new Set<string>();
  if (mariadb) {
    const checks = await rows<{ schema: string; table: string; clause: string }>(
      `select constraint_schema as \`schema\`, table_name as \`table\`, check_clause as clause
         from information_schema.check_constraints where constraint_schema in (?) and check_clause like 'json_valid(%'`,
      [schemas],
    );
    for (const k of checks) {
      const m = /^json_valid\(`((?:[^`]|``)+)`\)$/.exec(k.clause.trim());
      if (m) json.add(`${k.schema}.${k.table}.${m[1].replaceAll('``', '`')}`);
    }
  }
  return { columns, json };
}

/**
 * The expression of a generated column, else null. EXTRA says VIRTUAL GENERATED or STORED GENERATED
 * (MySQL, MariaDB 10.11), VIRTUAL or PERSISTENT (older MariaDB); DEFAULT_GENERATED is MySQL's mark of an
 * expression default, not a generated column. MySQL's GENERATION_EXPRESSION is '' for other columns.
 * COLUMN_DEFAULT of a generated column is no default (MariaDB 10.11 says 'NULL' there), nor its expression.
 */
function generationOf(col: RawColumnRow): string | null {
  if (!/\b(VIRTUAL|STORED|PERSISTENT)\b/i.test(col.extra)) return null;
  return col.generated || null;
}

/**
 * The default as an expression, else null. MariaDB (10.2.7+) writes COLUMN_DEFAULT as SQL: the word
 * NULL for a nullable column with no default (or DEFAULT NULL), a text default quoted ('x'), so its
 * NULL means none; a text default of the four letters is 'NULL' with quotes there. MySQL writes
 * literals bare and no default as SQL NULL.
 */
function defaultOf(col: RawColumnRow, generated: string | null, mariadb: boolean): string | null {
  if (generated !== null) return null;
  if (mariadb && col.default === 'NULL') return null;
  return col.default;
}

/**
 * Catalog names compared as bytes where the server's names are case-sensitive: information_schema's
 * collation is case-insensitive, while with lower_case_table_names=0 (the default on Linux) `UPPER`
 * and `upper` are two tables. Servers that fold names (1, 2) keep the case-insensitive comparison.
 */
const same = (a: string, b: string) =>
  `${a} = ${b} and (cast(${a} as binary) = cast(${b} as binary) or @@lower_case_table_names <> 0)`;

/** Four catalog queries whatever the number of tables, like the PostgreSQL introspection. */
export async function mysqlIntrospect(
  rows: MysqlRows,
  mariadb: boolean,
  config: ConnectionConfig,
  options: IntrospectOptions = {},
): Promise<IntrospectedSchema> {
  const schemas = options.schemas ?? mysqlSchemas(config);
  const keep = tableFilter(options.tables ?? config.tables);
  const present = await rows<{ name: string }>(
    'select schema_name as name from information_schema.schemata where schema_name in (?)',
    [schemas],
  );
  const relations = await rows<{
    schema: string;
    name: string;
    type: string;
    description: string;
    rows: number | string | null;
  }>(
    `select table_schema as \`schema\`, table_name as name, table_type as type, table_comment as description,
            table_rows as \`rows\`
       from information_schema.tables where table_schema in (?) order by table_schema, table_name`,
    [schemas],
  );
  const { columns, json } = await mysqlColumns(rows, mariadb, schemas);
  const keys = await rows<{
    schema: string;
    table: string;
    name: string;
    kind: string;
    column: string;
    ref_schema: string | null;
    ref_table: string | null;
    ref_column: string | null;
  }>(
    `select k.table_schema as \`schema\`, k.table_name as \`table\`, k.constraint_name as name,
            t.constraint_type as kind, k.column_name as \`column\`, k.referenced_table_schema as ref_schema,
            k.referenced_table_name as ref_table, k.referenced_column_name as ref_column
       from information_schema.key_column_usage k
       join information_schema.table_constraints t
         on ${same('t.constraint_schema', 'k.constraint_schema')} and ${same('t.constraint_name', 'k.constraint_name')}
        and ${same('t.table_schema', 'k.table_schema')} and ${same('t.table_name', 'k.table_name')}
      where k.table_schema in (?) and t.constraint_type in ('PRIMARY KEY', 'FOREIGN KEY')
      order by k.table_schema, k.table_name, k.constraint_name, k.ordinal_position`,
    [schemas],
  );
  const tables = new Map<string, IntrospectedTable>();
  for (const r of relations) {
    if (!keep(r.schema, r.name) || r.type === 'SEQUENCE') continue;
    tables.set(`${r.schema}.${r.name}`, {
      schema: r.schema,
      name: r.name,
      kind: r.type === 'VIEW' ? 'view' : 'table',
      // A view's comment is the word VIEW, or, for a broken one (MariaDB), why it cannot be selected.
      description: (r.type === 'VIEW' && r.description === 'VIEW' ? null : r.description) || null,
      // InnoDB's estimate; views have none.
      estimated_rows: r.rows === null ? null : Number(r.rows),
      primary_key: [],
      foreign_keys: [],
      columns: [],
    });
  }
  for (const col of columns) {
    const key = `${col.schema}.${col.table}`;
    const mapped = mapMysqlType(col.column_type, json.has(`${key}.${col.name}`));
    const generated = generationOf(col);
    tables.get(key)?.columns.push({
      name: col.name,
      type: mapped.pg,
      // MySQL has no domains: the mapped type is what the values are.
      base_type: mapped.pg,
      // As loaded: a date column may receive NULL for dates PostgreSQL has none for (zero dates).
      nullable: col.nullable === 'YES' || mayLoadAsNull(mapped.kind),
      default: defaultOf(col, generated, mariadb),
      generated,
      description: col.description || null,
      position: Number(col.position),
    });
  }
  for (const k of keys) {
    const table = tables.get(`${k.schema}.${k.table}`);
    if (!table) continue;
    if (k.kind === 'PRIMARY KEY') table.primary_key.push(k.column);
    else {
      let fk = table.foreign_keys.find((f) => f.name === k.name);
      if (!fk) {
        fk = {
          name: k.name,
          columns: [],
          references: { schema: k.ref_schema ?? '', table: k.ref_table ?? '', columns: [] },
        };
        table.foreign_keys.push(fk);
      }
      fk.columns.push(k.column);
      fk.references.columns.push(k.ref_column ?? '');
    }
  }
  const found = new Set(present.map((p) => p.name));
  return {
    database: config.database,
    schemas: schemas.filter((s) => found.has(s)),
    tables: [...tables.values()],
  };
}
