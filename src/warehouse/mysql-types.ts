/**
 * MySQL / MariaDB column types → the PostgreSQL types of their raw copy, and the encoders that turn
 * the values mysql2 hands over (as text, see `mysqlTypeCast`) into COPY text-format fields.
 *
 * The mapping (README "MySQL and MariaDB sources" repeats it for users):
 * - tinyint(1) and bit(1) → boolean (any non-zero value is true)
 * - tinyint, smallint, year → smallint; tinyint unsigned → smallint; smallint unsigned, mediumint → integer;
 *   int → integer; int unsigned → bigint; bigint → bigint; bigint unsigned → numeric(20,0)
 *   (the unsigned ranges do not fit the signed PostgreSQL type of the same width)
 * - decimal(p,s) → numeric(p,s); float → real (read as a double: the text protocol prints a float with six
 *   significant digits); double → double precision; bit(n) → bigint for n < 64, numeric(20,0) for bit(64)
 *   (values up to 2^64 - 1)
 * - char(n), varchar(n) → character varying(n); the text types → text; enum → text;
 *   set → text[] (one element per member); json (MySQL json, MariaDB longtext checked by json_valid) → jsonb
 * - date → date; datetime(p) → timestamp(p); timestamp(p) → timestamptz(p) (read in UTC); time → interval;
 *   dates PostgreSQL has no value for → NULL: zero dates (`0000-00-00`, a zero month or day), year 0, and
 *   days past the end of their month (`2021-02-31`, stored under ALLOW_INVALID_DATES); such columns are
 *   therefore never NOT NULL in the raw copy (see `mayLoadAsNull`)
 * - binary, varbinary, the blob types, geometry → bytea
 * Text is read as utf8mb4 whatever the column's charset (the server converts); NUL characters, which
 * PostgreSQL text cannot hold, are dropped; so is the `\u0000` escape in JSON, which jsonb refuses.
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
  /**
   * Extract the column as a double (`col + 0e0`): MySQL's text protocol prints a FLOAT with six
   * significant digits, while its double spelling parses back into exactly the same single-precision value.
   */
  asDouble?: true;
}

/**
 * Kinds whose values the encoder may turn into NULL (dates PostgreSQL has no value for): their raw
 * columns are never NOT NULL, whatever the source column says.
 */
export function mayLoadAsNull(kind: ValueKind): boolean {
  return kind === 'date' || kind === 'timestamp' || kind === 'timestamptz';
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
      return { pg: 'real', kind: 'numeric', asDouble: true };
    case 'double':
    case 'real':
      return { pg: 'double precision', kind: 'numeric' };
    case 'bit': {
      // bit(64) reaches 2^64 - 1, past bigint; bit(2) … bit(63) fit it.
      const width = Number(args || '1');
      if (width <= 1) return { pg: 'boolean', kind: 'bool' };
      return width < 64 ? { pg: 'bigint', kind: 'bits' } : { pg: 'numeric(20,0)', kind: 'bits' };
    }
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

/**
 * `\u0000` escapes dropped from JSON text (jsonb cannot hold NUL, as text cannot). Escapes are read
 * in pairs, so an escaped backslash followed by `u0000` (`\\u0000`) stays: that is text, not NUL.
 */
function dropJsonNul(text: string): string {
  return text.replace(/\\u0000|\\./gs, (escape) => (escape === '\\u0000' ? '' : escape));
}

const DATE_PARTS = /^(\d{4})-(\d{2})-(\d{2})/;
const DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

/**
 * Whether PostgreSQL has a date for that year, month and day. MySQL also stores zero dates
 * (`0000-00-00`, `2024-00-10`, `2024-05-00`) and, under ALLOW_INVALID_DATES, days past the end of the
 * month (`2021-02-31`, `2023-02-29`); PostgreSQL has no year 0 either.
 */
function isLoadableDate(year: number, month: number, day: number): boolean {
  if (year < 1 || year > 9999 || month < 1 || month > 12 || day < 1) return false;
  if (day <= 28) return true;
  const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
  return day <= (month === 2 && leap ? 29 : DAYS_IN_MONTH[month - 1]);
}

function isUnloadableDate(value: string): boolean {
  const m = DATE_PARTS.exec(value);
  return !m || !isLoadableDate(Number(m[1]), Number(m[2]), Number(m[3]));
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
      return isUnloadableDate(text) ? NULL : text;
    case 'timestamptz':
      return isUnloadableDate(text) ? NULL : `${text}+00`;
    case 'json':
      return copyEscape(dropJsonNul(text));
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
 * (text; json, which also drops `\u0000`), as a date unless PostgreSQL has none for it (with `+00`
 * for timestamptz), as a boolean, or through encodeValue (bit(n), the byte types, set: rare enough to
 * go through a string).
 */
const AS_IS = 0;
const ESCAPED = 1;
const DATE = 2;
const DATE_UTC = 3;
const BOOL = 4;
const VIA_STRING = 5;
const ESCAPED_JSON = 6;

function writeMode(kind: ValueKind): number {
  switch (kind) {
    case 'int':
    case 'numeric':
    case 'interval':
      return AS_IS;
    case 'text':
      return ESCAPED;
    case 'json':
      return ESCAPED_JSON;
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

/** A date (`YYYY-MM-DD…`, read off the bytes) that PostgreSQL has no value for: see isLoadableDate. */
export function unloadableDateBytes(v: Buffer): boolean {
  if (v.length < 10 || v[4] !== 0x2d || v[7] !== 0x2d) return true;
  const year = (v[0] - 0x30) * 1000 + (v[1] - 0x30) * 100 + (v[2] - 0x30) * 10 + (v[3] - 0x30);
  const month = (v[5] - 0x30) * 10 + (v[6] - 0x30);
  const day = (v[8] - 0x30) * 10 + (v[9] - 0x30);
  return !isLoadableDate(year, month, day);
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
        if (mode !== AS_IS && unloadableDateBytes(v)) {
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
      } else if (mode === ESCAPED || mode === ESCAPED_JSON) {
        const json = mode === ESCAPED_JSON;
        const n = v.length;
        for (let j = 0; j < n; j++) {
          const c = v[j];
          if (c > 0x5c) buf[pos++] = c;
          else if (c === 0x5c) {
            buf[pos++] = 0x5c;
            buf[pos++] = 0x5c;
            if (json) {
              // A JSON escape is read whole: `\u0000` (NUL, which jsonb refuses) is dropped, and the
              // second backslash of `\\` is consumed here so that it never starts an escape of its own.
              const next = v[j + 1];
              if (next === 0x5c) {
                buf[pos++] = 0x5c;
                buf[pos++] = 0x5c;
                j++;
              } else if (
                next === 0x75 &&
                v[j + 2] === 0x30 &&
                v[j + 3] === 0x30 &&
                v[j + 4] === 0x30 &&
                v[j + 5] === 0x30
              ) {
                pos -= 2;
                j += 5;
              }
            }
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
