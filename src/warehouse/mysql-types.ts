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
function copyEscape(text: string): string {
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
function encodeValue(kind: ValueKind, value: string | Buffer | null): string {
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

/**
 * How the encoder writes a column's bytes: as they are (digits, `time` as an interval), escaped
 * (text, json), as a date unless it is a zero date (with `+00` for timestamptz), as a boolean, or
 * through encodeValue (bit(n), the byte types, set: rare enough to go through a string).
 */
const AS_IS = 0;
const ESCAPED = 1;
const DATE = 2;
const DATE_UTC = 3;
const BOOL = 4;
const VIA_STRING = 5;

function writeMode(kind: ValueKind): number {
  switch (kind) {
    case 'int':
    case 'numeric':
    case 'interval':
      return AS_IS;
    case 'text':
    case 'json':
      return ESCAPED;
    case 'date':
    case 'timestamp':
      return DATE;
    case 'timestamptz':
      return DATE_UTC;
    case 'bool':
      return BOOL;
    default:
      return VIA_STRING;
  }
}

// 256 KiB: a few COPY messages per thousand rows rather than one per row, and far below any RSS concern.
const CHUNK_BYTES = 256 * 1024;
// Below this length a byte loop beats Buffer#copy, whose call costs more than the copy itself.
const SHORT = 48;

/** Year, month or day all zeros, read off the bytes (`YYYY-MM-DD…`). */
function zeroDateBytes(v: Buffer): boolean {
  if (v.length < 10) return true;
  return (
    (v[0] === 0x30 && v[1] === 0x30 && v[2] === 0x30 && v[3] === 0x30) ||
    (v[5] === 0x30 && v[6] === 0x30) ||
    (v[8] === 0x30 && v[9] === 0x30)
  );
}

/**
 * COPY text built directly from the server's bytes into one buffer: numbers, dates and text are copied
 * (text escaped byte by byte), with no decoding to a JS string and back. Full chunks are handed to `emit`.
 */
export class CopyEncoder {
  #buf = Buffer.allocUnsafe(CHUNK_BYTES);
  #pos = 0;
  readonly #modes: number[];
  readonly #kinds: ValueKind[];
  private readonly emit: (chunk: Buffer) => void;

  constructor(kinds: ValueKind[], emit: (chunk: Buffer) => void) {
    this.emit = emit;
    this.#kinds = kinds;
    this.#modes = kinds.map(writeMode);
  }

  /** Room for `bytes` more: the full part is emitted and a new chunk started (larger for one huge value). */
  #room(bytes: number) {
    this.flush();
    if (bytes > this.#buf.length) this.#buf = Buffer.allocUnsafe(bytes + CHUNK_BYTES);
  }

  row(values: (Buffer | null)[]) {
    const modes = this.#modes;
    let buf = this.#buf;
    let pos = this.#pos;
    for (let i = 0; i < modes.length; i++) {
      const v = values[i];
      // Escaping at most doubles a value; 8 covers the tab, `\N`, `+00` and the newline.
      const need = v === null ? 8 : 2 * v.length + 8;
      if (pos + need > buf.length) {
        this.#pos = pos;
        this.#room(need);
        buf = this.#buf;
        pos = this.#pos;
      }
      if (i) buf[pos++] = 0x09;
      if (v === null) {
        buf[pos++] = 0x5c;
        buf[pos++] = 0x4e;
        continue;
      }
      const mode = modes[i];
      if (mode === AS_IS || mode === DATE || mode === DATE_UTC) {
        if (mode !== AS_IS && zeroDateBytes(v)) {
          buf[pos++] = 0x5c;
          buf[pos++] = 0x4e;
          continue;
        }
        const n = v.length;
        if (n < SHORT) for (let j = 0; j < n; j++) buf[pos++] = v[j];
        else pos += v.copy(buf, pos);
        if (mode === DATE_UTC) {
          buf[pos++] = 0x2b;
          buf[pos++] = 0x30;
          buf[pos++] = 0x30;
        }
      } else if (mode === ESCAPED) {
        const n = v.length;
        for (let j = 0; j < n; j++) {
          const c = v[j];
          if (c > 0x5c) buf[pos++] = c;
          else if (c === 0x5c) {
            buf[pos++] = 0x5c;
            buf[pos++] = 0x5c;
          } else if (c === 0x0a) {
            buf[pos++] = 0x5c;
            buf[pos++] = 0x6e;
          } else if (c === 0x0d) {
            buf[pos++] = 0x5c;
            buf[pos++] = 0x72;
          } else if (c === 0x09) {
            buf[pos++] = 0x5c;
            buf[pos++] = 0x74;
          } else if (c !== 0) buf[pos++] = c;
        }
      } else if (mode === BOOL) {
        // tinyint(1) arrives as its digits, bit(1) as the bit itself: only a single 0 or '0' is false.
        buf[pos++] = v.length === 1 && (v[0] === 0 || v[0] === 0x30) ? 0x66 : 0x74;
      } else {
        const text = encodeValue(this.#kinds[i], v);
        const bytes = Buffer.byteLength(text);
        if (pos + bytes + 2 > buf.length) {
          this.#pos = pos;
          this.#room(bytes + 2);
          buf = this.#buf;
          pos = this.#pos;
        }
        pos += buf.write(text, pos);
      }
    }
    if (pos + 1 > buf.length) {
      this.#pos = pos;
      this.#room(1);
      buf = this.#buf;
      pos = this.#pos;
    }
    buf[pos++] = 0x0a;
    this.#pos = pos;
  }

  flush() {
    if (this.#pos) this.emit(this.#buf.subarray(0, this.#pos));
    this.#buf = Buffer.allocUnsafe(CHUNK_BYTES);
    this.#pos = 0;
  }
}
