// pg-cursor ships without types; only what the warehouse layer uses.
declare module 'pg-cursor' {
  import type { FieldDef, Submittable } from 'pg';

  export default class Cursor<R = Record<string, unknown>> implements Submittable {
    constructor(text: string, values?: unknown[], config?: { rowMode?: 'array'; types?: unknown });
    submit(connection: unknown): void;
    read(rows: number): Promise<R[]>;
    read(
      rows: number,
      cb: (error: Error | undefined, rows: R[], result: { fields: FieldDef[] }) => void,
    ): void;
    close(): Promise<void>;
  }
}
