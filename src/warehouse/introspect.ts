import type { IntrospectedSchema, IntrospectedTable, IntrospectOptions, RelationKind } from './warehouse.ts';

/**
 * The type `oid` (with `typmod`) as format_type spells it, or, for a domain, its base type: a domain over
 * a domain is followed to the end (pg_type.typbasetype names the next step, typtypmod its modifier). A
 * domain holds its base type's values and operators, so it is judged as that type; its own name says
 * nothing about them. A scalar subquery, correlated with the outer query through `oid` and `typmod`.
 */
export function baseTypeSql(oid: string, typmod = 'NULL'): string {
  return (
    `(WITH RECURSIVE d(oid, typmod) AS (SELECT (${oid})::oid, (${typmod})::int ` +
    `UNION ALL SELECT t.typbasetype, t.typtypmod FROM d JOIN pg_catalog.pg_type t ON t.oid = d.oid WHERE t.typtype = 'd') ` +
    `SELECT pg_catalog.format_type(d.oid, d.typmod) FROM d JOIN pg_catalog.pg_type t ON t.oid = d.oid WHERE t.typtype <> 'd')`
  );
}

/** Runs one catalog query; introspection counts on exactly these calls, never one per table. */
export type CatalogQuery = <R>(sql: string, params: unknown[]) => Promise<R[]>;

const KINDS: Record<string, RelationKind> = {
  r: 'table',
  p: 'partitioned_table',
  v: 'view',
  m: 'materialized_view',
  f: 'foreign_table',
};

// Relations of the schemas, with the planner's row estimate (reltuples is -1 before the first ANALYZE).
const RELATIONS_SQL = `
  select n.nspname as schema, c.relname as name, c.relkind as kind,
         obj_description(c.oid, 'pg_class') as description,
         case when c.reltuples >= 0 then c.reltuples::bigint
              else s.n_live_tup end as estimated_rows
    from pg_class c
    join pg_namespace n on n.oid = c.relnamespace
    left join pg_stat_all_tables s on s.relid = c.oid
   where n.nspname = any($1::text[]) and c.relkind in ('r', 'p', 'v', 'm', 'f')
     and not c.relispartition
   order by n.nspname, c.relname`;

// A generated column keeps its expression in pg_attrdef, where defaults are: read as a default, it would
// promise that an insert without the column fills it in, while inserting into it is refused. The base
// type is looked up for domain columns only (case evaluates the subquery for those rows alone).
const COLUMNS_SQL = `
  select n.nspname as schema, c.relname as table, a.attname as name, a.attnum as position,
         format_type(a.atttypid, a.atttypmod) as type,
         case when ty.typtype = 'd' then ${baseTypeSql('a.atttypid', 'a.atttypmod')}
              else format_type(a.atttypid, a.atttypmod) end as base_type,
         not a.attnotnull as nullable,
         case when a.attgenerated = '' then pg_get_expr(d.adbin, d.adrelid) end as default,
         case when a.attgenerated <> '' then pg_get_expr(d.adbin, d.adrelid) end as generated,
         col_description(c.oid, a.attnum) as description
    from pg_attribute a
    join pg_class c on c.oid = a.attrelid
    join pg_namespace n on n.oid = c.relnamespace
    join pg_type ty on ty.oid = a.atttypid
    left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
   where n.nspname = any($1::text[]) and c.relkind in ('r', 'p', 'v', 'm', 'f')
     and not c.relispartition and a.attnum > 0 and not a.attisdropped
   order by n.nspname, c.relname, a.attnum`;

// Primary and foreign keys with their columns in key order (unnest … with ordinality keeps it).
const KEYS_SQL = `
  select n.nspname as schema, c.relname as table, k.conname as name, k.contype as kind,
         array(select a.attname from unnest(k.conkey) with ordinality u(attnum, i)
                 join pg_attribute a on a.attrelid = k.conrelid and a.attnum = u.attnum order by u.i)::text[] as columns,
         fn.nspname as ref_schema, fc.relname as ref_table,
         array(select a.attname from unnest(k.confkey) with ordinality u(attnum, i)
                 join pg_attribute a on a.attrelid = k.confrelid and a.attnum = u.attnum order by u.i)::text[] as ref_columns
    from pg_constraint k
    join pg_class c on c.oid = k.conrelid
    join pg_namespace n on n.oid = c.relnamespace
    left join pg_class fc on fc.oid = k.confrelid
    left join pg_namespace fn on fn.oid = fc.relnamespace
   where n.nspname = any($1::text[]) and k.contype in ('p', 'f') and k.conparentid = 0
   order by n.nspname, c.relname, k.conname`;

interface RelationRow {
  schema: string;
  name: string;
  kind: string;
  description: string | null;
  estimated_rows: string | number | null;
}
interface ColumnRow {
  schema: string;
  table: string;
  name: string;
  position: number;
  type: string;
  base_type: string;
  nullable: boolean;
  default: string | null;
  generated: string | null;
  description: string | null;
}
interface KeyRow {
  schema: string;
  table: string;
  name: string;
  kind: 'p' | 'f';
  columns: string[];
  ref_schema: string | null;
  ref_table: string | null;
  ref_columns: string[];
}

/** `schema.table` or `table` (any of the schemas) → a predicate on (schema, table). */
export function tableFilter(tables: string[] | undefined): (schema: string, table: string) => boolean {
  if (!tables?.length) return () => true;
  const qualified = new Set(tables.filter((t) => t.includes('.')));
  const bare = new Set(tables.filter((t) => !t.includes('.')));
  return (schema, table) => bare.has(table) || qualified.has(`${schema}.${table}`);
}

/** Four catalog queries whatever the number of tables: schemas, relations, columns, keys. */
export async function introspectCatalog(
  query: CatalogQuery,
  defaults: { schemas: string[]; tables?: string[] },
  options: IntrospectOptions = {},
): Promise<IntrospectedSchema> {
  const schemas = options.schemas ?? defaults.schemas;
  const keep = tableFilter(options.tables ?? defaults.tables);
  const [head] = await query<{ database: string; schemas: string[] }>(
    `select current_database() as database,
            array(select nspname::text from pg_namespace where nspname = any($1::text[]) order by nspname) as schemas`,
    [schemas],
  );
  const [relations, columns, keys] = [
    await query<RelationRow>(RELATIONS_SQL, [schemas]),
    await query<ColumnRow>(COLUMNS_SQL, [schemas]),
    await query<KeyRow>(KEYS_SQL, [schemas]),
  ];
  const tables = new Map<string, IntrospectedTable>();
  for (const r of relations) {
    if (!keep(r.schema, r.name)) continue;
    tables.set(`${r.schema}.${r.name}`, {
      schema: r.schema,
      name: r.name,
      kind: KINDS[r.kind] ?? 'table',
      description: r.description,
      estimated_rows: r.estimated_rows === null ? null : Number(r.estimated_rows),
      primary_key: [],
      foreign_keys: [],
      columns: [],
    });
  }
  for (const c of columns) {
    tables.get(`${c.schema}.${c.table}`)?.columns.push({
      name: c.name,
      type: c.type,
      base_type: c.base_type,
      nullable: c.nullable,
      default: c.default,
      generated: c.generated,
      description: c.description,
      position: Number(c.position),
    });
  }
  for (const k of keys) {
    const table = tables.get(`${k.schema}.${k.table}`);
    if (!table) continue;
    if (k.kind === 'p') table.primary_key = k.columns;
    else
      table.foreign_keys.push({
        name: k.name,
        columns: k.columns,
        references: { schema: k.ref_schema ?? '', table: k.ref_table ?? '', columns: k.ref_columns },
      });
  }
  // Keep the caller's schema order (the config lists the main schema first).
  const order = new Map(schemas.map((s, i) => [s, i]));
  const present = head.schemas.slice().sort((a, b) => (order.get(a) ?? 0) - (order.get(b) ?? 0));
  return { database: head.database, schemas: present, tables: [...tables.values()] };
}
