/**
 * MySQL / MariaDB column types → the PostgreSQL types of their raw copy, and the encoders that turn
 * the values mysql2 hands over (as text, see `mysqlTypeCast`) into COPY text-format fields.
 *
 * The mapping (README "MySQL and MariaDB sources" repeats it for users):
 * - tinyint(1) and bit(1) → boolean (any non-zero value is true)
 * - tinyint, smallint, year → smallint; tinyint unsigned → smallint; smallint unsigned, mediumint → integer;
 *   int → integer; int unsigned → bigint; bigint → bigint; bigint unsigned → numeric(20,0)
 *   (the unsigned ranges do not fit the signed PostgreSQL type of the same width)
 * - decimal(p,s) → numeric(p,s); float → real; double → double precision; bit(n) → bigint
 * - char(n), varchar(n) → character varying(n); the text types → text; enum → text;
 *   set → text[] (one element per member); json (MySQL json, MariaDB longtext checked by json_valid) → jsonb
 * - date → date; datetime(p) → timestamp(p); timestamp(p) → timestamptz(p) (read in UTC); time → interval;
 *   zero dates (`0000-00-00`, a zero month or day) → NULL, which PostgreSQL has no value for
 * - binary, varbinary, the blob types, geometry → bytea
 * Text is read as utf8mb4 whatever the column's charset (the server converts); NUL characters, which
 * PostgreSQL text cannot hold, are dropped.
 */

export type ValueKind =
  | 'bool'
  | 'int'
  | 'numeric'
  | 'text'
  | 'json'
  | 'set'
  | 'date'
  | 'timestamp'
  | 'timestamptz'
  | 'interval'
  | 'bytea'
  | 'bits';

export interface MappedType {
  /** PostgreSQL spelling, as introspection reports column types. */
  pg: string;
  kind: ValueKind;
}

/**
 * `columnType` is information_schema.COLUMNS.COLUMN_TYPE (e.g. `int(10) unsigned`, `enum('a','b')`);
 * `json` says that the column is JSON (MariaDB spells it longtext with a json_valid check).
 */
export function mapMysqlType(columnType: string, json = false): MappedType {
  const t = columnType.toLowerCase().trim();
  if (json || t === 'json') return { pg: 'jsonb', kind: 'json' };
  const m = /^([a-z]+)(?:\(([^)]*)\))?\s*(.*)$/.exec(t);
  const base = m?.[1] ?? t;
  const args = m?.[2] ?? '';
  const unsigned = /unsigned/.test(m?.[3] ?? '');
  switch (base) {
    case 'tinyint':
      return args === '1' && !unsigned ? { pg: 'boolean', kind: 'bool' } : { pg: 'smallint', kind: 'int' };
    case 'bool':
    case 'boolean':
      return { pg: 'boolean', kind: 'bool' };
    case 'smallint':
      return unsigned ? { pg: 'integer', kind: 'int' } : { pg: 'smallint', kind: 'int' };
    case 'year':
      return { pg: 'smallint', kind: 'int' };
    case 'mediumint':
      return { pg: 'integer', kind: 'int' };
    case 'int':
    case 'integer':
      return unsigned ? { pg: 'bigint', kind: 'int' } : { pg: 'integer', kind: 'int' };
    case 'bigint':
      return unsigned ? { pg: 'numeric(20,0)', kind: 'numeric' } : { pg: 'bigint', kind: 'int' };
    case 'decimal':
    case 'numeric':
    case 'dec':
    case 'fixed':
      return { pg: args ? `numeric(${args.replace(/\s/g, '')})` : 'numeric', kind: 'numeric' };
    case 'float':
      return { pg: 'real', kind: 'numeric' };
    case 'double':
    case 'real':
      return { pg: 'double precision', kind: 'numeric' };
    case 'bit':
      return args === '1' || !args ? { pg: 'boolean', kind: 'bool' } : { pg: 'bigint', kind: 'bits' };
    case 'char':
    case 'varchar':
      return { pg: args ? `character varying(${args})` : 'text', kind: 'text' };
    case 'tinytext':
    case 'text':
    case 'mediumtext':
    case 'longtext':
    case 'enum':
    case 'uuid':
    case 'inet4':
    case 'inet6':
      return { pg: 'text', kind: 'text' };
    case 'set':
      return { pg: 'text[]', kind: 'set' };
    case 'date':
      return { pg: 'date', kind: 'date' };
    case 'datetime':
      return {
        pg: args ? `timestamp(${args}) without time zone` : 'timestamp without time zone',
        kind: 'timestamp',
      };
    case 'timestamp':
      return {
        pg: args ? `timestamp(${args}) with time zone` : 'timestamp with time zone',
        kind: 'timestamptz',
      };
    case 'time':
      return { pg: 'interval', kind: 'interval' };
    default:
      // binary, varbinary, the blobs, geometry and whatever a later server version adds: the bytes.
      return { pg: 'bytea', kind: 'bytea' };
  }
}

/** COPY text format: backslash, newline, carriage return and tab escaped; NUL dropped. */
export function copyEscape(text: string): string {
  return text.replace(/[\\\n\r\t\0]/g, (c) =>
    c === '\\' ? '\\\\' : c === '\n' ? '\\n' : c === '\r' ? '\\r' : c === '\t' ? '\\t' : '',
  );
}

const ZERO_DATE = /^(\d{4})-(\d{2})-(\d{2})/;

/** `0000-00-00`, `2024-00-10`, `2024-05-00`: values MySQL accepts and PostgreSQL has no date for. */
function isZeroDate(value: string): boolean {
  const m = ZERO_DATE.exec(value);
  return !m || m[1] === '0000' || m[2] === '00' || m[3] === '00';
}

const NULL = '\\N';

/**
 * The COPY field for one value of a column of that kind. Extraction reads with mysql2's
 * `typeCast: false`, so values arrive as the server's bytes (text in utf8mb4); strings are accepted too.
 */
export function encodeValue(kind: ValueKind, value: string | Buffer | null): string {
  if (value === null) return NULL;
  switch (kind) {
    case 'bool':
      // tinyint(1) arrives as the digits, bit(1) as the bit itself.
      if (Buffer.isBuffer(value))
        return value.length === 1 && (value[0] === 0 || value[0] === 0x30) ? 'f' : 't';
      return value === '0' ? 'f' : 't';
    case 'bits':
      return Buffer.isBuffer(value) ? BigInt('0x' + (value.toString('hex') || '0')).toString() : value;
    case 'bytea':
      return '\\\\x' + (Buffer.isBuffer(value) ? value : Buffer.from(value)).toString('hex');
    default:
  }
  const text = Buffer.isBuffer(value) ? value.toString('utf8') : value;
  switch (kind) {
    case 'int':
    case 'numeric':
      return text;
    case 'date':
    case 'timestamp':
      return isZeroDate(text) ? NULL : text;
    case 'timestamptz':
      return isZeroDate(text) ? NULL : `${text}+00`;
    case 'set': {
      if (!text) return '{}';
      const members = text.split(',').map((m) => `"${m.replace(/["\\]/g, (c) => `\\${c}`)}"`);
      return copyEscape(`{${members.join(',')}}`);
    }
    default:
      return copyEscape(text);
  }
}

const CHUNK_BYTES = 64 * 1024;
const BACKSLASH_N = Buffer.from('\\N');
const UTC = Buffer.from('+00');
const ESCAPES: Record<number, number> = { 0x5c: 0x5c, 0x0a: 0x6e, 0x0d: 0x72, 0x09: 0x74 };

/** Year, month or day all zeros, read off the bytes (`YYYY-MM-DD…`). */
function zeroDateBytes(v: Buffer): boolean {
  if (v.length < 10) return true;
  const zero = (from: number, to: number) => {
    for (let i = from; i < to; i++) if (v[i] !== 0x30) return false;
    return true;
  };
  return zero(0, 4) || zero(5, 7) || zero(8, 10);
}

/**
 * COPY text built directly from the server's bytes: numbers, dates and text that needs no escaping
 * are copied as they are, with no decoding to a JS string and back. Full chunks are handed to `emit`.
 */
export class CopyEncoder {
  #buf = Buffer.allocUnsafe(CHUNK_BYTES);
  #pos = 0;
  constructor(
    private readonly kinds: ValueKind[],
    private readonly emit: (chunk: Buffer) => void,
  ) {}

  #room(bytes: number) {
    if (this.#pos + bytes <= this.#buf.length) return;
    this.flush();
    if (bytes > this.#buf.length) this.#buf = Buffer.allocUnsafe(Math.max(CHUNK_BYTES, bytes));
  }

  #bytes(b: Buffer) {
    this.#room(b.length);
    b.copy(this.#buf, this.#pos);
    this.#pos += b.length;
  }

  #text(v: Buffer) {
    this.#room(v.length * 2);
    const buf = this.#buf;
    let pos = this.#pos;
    for (let i = 0; i < v.length; i++) {
      const c = v[i];
      if (c === 0) continue;
      const e = c === 0x5c || c === 0x0a || c === 0x0d || c === 0x09 ? ESCAPES[c] : 0;
      if (e) {
        buf[pos++] = 0x5c;
        buf[pos++] = e;
      } else buf[pos++] = c;
    }
    this.#pos = pos;
  }

  row(values: (Buffer | null)[]) {
    const kinds = this.kinds;
    for (let i = 0; i < kinds.length; i++) {
      if (i) this.#bytes(TAB);
      const v = values[i];
      const kind = kinds[i];
      if (v === null) this.#bytes(BACKSLASH_N);
      else if (kind === 'int' || kind === 'numeric' || kind === 'interval') this.#bytes(v);
      else if (kind === 'text' || kind === 'json') this.#text(v);
      else if (kind === 'date' || kind === 'timestamp' || kind === 'timestamptz') {
        if (zeroDateBytes(v)) this.#bytes(BACKSLASH_N);
        else {
          this.#bytes(v);
          if (kind === 'timestamptz') this.#bytes(UTC);
        }
      } else this.#bytes(Buffer.from(encodeValue(kind, v), 'utf8'));
    }
    this.#bytes(NEWLINE);
  }

  flush() {
    if (this.#pos) this.emit(this.#buf.subarray(0, this.#pos));
    this.#buf = Buffer.allocUnsafe(CHUNK_BYTES);
    this.#pos = 0;
  }
}

const TAB = Buffer.from('\t');
const NEWLINE = Buffer.from('\n');
