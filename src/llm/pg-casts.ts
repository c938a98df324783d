import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { POSTGRES_TYPES } from '../warehouse/types.ts';

/**
 * Which source column types PostgreSQL can cast to a target field's type, decided the way the server
 * decides `CAST(x AS t)` (find_coercion_pathway in parse_coerce.c): a domain stands for its base type,
 * the same type needs nothing, a pg_cast row of any context will do (the generated SQL casts
 * explicitly), one array casts to another when their elements cast, and failing that a string type
 * (typcategory 'S') takes any value and gives any value by the types' text forms.
 *
 * The built-in types and their pg_cast rows are facts of the catalog, read once into `pg-casts.json`
 * by scripts/generate-pg-casts.ts; test/pg-casts.test.ts compares that file with the catalog of the
 * test server and the rule with the server's own answers, so neither can drift unnoticed. Types of
 * the user's database (enums, domains, extension types) exist only in its catalog: discovery asks it
 * about them (`lookupCatalogTypes`) and passes the answer along with the column.
 */

const catalogFileSchema = z
  .object({
    generated_by: z.string(),
    server_version: z.string(),
    types: z.record(
      z.string(),
      z
        .object({
          category: z.string().length(1),
          element: z.string().optional(),
          casts: z.array(z.string()),
        })
        .strict(),
    ),
    names: z.record(z.string(), z.string()),
  })
  .strict();

export type CastCatalog = Pick<z.infer<typeof catalogFileSchema>, 'types' | 'names'>;

/** What the source's catalog says of one type the built-in table does not hold. */
export interface CatalogType {
  /** The type, or the base type of a domain (a domain casts as its base), as format_type spells it. */
  base: string;
  /** pg_type.typcategory of `base`. */
  category: string;
  /** The element type, described the same way, when `base` is an array. */
  element: CatalogType | null;
  /** The types pg_cast casts `base` to. */
  casts: string[];
}

const file = catalogFileSchema.parse(
  JSON.parse(readFileSync(new URL('./pg-casts.json', import.meta.url), 'utf8')) as unknown,
);
const TYPES = new Map(Object.entries(file.types));
const NAMES = new Map(Object.entries(file.names));

/** Arrays whose casts PostgreSQL does not build from their elements' (they are only pg_cast's). */
const NO_ELEMENT_CASTS = new Set(['int2vector', 'oidvector']);

interface TypeInfo {
  name: string;
  category: string;
  /** Set for arrays: the element, resolved when two arrays meet (null: not known). */
  element?: () => TypeInfo | null;
  casts: ReadonlySet<string>;
}

interface Spelling {
  name: string;
  array: boolean;
}

/**
 * A type name as introspection, the MySQL load or a person writes it, without what does not change
 * how it casts: modifiers (`varchar(40)`, `timestamp(3) with time zone`, `numeric(10,2)`), interval
 * fields, array bounds, the pg_catalog prefix.
 */
function spell(raw: string): Spelling {
  let s = raw.trim();
  let array = false;
  const bounds = /(\s*\[\s*\d*\s*\])+$/.exec(s);
  const keyword = /\s+array(\s*\[\s*\d*\s*\])?$/i.exec(s);
  if (bounds) [s, array] = [s.slice(0, bounds.index), true];
  else if (keyword) [s, array] = [s.slice(0, keyword.index), true];
  s = s.replace(/^pg_catalog\./i, '');
  // The one modifier that picks the type: float(1)…float(24) is real, float(25)…float(53) double.
  const float = /^float\s*\(\s*(\d+)\s*\)$/i.exec(s);
  if (float) s = Number(float[1]) <= 24 ? 'real' : 'double precision';
  if (/^interval\b/i.test(s)) s = 'interval';
  s = s
    .replace(/\s*\(\s*\d+(\s*,\s*-?\d+)?\s*\)/g, ' ')
    .replace(/\s+/g, ' ')
    .trim();
  // Unquoted names fold to lower case; a quoted one ("char", "MyType") is exactly as written.
  if (!s.includes('"')) s = s.toLowerCase();
  return { name: s, array };
}

/** The canonical (format_type) name of a built-in spelling, `[]` for arrays; null when not built in. */
function builtIn(raw: string): string | null {
  const { name, array } = spell(raw);
  // information_schema says ARRAY of every array, whatever its element.
  if (name === 'array' && !array) return '[]';
  const canonical = TYPES.has(name) ? name : NAMES.get(name);
  if (canonical === undefined) return null;
  return array && !canonical.endsWith('[]') ? `${canonical}[]` : canonical;
}

/** Whether the built-in table knows the type (else only the source's catalog can say). */
export function isBuiltInType(type: string): boolean {
  return builtIn(type) !== null;
}

const NO_CASTS: ReadonlySet<string> = new Set();
const CAST_SETS = new Map([...TYPES].map(([name, t]) => [name, new Set(t.casts)]));

const builtInElement = (name: string | undefined) =>
  name === undefined ? undefined : () => (builtIn(name) === null ? null : infoOf(builtIn(name)!));

function infoOf(canonical: string): TypeInfo | null {
  if (canonical.endsWith('[]'))
    // No pg_cast row has an array on either side (the generator checks it).
    return {
      name: canonical,
      category: 'A',
      element: builtInElement(canonical.slice(0, -2)),
      casts: NO_CASTS,
    };
  const t = TYPES.get(canonical);
  if (!t) return null;
  return {
    name: canonical,
    category: t.category,
    element: builtInElement(t.element),
    casts: CAST_SETS.get(canonical)!,
  };
}

function sourceInfo(type: string, catalog?: CatalogType | null): TypeInfo | null {
  if (catalog) {
    const base = builtIn(catalog.base);
    if (base !== null) return infoOf(base);
    const { element } = catalog;
    return {
      name: catalog.base,
      category: catalog.category,
      element: element ? () => sourceInfo(element.base, element) : undefined,
      casts: new Set(catalog.casts.map((c) => builtIn(c) ?? c)),
    };
  }
  const canonical = builtIn(type);
  return canonical === null ? null : infoOf(canonical);
}

/** A field's type: the portable types of schema.json (`json` is stored as jsonb) or PostgreSQL's own. */
function targetInfo(type: string): TypeInfo | null {
  const portable = POSTGRES_TYPES[type.trim().toLowerCase() as keyof typeof POSTGRES_TYPES];
  const canonical = builtIn(portable ?? type);
  return canonical === null ? null : infoOf(canonical);
}

function pathway(source: TypeInfo, target: TypeInfo): boolean | null {
  if (source.name === target.name) return true;
  if (source.casts.has(target.name)) return true;
  if (source.element !== undefined && target.element !== undefined && !NO_ELEMENT_CASTS.has(target.name)) {
    const s = source.element();
    const t = target.element();
    const elements = s && t ? pathway(s, t) : null;
    if (elements === null) return null;
    if (elements) return true;
  }
  return target.category === 'S' || source.category === 'S';
}

const ANSWERS = new Map<string, boolean | null>();

/**
 * Whether `CAST(<source column> AS <target type>)` is accepted by PostgreSQL: true or false from the
 * catalog's facts, null when a type is not known (neither built in nor described by `catalog`).
 */
export function castable(
  sourceType: string,
  targetType: string,
  catalog?: CatalogType | null,
): boolean | null {
  if (catalog) {
    const source = sourceInfo(sourceType, catalog);
    const target = targetInfo(targetType);
    return source && target ? pathway(source, target) : null;
  }
  const key = `${sourceType}\u0000${targetType}`;
  let answer = ANSWERS.get(key);
  if (answer === undefined) {
    const source = sourceInfo(sourceType);
    const target = targetInfo(targetType);
    answer = source && target ? pathway(source, target) : null;
    ANSWERS.set(key, answer);
  }
  return answer;
}
