/**
 * The smallest surface the quality engines need from a database connection: `pg.Client`,
 * `pg.PoolClient` and `pg.Pool` satisfy it as they are. Engines that run several statements
 * in a transaction (identity resolution) need a single connection, never a pool.
 */
export interface SqlRunner {
  query(sql: string, params?: unknown[]): Promise<{ rows: any[]; rowCount?: number | null }>;
}

/**
 * A runner on one connection that can also stream `COPY … TO STDOUT` (identity resolution reads
 * its edge list that way: no row objects, a few bytes per edge).
 */
export interface CopyOutRunner extends SqlRunner {
  copyOut(sql: string): AsyncIterable<Buffer>;
}

/** A table named by its schema, as introspection reports it. */
export interface TableRef {
  schema: string;
  name: string;
}

export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

export function qualified(table: TableRef): string {
  return `${quoteIdent(table.schema)}.${quoteIdent(table.name)}`;
}

/** String literal for the few places a value is part of generated DDL/identifiers; values otherwise go in params. */
export function quoteLiteral(value: string): string {
  return `'${value.replaceAll("'", "''")}'`;
}

/** Parses "schema.table" (quoted parts allowed); a bare name lands in `defaultSchema`. */
export function parseTableName(text: string, defaultSchema = 'public'): TableRef {
  const parts: string[] = [];
  let i = 0;
  while (i < text.length) {
    if (text[i] === '"') {
      let part = '';
      i++;
      while (i < text.length) {
        if (text[i] === '"' && text[i + 1] === '"') {
          part += '"';
          i += 2;
        } else if (text[i] === '"') {
          i++;
          break;
        } else part += text[i++];
      }
      parts.push(part);
    } else {
      const end = text.indexOf('.', i);
      parts.push(text.slice(i, end === -1 ? text.length : end).trim());
      i = end === -1 ? text.length : end;
    }
    if (text[i] === '.') i++;
  }
  if (parts.length === 1) return { schema: defaultSchema, name: parts[0] };
  if (parts.length === 2 && parts[0] && parts[1]) return { schema: parts[0], name: parts[1] };
  throw new Error(`Not a table name: ${text}`);
}

/** pg returns bigint/numeric as strings; counts and estimates are safe as JS numbers. */
export function toNumber(value: unknown): number | null {
  if (value === null || value === undefined) return null;
  const n = typeof value === 'number' ? value : Number(value);
  return Number.isNaN(n) ? null : n;
}

export type TypeFamily =
  | 'integer'
  | 'bigint'
  | 'float'
  | 'numeric'
  | 'boolean'
  | 'date'
  | 'timestamp'
  | 'timestamptz'
  | 'time'
  | 'text'
  | 'uuid'
  | 'json'
  | 'unordered'
  | 'other';

/**
 * Groups the type names information_schema/pg_catalog report (and the portable names of
 * schema.json) by what can be aggregated on them.
 */
export function typeFamily(type: string): TypeFamily {
  const t = type.toLowerCase().trim();
  if (t.endsWith('[]') || t.startsWith('_') || t === 'array') return 'other';
  const base = t.replace(/\(.*\)/, '').trim();
  if (['smallint', 'integer', 'int', 'int2', 'int4', 'smallserial', 'serial', 'serial4'].includes(base))
    return 'integer';
  if (['bigint', 'int8', 'bigserial', 'serial8'].includes(base)) return 'bigint';
  if (['real', 'float4', 'double precision', 'float8', 'float'].includes(base)) return 'float';
  if (['numeric', 'decimal', 'money'].includes(base)) return base === 'money' ? 'other' : 'numeric';
  if (['boolean', 'bool'].includes(base)) return 'boolean';
  if (base === 'date') return 'date';
  if (['timestamp with time zone', 'timestamptz'].includes(base)) return 'timestamptz';
  if (['timestamp', 'timestamp without time zone'].includes(base)) return 'timestamp';
  if (base.startsWith('time')) return 'time';
  if (
    ['text', 'character varying', 'varchar', 'character', 'char', 'bpchar', 'name', 'citext'].includes(base)
  )
    return 'text';
  if (base === 'uuid') return 'uuid';
  if (['json', 'jsonb'].includes(base)) return 'json';
  // No equality operator: count(distinct) must go through text.
  if (['xml', 'point', 'line', 'lseg', 'box', 'path', 'polygon', 'circle'].includes(base)) return 'unordered';
  return 'other';
}
