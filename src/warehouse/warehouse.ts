import { Readable, type Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ConnectionConfig } from './config.ts';
import type { ColumnProfile } from '../llm/profile.ts';

/** A relation of a warehouse as introspection reports it. */
export type RelationKind = 'table' | 'view' | 'materialized_view' | 'foreign_table' | 'partitioned_table';

interface IntrospectedColumn {
  name: string;
  /** PostgreSQL spelling, e.g. `character varying(255)`, `timestamp with time zone`; a domain by its own name. */
  type: string;
  /**
   * The type the column's values are of, spelled as `type`: for a domain, the type it is over (a domain
   * over a domain followed to the end, from the catalog's pg_type.typbasetype); else `type` itself.
   * Whatever depends on the values (aggregates, operators, casts, families) decides by it, never by a
   * domain's name, which no list of type names can know.
   */
  base_type: string;
  nullable: boolean;
  /** What an insert without the column fills in; null for a generated column, whose expression is no default. */
  default: string | null;
  /** The expression of a generated column (computed from the row's other columns, never inserted); else null. */
  generated: string | null;
  description: string | null;
  position: number;
}

interface IntrospectedForeignKey {
  name: string;
  columns: string[];
  references: { schema: string; table: string; columns: string[] };
}

export interface IntrospectedTable {
  schema: string;
  name: string;
  kind: RelationKind;
  description: string | null;
  /** The planner's estimate (pg_class.reltuples, else live tuples); null when never analyzed. */
  estimated_rows: number | null;
  primary_key: string[];
  foreign_keys: IntrospectedForeignKey[];
  columns: IntrospectedColumn[];
}

export interface IntrospectedSchema {
  database: string;
  /** The schemas asked for that exist. */
  schemas: string[];
  tables: IntrospectedTable[];
}

export interface IntrospectOptions {
  /** Schemas to read; default the config's `schemas`. */
  schemas?: string[];
  /** `table` or `schema.table` names to keep; default all. */
  tables?: string[];
}

/** @public The declarations of `dimas/client` (npm run build:types) name it in a procedure's output. */
export interface ResultColumn {
  name: string;
  type: string;
}

export interface QueryResult {
  columns: ResultColumn[];
  rows: Record<string, unknown>[];
  row_count: number;
  /** More rows existed than the cap allowed. */
  truncated: boolean;
  duration_ms: number;
}

export interface ReadOptions {
  /** Row cap; default and maximum WAREHOUSE_ROW_CAP. */
  limit?: number;
  /** statement_timeout; default WAREHOUSE_STATEMENT_TIMEOUT_MS. */
  timeoutMs?: number;
  params?: unknown[];
}

export interface AggregateOptions {
  params?: unknown[];
  /** statement_timeout; default WAREHOUSE_STATEMENT_TIMEOUT_MS. */
  timeoutMs?: number;
}

export interface StreamOptions {
  params?: unknown[];
  batchSize?: number;
  /** statement_timeout for the whole read; 0 = none (default: none, long reads feed jobs). */
  timeoutMs?: number;
}

/**
 * Longest sample value shown, in characters: a sample is a preview, and a column of 200 KB texts
 * would otherwise answer 200 KB per value. Longer values (bytes as \x hex included) are cut to this
 * many characters followed by SAMPLE_VALUE_CUT, in SQL, so the whole value never leaves the database.
 */
export const SAMPLE_VALUE_MAX_LENGTH = 1000;
export const SAMPLE_VALUE_CUT = '…';

export interface SampleValue {
  /** At most SAMPLE_VALUE_MAX_LENGTH characters, plus SAMPLE_VALUE_CUT when cut. */
  value: string;
  count: number;
  /** Present (true) only when the value was cut. */
  truncated?: true;
}

/** A row of a sample-values query (drivers answer counts and flags in their own types). */
export function sampleValue(value: unknown, truncated: unknown, count: unknown): SampleValue {
  const sample: SampleValue = { value: String(value), count: Number(count) };
  // MySQL answers the comparison as the number 0 or 1, PostgreSQL as a boolean.
  if (truncated === true || Number(truncated) === 1) sample.truncated = true;
  return sample;
}

export interface TableRef {
  schema: string;
  name: string;
}

/** The rows a chunk of COPY text-format data ends: the format escapes line breaks inside values. */
function copyRowsIn(chunk: Buffer): number {
  let rows = 0;
  for (let at = chunk.indexOf(10); at !== -1; at = chunk.indexOf(10, at + 1)) rows++;
  return rows;
}

/**
 * `sql`'s rows from `source` into `into`, a `COPY … FROM STDIN` of another database: the source's
 * COPY text as it comes, no row built in this process, with the pipeline's backpressure. `counted`
 * hears the rows of each chunk once it has gone on (it may throw to stop the copy).
 */
export async function pipeCopyText(
  source: Warehouse,
  sql: string,
  into: Writable,
  counted: (rows: number) => Promise<void>,
): Promise<void> {
  const copyOut = source.copyOut?.bind(source);
  if (!copyOut) throw new Error(`A ${source.config.type} warehouse gives no COPY text`);
  const chunks = async function* () {
    for await (const chunk of copyOut(sql)) {
      yield chunk;
      await counted(copyRowsIn(chunk));
    }
  };
  await pipeline(Readable.from(chunks(), { objectMode: false }), into);
}

/** What runs inside `transaction(fn)`: statements on one connection, committed together. */
export interface WarehouseTransaction {
  query<R extends Record<string, unknown> = Record<string, unknown>>(
    sql: string,
    params?: unknown[],
  ): Promise<{ rows: R[]; rowCount: number }>;
  /**
   * A `COPY … FROM STDIN` on the transaction's connection, as a stream taking COPY text-format lines
   * (with backpressure); the statement completes when the stream finishes.
   */
  copyFrom(sql: string): Writable;
  /** A `COPY … TO STDOUT` on the transaction's connection, as a stream of COPY text chunks. */
  copyTo(sql: string): Readable;
}

/**
 * A user's database (source or target), reached with a workspace's decrypted configuration.
 * Failures to connect are AppError UNPROCESSABLE_CONTENT with the driver's reason; user SQL that the
 * database rejects is BAD_REQUEST with its message.
 */
export interface Warehouse {
  readonly config: ConnectionConfig;
  /** Connects and runs `select 1`; throws the 422 with the reason when that fails. */
  ping(): Promise<{ server_version: string; database: string; user: string }>;
  /**
   * Whom this warehouse reaches, by the server's own identity (cluster, database, login role): two
   * warehouses with equal answers read the same data with the same rights, however their hosts were
   * written. Absent where the engine cannot tell it (MySQL).
   */
  reach?(): Promise<string>;
  /** Databases and schemas the credentials can see. */
  catalogs(): Promise<{ databases: string[]; schemas: string[] }>;
  /** Schemas, relations, columns, keys and estimated rows in a constant number of catalog queries. */
  introspect(options?: IntrospectOptions): Promise<IntrospectedSchema>;
  /**
   * Distinct non-null values of a column, most frequent first (limit default 20, max 1000), counted
   * on the whole value and shown cut at SAMPLE_VALUE_MAX_LENGTH.
   */
  sampleValues(table: TableRef, column: string, limit?: number): Promise<SampleValue[]>;
  /**
   * One read-only statement (checked by the SQL guard) in a READ ONLY transaction with a
   * statement_timeout and a row cap.
   */
  readOnlyQuery(sql: string, options?: ReadOptions): Promise<QueryResult>;
  /**
   * One statement that dimas generated itself (statistics, profiling): a READ ONLY transaction with a
   * statement_timeout, without the SQL guard's parse (which costs more than running a wide profile
   * statement) or a row cap. Never give it user text: only generated SQL whose user-supplied fragments
   * were checked as expressions, and which bounds its own result rows.
   */
  aggregate(sql: string, options?: AggregateOptions): Promise<Record<string, unknown>[]>;
  /**
   * Checks user SQL that is about to run inside a write (CREATE TABLE … AS, INSERT … SELECT): one
   * read-only statement whose called functions the catalog allows, as `readOnlyQuery` would; throws
   * the same 400 otherwise.
   */
  assertUserSqlAllowed(sql: string): Promise<void>;
  /** A read-only statement streamed in batches through a cursor; nothing is held beyond one batch. */
  stream(sql: string, options?: StreamOptions): AsyncGenerator<Record<string, unknown>[]>;
  /**
   * A read-only statement's rows as COPY text-format chunks (`COPY (…) TO STDOUT`), checked and run
   * as `stream` runs it: what another database's `COPY … FROM STDIN` reads without a row ever being
   * built in this process. Absent where the engine has no COPY (MySQL).
   */
  copyOut?(sql: string, options?: Pick<StreamOptions, 'timeoutMs'>): AsyncGenerator<Buffer>;
  /**
   * Discovery's column profiles in the engine's own SQL; absent, discovery runs the PostgreSQL profile
   * through `aggregate`.
   */
  profileTable?(
    schema: string,
    table: string,
    columns: readonly { name: string; type: string }[],
    options?: { rowLimit?: number | null; sampleSize?: number; maxSampleLength?: number },
  ): Promise<ColumnProfile[]>;
  /** DDL/DML in one transaction: committed when `fn` resolves, rolled back when it throws. */
  transaction<T>(fn: (tx: WarehouseTransaction) => Promise<T>): Promise<T>;
}
