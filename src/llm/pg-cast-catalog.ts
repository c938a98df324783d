import type { CastCatalog, CatalogType } from './pg-casts.ts';
import type { QueryRunner } from './profile.ts';

/*
 * Reading casts out of a PostgreSQL catalog: the built-in part once, into `pg-casts.json` (by
 * scripts/generate-pg-casts.ts, checked against the test server by test/pg-casts.test.ts), and the
 * user's own types of a source at discovery time.
 */

/**
 * Spellings the SQL grammar gives built-in types besides their catalog names (gram.y's
 * SimpleTypename); `readCastCatalog` keeps those the server resolves, to what it resolves them to.
 */
const GRAMMAR_SPELLINGS = [
  'int',
  'integer',
  'smallint',
  'bigint',
  'real',
  'float',
  'double precision',
  'decimal',
  'dec',
  'numeric',
  'boolean',
  'char',
  'character',
  'nchar',
  'national char',
  'national character',
  'varchar',
  'char varying',
  'character varying',
  'nchar varying',
  'national char varying',
  'national character varying',
  'bit',
  'bit varying',
  'timestamp',
  'timestamp without time zone',
  'timestamp with time zone',
  'time',
  'time without time zone',
  'time with time zone',
  'interval',
];

/*
 * The built-in types: pg_catalog's base, range and multirange types, without the array types of
 * other types (spelled `element[]` and handled by the element rule); each with its category, its
 * element when it is an array, and its pg_cast targets. Every spelling of them to_regtype resolves:
 * catalog names (int4, bpchar, `_int4` for integer[]) and the grammar's.
 */
const CATALOG_SQL = `
with types as (
  select t.oid, t.typname, format_type(t.oid, null) as name, t.typcategory::text as category,
         case when t.typsubscript = 'array_subscript_handler'::regproc then format_type(t.typelem, null) end as element,
         t.typarray
    from pg_type t
   where t.typnamespace = 'pg_catalog'::regnamespace and t.typtype in ('b', 'r', 'm')
     and not exists (select 1 from pg_type a where a.typarray = t.oid)
), spellings as (
  select typname as spelling from types
  union select '_' || typname from types where typarray <> 0
  union select unnest($1::text[])
), named as (
  select spelling, format_type(to_regtype(spelling), null) as name from spellings
)
select current_setting('server_version') as server_version,
       (select json_agg(json_build_object('name', t.name, 'category', t.category, 'element', t.element,
                'casts', array(select u.name from pg_cast c join types u on u.oid = c.casttarget
                                where c.castsource = t.oid order by u.name)))
          from types t) as types,
       (select json_object_agg(n.spelling, n.name) from named n
         where n.name is not null and n.spelling <> n.name
           and exists (select 1 from types t where n.name in (t.name, t.name || '[]'))) as names,
       (select count(*)::int from pg_cast c
         where not exists (select 1 from types t where t.oid = c.castsource)
            or not exists (select 1 from types t where t.oid = c.casttarget)) as casts_elsewhere`;

const json = (value: unknown) => (typeof value === 'string' ? (JSON.parse(value) as unknown) : value);
const byKey = <T>(entries: [string, T][]) =>
  Object.fromEntries(entries.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)));

/**
 * The built-in part of a server's catalog, in the form of `pg-casts.json`. Refuses a catalog with
 * pg_cast rows the rule would not read (of arrays, domains or types outside pg_catalog: a database
 * with extensions installed, or a server version that added such rows).
 */
export async function readCastCatalog(run: QueryRunner): Promise<CastCatalog & { server_version: string }> {
  const [row] = await run(CATALOG_SQL, [GRAMMAR_SPELLINGS]);
  if (Number(row.casts_elsewhere) !== 0)
    throw new Error(
      `${String(row.casts_elsewhere)} pg_cast rows involve arrays, domains or types outside pg_catalog: read the catalog of a database without extensions`,
    );
  const types = json(row.types) as {
    name: string;
    category: string;
    element: string | null;
    casts: string[];
  }[];
  return {
    server_version: String(row.server_version),
    types: byKey(
      types.map((t) => [
        t.name,
        { category: t.category, ...(t.element ? { element: t.element } : {}), casts: t.casts },
      ]),
    ),
    names: byKey(Object.entries(json(row.names) as Record<string, string>)),
  };
}

/*
 * Types the built-in table does not hold, looked up in the source's catalog: a domain followed to
 * its base (a domain of a domain too), then that type's category and pg_cast targets, and the same of
 * its element when it is an array. Names the catalog does not resolve are left out.
 */
const LOOKUP_SQL = `
with recursive based(name, role, oid) as (
  select n, 'type', to_regtype(n) from unnest($1::text[]) n where to_regtype(n) is not null
  union all
  select b.name, case when t.typtype = 'd' then b.role else 'element' end,
         case when t.typtype = 'd' then t.typbasetype else t.typelem end
    from based b join pg_type t on t.oid = b.oid
   where t.typtype = 'd' or (b.role = 'type' and t.typsubscript = 'array_subscript_handler'::regproc)
), described as (
  select b.name, b.role, format_type(t.oid, null) as base, t.typcategory::text as category,
         coalesce((select json_agg(format_type(c.casttarget, null) order by c.casttarget)
                     from pg_cast c where c.castsource = t.oid), '[]') as casts
    from based b join pg_type t on t.oid = b.oid
   where t.typtype <> 'd'
)
select d.name, d.base, d.category, d.casts,
       e.base as element_base, e.category as element_category, e.casts as element_casts
  from described d left join described e on e.name = d.name and e.role = 'element'
 where d.role = 'type'`;

const described = (base: unknown, category: unknown, casts: unknown, element: CatalogType | null) => ({
  base: String(base),
  category: String(category),
  element,
  casts: (json(casts) as unknown[]).map(String),
});

/** What the source's catalog says of the given type names (one statement), by name. */
export async function lookupCatalogTypes(
  run: QueryRunner,
  names: readonly string[],
): Promise<Map<string, CatalogType>> {
  if (names.length === 0) return new Map();
  const rows = await run(LOOKUP_SQL, [[...names]]);
  return new Map(
    rows.map((r) => [
      String(r.name),
      described(
        r.base,
        r.category,
        r.casts,
        r.element_base === null || r.element_base === undefined
          ? null
          : described(r.element_base, r.element_category, r.element_casts, null),
      ),
    ]),
  );
}
