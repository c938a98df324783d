import pg from 'pg';
import type Cursor from 'pg-cursor';
import { AppError } from '../app-error.ts';

/** Reading results within bounds: rows counted in bytes as they arrive, cursors read a batch at a time. */

/** What a row weighs in the answer: string and buffer lengths, 8 bytes for other scalars. */
function sizeOfRow(row: Record<string, unknown>): number {
  let size = 0;
  for (const value of Object.values(row)) {
    if (typeof value === 'string') size += value.length;
    else if (Buffer.isBuffer(value)) size += value.length;
    else if (value !== null && typeof value === 'object') size += JSON.stringify(value).length;
    else size += 8;
  }
  return size;
}

/**
 * A 'data' listener that follows the protocol's message framing (type byte, 4-byte length) from a
 * message boundary and calls `onOversized` as soon as a header announces a message longer than
 * `maxBytes`: the bytes of such a message are never gathered. It only counts; pg parses as before.
 */
function messageSizeLimit(maxBytes: number, onOversized: () => void): (chunk: Buffer) => void {
  let bodyLeft = 0;
  const header = Buffer.alloc(5);
  let headerFill = 0;
  let stopped = false;
  return (chunk) => {
    let offset = 0;
    while (!stopped && offset < chunk.length) {
      if (bodyLeft > 0) {
        const skip = Math.min(bodyLeft, chunk.length - offset);
        bodyLeft -= skip;
        offset += skip;
        continue;
      }
      const take = Math.min(5 - headerFill, chunk.length - offset);
      chunk.copy(header, headerFill, offset, offset + take);
      headerFill += take;
      offset += take;
      if (headerFill < 5) return;
      headerFill = 0;
      bodyLeft = header.readInt32BE(1) - 4;
      if (bodyLeft > maxBytes) {
        stopped = true;
        onOversized();
      }
    }
  };
}

export function readCursor(
  cursor: Cursor,
  count: number,
): Promise<{ rows: Record<string, unknown>[]; fields: pg.FieldDef[] }> {
  return new Promise((resolve, reject) =>
    cursor.read(count, (error, rows, result) =>
      error ? reject(error) : resolve({ rows, fields: result?.fields ?? [] }),
    ),
  );
}

/**
 * Runs `text`, keeping its rows as they arrive and counting their bytes: past the byte cap it stops
 * keeping them and answers 413 at once; the connection, which the server may still be filling,
 * is then dropped rather than reused. pg reads each protocol message whole before it parses it, so a
 * single row larger than the cap is stopped on its message header, before its bytes are held.
 */
export function readCapped(
  client: pg.PoolClient,
  text: string,
  params: unknown[] | undefined,
  byteCap: number,
): Promise<{ rows: Record<string, unknown>[]; fields: pg.FieldDef[] }> {
  const socket = (client as unknown as pg.Client).connection.stream;
  return new Promise((resolve, reject) => {
    const rows: Record<string, unknown>[] = [];
    let bytes = 0;
    let over = false;
    const tooLarge = () => {
      over = true;
      reject(
        new AppError(
          'PAYLOAD_TOO_LARGE',
          `The result is larger than ${byteCap} bytes (WAREHOUSE_RESULT_BYTE_CAP) after ${rows.length} rows: select fewer rows or columns, or aggregate`,
          { reason: 'RESULT_TOO_LARGE' },
        ),
      );
    };
    const watchMessages = messageSizeLimit(byteCap, () => {
      if (!over) tooLarge();
      socket.destroy();
    });
    socket.prependListener('data', watchMessages);
    const done = () => socket.off('data', watchMessages);
    const query = new pg.Query(text, params);
    query.on('row', (row: Record<string, unknown>) => {
      if (over) return;
      bytes += sizeOfRow(row);
      if (bytes > byteCap) return tooLarge();
      rows.push(row);
    });
    query.on('error', (error: Error) => {
      done();
      if (!over) reject(error);
    });
    query.on('end', (result: pg.QueryResult) => {
      done();
      if (!over) resolve({ rows, fields: result.fields });
    });
    client.query(query);
  });
}

const FLOATS = new Set([700, 701]);
const FLOAT_ARRAYS = new Set([1021, 1022]);
const BYTEA = 17;
const BYTEA_ARRAY = 1001;

/**
 * Result values that JSON cannot carry as they are, in the text PostgreSQL prints for them: a float
 * NaN or ±Infinity (JSON made them null, like SQL NULL) and bytea (a Buffer became
 * `{"type":"Buffer","data":[…]}`; `\x…` hex as sample values show it). Rows are changed in place,
 * only in the columns of those types.
 */
export function asJsonValues(rows: Record<string, unknown>[], fields: pg.FieldDef[]): void {
  const float = (v: unknown) => (typeof v === 'number' && !Number.isFinite(v) ? String(v) : v);
  const bytes = (v: unknown) => (Buffer.isBuffer(v) ? `\\x${v.toString('hex')}` : v);
  const each = (f: (v: unknown) => unknown) => (v: unknown) => (Array.isArray(v) ? v.map(f) : v);
  const convert = new Map<string, (v: unknown) => unknown>();
  for (const { name, dataTypeID } of fields) {
    if (FLOATS.has(dataTypeID)) convert.set(name, float);
    else if (FLOAT_ARRAYS.has(dataTypeID)) convert.set(name, each(float));
    else if (dataTypeID === BYTEA) convert.set(name, bytes);
    else if (dataTypeID === BYTEA_ARRAY) convert.set(name, each(bytes));
  }
  if (!convert.size) return;
  for (const row of rows) for (const [name, f] of convert) row[name] = f(row[name]);
}
