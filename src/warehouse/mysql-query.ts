import type { FieldPacket, PoolConnection } from 'mysql2';
import { AppError } from '../app-error.ts';

/**
 * Rows of a user's statement on `connection`, kept as they arrive while their bytes are counted:
 * one row past `cap` stops the read (`stopped`: the server may still be sending, so the caller drops
 * the connection), and past `byteCap` the answer is a 413.
 */
export function readCapped(
  connection: PoolConnection,
  statement: string,
  params: unknown[] | undefined,
  cap: number,
  byteCap: number,
): Promise<{ rows: Record<string, unknown>[]; fields: FieldPacket[]; stopped: boolean }> {
  return new Promise((resolve, reject) => {
    const rows: Record<string, unknown>[] = [];
    let fields: FieldPacket[] = [];
    let bytes = 0;
    let done = false;
    const query = connection.query({ sql: statement, values: params });
    query.on('fields', (f: FieldPacket[]) => (fields = f));
    query.on('result', (row: Record<string, unknown>) => {
      if (done) return;
      if (rows.length === cap) {
        done = true;
        return resolve({ rows: [...rows, row], fields, stopped: true });
      }
      for (const v of Object.values(row))
        bytes += typeof v === 'string' ? v.length : Buffer.isBuffer(v) ? v.length : 8;
      if (bytes > byteCap) {
        done = true;
        return reject(
          new AppError(
            'PAYLOAD_TOO_LARGE',
            `The result is larger than ${byteCap} bytes (WAREHOUSE_RESULT_BYTE_CAP) after ${rows.length} rows: select fewer rows or columns, or aggregate`,
            { reason: 'RESULT_TOO_LARGE' },
          ),
        );
      }
      rows.push(row);
    });
    query.on('error', (error: Error) => {
      if (!done) reject(error);
      done = true;
    });
    query.on('end', () => {
      if (!done) resolve({ rows, fields, stopped: false });
      done = true;
    });
  });
}

const FIELD_TYPES: Record<number, string> = {
  0: 'numeric',
  1: 'smallint',
  2: 'smallint',
  3: 'integer',
  4: 'real',
  5: 'double precision',
  7: 'timestamp with time zone',
  8: 'bigint',
  9: 'integer',
  10: 'date',
  11: 'interval',
  12: 'timestamp without time zone',
  13: 'smallint',
  16: 'bigint',
  245: 'jsonb',
  246: 'numeric',
  247: 'text',
  248: 'text[]',
  252: 'text',
  253: 'text',
  254: 'text',
  255: 'bytea',
};

/** A result column's type in the PostgreSQL spelling the rest of dimas reads. */
export function fieldTypeName(f: FieldPacket): string {
  const type =
    (f as { columnType?: number; type?: number }).columnType ?? (f as { type?: number }).type ?? -1;
  // Binary charset (63) on a string type means bytes.
  if ((type === 252 || type === 253 || type === 254) && (f as { characterSet?: number }).characterSet === 63)
    return 'bytea';
  return FIELD_TYPES[type] ?? 'text';
}

const BIT = 16;

/**
 * Bytes as JSON can carry them, as the PostgreSQL path shows them: a BIT value (labelled bigint) as
 * its number (text beyond 2^53), other bytes as `\x…` hex. Both reached clients as a serialized
 * Buffer. Rows are changed in place.
 */
export function bytesAsJson(rows: Record<string, unknown>[], fields: FieldPacket[]): void {
  const bit = new Set(
    fields
      .filter((f) => ((f as { columnType?: number }).columnType ?? (f as { type?: number }).type) === BIT)
      .map((f) => f.name),
  );
  for (const row of rows)
    for (const [name, value] of Object.entries(row)) {
      if (!Buffer.isBuffer(value)) continue;
      if (bit.has(name)) {
        const n = value.length ? BigInt(`0x${value.toString('hex')}`) : 0n;
        row[name] = n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n.toString();
      } else row[name] = `\\x${value.toString('hex')}`;
    }
}
