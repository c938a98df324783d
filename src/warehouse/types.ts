import { AppError } from '../app-error.ts';

/** The portable column types of schema.json (DESIGN §5); each warehouse dialect maps them to its own. */
export const PORTABLE_TYPES = [
  'text',
  'integer',
  'bigint',
  'numeric',
  'boolean',
  'date',
  'timestamp',
  'timestamptz',
  'json',
  'uuid',
] as const;
export type PortableType = (typeof PORTABLE_TYPES)[number];

/** The PostgreSQL type of each portable type, as DDL and casts spell it; json is stored as jsonb. */
export const POSTGRES_TYPES: Record<PortableType, string> = {
  text: 'text',
  integer: 'integer',
  bigint: 'bigint',
  numeric: 'numeric',
  boolean: 'boolean',
  date: 'date',
  timestamp: 'timestamp',
  timestamptz: 'timestamptz',
  json: 'jsonb',
  uuid: 'uuid',
};

const isPortable = (type: string): type is PortableType => Object.hasOwn(POSTGRES_TYPES, type);

/** The PostgreSQL type for a portable type named by a user (any case); unknown names are a 400. */
export function postgresType(portable: string): string {
  const type = portable.toLowerCase();
  if (!isPortable(type))
    throw new AppError(
      'BAD_REQUEST',
      `Unknown column type ${portable} (use one of ${PORTABLE_TYPES.join(', ')})`,
    );
  return POSTGRES_TYPES[type];
}

/** The portable family of a PostgreSQL type, so `varchar(80)` satisfies `text` and `numeric(12,2)` `numeric`. */
export function portableFamily(pgType: string): string {
  const t = pgType
    .toLowerCase()
    .replace(/\(.*\)/, '')
    .trim();
  if (['text', 'character varying', 'character', 'varchar', 'char', 'name', 'citext'].includes(t))
    return 'text';
  if (['integer', 'smallint', 'int', 'int4', 'int2'].includes(t)) return 'integer';
  if (['bigint', 'int8'].includes(t)) return 'bigint';
  if (['numeric', 'decimal', 'real', 'double precision', 'money'].includes(t)) return 'numeric';
  if (t === 'boolean') return 'boolean';
  if (t === 'date') return 'date';
  if (t === 'timestamp without time zone' || t === 'timestamp') return 'timestamp';
  if (t === 'timestamp with time zone' || t === 'timestamptz') return 'timestamptz';
  if (t === 'json' || t === 'jsonb') return 'json';
  if (t === 'uuid') return 'uuid';
  return `other:${t}`;
}
