import type pg from 'pg';
import Cursor from 'pg-cursor';
import { from as copyFrom, to as copyTo } from 'pg-copy-streams';
import { AppError } from '../app-error.ts';
import type { ConnectionConfig } from './config.ts';
import type { ServerIdentity } from './postgres-identity.ts';
import { introspectCatalog } from './introspect.ts';
import { asJsonValues, readCapped, readCursor } from './postgres-read.ts';
import {
  charsBefore,
  type ErrorContext,
  positionedIn,
  qualified,
  SAMPLE_LIMIT_DEFAULT,
  SAMPLE_LIMIT_MAX,
  sampleValuesSql,
  translate,
} from './postgres-sql.ts';
import {
  assertReadOnlySql,
  catalogVerdictSql,
  dependencyVerdictStatements,
  OWN_REFUSED_ROUTINES_SQL,
  reachedVerdictSql,
  refusedRoutine,
  type RoutineCheck,
  type CatalogObject,
} from './sql-guard.ts';
import type {
  AggregateOptions,
  IntrospectOptions,
  QueryResult,
  ReadOptions,
  SampleValue,
  StreamOptions,
  TableRef,
  Warehouse,
  WarehouseTransaction,
} from './warehouse.ts';
import { sampleValue } from './warehouse.ts';

export interface PoolEntry {
  key: string;
  config: ConnectionConfig;
  /** The pool once its host was resolved and checked (see #pool). */
  pool?: pg.Pool;
  opening?: Promise<pg.Pool>;
  lastUsed: number;
  /** Type OID → name, filled as result columns are described. */
  typeNames: Map<number, string>;
  /**
   * Whether user SQL can be checked as a temporary view here (not a standby, TEMPORARY granted, not
   * read only by default); asked once per pool.
   */
  holdsTempViews?: Promise<boolean>;
  /** Whether the last statement checked found functions of the database's own that may not run. */
  ownRefusedRoutines?: boolean;
  /** Whom the pool's connections reach, as the identity check of the latest one saw it. */
  server?: ServerIdentity;
}

/**
 * How values leave the warehouse as text, in every transaction dimas opens there: a database or role
 * may set other styles (`SQL, DMY` dates with zone abbreviations, escaped bytea, fewer float digits),
 * and text read in those styles was shifted or cut when a streamed copy parsed it in another
 * database, or when dimas read a date. Output only: `DateStyle = ISO` keeps the session's day order
 * for input, so the user's own date literals read as before. Set in the transaction's first round
 * trip, local to it, so nothing outlives it.
 */
const TEXT_FORMATS = [
  'set local DateStyle = ISO',
  'set local IntervalStyle = postgres',
  'set local bytea_output = hex',
  // 3: exact on every version (from 12 on, any positive value prints the shortest exact form).
  'set local extra_float_digits = 3',
];
const BEGIN_WITH_TEXT_FORMATS = ['begin', ...TEXT_FORMATS].join(';\n');

/** A PostgreSQL database behind the Warehouse interface, over one pool of the registry. */
export class PostgresWarehouse implements Warehouse {
  readonly config: ConnectionConfig;
  private readonly entry: PoolEntry;
  private readonly settings: { statementTimeoutMs: number; rowCap: number; resultByteCap: number };
  private readonly pool: () => Promise<pg.Pool>;

  constructor(
    config: ConnectionConfig,
    entry: PoolEntry,
    settings: { statementTimeoutMs: number; rowCap: number; resultByteCap: number },
    pool: () => Promise<pg.Pool>,
  ) {
    this.config = config;
    this.entry = entry;
    this.settings = settings;
    this.pool = pool;
  }

  /** A checked connection: the pool's address passed the network guard and the server its identity check. */
  async #connect(): Promise<pg.PoolClient> {
    this.entry.lastUsed = Date.now();
    try {
      return await (await this.pool()).connect();
    } catch (error) {
      throw translate(error, this.config, 'connect');
    }
  }

  /** One client for `fn`; a client that saw an error is discarded rather than reused. */
  async #withClient<T>(fn: (client: pg.PoolClient) => Promise<T>, context: ErrorContext): Promise<T> {
    const client = await this.#connect();
    try {
      const result = await fn(client);
      client.release();
      return result;
    } catch (error) {
      client.release(true);
      throw translate(error, this.config, context);
    }
  }

  /**
   * READ ONLY transaction with a statement timeout around `fn`. With `check` (user SQL), the round
   * trip that opens the transaction also asks the catalog which routines the statement would run that
   * may not run, and refuses before running it; the connection is then reset (`discard all`) after
   * the commit, so nothing the statement did to its session outlives it.
   */
  #readOnly<T>(
    timeoutMs: number,
    fn: (client: pg.PoolClient) => Promise<T>,
    context: ErrorContext,
    check?: RoutineCheck,
  ): Promise<T> {
    return this.#withClient(async (client) => {
      await this.#begin(client, timeoutMs, check);
      const result = await fn(client);
      await client.query('commit');
      // DISCARD ALL cannot share a multi-statement query (an implicit transaction): its own round trip.
      if (check) await client.query('discard all');
      return result;
    }, context);
  }

  /**
   * `useView`: whether to check `check` through a temporary view too; by default where the warehouse
   * can hold one and while it holds functions of its own that may not run (without any, no
   * dependency can lead to one; whether it does is asked again in every round trip).
   */
  async #begin(
    client: pg.PoolClient,
    timeoutMs: number,
    check?: RoutineCheck,
    useView?: boolean,
  ): Promise<void> {
    const timeout = `set local statement_timeout = ${Math.max(0, Math.floor(timeoutMs))}`;
    const byName = check ? catalogVerdictSql(check.calls) : null;
    const viaView = useView !== false && check !== undefined && (await this.#holdsTempViews(client));
    const view =
      viaView && (useView ?? this.entry.ownRefusedRoutines !== false)
        ? dependencyVerdictStatements(check.select)
        : null;
    const statements = [viaView ? 'begin' : 'begin transaction read only', timeout, ...TEXT_FORMATS];
    const nameAt = byName ? statements.push(byName) - 1 : -1;
    const ownAt = viaView ? statements.push(OWN_REFUSED_ROUTINES_SQL) - 1 : -1;
    const viewAt = view
      ? statements.push(...view.statements) - view.statements.length + view.verdictIndex
      : -1;
    if (viaView) statements.push('set transaction read only');
    let results: pg.QueryResult[];
    const batch = statements.join(';\n');
    try {
      // One round trip (no parameters: the simple protocol takes several statements).
      results = [(await client.query(batch)) as unknown as pg.QueryResult[] | pg.QueryResult].flat();
    } catch (error) {
      if (!view || !check) throw error;
      // PostgreSQL rejected the statement as a view (a missing column, a type mismatch). A routine
      // refused by name is still the answer to give (thrown by the check by name alone); the
      // database's error otherwise.
      await client.query('rollback');
      if (byName) await this.#begin(client, timeoutMs, check, false);
      throw positionedIn(error, batch, check.select, check.selectAt);
    }
    let refused = nameAt >= 0 ? results[nameAt]?.rows[0] : undefined;
    if (viaView) {
      const own = results[ownAt]?.rows[0]?.present === true;
      this.entry.ownRefusedRoutines = own;
      if (!refused && own && !view) {
        // Such a function appeared since the last statement: again, with the view.
        await client.query('rollback');
        return this.#begin(client, timeoutMs, check, true);
      }
      // Functions, views, domains, operators or policies of the database's own: one more round trip.
      const reached = view ? (results[viewAt]?.rows as CatalogObject[]) : [];
      if (!refused && reached.length) refused = (await client.query(reachedVerdictSql(reached))).rows[0];
    }
    if (refused) throw refusedRoutine(refused as { routine: string; kind: string });
  }

  #holdsTempViews(client: pg.PoolClient): Promise<boolean> {
    this.entry.holdsTempViews ??= client
      .query<{ holds: boolean }>(
        `select has_database_privilege(current_database(), 'TEMPORARY') and not pg_is_in_recovery()
           and current_setting('default_transaction_read_only') = 'off' as holds`,
      )
      .then(({ rows }) => rows[0]?.holds === true)
      .catch((error: unknown) => {
        this.entry.holdsTempViews = undefined;
        throw error;
      });
    return this.entry.holdsTempViews;
  }

  async reach() {
    // The identity check of a new connection records it: connect once if none was made yet.
    if (!this.entry.server) await this.#withClient(async () => {}, 'connect');
    const { systemIdentifier, databaseOid } = this.entry.server!;
    return JSON.stringify(['postgresql', systemIdentifier, databaseOid, this.config.user]);
  }

  async ping() {
    return this.#withClient(async (client) => {
      const { rows } = await client.query(
        `select current_setting('server_version') as server_version, current_database() as database, current_user as user`,
      );
      return rows[0] as { server_version: string; database: string; user: string };
    }, 'connect');
  }

  async catalogs() {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (client) => {
        const databases = await client.query<{ name: string }>(
          `select datname as name from pg_database
            where datallowconn and not datistemplate and has_database_privilege(datname, 'CONNECT')
            order by datname`,
        );
        const schemas = await client.query<{ name: string }>(
          `select nspname as name from pg_namespace
            where nspname !~ '^pg_' and nspname <> 'information_schema' and has_schema_privilege(nspname, 'USAGE')
            order by nspname`,
        );
        return { databases: databases.rows.map((r) => r.name), schemas: schemas.rows.map((r) => r.name) };
      },
      'internal',
    );
  }

  introspect(options?: IntrospectOptions) {
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      (client) =>
        introspectCatalog(
          async <R>(sql: string, params: unknown[]) => (await client.query(sql, params)).rows as R[],
          { schemas: this.config.schemas, tables: this.config.tables },
          options,
        ),
      'internal',
    );
  }

  async sampleValues(table: TableRef, column: string, limit = SAMPLE_LIMIT_DEFAULT): Promise<SampleValue[]> {
    if (!Number.isInteger(limit) || limit < 1 || limit > SAMPLE_LIMIT_MAX)
      throw new AppError('BAD_REQUEST', `limit must be an integer between 1 and ${SAMPLE_LIMIT_MAX}`);
    return this.#readOnly(
      this.settings.statementTimeoutMs,
      async (client) => {
        const exists = await client.query(
          `select 1 from pg_attribute a join pg_class c on c.oid = a.attrelid
             join pg_namespace n on n.oid = c.relnamespace
            where n.nspname = $1 and c.relname = $2 and a.attname = $3 and a.attnum > 0 and not a.attisdropped`,
          [table.schema, table.name, column],
        );
        if (!exists.rowCount)
          throw new AppError('NOT_FOUND', `Column ${table.schema}.${table.name}.${column} not found`);
        const { rows } = await client.query<{ value: string; truncated: boolean; count: string }>(
          `${sampleValuesSql(qualified(table), column)} limit $1`,
          [limit],
        );
        return rows.map((r) => sampleValue(r.value, r.truncated, r.count));
      },
      'internal',
    );
  }

  async readOnlyQuery(sql: string, options: ReadOptions = {}): Promise<QueryResult> {
    const { kind, statement, check } = await assertReadOnlySql(sql);
    const cap = Math.min(options.limit ?? this.settings.rowCap, this.settings.rowCap);
    const started = performance.now();
    return this.#readOnly(
      options.timeoutMs ?? this.settings.statementTimeoutMs,
      async (client) => {
        // One row past the cap tells that the result was truncated. The cap is a LIMIT around the
        // statement rather than a cursor: PostgreSQL never runs a portal read with a row limit in
        // parallel, and aggregates over large tables need their parallel workers.
        const text =
          kind === 'EXPLAIN' ? statement : `select * from (\n${statement}\n) as capped limit ${cap + 1}`;
        const { rows, fields } = await readCapped(
          client,
          text,
          options.params,
          this.settings.resultByteCap,
        ).catch((error: unknown) => {
          throw positionedIn(error, text, statement, charsBefore(sql, statement));
        });
        const truncated = rows.length > cap;
        if (truncated) rows.length = cap;
        asJsonValues(rows, fields);
        return {
          columns: await this.#describe(client, fields),
          rows,
          row_count: rows.length,
          truncated,
          duration_ms: Math.round(performance.now() - started),
        };
      },
      'user-sql',
      check,
    );
  }

  async assertUserSqlAllowed(sql: string): Promise<void> {
    const { check } = await assertReadOnlySql(sql);
    await this.#readOnly(this.settings.statementTimeoutMs, async () => undefined, 'user-sql', check);
  }

  async aggregate(sql: string, options: AggregateOptions = {}): Promise<Record<string, unknown>[]> {
    // Generated SQL carries users' expressions (metrics, filters, mapping expressions): the functions
    // it calls pass the same catalog rule as user SQL, and the connection is reset afterwards. What
    // can fail at run time (a cast, a division) is a 400 with the database's message, as for user SQL.
    const { check } = await assertReadOnlySql(sql);
    return this.#readOnly(
      options.timeoutMs ?? this.settings.statementTimeoutMs,
      async (client) => (await client.query(sql, options.params)).rows,
      'user-sql',
      check,
    );
  }

  async #describe(client: pg.PoolClient, fields: pg.FieldDef[]) {
    const unknown = [...new Set(fields.map((f) => f.dataTypeID))].filter(
      (oid) => !this.entry.typeNames.has(oid),
    );
    if (unknown.length) {
      const { rows } = await client.query<{ oid: number; name: string }>(
        'select oid::int as oid, format_type(oid, null) as name from pg_type where oid = any($1::oid[])',
        [unknown],
      );
      for (const r of rows) this.entry.typeNames.set(r.oid, r.name);
    }
    return fields.map((f) => ({ name: f.name, type: this.entry.typeNames.get(f.dataTypeID) ?? 'unknown' }));
  }

  /**
   * The session `stream` and `copyOut` read in: the statement checked by the SQL guard, a READ ONLY
   * transaction with its timeout, committed and reset once `read` has given everything. A consumer
   * that stops early leaves a portal or a COPY under way: that connection is dropped, not reused.
   */
  async *#readOnlySession<T>(
    sql: string,
    timeoutMs: number,
    read: (client: pg.PoolClient) => AsyncGenerator<T>,
  ): AsyncGenerator<T> {
    const { check } = await assertReadOnlySql(sql);
    const client = await this.#connect();
    let clean = false;
    try {
      try {
        await this.#begin(client, timeoutMs, check);
      } catch (error) {
        throw translate(error, this.config, 'user-sql');
      }
      yield* read(client);
      await client.query('commit');
      await client.query('discard all');
      clean = true;
    } finally {
      client.release(clean ? undefined : true);
    }
  }

  stream(sql: string, options: StreamOptions = {}): AsyncGenerator<Record<string, unknown>[]> {
    const { config } = this;
    return this.#readOnlySession(sql, options.timeoutMs ?? 0, async function* (client) {
      const cursor = client.query(new Cursor(sql, options.params));
      const batchSize = options.batchSize ?? 1000;
      for (;;) {
        let rows: Record<string, unknown>[];
        try {
          const read = await readCursor(cursor, batchSize);
          rows = read.rows;
          asJsonValues(rows, read.fields);
        } catch (error) {
          throw translate(error, config, 'user-sql');
        }
        if (!rows.length) break;
        yield rows;
      }
      await cursor.close();
    });
  }

  copyOut(sql: string, options: Pick<StreamOptions, 'timeoutMs'> = {}): AsyncGenerator<Buffer> {
    const { config } = this;
    return this.#readOnlySession(sql, options.timeoutMs ?? 0, async function* (client) {
      try {
        for await (const chunk of client.query(copyTo(`COPY (${sql}) TO STDOUT`))) yield chunk as Buffer;
      } catch (error) {
        throw translate(error, config, 'user-sql');
      }
    });
  }

  async transaction<T>(fn: (tx: WarehouseTransaction) => Promise<T>): Promise<T> {
    return this.#withClient(async (client) => {
      await client.query(BEGIN_WITH_TEXT_FORMATS);
      try {
        const result = await fn({
          query: async <R extends Record<string, unknown>>(text: string, params?: unknown[]) => {
            const res = await client.query<R>(text, params);
            return { rows: res.rows, rowCount: res.rowCount ?? 0 };
          },
          copyFrom: (text: string) => client.query(copyFrom(text)),
          copyTo: (text: string) => client.query(copyTo(text)),
        });
        await client.query('commit');
        // Back to the pool as it came: a session setting or advisory lock taken inside (by users'
        // expressions that a write runs: a stable function may still call set_config) must not reach
        // the next borrower. Its own round trip, as in #readOnly.
        await client.query('discard all');
        return result;
      } catch (error) {
        await client.query('rollback').catch(() => {});
        throw error;
      }
    }, 'user-sql');
  }
}
