import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { from as copyFrom, to as copyTo } from 'pg-copy-streams';
import { PGlite } from '@electric-sql/pglite';
import { loadModule, parseSync } from 'libpg-query';
import { buildMetricsQuery, computeTableMetrics, type ColumnInput } from '../src/quality/metrics.ts';
import { resolveIdentities, updateIdentities } from '../src/quality/identity-graph.ts';
import {
  createIdentitySchema,
  graphStatisticsSql,
  identityGraphStats,
  names,
  type ResolveOptions,
} from '../src/quality/identity-schema.ts';
import {
  evaluateColumnMonitoring,
  evaluateIdentityHealth,
  evaluateTableMonitoring,
  runColumnTests,
} from '../src/quality/rules.ts';
import type { CopyOutRunner, SqlRunner } from '../src/quality/sql.ts';
import {
  buildGoldenRecords,
  recordedProfileCounts,
  type ProfileSource,
} from '../src/quality/golden-records.ts';
import { scratchDatabase } from './helpers/scratch-db.ts';
import { until } from './helpers/api.ts';
import { transactionRunner } from '../src/modules/monitoring/monitoring-metrics.ts';
import type { WarehouseTransaction } from '../src/warehouse/warehouse.ts';

/**
 * The engines run against a real PostgreSQL server when TEST_DATABASE_URL is set (a scratch
 * database, dropped afterwards), else against embedded PGlite, the demo warehouse of embedded mode.
 */
let db: CopyOutRunner & { statements: string[] };
let close: () => Promise<void>;
/** The scratch database on a real server (null on PGlite, which has one connection). */
let serverUrl: string | null = null;

function counting(
  query: SqlRunner['query'],
  copyOut: CopyOutRunner['copyOut'],
): CopyOutRunner & { statements: string[] } {
  const statements: string[] = [];
  return {
    statements,
    copyOut,
    query: (sql, params) => {
      statements.push(sql);
      return query(sql, params);
    },
  };
}

beforeAll(async () => {
  if (process.env.TEST_DATABASE_URL) {
    const scratch = scratchDatabase('quality');
    await scratch.create();
    const client = new pg.Client({ connectionString: scratch.url });
    await client.connect();
    serverUrl = scratch.url;
    db = counting(
      (sql, params) => client.query(sql, params),
      (sql) => client.query(copyTo(sql)),
    );
    close = async () => {
      await client.end();
      await scratch.drop();
    };
  } else {
    const lite = await PGlite.create();
    db = counting(
      async (sql, params) => {
        // PGlite answers within this turn of the event loop: a minute of statements without a turn
        // starved vitest's own messages to this worker ('Timeout calling "onTaskUpdate"').
        await new Promise((resolve) => setImmediate(resolve));
        const r = await lite.query(sql, params);
        return { rows: r.rows, rowCount: r.affectedRows ?? r.rows.length };
      },
      // PGlite has no wire protocol here: its COPY writes to a blob instead of STDOUT.
      async function* (sql) {
        const r = await lite.query(sql.replace(/to stdout$/i, "to '/dev/blob'"));
        if (r.blob) yield Buffer.from(await r.blob.arrayBuffer());
      },
    );
    close = () => lite.close();
  }
  await db.query('create schema qt');
  await db.query(`create table qt.people (
    id integer primary key, email text, age integer, score numeric(10,2), big bigint, born date,
    active boolean, updated_at timestamptz, payload jsonb)`);
  await db.query(`insert into qt.people values
    (1, 'a@x.com', 30, 1.50, 9007199254740993, '1990-01-01', true, '2024-05-01T08:00:00Z', '{"a":1}'),
    (2, 'b@x.com', null, 2.25, 5, '1985-06-15', false, '2024-05-01T09:00:00Z', '{"a":1}'),
    (3, null, 30, null, null, null, true, '2024-05-01T09:30:00Z', null),
    (4, 'a@x.com', 45, -3.00, 7, '2000-12-31', null, '2024-05-01T09:50:00Z', '{"b":2}')`);
}, 60_000);

afterAll(async () => close?.());

const peopleColumns: ColumnInput[] = [
  { name: 'id', type: 'integer' },
  { name: 'email', type: 'text' },
  { name: 'age', type: 'integer' },
  { name: 'score', type: 'numeric(10,2)' },
  { name: 'big', type: 'bigint' },
  { name: 'born', type: 'date' },
  { name: 'active', type: 'boolean' },
  { name: 'updated_at', type: 'timestamp with time zone' },
  { name: 'payload', type: 'jsonb' },
];
const people = { schema: 'qt', name: 'people' };

describe('table metrics', () => {
  it('equals hand-computed values on seeded data, in one statement', async () => {
    const before = db.statements.length;
    const m = await computeTableMetrics(db, people, peopleColumns, { textMinMax: true });
    expect(db.statements.length - before).toBe(1);
    expect(m.table).toBe('qt.people');
    expect(m.row_count).toBe(4);
    const col = (name: string) => m.columns.find((c) => c.name === name)!;
    expect(col('id')).toMatchObject({
      null_count: 0,
      null_rate: 0,
      distinct_count: 4,
      distinct_exact: true,
      min: 1,
      max: 4,
    });
    expect(col('email')).toMatchObject({
      null_count: 1,
      null_rate: 0.25,
      distinct_count: 2,
      min: 'a@x.com',
      max: 'b@x.com',
    });
    expect(col('age')).toMatchObject({ null_rate: 0.25, distinct_count: 2, min: 30, max: 45 });
    expect(col('score')).toMatchObject({ null_rate: 0.25, distinct_count: 3, min: -3, max: 2.25 });
    // Beyond 2^53 a bigint stays a string rather than silently losing digits.
    expect(col('big')).toMatchObject({ distinct_count: 3, min: 5, max: '9007199254740993' });
    expect(col('born')).toMatchObject({ distinct_count: 3, min: '1985-06-15', max: '2000-12-31' });
    expect(col('active')).toMatchObject({ null_count: 1, distinct_count: 2, min: null, max: null });
    expect(col('payload')).toMatchObject({ null_count: 1, distinct_count: 2 });
    expect(m.freshness?.column).toBe('updated_at');
    expect(Date.parse(m.freshness!.max_timestamp!)).toBe(Date.parse('2024-05-01T09:50:00Z'));
    const expectedAge = (m.measured_at.getTime() - Date.parse('2024-05-01T09:50:00Z')) / 1000;
    expect(m.freshness!.age_seconds!).toBeCloseTo(expectedAge, 0);
    expect(m.last_change?.at).toBe(m.freshness!.max_timestamp);
    expect(m.measured_at).toBeInstanceOf(Date);
  });

  it('reports null rates as null for an empty table and skips freshness when asked', async () => {
    await db.query('create table qt.empty_t (a int, t timestamp)');
    const m = await computeTableMetrics(
      db,
      { schema: 'qt', name: 'empty_t' },
      [
        { name: 'a', type: 'integer' },
        { name: 't', type: 'timestamp without time zone' },
      ],
      { timestampColumn: null },
    );
    expect(m.row_count).toBe(0);
    expect(m.columns[0]).toMatchObject({ null_rate: null, distinct_count: 0, min: null, max: null });
    expect(m.freshness).toBeNull();
  });

  it("takes freshness from real timestamps: 'infinity' (never) is not the newest change", async () => {
    await db.query('create table qt.expiring (id int, updated_at timestamptz, valid_until date)');
    await db.query(`insert into qt.expiring values (1, '2024-05-01T09:00:00Z', 'infinity'), (2, 'infinity', '-infinity'),
        (3, '-infinity', '2024-06-30'), (4, '2024-04-01T00:00:00Z', null)`);
    const columns = [
      { name: 'id', type: 'integer' },
      { name: 'updated_at', type: 'timestamp with time zone' },
      { name: 'valid_until', type: 'date' },
    ];
    const table = { schema: 'qt', name: 'expiring' };
    const m = await computeTableMetrics(db, table, columns);
    expect(m.freshness?.column).toBe('updated_at');
    expect(Date.parse(m.freshness!.max_timestamp!)).toBe(Date.parse('2024-05-01T09:00:00Z'));
    expect(m.freshness!.age_seconds!).toBeGreaterThan(0);
    expect(m.columns.find((c) => c.name === 'valid_until')).toMatchObject({
      min: '-infinity',
      max: 'infinity',
    });
    const byDate = await computeTableMetrics(db, table, columns, { timestampColumn: 'valid_until' });
    expect(byDate.freshness!.max_timestamp).toMatch(/^2024-06-30T00:00:00/);
  });

  it('measures a 20-column table with ONE statement', async () => {
    const columns: ColumnInput[] = Array.from({ length: 20 }, (_, i) => ({
      name: `c${i}`,
      type: ['integer', 'text', 'double precision', 'date', 'timestamp with time zone'][i % 5],
    }));
    const defs = columns.map((c) => `${c.name} ${c.type}`).join(', ');
    const exprs = columns.map((c, i) =>
      c.type === 'integer'
        ? `case when g % 10 = ${i % 10} then null else g % ${i + 2} end`
        : c.type === 'text'
          ? `'v' || (g % ${i + 3})`
          : c.type === 'double precision'
            ? `g / 4.0`
            : c.type === 'date'
              ? `date '2024-01-01' + (g % 30)`
              : `timestamptz '2024-01-01T00:00:00Z' + g * interval '1 minute'`,
    );
    await db.query(`create table qt.wide (${defs})`);
    await db.query(`insert into qt.wide select ${exprs.join(', ')} from generate_series(1, 1000) g`);
    const query = buildMetricsQuery({ schema: 'qt', name: 'wide' }, columns);
    await loadModule();
    expect(parseSync(query.sql).stmts).toHaveLength(1);
    const before = db.statements.length;
    const m = await computeTableMetrics(db, { schema: 'qt', name: 'wide' }, columns);
    expect(db.statements.length - before).toBe(1);
    expect(m.row_count).toBe(1000);
    expect(m.columns).toHaveLength(20);
    expect(m.columns[0]).toMatchObject({
      null_count: 100,
      null_rate: 0.1,
      distinct_count: 2,
      min: 0,
      max: 1,
    });
    expect(m.columns[1]).toMatchObject({ null_count: 0, distinct_count: 4, min: null });
    expect(m.columns[3]).toMatchObject({ distinct_count: 30, min: '2024-01-01', max: '2024-01-30' });
    expect(m.freshness?.column).toBe('c4');
    expect(Date.parse(m.freshness!.max_timestamp!)).toBe(Date.parse('2024-01-01T00:00:00Z') + 1000 * 60_000);
  });

  it('estimates distinct counts above the threshold and says so', async () => {
    await db.query('create table qt.big_t (u bigint, k integer, n text) with (autovacuum_enabled = false)');
    await db.query(
      `insert into qt.big_t select g, (g * 7919) % 1000, case when g % 2 = 0 then null else 'x' || (g % 50) end
       from generate_series(1, 50000) g`,
    );
    const cols = [
      { name: 'u', type: 'bigint' },
      { name: 'k', type: 'integer' },
      { name: 'n', type: 'text' },
    ];
    const table = { schema: 'qt', name: 'big_t' };
    const options = { estimatedRows: 50_000, exactDistinctMaxRows: 10_000, sampleRows: 10_000 };
    // Never analyzed: a block sample, estimated with Haas–Stokes.
    const sampled = await computeTableMetrics(db, table, cols, options);
    expect(sampled.row_count).toBe(50_000);
    for (const c of sampled.columns)
      expect(c).toMatchObject({ distinct_exact: false, distinct_method: 'sample' });
    expect(sampled.columns[0].distinct_count).toBe(50_000);
    expect(sampled.columns[1].distinct_count).toBeGreaterThan(900);
    expect(sampled.columns[1].distinct_count).toBeLessThanOrEqual(1100);
    expect(sampled.columns[2].distinct_count).toBeGreaterThanOrEqual(25);
    expect(sampled.columns[2].distinct_count).toBeLessThanOrEqual(30);
    expect(sampled.columns[2].null_rate).toBe(0.5);
    // Analyzed: pg_stats, no sample scan.
    await db.query('analyze qt.big_t');
    const analyzed = await computeTableMetrics(db, table, cols, options);
    for (const c of analyzed.columns)
      expect(c).toMatchObject({ distinct_exact: false, distinct_method: 'pg_stats' });
    expect(analyzed.columns[0].distinct_count).toBe(50_000);
    expect(analyzed.columns[1].distinct_count).toBe(1000);
    expect(analyzed.columns[2].distinct_count).toBe(25);
    const exact = await computeTableMetrics(db, table, cols, { estimatedRows: 50_000 });
    expect(exact.columns.map((c) => [c.distinct_count, c.distinct_exact])).toEqual([
      [50_000, true],
      [1000, true],
      [25, true],
    ]);
  });

  it('refuses a freshness column that is not a timestamp', () => {
    expect(() => buildMetricsQuery(people, peopleColumns, { timestampColumn: 'email' })).toThrow(
      /not a date/,
    );
  });
});

describe('rule evaluation', () => {
  it('flags a crossed null-rate threshold and passes one that holds', async () => {
    const m = await computeTableMetrics(db, people, peopleColumns);
    const [crossed] = evaluateColumnMonitoring(m, 'email', { null_rate: { max: 0.1 }, severity: 'critical' });
    expect(crossed).toMatchObject({
      check_key: 'monitor:qt.people:email:null_rate',
      table: 'qt.people',
      column: 'email',
      status: 'fail',
      measured: 0.25,
      threshold: 0.1,
      severity: 'critical',
    });
    const [held] = evaluateColumnMonitoring(m, 'email', { null_rate: { max: 0.3 } });
    expect(held).toMatchObject({ check_key: crossed.check_key, status: 'pass', severity: 'warning' });
  });

  it('evaluates distinct, range, freshness and volume thresholds', async () => {
    const m = await computeTableMetrics(db, people, peopleColumns);
    const checks = [
      ...evaluateColumnMonitoring(m, 'age', { distinct: { min: 3 }, range: { min: 18, max: 40 } }),
      ...evaluateColumnMonitoring(m, 'born', { range: { min: '1980-01-01', max: '2001-01-01' } }),
      ...evaluateTableMonitoring(
        m,
        {
          freshness: { max_age_seconds: 3600, severity: 'error' },
          volume: { min_rows: 1, max_change_ratio: 0.5 },
        },
        { row_count: 2 },
      ),
    ];
    expect(checks.map((c) => [c.check_key, c.status, c.measured])).toEqual([
      ['monitor:qt.people:age:distinct', 'fail', 2],
      ['monitor:qt.people:age:range', 'fail', 45],
      ['monitor:qt.people:born:range', 'pass', '2000-12-31'],
      ['monitor:qt.people:updated_at:freshness', 'fail', m.freshness!.age_seconds],
      ['monitor:qt.people::volume', 'pass', 4],
      ['monitor:qt.people::volume_change', 'fail', 1],
    ]);
    expect(checks[3].severity).toBe('error');
  });

  it('runs every column test of a table as one statement of failing-row counts', async () => {
    await db.query(
      'create table qt.orders (id int, customer_id int, status text, amount numeric, code text)',
    );
    await db.query(`insert into qt.orders values
      (1, 1, 'paid', 10, 'A-1'), (2, 2, 'paid', 20, 'A-2'), (3, 99, 'lost', -5, 'bad'),
      (3, null, 'open', 500, 'A-4')`);
    const before = db.statements.length;
    const results = await runColumnTests(db, { schema: 'qt', name: 'orders' }, [
      { column: 'id', config: { not_null: true, unique: true } },
      { column: 'customer_id', config: { not_null: true, relationships: { to: 'qt.people', field: 'id' } } },
      { column: 'status', config: { accepted_values: ['paid', 'open'], severity: 'warning' } },
      { column: 'amount', config: { range: { min: 0, max: 100 } } },
      { column: 'code', config: { regex: '^A-[0-9]+$' } },
    ]);
    expect(db.statements.length - before).toBe(1);
    expect(results.map((r) => [r.check_key, r.status, r.measured, r.severity])).toEqual([
      ['test:qt.orders:id:not_null', 'pass', 0, 'error'],
      ['test:qt.orders:id:unique', 'fail', 1, 'error'],
      ['test:qt.orders:customer_id:not_null', 'fail', 1, 'error'],
      ['test:qt.orders:customer_id:relationships', 'fail', 1, 'error'],
      ['test:qt.orders:status:accepted_values', 'fail', 1, 'warning'],
      ['test:qt.orders:amount:range', 'fail', 2, 'error'],
      ['test:qt.orders:code:regex', 'fail', 1, 'error'],
    ]);
  });
});

describe('identity graph', () => {
  const schema = 'idg';
  const sources: ResolveOptions['sources'] = [
    {
      table: { schema: 'qt', name: 'crm' },
      keyColumn: 'id',
      identifiers: [
        { column: 'email', type: 'email' },
        { column: 'phone', type: 'phone' },
      ],
    },
    {
      table: { schema: 'qt', name: 'shop' },
      keyColumn: 'order_id',
      rule: 'order_contact',
      identifiers: [
        { column: 'customer_ref', type: 'customer_id' },
        { column: 'contact_email', type: 'email' },
      ],
    },
    {
      table: { schema: 'qt', name: 'chain' },
      identifiers: [
        { column: 'a', type: 'email' },
        { column: 'b', type: 'email' },
      ],
    },
  ];

  /** One source, `qt.<table>`, whose columns all hold e-mail addresses (no record key). */
  const emailColumnsOf = (table: string, columns: string[]): ResolveOptions['sources'] => [
    {
      table: { schema: 'qt', name: table },
      identifiers: columns.map((column) => ({ column, type: 'email' })),
    },
  ];
  /** Every identifier's node and cluster in node order: what two ways of building must agree on. */
  const nodeClusters = async (schema: string) =>
    (await db.query(`select node_id::int, cluster_id::int from ${schema}.identity_nodes order by node_id`))
      .rows;

  beforeAll(async () => {
    await db.query('create table qt.crm (id int, email text, phone text)');
    await db.query(`insert into qt.crm values
      (1, ' Alice@Example.com ', '555 000 1111'),
      (2, 'alice@example.com', null),
      (3, 'alice.work@example.com', '(555) 000-1111'),
      (5, 'bob@example.com', '555 999 0000'),
      (6, 'carol@example.com', null),
      (7, 'not-an-email', '0'),
      (11, 'd1@x.com', '800 123 4567'), (12, 'd2@x.com', '800-123-4567'), (13, 'd3@x.com', '8001234567'),
      (14, 'd4@x.com', '800.123.4567'), (15, 'd5@x.com', '800 123 4567')`);
    await db.query('create table qt.shop (order_id text, customer_ref text, contact_email text)');
    await db.query(`insert into qt.shop values ('o1', ' C9 ', 'ALICE.WORK@example.com'), ('o2', '', null)`);
    // A 30-link chain: plain propagation needs ~30 rounds; pointer jumping far fewer.
    await db.query('create table qt.chain (a text, b text)');
    await db.query(`insert into qt.chain select 'k' || g || '@chain.io', 'k' || (g + 1) || '@chain.io'
      from generate_series(1, 30) g`);
  });

  async function clusters(): Promise<string[][]> {
    const { rows } = await db.query(
      `select array_agg(id_type || ':' || id_value) as members from ${schema}.identity_nodes group by cluster_id`,
    );
    return rows.map((r) => (r.members as string[]).sort()).sort((a, b) => a[0].localeCompare(b[0]));
  }

  it('reports a graph that was never built', async () => {
    const stats = await identityGraphStats(db, schema);
    expect(stats).toMatchObject({ built: false, last_built_at: null, clusters: 0 });
  });

  it('creates the schema idempotently', async () => {
    await createIdentitySchema(db, schema);
    await createIdentitySchema(db, schema);
    const { rows } = await db.query(
      `select table_name from information_schema.tables where table_schema = $1 order by table_name`,
      [schema],
    );
    expect(rows.map((r) => r.table_name)).toEqual([
      'identity_clusters',
      'identity_edges',
      'identity_nodes',
      'identity_profiles',
      'identity_records',
      'identity_runs',
    ]);
  });

  it('moves the text columns of a graph created earlier to byte-wise ones, its view kept', async () => {
    const earlier = 'idg_collation';
    await createIdentitySchema(db, earlier);
    // The layout graphs were created with before: text columns in the database's collation, and the
    // identifiers keyed by type first.
    const view = await db.query(`select pg_get_viewdef($1::regclass) as sql`, [
      `${earlier}.identity_profiles`,
    ]);
    await db.query(`drop view ${earlier}.identity_profiles`);
    await db.query(
      `alter table ${earlier}.identity_records alter column source_table type text collate "default",
         alter column record_key type text collate "default"`,
    );
    await db.query(
      `alter table ${earlier}.identity_nodes alter column id_type type text collate "default",
         alter column id_value type text collate "default",
         drop constraint identity_nodes_id_value_id_type_key,
         add constraint identity_nodes_id_type_id_value_key unique (id_type, id_value)`,
    );
    await db.query(`create view ${earlier}.identity_profiles as ${view.rows[0].sql}`);
    const collations = async () =>
      (
        await db.query(
          `select table_name || '.' || column_name || ' ' || coalesce(collation_name, 'default') as c
           from information_schema.columns
           where table_schema = $1 and table_name in ('identity_records', 'identity_nodes')
             and data_type = 'text' and column_name <> 'flagged' order by 1`,
          [earlier],
        )
      ).rows.map((r) => r.c);
    expect(await collations()).toEqual([
      'identity_nodes.id_type default',
      'identity_nodes.id_value default',
      'identity_records.record_key default',
      'identity_records.source_table default',
    ]);
    await createIdentitySchema(db, earlier);
    expect(await collations()).toEqual([
      'identity_nodes.id_type C',
      'identity_nodes.id_value C',
      'identity_records.record_key C',
      'identity_records.source_table C',
    ]);
    await resolveIdentities(db, { schema: earlier, sources: sources.slice(0, 1) });
    const profile = await db.query(
      `select p.records from ${earlier}.identity_profiles p join ${earlier}.identity_nodes n
       on n.cluster_id = p.cluster_id where n.id_value = 'bob@example.com'`,
    );
    expect(Number(profile.rows[0].records)).toBe(1);
    // The full build replaced the earlier key by the one it loads in order.
    const keys = await db.query(
      `select conname::text as name from pg_constraint where conrelid = $1::regclass and contype = 'u'`,
      [`${earlier}.identity_nodes`],
    );
    expect(keys.rows).toEqual([{ name: 'identity_nodes_id_value_id_type_key' }]);
  });

  it('records each identifier of a record once, whether the catalog vouches for the key or not', async () => {
    // Only a key column with a unique index of its own, and no identifier type listed twice, let a
    // source's records load without being made distinct; every other case here repeats a record.
    await db.query(`create table qt.rec_unique (id int primary key, email text, phone text)`);
    await db.query(`insert into qt.rec_unique values (1, 'a@r.io', '555 100 0001'), (2, 'b@r.io', null)`);
    await db.query(`create table qt.rec_no_index (id int, email text)`);
    await db.query(`insert into qt.rec_no_index values (1, 'a@r.io'), (1, ' A@r.io'), (2, 'c@r.io')`);
    await db.query(`create table qt.rec_partial (id int, email text)`);
    await db.query(`create unique index on qt.rec_partial (id) where id > 10`);
    await db.query(`insert into qt.rec_partial values (1, 'd@r.io'), (1, 'd@r.io'), (11, 'e@r.io')`);
    await db.query(`create table qt.rec_pair_key (id int, region text, email text, unique (id, region))`);
    await db.query(`insert into qt.rec_pair_key values (1, 'eu', 'f@r.io'), (1, 'us', 'F@r.io')`);
    await db.query(`create table qt.rec_same_type (id int primary key, email text, work_email text)`);
    await db.query(`insert into qt.rec_same_type values (1, 'g@r.io', 'G@r.io'), (2, 'h@r.io', 'i@r.io')`);
    // Two keys the index tells apart whose text is the same at extra_float_digits 0.
    await db.query(`create table qt.rec_float (k float8 primary key, email text)`);
    await db.query(`insert into qt.rec_float values (0.1::float8 + 0.2::float8, 'j@r.io'), (0.3, 'j@r.io')`);
    // A table another inherits from: reading it reads the child's rows, which its key does not cover.
    await db.query(`create table qt.rec_parent (id int primary key, email text)`);
    await db.query(`create table qt.rec_child () inherits (qt.rec_parent)`);
    await db.query(`insert into qt.rec_parent values (1, 'k@r.io')`);
    await db.query(`insert into qt.rec_child values (1, 'k@r.io')`);
    const email = (column = 'email') => ({ column, type: 'email' });
    const table = (name: string) => ({ schema: 'qt', name });
    await db.query('set extra_float_digits = 0');
    try {
      await resolveIdentities(db, {
        schema: 'idg_records',
        sources: [
          {
            table: table('rec_unique'),
            keyColumn: 'id',
            identifiers: [email(), { column: 'phone', type: 'phone' }],
          },
          { table: table('rec_no_index'), keyColumn: 'id', identifiers: [email()] },
          { table: table('rec_partial'), keyColumn: 'id', identifiers: [email()] },
          { table: table('rec_pair_key'), keyColumn: 'id', identifiers: [email()] },
          { table: table('rec_same_type'), keyColumn: 'id', identifiers: [email(), email('work_email')] },
          { table: table('rec_float'), keyColumn: 'k', identifiers: [email()] },
          { table: table('rec_parent'), keyColumn: 'id', identifiers: [email()] },
        ],
      });
    } finally {
      await db.query('reset extra_float_digits');
    }
    const { rows } = await db.query(
      `select r.source_table || ' ' || r.record_key || ' ' || n.id_value as record
       from idg_records.identity_records r join idg_records.identity_nodes n on n.node_id = r.node_id`,
    );
    expect(rows.map((r) => r.record).sort()).toEqual(
      [
        'qt.rec_unique 1 a@r.io',
        'qt.rec_unique 1 5551000001',
        'qt.rec_unique 2 b@r.io',
        'qt.rec_no_index 1 a@r.io',
        'qt.rec_no_index 2 c@r.io',
        'qt.rec_partial 1 d@r.io',
        'qt.rec_partial 11 e@r.io',
        'qt.rec_pair_key 1 f@r.io',
        'qt.rec_same_type 1 g@r.io',
        'qt.rec_same_type 2 h@r.io',
        'qt.rec_same_type 2 i@r.io',
        'qt.rec_float 0.3 j@r.io',
        'qt.rec_parent 1 k@r.io',
      ].sort(),
    );
  });

  it('resolves chains of shared identifiers into one cluster and leaves the rest apart', async () => {
    const result = await resolveIdentities(db, { schema, sources, maxDegree: 3, maxClusterSize: 100 });
    const chain = Array.from({ length: 31 }, (_, i) => `email:k${i + 1}@chain.io`).sort();
    const hubEmails = [1, 2, 3, 4, 5].map((i) => [`email:d${i}@x.com`]);
    expect(await clusters()).toEqual(
      [
        ['customer_id:C9', 'email:alice.work@example.com', 'email:alice@example.com', 'phone:5550001111'],
        ['email:bob@example.com', 'phone:5559990000'],
        ['email:carol@example.com'],
        chain,
        ...hubEmails,
        ['phone:8001234567'],
      ].sort((a, b) => a[0].localeCompare(b[0])),
    );
    expect(result).toMatchObject({
      identifiers: 4 + 2 + 1 + 31 + 5 + 1,
      clusters: 1 + 1 + 1 + 1 + 5 + 1,
      largest_cluster: 31,
      singletons: 7,
      flagged_nodes: 1,
      ignored_edges: 5,
      oversized_components: 0,
    });
    const hub = await db.query(
      `select degree, flagged from ${schema}.identity_nodes where id_value = '8001234567'`,
    );
    expect(hub.rows[0]).toEqual({ degree: 5, flagged: 'high_degree' });
    const edge = await db.query(
      `select e.rule, e.source_table from ${schema}.identity_edges e
       join ${schema}.identity_nodes n on n.node_id in (e.node_a, e.node_b) where n.id_value = 'C9'`,
    );
    expect(edge.rows).toEqual([{ rule: 'order_contact', source_table: 'qt.shop' }]);
    const profile = await db.query(
      `select p.size, p.identifiers, p.records from ${schema}.identity_profiles p
       join ${schema}.identity_nodes n on n.cluster_id = p.cluster_id where n.id_value = 'C9'`,
    );
    expect(profile.rows[0].size).toBe(4);
    expect(Number(profile.rows[0].records)).toBe(4);
    expect(profile.rows[0].identifiers).toEqual({
      customer_id: ['C9'],
      email: ['alice.work@example.com', 'alice@example.com'],
      phone: ['5550001111'],
    });

    const stats = await identityGraphStats(db, schema);
    expect(stats).toMatchObject({
      built: true,
      identifiers: 44,
      identifiers_by_type: { customer_id: 1, email: 40, phone: 3 },
      edges: result.edges,
      ignored_edges: 5,
      clusters: 10,
      singletons: 7,
      largest_cluster: { size: 31 },
      cluster_size_distribution: {
        '1': 7,
        '2': 1,
        '3-5': 1,
        '6-10': 0,
        '11-100': 1,
        '101-1000': 0,
        '>1000': 0,
      },
    });
    expect(stats.last_built_at).toBeInstanceOf(Date);
    // Near max_degree 3 is from 3 neighbours (ceil(0.8 × 3)): only the flagged support line has as many.
    const near = await db.query(
      `select count(*)::int as n from ${schema}.identity_nodes where flagged is null and degree >= 3`,
    );
    expect(near.rows[0].n).toBe(0);
    expect(stats).toMatchObject({ identifiers_near_max_degree: 0, near_max_degree_from: 3 });
    expect(evaluateIdentityHealth(schema, stats).map((c) => [c.check, c.status])).toEqual([
      ['cluster_size_limit', 'pass'],
      ['degree_near_limit', 'pass'],
    ]);

    // Those came from the build's run row: a reader does not count the graph. The row holds what
    // counting the tables gives (the largest cluster's id included).
    const largest = await db.query(
      `select cluster_id::int from ${schema}.identity_clusters order by size desc, cluster_id limit 1`,
    );
    expect(stats.largest_cluster).toEqual({ cluster_id: largest.rows[0].cluster_id, size: 31 });
    await db.query(`delete from ${schema}.identity_nodes where id_value = 'carol@example.com'`);
    expect(await identityGraphStats(db, schema)).toEqual(stats);
    // A graph last built by the earlier version (no statistics columns) is counted instead, and
    // create-schema adds the columns its next build fills.
    await db.query(
      `alter table ${schema}.identity_runs drop column identifiers_by_type, drop column largest_cluster_id,
         drop column cluster_size_distribution`,
    );
    expect(await identityGraphStats(db, schema)).toMatchObject({
      identifiers: 43,
      identifiers_by_type: { customer_id: 1, email: 39, phone: 3 },
      largest_cluster: stats.largest_cluster,
      cluster_size_distribution: stats.cluster_size_distribution,
    });
    await createIdentitySchema(db, schema);
    await resolveIdentities(db, { schema, sources, maxDegree: 3, maxClusterSize: 100 });
    expect(await identityGraphStats(db, schema)).toMatchObject({
      identifiers: 44,
      identifiers_by_type: stats.identifiers_by_type,
      cluster_size_distribution: stats.cluster_size_distribution,
    });
    const recorded = await db.query(
      `select identifiers_by_type, cluster_size_distribution from ${schema}.identity_runs
       order by run_id desc limit 1`,
    );
    expect(recorded.rows[0].identifiers_by_type).toEqual(stats.identifiers_by_type);
  });

  it('matches a union-find on a random graph', async () => {
    // Deterministic pseudo-random rows of two identifiers drawn from a small pool, so components of
    // every shape (chains, stars, cycles, singletons) appear.
    let seed = 7;
    const next = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const rows = Array.from({ length: 400 }, () => [
      `u${Math.floor(next() * 500)}@r.io`,
      next() < 0.3 ? null : `u${Math.floor(next() * 500)}@r.io`,
    ]);
    await db.query('create table qt.rand (a text, b text)');
    await db.query(`insert into qt.rand select * from unnest($1::text[], $2::text[])`, [
      rows.map((r) => r[0]),
      rows.map((r) => r[1]),
    ]);
    const parent = new Map<string, string>();
    const find = (x: string): string => {
      if (!parent.has(x)) parent.set(x, x);
      const p = parent.get(x)!;
      if (p === x) return x;
      const root = find(p);
      parent.set(x, root);
      return root;
    };
    for (const [a, b] of rows) {
      find(a!);
      if (b) parent.set(find(a!), find(b));
    }
    const expected = new Map<string, string[]>();
    for (const x of parent.keys()) expected.set(find(x), [...(expected.get(find(x)) ?? []), `email:${x}`]);
    await resolveIdentities(db, {
      schema: 'idg_rand',
      sources: emailColumnsOf('rand', ['a', 'b']),
      maxDegree: 1000,
      maxClusterSize: 1000,
    });
    const { rows: got } = await db.query(
      `select array_agg(id_type || ':' || id_value) as members from idg_rand.identity_nodes group by cluster_id`,
    );
    const canon = (groups: string[][]) => groups.map((g) => [...g].sort().join(' ')).sort();
    expect(canon(got.map((r) => r.members))).toEqual(canon([...expected.values()]));
  });

  it('settles a graph of stars in one round of the warehouse components', async () => {
    // Stars of five identifiers: every node points at its star's smallest id in the first round,
    // which leaves no pair between groups, so no second round runs.
    await db.query('create table qt.stars (hub text, spoke text)');
    await db.query(
      `insert into qt.stars select 'h' || s || '@s.io', 's' || s || '-' || k || '@s.io'
       from generate_series(1, 40) s, generate_series(1, 4) k`,
    );
    const options = {
      sources: emailColumnsOf('stars', ['hub', 'spoke']),
    };
    const inWarehouse = await resolveIdentities(db, { ...options, schema: 'idg_stars_w', inProcessLimit: 0 });
    const inProcess = await resolveIdentities(db, { ...options, schema: 'idg_stars_p' });
    expect(inWarehouse).toMatchObject({
      components_in: 'warehouse',
      iterations: 1,
      clusters: 40,
      largest_cluster: 5,
    });
    expect(await nodeClusters('idg_stars_w')).toEqual(await nodeClusters('idg_stars_p'));
    expect(inProcess.clusters).toBe(40);
  });

  it('computes the same graph in the warehouse as in the process, guards and long chains included', async () => {
    // Pairs from a small pool (components of every shape), a hub shared by 30 records (over the
    // degree limit), and a 300-identifier chain whose node ids are shuffled along it (over the
    // cluster-size limit in the first build; many label rounds in the second).
    let seed = 11;
    const next = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const rows: [string, string | null][] = Array.from({ length: 500 }, () => [
      `p${Math.floor(next() * 450)}@w.io`,
      next() < 0.2 ? null : `p${Math.floor(next() * 450)}@w.io`,
    ]);
    for (let i = 0; i < 30; i++) rows.push([`hub${i}@w.io`, 'hub@w.io']);
    const chain = Array.from({ length: 300 }, (_, i) => `c${Math.floor(next() * 1e9)}x${i}@w.io`);
    for (let i = 0; i + 1 < chain.length; i++) rows.push([chain[i], chain[i + 1]]);
    await db.query('create table qt.both_ways (a text, b text)');
    await db.query(`insert into qt.both_ways select * from unnest($1::text[], $2::text[])`, [
      rows.map((r) => r[0]),
      rows.map((r) => r[1]),
    ]);
    const sources = emailColumnsOf('both_ways', ['a', 'b']);
    const graph = async (schema: string) => ({
      nodes: (
        await db.query(
          `select node_id::int, cluster_id::int, degree, flagged from ${schema}.identity_nodes order by node_id`,
        )
      ).rows,
      ignored: (await db.query(`select count(*)::int as n from ${schema}.identity_edges where ignored`))
        .rows[0].n,
    });
    for (const maxClusterSize of [40, 1000]) {
      const limits = { sources, maxDegree: 10, maxClusterSize };
      const inProcess = await resolveIdentities(db, { ...limits, schema: 'idg_in_process' });
      const inWarehouse = await resolveIdentities(db, {
        ...limits,
        schema: 'idg_in_warehouse',
        inProcessLimit: 0,
      });
      expect(inProcess).toMatchObject({ components_in: 'process', iterations: 1 });
      expect(inWarehouse.components_in).toBe('warehouse');
      const counts = (r: typeof inProcess) => ({
        identifiers: r.identifiers,
        edges: r.edges,
        ignored_edges: r.ignored_edges,
        flagged_nodes: r.flagged_nodes,
        clusters: r.clusters,
        largest_cluster: r.largest_cluster,
        singletons: r.singletons,
        oversized_components: r.oversized_components,
        largest_oversized_component: r.largest_oversized_component,
      });
      expect(counts(inWarehouse)).toEqual(counts(inProcess));
      expect(await graph('idg_in_warehouse')).toEqual(await graph('idg_in_process'));
      // Contracted in the warehouse until at most 60 nodes are left, finished in the process.
      const finishedInProcess = await resolveIdentities(db, {
        ...limits,
        schema: 'idg_in_both',
        inProcessLimit: 60,
      });
      expect(finishedInProcess.components_in).toBe('warehouse');
      expect(finishedInProcess.iterations).toBeGreaterThan(1);
      expect(finishedInProcess.iterations).toBeLessThan(inWarehouse.iterations + 1);
      expect(counts(finishedInProcess)).toEqual(counts(inProcess));
      expect(await graph('idg_in_both')).toEqual(await graph('idg_in_process'));
      const flagged = (await graph('idg_in_warehouse')).nodes.filter((n) => n.flagged);
      expect(flagged.some((n) => n.flagged === 'high_degree')).toBe(true);
      if (maxClusterSize === 40) {
        expect(inWarehouse.oversized_components).toBeGreaterThan(0);
      } else {
        // The chain is one cluster, found in a few rounds, not in one per link.
        const { rows: chainClusters } = await db.query(
          `select count(distinct cluster_id)::int as clusters from idg_in_warehouse.identity_nodes
           where id_value = any($1::text[])`,
          [chain],
        );
        expect(chainClusters[0].clusters).toBe(1);
        expect(inWarehouse.iterations).toBeGreaterThan(1);
        expect(inWarehouse.iterations).toBeLessThan(20);
      }
    }
  });

  it('labels a graph larger than one label batch and one copied row of pairs, in the process as in the warehouse', async () => {
    // 110,000 identifiers (the labels go back 100,000 nodes a batch; the pairs come out in rows of
    // 8,192 first nodes), each linked to the one a permutation sends it to: components are the
    // permutation's cycles, of many sizes.
    const n = 110_000;
    const image = (i: number) => (i * 7919) % n;
    await db.query('create table qt.cycles (a text, b text)');
    await db.query(
      `insert into qt.cycles select 'w' || i || '@wide.io', 'w' || (i * 7919) % $1 || '@wide.io'
       from generate_series(0, $1 - 1) i`,
      [n],
    );
    const root = new Int32Array(n).map((_, i) => i);
    const find = (x: number): number => (root[x] === x ? x : (root[x] = find(root[x])));
    for (let i = 0; i < n; i++) root[find(i)] = find(image(i));
    const expected = new Map<number, string[]>();
    for (let i = 0; i < n; i++) {
      const members = expected.get(find(i)) ?? [];
      members.push(`w${i}@wide.io`);
      expected.set(find(i), members);
    }
    const canon = (groups: string[][]) => groups.map((g) => [...g].sort().join(' ')).sort();
    const options = {
      sources: emailColumnsOf('cycles', ['a', 'b']),
      maxClusterSize: n,
    };
    const clusters = async (schema: string) =>
      (
        await db.query(
          `select array_agg(id_value) as members, min(node_id)::int as smallest, min(cluster_id)::int as cluster
           from ${schema}.identity_nodes group by cluster_id`,
        )
      ).rows;
    for (const [schema, inProcessLimit, componentsIn] of [
      ['idg_cycles_p', undefined, 'process'],
      ['idg_cycles_w', 0, 'warehouse'],
      // Contracted once, the rest finished in the process.
      ['idg_cycles_both', n - 1, 'warehouse'],
    ] as const) {
      const result = await resolveIdentities(db, { ...options, schema, inProcessLimit });
      expect(result).toMatchObject({ identifiers: n, components_in: componentsIn });
      const got = await clusters(schema);
      expect(canon(got.map((c) => c.members))).toEqual(canon([...expected.values()]));
      // Each cluster is labelled by its smallest node.
      for (const c of got) expect(c.cluster).toBe(c.smallest);
    }
  }, 120_000);

  it('computes the components of a graph with many pairs per identifier in the warehouse, under the same limit', async () => {
    // 20 records of six identifiers each: 120 identifiers, 15 pairs per record (300). The process
    // takes a graph of at most the limit's identifiers and twice its pairs.
    await db.query('create table qt.dense (a text, b text, c text, d text, e text, f text)');
    await db.query(
      `insert into qt.dense select ${['a', 'b', 'c', 'd', 'e', 'f'].map((c) => `'${c}' || r || '@d.io'`).join(', ')}
       from generate_series(1, 20) r`,
    );
    const options = {
      sources: emailColumnsOf('dense', ['a', 'b', 'c', 'd', 'e', 'f']),
    };
    const fits = await resolveIdentities(db, { ...options, schema: 'idg_dense_p', inProcessLimit: 150 });
    const tooManyPairs = await resolveIdentities(db, {
      ...options,
      schema: 'idg_dense_w',
      inProcessLimit: 130,
    });
    for (const result of [fits, tooManyPairs])
      expect(result).toMatchObject({ identifiers: 120, edges: 300, clusters: 20, largest_cluster: 6 });
    expect(fits.components_in).toBe('process');
    expect(tooManyPairs.components_in).toBe('warehouse');
    expect(await nodeClusters('idg_dense_w')).toEqual(await nodeClusters('idg_dense_p'));
  });

  it('ignores the edges of identifiers over a degree limit that most identifiers pass, in the process as in the warehouse', async () => {
    // A path of 20 identifiers (18 with two neighbours) and five separate pairs, at max_degree 1.
    await db.query('create table qt.low_degree (a text, b text)');
    await db.query(
      `insert into qt.low_degree
       select 'p' || lpad(i::text, 2, '0') || '@l.io', 'p' || lpad((i + 1)::text, 2, '0') || '@l.io' from generate_series(1, 19) i
       union all select 'x' || i || '@l.io', 'y' || i || '@l.io' from generate_series(1, 5) i`,
    );
    const options = {
      sources: emailColumnsOf('low_degree', ['a', 'b']),
      maxDegree: 1,
    };
    const graph = async (schema: string) => ({
      nodes: (
        await db.query(
          `select id_value, cluster_id::int, degree, flagged from ${schema}.identity_nodes order by node_id`,
        )
      ).rows,
      // Each edge is ignored exactly when one of its ends is flagged over the degree limit.
      mismatched: (
        await db.query(
          `select count(*)::int as n from ${schema}.identity_edges e
           where e.ignored <> exists (select 1 from ${schema}.identity_nodes n
                                      where n.node_id in (e.node_a, e.node_b) and n.flagged = 'high_degree')`,
        )
      ).rows[0].n,
    });
    const inProcess = await resolveIdentities(db, { ...options, schema: 'idg_low_degree_p' });
    const inWarehouse = await resolveIdentities(db, {
      ...options,
      schema: 'idg_low_degree_w',
      inProcessLimit: 0,
    });
    for (const result of [inProcess, inWarehouse])
      expect(result).toMatchObject({
        identifiers: 30,
        edges: 24,
        ignored_edges: 19,
        flagged_nodes: 18,
        clusters: 25,
        largest_cluster: 2,
      });
    expect(inWarehouse.components_in).toBe('warehouse');
    const processed = await graph('idg_low_degree_p');
    expect(processed.mismatched).toBe(0);
    expect(processed.nodes.filter((n) => n.flagged === 'high_degree').map((n) => n.id_value)).toEqual(
      Array.from({ length: 18 }, (_, i) => `p${String(i + 2).padStart(2, '0')}@l.io`),
    );
    expect(await graph('idg_low_degree_w')).toEqual(processed);
  });

  it('finishes in the process what is left of a graph once it fits the limit in identifiers and pairs', async () => {
    // Ten paths of seven identifiers whose ids zigzag (1-5-2-6-3-7-4: one round of pointers leaves
    // four groups of each), and 40 identifiers alone in their records: 110 identifiers, 60 pairs.
    await db.query('create table qt.zigzag (a text, b text)');
    await db.query(
      `insert into qt.zigzag
       select 'c' || lpad(c::text, 2, '0') || '_' || p.a || '@z.io', 'c' || lpad(c::text, 2, '0') || '_' || p.b || '@z.io'
       from generate_series(1, 10) c cross join (values (1, 5), (5, 2), (2, 6), (6, 3), (3, 7), (7, 4)) p(a, b)
       union all select 's' || i || '@z.io', null from generate_series(1, 40) i`,
    );
    const options = {
      sources: emailColumnsOf('zigzag', ['a', 'b']),
    };
    const inProcess = await resolveIdentities(db, { ...options, schema: 'idg_zigzag_p' });
    expect(inProcess).toMatchObject({ identifiers: 110, edges: 60, clusters: 50, largest_cluster: 7 });
    // Over 100 identifiers, but its 70 linked ones and 60 pairs fit: no round in the warehouse.
    const atOnce = await resolveIdentities(db, { ...options, schema: 'idg_zigzag_100', inProcessLimit: 100 });
    // 70 linked identifiers are over 50: one round leaves 40 groups and 30 pairs, which fit.
    const oneRound = await resolveIdentities(db, { ...options, schema: 'idg_zigzag_50', inProcessLimit: 50 });
    expect(atOnce).toMatchObject({ components_in: 'warehouse', iterations: 1 });
    expect(oneRound).toMatchObject({ components_in: 'warehouse', iterations: 2 });
    for (const schema of ['idg_zigzag_100', 'idg_zigzag_50'])
      expect(await nodeClusters(schema)).toEqual(await nodeClusters('idg_zigzag_p'));
  });

  it('adds new records incrementally with the same clusters as a full rebuild', async () => {
    const incrementalSchema = 'idg_incr';
    await db.query('create table qt.incr (id int primary key, email text, phone text)');
    await db.query(`insert into qt.incr select g, 'p' || g || '@i.io', '555 01' || lpad(g::text, 4, '0')
      from generate_series(1, 50) g`);
    const incrSources: ResolveOptions['sources'] = [
      {
        table: { schema: 'qt', name: 'incr' },
        keyColumn: 'id',
        identifiers: [
          { column: 'email', type: 'email' },
          { column: 'phone', type: 'phone' },
        ],
      },
    ];
    const options = { schema: incrementalSchema, sources: incrSources, maxDegree: 5, maxClusterSize: 100 };
    const first = await resolveIdentities(db, options);
    expect(first).toMatchObject({ mode: 'full', clusters: 50, identifiers: 100 });
    // New people, a new record of a known person, and records that join two known people.
    await db.query(`insert into qt.incr values
      (101, 'new1@i.io', '555 090 0001'), (102, 'p7@i.io', '555 090 0002'),
      (103, 'p1@i.io', '555-01-0002'), (104, 'p3@i.io', '55501 0004'), (105, 'p2@i.io', null)`);
    const statementsBefore = db.statements.length;
    const added = await updateIdentities(db, options);
    expect(added.mode).toBe('incremental');
    // The scan of new records reads no table in full: every statement after staging touches the new rows.
    expect(db.statements.slice(statementsBefore).join('\n')).not.toMatch(/truncate/i);
    const canon = async () =>
      (
        await db.query(
          `select array_agg(id_type || ':' || id_value order by id_type, id_value) as members
           from ${incrementalSchema}.identity_nodes group by cluster_id`,
        )
      ).rows
        .map((r) => (r.members as string[]).join(' '))
        .sort();
    const incremental = await canon();
    const incrementalRecords = await db.query(
      `select count(*)::int as n from ${incrementalSchema}.identity_records`,
    );
    const full = await resolveIdentities(db, options);
    expect(await canon()).toEqual(incremental);
    expect(added).toMatchObject({
      clusters: full.clusters,
      identifiers: full.identifiers,
      edges: full.edges,
      largest_cluster: full.largest_cluster,
    });
    expect(full.clusters).toBe(50 + 1 - 2);
    const fullRecords = await db.query(
      `select count(*)::int as n from ${incrementalSchema}.identity_records`,
    );
    expect(incrementalRecords.rows[0].n).toBe(fullRecords.rows[0].n);
    // Nothing new: an incremental build changes nothing.
    const again = await updateIdentities(db, options);
    expect(again).toMatchObject({ mode: 'incremental', clusters: full.clusters, edges: full.edges });
  });

  /** `qt.<table>`: `people` records (id, e-mail `<tag><id>@<tag>.io`, phone `<prefix><id as 4 digits>`). */
  async function peopleTable(table: string, people: number, tag: string, phonePrefix: string) {
    await db.query(`create table qt.${table} (id int primary key, email text, phone text)`);
    await db.query(
      `insert into qt.${table} select g, $1 || g || '@' || $1 || '.io', $2 || lpad(g::text, 4, '0')
       from generate_series(1, $3) g`,
      [tag, phonePrefix, people],
    );
  }

  /** A graph in `schema` over `qt.<source>`, keyed by id, linking e-mail and phone. */
  const emailAndPhoneOf = (schema: string, source: string) => ({
    schema,
    sources: [
      {
        table: { schema: 'qt', name: source },
        keyColumn: 'id',
        identifiers: [
          { column: 'email', type: 'email' },
          { column: 'phone', type: 'phone' },
        ],
      },
    ],
  });

  /** Person `n`'s e-mail and phone as SQL over the integer expression `n`. */
  const personEmail = (n: string) => `'m' || ${n} || '@n.io'`;
  const personPhone = (n: string) => `'555 300 ' || lpad(${n}::text, 6, '0')`;
  /** People `from`..`to` (each an id, an e-mail and a phone) into `qt.<table>`. */
  const addPeople = (table: string, from: number, to: number) =>
    db.query(
      `insert into qt.${table} select g, ${personEmail('g')}, ${personPhone('g')}
       from generate_series($1::int, $2::int) g`,
      [from, to],
    );

  /** A profile build's counts when no identifier is flagged: every record is in a profile. */
  const inEveryProfile = { recordsWithoutProfile: 0, recordsWithoutProfileBySource: {} };

  /**
   * A graph build and the unified profiles after it in one transaction, as the build job runs
   * them: the profiles are refreshed when the graph's build was incremental.
   */
  async function graphAndProfiles(
    options: ResolveOptions,
    profileOptions: Parameters<typeof buildGoldenRecords>[1],
    incremental: boolean,
  ) {
    const runner = transactionRunner({
      query: (sql, params) => db.query(sql, params),
      copyTo: (sql) => db.copyOut(sql),
    } as WarehouseTransaction);
    await db.query('begin');
    try {
      const graph = incremental
        ? await updateIdentities(runner, options)
        : await resolveIdentities(runner, options);
      const profiles = await buildGoldenRecords(runner, profileOptions, graph.mode === 'incremental');
      await db.query('commit');
      return { graph: graph.mode, ...profiles };
    } catch (error) {
      await db.query('rollback');
      throw error;
    }
  }

  /** Clusters as sorted member lists, edge occurrences and record count: what a full build must equal. */
  async function graphState(schema: string) {
    const clusters = await db.query(
      `select array_to_string(array_agg(id_type || ':' || id_value order by id_type, id_value), ' ') as members
       from ${schema}.identity_nodes group by cluster_id order by 1`,
    );
    const totals = await db.query(
      `select (select coalesce(sum(occurrences), 0)::int from ${schema}.identity_edges) as occurrences,
         (select count(*)::int from ${schema}.identity_records) as records`,
    );
    return { clusters: clusters.rows.map((r) => r.members as string), ...totals.rows[0] };
  }

  /** The statistics the last build recorded (an incremental one derives them) are what the graph counts. */
  async function expectRecordedStatistics(schema: string, context: string) {
    const columns = `identifiers::bigint, flagged_nodes::bigint, identifiers_by_type, edges::bigint,
      ignored_edges::bigint, clusters::bigint, largest_cluster::bigint, singletons::bigint,
      cluster_size_distribution, largest_cluster_id::bigint, identifiers_near_max_degree::bigint`;
    const recorded = await db.query(
      `select ${columns}, near_max_degree_from from ${schema}.identity_runs order by run_id desc limit 1`,
    );
    const { near_max_degree_from: nearFrom, ...figures } = recorded.rows[0];
    const counted = await db.query(
      `select ${columns} from (${graphStatisticsSql(names(schema), nearFrom)}) s`,
    );
    expect(figures, context).toEqual(counted.rows[0]);
  }

  /** The graph's records whose every identifier is flagged, by source table, counted plainly. */
  async function recordsWithOnlyFlaggedIdentifiers(schema: string) {
    const { rows } = await db.query(
      `select source_table, count(*)::int as n from (
         select r.source_table, r.record_key from ${schema}.identity_records r
         join ${schema}.identity_nodes n on n.node_id = r.node_id
         group by 1, 2 having bool_and(n.flagged is not null)) x
       group by 1 order by 1`,
    );
    return Object.fromEntries(rows.map((r) => [r.source_table as string, r.n as number]));
  }

  it('reads only the rows written since the last build, and counts a rewritten one once', async () => {
    const schema = 'idg_written';
    await peopleTable('written', 40, 'w', '555 02');
    const options = emailAndPhoneOf(schema, 'written');
    await resolveIdentities(db, options);
    // A new person, a new record joining two known people, and a known record rewritten in place.
    await db.query(
      `insert into qt.written values (41, 'new@w.io', '555 099 0001'), (42, 'w1@w.io', '555020002')`,
    );
    await db.query(`update qt.written set email = email where id = 3`);
    const before = db.statements.length;
    const added = await updateIdentities(db, options);
    const statements = db.statements.slice(before).join('\n');
    expect(added).toMatchObject({ mode: 'incremental', identifiers: 82, clusters: 40 });
    // The sources are filtered by the transaction that wrote each row, not joined with the graph's records.
    expect(statements).toMatch(/age\(t\.xmin\) <= \d+/);
    expect(statements).not.toMatch(/not exists \(select 1 from "idg_written"\.identity_records/);
    const incremental = await graphState(schema);
    const full = await resolveIdentities(db, options);
    expect(await graphState(schema)).toEqual(incremental);
    expect(added).toMatchObject({
      clusters: full.clusters,
      edges: full.edges,
      identifiers: full.identifiers,
    });
  });

  it('reads a view source by its keys, with the same graph as a full build', async () => {
    const schema = 'idg_view';
    await peopleTable('viewed_rows', 20, 'v', '555 03');
    await db.query('create view qt.viewed as select id, email, phone from qt.viewed_rows');
    const options = emailAndPhoneOf(schema, 'viewed');
    await resolveIdentities(db, options);
    await db.query(`insert into qt.viewed_rows values (21, 'v2@v.io', '555 099 0021'), (22, 'x@v.io', null)`);
    const before = db.statements.length;
    const added = await updateIdentities(db, options);
    // A view's rows carry no writing transaction: the new ones are those whose key the graph lacks.
    expect(db.statements.slice(before).join('\n')).toMatch(
      /not exists \(select 1 from "idg_view"\.identity_records/,
    );
    expect(added).toMatchObject({ mode: 'incremental', identifiers: 42, clusters: 21 });
    const incremental = await graphState(schema);
    await resolveIdentities(db, options);
    expect(await graphState(schema)).toEqual(incremental);
  });

  it('picks up rows of a transaction that was still open during the last build', async (context) => {
    if (!serverUrl) return context.skip(); // PGlite here has a single connection: nothing runs alongside
    const schema = 'idg_open_tx';
    await db.query('create table qt.open_tx (id int primary key, email text)');
    await db.query(`insert into qt.open_tx select g, 'o' || g || '@o.io' from generate_series(1, 10) g`);
    const options = {
      schema,
      sources: [
        {
          table: { schema: 'qt', name: 'open_tx' },
          keyColumn: 'id',
          identifiers: [{ column: 'email', type: 'email' }],
        },
      ],
    };
    const writer = new pg.Client({ connectionString: serverUrl });
    await writer.connect();
    try {
      await writer.query('begin');
      await writer.query(`insert into qt.open_tx values (11, 'late@o.io')`);
      // The build does not see the uncommitted row; it commits once the build is done.
      expect(await resolveIdentities(db, options)).toMatchObject({ identifiers: 10 });
      await writer.query('commit');
    } finally {
      await writer.end();
    }
    await db.query(`insert into qt.open_tx values (12, 'after@o.io')`);
    const added = await updateIdentities(db, options);
    expect(added).toMatchObject({ mode: 'incremental', identifiers: 12, clusters: 12 });
    const rows = await db.query(`select id_value from ${schema}.identity_nodes order by 1`);
    expect(rows.rows.map((r) => r.id_value)).toEqual(expect.arrayContaining(['late@o.io', 'after@o.io']));
  });

  it('reads new rows of a known key once, those of transactions open during the last build included', async (context) => {
    if (!serverUrl) return context.skip(); // transactions alongside the build need other connections
    const schema = 'idg_open_events';
    // No unique key: a user's events are rows of one record key (`id`, the user's), each linking an
    // e-mail and a phone.
    await db.query('create table qt.open_events (id text, email text, phone text)');
    await db.query(`insert into qt.open_events values ('u1', 'u1@e.io', '555 070 0001')`);
    const options = emailAndPhoneOf(schema, 'open_events');
    const [open, withSavepoint, committer] = [
      new pg.Client({ connectionString: serverUrl }),
      new pg.Client({ connectionString: serverUrl }),
      new pg.Client({ connectionString: serverUrl }),
    ];
    await open.connect();
    await withSavepoint.connect();
    await committer.connect();
    try {
      await open.query('begin');
      await open.query(`insert into qt.open_events values ('u1', 'late@e.io', '555 070 0002')`);
      // Written in a subtransaction: its rows carry an id the build's snapshot does not list.
      await withSavepoint.query('begin');
      await withSavepoint.query('savepoint s');
      await withSavepoint.query(`insert into qt.open_events values ('u2', 'sub@e.io', '555 070 0003')`);
      // Committed after the open ones began and before the build: the build reads it.
      await db.query(`insert into qt.open_events values ('u1', 'seen@e.io', '555 070 0001')`);
      // Committed while the build runs, just before the statement that reads the source: read too.
      let between = false;
      const committingBeforeReading: CopyOutRunner = {
        copyOut: db.copyOut,
        query: async (sql, params) => {
          if (!between && /create temp table _id_obs/.test(sql)) {
            between = true;
            await committer.query(`insert into qt.open_events values ('u3', 'between@e.io', '555 070 0004')`);
          }
          return db.query(sql, params);
        },
      };
      expect(await resolveIdentities(committingBeforeReading, options)).toMatchObject({ identifiers: 5 });
      expect(between).toBe(true);
      await open.query('commit');
      await withSavepoint.query('commit');
    } finally {
      await open.end();
      await withSavepoint.end();
      await committer.end();
    }
    // New rows of u1, one the same as its first: counted again, as a full build counts it.
    await db.query(
      `insert into qt.open_events values ('u1', 'after@e.io', '555 070 0002'), ('u1', 'u1@e.io', '555 070 0001')`,
    );
    const added = await updateIdentities(db, options);
    expect(added).toMatchObject({ mode: 'incremental', identifiers: 10, clusters: 4 });
    const incremental = await graphState(schema);
    await resolveIdentities(db, options);
    // The same occurrences too: the row the last build read is not counted again.
    expect(await graphState(schema)).toEqual(incremental);
  });

  it('lets a reader of the graph finish while a build in one transaction waits for it', async (context) => {
    if (!serverUrl) return context.skip(); // two connections needed
    const schema = 'idg_reader';
    await peopleTable('read_while', 30, 'r', '555 04');
    const options = emailAndPhoneOf(schema, 'read_while');
    await resolveIdentities(db, options);
    const reader = new pg.Client({ connectionString: serverUrl });
    const builder = new pg.Client({ connectionString: serverUrl });
    await Promise.all([reader.connect(), builder.connect()]);
    try {
      // The reader as GET identity-graph/workspace reads: statistics, then the profiles view, in one
      // transaction.
      await reader.query('begin');
      await reader.query(
        `select (select count(*) from ${schema}.identity_nodes), (select count(*) from ${schema}.identity_edges),
           (select count(*) from ${schema}.identity_clusters), (select count(*) from ${schema}.identity_runs)`,
      );
      // The build as the job runs it: schema statements and build in the job's one transaction.
      const builderPid = (await builder.query('select pg_backend_pid() as pid')).rows[0].pid;
      await builder.query('begin');
      const building = resolveIdentities(
        transactionRunner({
          query: (sql, params) => builder.query(sql, params),
          copyFrom: (sql) => builder.query(copyFrom(sql)),
          copyTo: (sql) => builder.query(copyTo(sql)),
        } as WarehouseTransaction),
        options,
      ).then(async (result) => {
        await builder.query('commit');
        return result;
      });
      // Until the build waits for the reader's tables.
      await until(
        'the build waits for a lock',
        async () =>
          (await db.query(`select wait_event_type, query from pg_stat_activity where pid = $1`, [builderPid]))
            .rows[0],
        (row) => row?.wait_event_type === 'Lock' && /^truncate/i.test(row.query),
      );
      const profiles = await reader.query(`select count(*)::int as n from ${schema}.identity_profiles`);
      expect(profiles.rows[0].n).toBe(30);
      await reader.query('commit');
      expect(await building).toMatchObject({ clusters: 30 });
    } finally {
      await reader.end();
      await builder.end();
    }
  });

  it('falls back to a full build when new records turn an identifier into a high-degree one', async () => {
    const options = { ...emailAndPhoneOf('idg_incr_hub', 'hub'), maxDegree: 3, maxClusterSize: 100 };
    await db.query('create table qt.hub (id int primary key, email text, phone text)');
    await db.query(
      `insert into qt.hub select g, 'h' || g || '@h.io', '555 777 0000' from generate_series(1, 3) g`,
    );
    expect(await resolveIdentities(db, options)).toMatchObject({ clusters: 1, flagged_nodes: 0 });
    await db.query(`insert into qt.hub values (4, 'h4@h.io', '555 777 0000')`);
    const updated = await updateIdentities(db, options);
    // The shared phone now has 4 neighbours: its earlier merges are undone, as a full build would.
    expect(updated).toMatchObject({
      mode: 'full',
      full_reason: 'degree_limit_crossed',
      clusters: 5,
      flagged_nodes: 1,
    });
    // One more record at the flagged phone: incremental, and its new edge links nothing (ignored).
    await db.query(`insert into qt.hub values (5, 'h5@h.io', '555 777 0000')`);
    expect(await updateIdentities(db, options)).toMatchObject({
      mode: 'incremental',
      clusters: 6,
      flagged_nodes: 1,
      edges: 5,
      ignored_edges: 5,
    });
    await expectRecordedStatistics('idg_incr_hub', 'a new edge at a flagged identifier');
  });

  it('falls back to a full build when new records merge clusters past the size limit', async () => {
    const options = { ...emailAndPhoneOf('idg_incr_size', 'sized'), maxDegree: 10, maxClusterSize: 4 };
    // Two people of two identifiers each, and a third of one.
    await db.query('create table qt.sized (id int primary key, email text, phone text)');
    await db.query(`insert into qt.sized values
      (1, 'a@s.io', '555 100 0001'), (2, 'b@s.io', '555 100 0002'), (3, 'c@s.io', null)`);
    expect(await resolveIdentities(db, options)).toMatchObject({ clusters: 3, largest_cluster: 2 });
    // Joins the first two: a cluster of 4, at the limit, merged incrementally.
    await db.query(`insert into qt.sized values (4, 'a@s.io', '555 100 0002')`);
    expect(await updateIdentities(db, options)).toMatchObject({
      mode: 'incremental',
      clusters: 2,
      largest_cluster: 4,
    });
    // Joins the third to them: 5 identifiers, over the limit, which only a full build handles.
    await db.query(`insert into qt.sized values (5, 'c@s.io', '555 100 0001')`);
    expect(await updateIdentities(db, options)).toMatchObject({
      mode: 'full',
      full_reason: 'cluster_limit_crossed',
      oversized_components: 1,
      largest_oversized_component: 5,
    });
  });

  it('merges clusters chained by new records in one incremental build, each named by its smallest node', async () => {
    const options = emailAndPhoneOf('idg_incr_chain', 'chained');
    await db.query('create table qt.chained (id int primary key, email text, phone text)');
    await db.query(`insert into qt.chained select g, 'k' || g || '@c.io', '555 400 000' || g
      from generate_series(1, 6) g`);
    expect(await resolveIdentities(db, options)).toMatchObject({ clusters: 6 });
    // Persons 1-2-3 chained by two records, 5-6 by one; and a new person.
    await db.query(`insert into qt.chained values
      (7, 'k1@c.io', '555 400 0002'), (8, 'k2@c.io', '555 400 0003'), (9, 'k6@c.io', '555 400 0005'),
      (10, 'k7@c.io', null)`);
    const added = await updateIdentities(db, options);
    expect(added).toMatchObject({ mode: 'incremental', clusters: 4, largest_cluster: 6 });
    const clusters = async () =>
      (
        await db.query(
          `select min(node_id)::int as smallest, min(cluster_id)::int as cluster, max(cluster_id)::int as last,
             array_agg(id_value order by id_value) as members
           from idg_incr_chain.identity_nodes group by cluster_id order by 4`,
        )
      ).rows;
    const incremental = await clusters();
    for (const c of incremental) expect([c.cluster, c.last]).toEqual([c.smallest, c.smallest]);
    await resolveIdentities(db, options);
    expect((await clusters()).map((c) => c.members)).toEqual(incremental.map((c) => c.members));
  });

  it('merges new pairs incrementally while their clusters fit the in-process limit, else builds in full', async () => {
    // A limit of 4: an incremental build merges the pairs of at most 4 clusters (and 8 pairs) in the
    // process, as a full build takes at most 4 identifiers (and 8 pairs) there.
    const options = { ...emailAndPhoneOf('idg_incr_pairs', 'many_new'), inProcessLimit: 4 };
    const people = (from: number, to: number) => addPeople('many_new', from, to);
    await db.query('create table qt.many_new (id int primary key, email text, phone text)');
    await people(1, 10);
    expect(await resolveIdentities(db, options)).toMatchObject({ clusters: 10 });
    // Two new people: 2 pairs of 4 new clusters.
    await people(11, 12);
    expect(await updateIdentities(db, options)).toMatchObject({ mode: 'incremental', clusters: 12 });
    // Six records pairing the e-mail of one of four people with the phone of another: 6 new pairs,
    // more than the limit, between 4 clusters, which fit it.
    await db.query(
      `insert into qt.many_new select 100 + row_number() over (), ${personEmail('a')}, ${personPhone('b')}
       from (values (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)) p(a, b)`,
    );
    expect(await updateIdentities(db, options)).toMatchObject({
      mode: 'incremental',
      identifiers: 24,
      edges: 18,
      clusters: 9,
      largest_cluster: 8,
    });
    // Five new people: 5 pairs, but of 10 clusters.
    await people(13, 17);
    const updated = await updateIdentities(db, options);
    expect(updated).toMatchObject({
      mode: 'full',
      full_reason: 'too_many_new_pairs',
      identifiers: 34,
      edges: 23,
      clusters: 14,
    });
  });

  it('builds in full when the new rows are many against the graph, where a full build is faster', async () => {
    const options = emailAndPhoneOf('idg_incr_batch', 'big_batch');
    const people = (from: number, to: number) => addPeople('big_batch', from, to);
    await db.query('create table qt.big_batch (id int primary key, email text, phone text)');
    await people(1, 6_000);
    expect(await resolveIdentities(db, options)).toMatchObject({ identifiers: 12_000 });
    // 5,001 new people: 10,002 new observations, more than half of the graph's 12,000 identifiers.
    await people(6_001, 11_001);
    expect(await updateIdentities(db, options)).toMatchObject({
      mode: 'full',
      full_reason: 'large_batch',
      identifiers: 22_002,
      clusters: 11_001,
    });
    // 11,002 new people, 22,004 observations: as large a batch, but a full build of the grown graph
    // would no longer fit an in-process limit of 40,000 identifiers (it would be contracted in the
    // warehouse, slower than the incremental build).
    await people(11_002, 22_003);
    expect(await updateIdentities(db, { ...options, inProcessLimit: 40_000 })).toMatchObject({
      mode: 'incremental',
      full_reason: null,
      identifiers: 44_006,
      clusters: 22_003,
    });
    // 5,001 new people: under half of the graph it has grown to.
    await people(22_004, 27_004);
    expect(await updateIdentities(db, options)).toMatchObject({
      mode: 'incremental',
      full_reason: null,
      identifiers: 54_008,
      clusters: 27_004,
    });
  });

  it('rebuilds every profile when a fifth of the clusters changed, where that is faster than a refresh', async () => {
    const options = emailAndPhoneOf('idg_incr_profiles', 'many_profiles');
    const profileOptions = {
      schema: 'idg_incr_profiles',
      sources: options.sources,
      fields: [{ name: 'email', rule: 'most_frequent' as const, columns: [{ source: 0, column: 'email' }] }],
    };
    await db.query('create table qt.many_profiles (id int primary key, email text, phone text)');
    await addPeople('many_profiles', 1, 4_000);
    expect(await graphAndProfiles(options, profileOptions, false)).toMatchObject({ mode: 'full' });
    // 1,001 new people: 1,001 of 5,001 clusters changed, over a fifth.
    await addPeople('many_profiles', 4_001, 5_001);
    expect(await graphAndProfiles(options, profileOptions, true)).toMatchObject({
      graph: 'incremental',
      mode: 'full',
      profiles: 5_001,
    });
    // 1,001 more: under a fifth of the 6,002 clusters.
    await addPeople('many_profiles', 5_002, 6_002);
    expect(await graphAndProfiles(options, profileOptions, true)).toMatchObject({
      graph: 'incremental',
      mode: 'incremental',
      profiles: 6_002,
    });
    const { rows } = await db.query(
      `select count(*)::int as profiles, count(*) filter (where p.email = n.id_value)::int as own_email
       from idg_incr_profiles.unified_profiles p
       join idg_incr_profiles.identity_nodes n on n.cluster_id = p.cluster_id and n.id_type = 'email'`,
    );
    expect(rows[0]).toEqual({ profiles: 6_002, own_email: 6_002 });
  });

  it('builds golden records by each survivorship rule, with the record each value came from', async () => {
    await db.query(
      'create table qt.gr_a (id text primary key, email text, name text, city text, updated_at timestamptz)',
    );
    await db.query(`insert into qt.gr_a values
        ('a1', 'ann@g.io', 'Ann', 'Paris', '2024-01-01'),
        ('a2', 'ann@g.io', 'Ann', 'Lyon', '2024-03-01'),
        ('a3', 'solo@g.io', null, 'Rome', null)`);
    await db.query(
      'create table qt.gr_b (id text primary key, email text, name text, city text, updated_at timestamptz)',
    );
    await db.query(`insert into qt.gr_b values ('b1', ' ANN@g.io', 'Anne', 'Nice', '2024-02-01')`);
    const grSources = [
      {
        table: { schema: 'qt', name: 'gr_a' },
        keyColumn: 'id',
        timestampColumn: 'updated_at',
        identifiers: [{ column: 'email', type: 'email' }],
      },
      {
        table: { schema: 'qt', name: 'gr_b' },
        keyColumn: 'id',
        timestampColumn: 'updated_at',
        identifiers: [{ column: 'email', type: 'email' }],
      },
    ];
    const graph = 'idg_golden';
    await resolveIdentities(db, { schema: graph, sources: grSources });
    const both = (column: string) => [
      { source: 0, column },
      { source: 1, column },
    ];
    const built = await buildGoldenRecords(db, {
      schema: graph,
      sources: grSources,
      sourcePriority: ['qt.gr_b'],
      fields: [
        {
          name: 'email',
          rule: 'most_frequent',
          columns: both('email').map((c) => ({ ...c, normalize: 'email' as const })),
        },
        { name: 'name', rule: 'most_frequent', columns: both('name') },
        { name: 'city_recent', rule: 'most_recent', columns: both('city') },
        { name: 'city_priority', rule: 'source_priority', columns: both('city') },
        { name: 'city_first', rule: 'first_non_null', columns: both('city') },
      ],
    });
    expect(built).toEqual({ profiles: 2, mode: 'full', ...inEveryProfile });
    const { rows } = await db.query(
      `select email, name, city_recent, city_priority, city_first, lineage from ${graph}.unified_profiles order by email`,
    );
    expect(rows).toEqual([
      {
        email: 'ann@g.io',
        // 2 of 3 records say Ann.
        name: 'Ann',
        // a2 is the latest record.
        city_recent: 'Lyon',
        // gr_b comes first in the priority list.
        city_priority: 'Nice',
        // Unlisted gr_a would follow gr_b; first non-null takes priority order, then record key.
        city_first: 'Nice',
        lineage: {
          email: { table: 'qt.gr_a', record_key: 'a2' },
          name: { table: 'qt.gr_a', record_key: 'a2' },
          city_recent: { table: 'qt.gr_a', record_key: 'a2' },
          city_priority: { table: 'qt.gr_b', record_key: 'b1' },
          city_first: { table: 'qt.gr_b', record_key: 'b1' },
        },
      },
      {
        email: 'solo@g.io',
        name: null,
        city_recent: 'Rome',
        city_priority: 'Rome',
        city_first: 'Rome',
        lineage: {
          email: { table: 'qt.gr_a', record_key: 'a3' },
          city_recent: { table: 'qt.gr_a', record_key: 'a3' },
          city_priority: { table: 'qt.gr_a', record_key: 'a3' },
          city_first: { table: 'qt.gr_a', record_key: 'a3' },
        },
      },
    ]);
    // Without a priority list, first non-null follows source order: gr_a's first record.
    await buildGoldenRecords(db, {
      schema: graph,
      sources: grSources,
      fields: [{ name: 'city_first', rule: 'first_non_null', columns: both('city') }],
    });
    const first = await db.query(
      `select city_first from ${graph}.unified_profiles where city_first <> 'Rome'`,
    );
    expect(first.rows).toEqual([{ city_first: 'Paris' }]);
    // A field may read two columns of one source (each value a candidate of its own), and a field
    // may read one source only: the other source's records give it nothing.
    await buildGoldenRecords(db, {
      schema: graph,
      sources: grSources,
      fields: [
        {
          name: 'place_or_name',
          rule: 'most_frequent',
          columns: [
            { source: 0, column: 'name' },
            { source: 0, column: 'city' },
            { source: 1, column: 'name' },
          ],
        },
        { name: 'name_b', rule: 'source_priority', columns: [{ source: 1, column: 'name' }] },
      ],
    });
    const mixed = await db.query(
      `select place_or_name, name_b, lineage from ${graph}.unified_profiles order by place_or_name`,
    );
    expect(mixed.rows).toEqual([
      {
        // a1 and a2 both say Ann (Paris, Lyon and Anne once each); a2 is the more recent of the two.
        place_or_name: 'Ann',
        name_b: 'Anne',
        lineage: {
          place_or_name: { table: 'qt.gr_a', record_key: 'a2' },
          name_b: { table: 'qt.gr_b', record_key: 'b1' },
        },
      },
      {
        place_or_name: 'Rome',
        name_b: null,
        lineage: { place_or_name: { table: 'qt.gr_a', record_key: 'a3' } },
      },
    ]);
  });

  it('after an incremental build, rebuilds only the profiles it changed, equal to a full rebuild', async () => {
    // Both tables' e-mails are their identifiers; pr_b repeats record key b9 over rows that no
    // identifier links, so that record spans clusters and belongs to its first identifier's.
    await db.query('create table qt.pr_a (id text primary key, email text, email2 text, name text)');
    await db.query(`insert into qt.pr_a values
        ('a1', 'a@p.io', null, 'Ann'), ('a4', 'w@p.io', null, 'Wes'), ('a8', 'u@p.io', null, 'Uma')`);
    await db.query('create table qt.pr_b (id text, email text, name text)');
    await db.query(`insert into qt.pr_b values ('b9', 'm@p.io', 'Mia'), ('b9', 'y@p.io', 'Mia')`);
    const prSources: ResolveOptions['sources'] = [
      {
        table: { schema: 'qt', name: 'pr_a' },
        keyColumn: 'id',
        identifiers: [
          { column: 'email', type: 'email' },
          { column: 'email2', type: 'email' },
        ],
      },
      {
        table: { schema: 'qt', name: 'pr_b' },
        keyColumn: 'id',
        identifiers: [{ column: 'email', type: 'email' }],
      },
    ];
    const graph = 'idg_profiles_incr';
    const options = { schema: graph, sources: prSources };
    const profileOptions = {
      schema: graph,
      sources: prSources,
      fields: [
        {
          name: 'email',
          rule: 'first_non_null' as const,
          columns: [
            { source: 0, column: 'email', normalize: 'email' as const },
            { source: 1, column: 'email', normalize: 'email' as const },
          ],
        },
        {
          name: 'name',
          rule: 'most_frequent' as const,
          columns: [
            { source: 0, column: 'name' },
            { source: 1, column: 'name' },
          ],
        },
      ],
    };
    const build = (incremental: boolean, fields = profileOptions.fields) =>
      graphAndProfiles(options, { ...profileOptions, fields }, incremental);
    // Each profile named by its cluster's identifiers: a full build numbers clusters anew.
    const profiles = async () =>
      (
        await db.query(
          `select (select string_agg(id_value, ' ' order by id_value) from ${graph}.identity_nodes n
                   where n.cluster_id = p.cluster_id) as members, p.identifiers, p.email, p.name, p.lineage
           from ${graph}.unified_profiles p order by members`,
        )
      ).rows;
    /** The profile of the cluster an e-mail is in (found by its identifier: a profile may have none). */
    const profileOf = async (email: string) =>
      (
        await db.query(
          `select p.* from ${graph}.unified_profiles p
           join ${graph}.identity_nodes n on n.cluster_id = p.cluster_id where n.id_value = $1`,
          [email],
        )
      ).rows[0];
    const nameOf = async (email: string) => (await profileOf(email))?.name;

    expect(await build(false)).toEqual({ graph: 'full', profiles: 4, mode: 'full', ...inEveryProfile });
    // b9 is in the clusters of m@ and y@, and belongs to m@'s: y@'s holds no record, so no profile.
    expect(await nameOf('m@p.io')).toBe('Mia');
    expect(await profileOf('y@p.io')).toBeUndefined();
    const untouched = await profileOf('u@p.io');

    await db.query(`insert into qt.pr_a values
        ('a3', 'a@p.io', 'y@p.io', null),
        ('a5', 'w@p.io', null, 'Wendy'), ('a6', 'W@p.io ', null, 'Wendy'),
        ('a7', 'n@p.io', null, 'Ned')`);
    await db.query(`insert into qt.pr_b values ('b9', 'c@p.io', 'Mia')`);
    // b9's new row brings c@, a new person, whose identifier comes first: b9 moves to c@'s cluster,
    // so m@'s cluster, which no new record touched, is left without a record and its profile goes.
    // a3 merges y@'s cluster into a@'s; w@ gets a new most frequent name; n@ is a new person.
    expect(await build(true)).toEqual({
      graph: 'incremental',
      profiles: 5,
      mode: 'incremental',
      ...inEveryProfile,
    });
    const refreshed = await profiles();
    expect(await profileOf('m@p.io')).toBeUndefined();
    expect(await profileOf('c@p.io')).toMatchObject({
      identifiers: 1,
      email: 'c@p.io',
      name: 'Mia',
      lineage: { name: { table: 'qt.pr_b', record_key: 'b9' } },
    });
    expect(await nameOf('w@p.io')).toBe('Wendy');
    expect(await nameOf('n@p.io')).toBe('Ned');
    // a@'s cluster now holds a1 and a3.
    expect(await profileOf('y@p.io')).toMatchObject({
      identifiers: 2,
      email: 'a@p.io',
      name: 'Ann',
      lineage: {
        email: { table: 'qt.pr_a', record_key: 'a1' },
        name: { table: 'qt.pr_a', record_key: 'a1' },
      },
    });
    expect(await profileOf('u@p.io')).toEqual(untouched);
    // Nothing new: the profiles stay as they are.
    expect(await build(true)).toEqual({
      graph: 'incremental',
      profiles: 5,
      mode: 'incremental',
      ...inEveryProfile,
    });
    expect(await profiles()).toEqual(refreshed);

    expect(await build(false)).toEqual({ graph: 'full', profiles: 5, mode: 'full', ...inEveryProfile });
    expect(await profiles()).toEqual(refreshed);

    // Another plan than the one the profiles were built with: rebuilt whole.
    const nameOnly = profileOptions.fields.slice(1);
    expect(await build(true, nameOnly)).toEqual({
      graph: 'incremental',
      profiles: 5,
      mode: 'full',
      ...inEveryProfile,
    });
    // Profiles of an older graph than the previous build's (a build that wrote none came between).
    await updateIdentities(db, options);
    expect(await build(true, nameOnly)).toEqual({
      graph: 'incremental',
      profiles: 5,
      mode: 'full',
      ...inEveryProfile,
    });
  });

  it('keeps a graph and its profiles built incrementally over random appends equal to full builds, guards included', async () => {
    // Two sources drawing identifiers from small pools, so appends keep merging clusters; rd_b's key
    // repeats over rows its identifiers do not link (records spanning clusters), and its rows of one
    // key disagree on values and share timestamps (ties down to the value).
    let seed = 29;
    const next = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const pick = <T>(values: T[]) => values[Math.floor(next() * values.length)];
    const maybe = (value: string) => (next() < 0.2 ? null : value);
    const email = () => maybe(`${pick(['', ' ', 'X'])}e${Math.floor(next() * 40)}@r.io`);
    const name = () => maybe(pick(['Ann', 'Bo', 'Cy', 'Di']));
    const seen = () => maybe(pick(['2024-01-01', '2024-02-01', '2024-03-01']));
    await db.query(
      'create table qt.rd_a (id text primary key, email text, phone text, name text, seen date)',
    );
    await db.query('create table qt.rd_b (id text, email text, name text, seen date)');
    let ids = 0;
    const append = async (aRows: number, bRows: number) => {
      for (let i = 0; i < aRows; i++)
        await db.query('insert into qt.rd_a values ($1, $2, $3, $4, $5)', [
          `a${ids++}`,
          email(),
          maybe(`555 01${String(Math.floor(next() * 30)).padStart(2, '0')}`),
          name(),
          seen(),
        ]);
      for (let i = 0; i < bRows; i++)
        await db.query('insert into qt.rd_b values ($1, $2, $3, $4)', [
          `k${Math.floor(next() * 12)}`,
          email(),
          name(),
          seen(),
        ]);
    };
    const sources: ProfileSource[] = [
      {
        table: { schema: 'qt', name: 'rd_a' },
        keyColumn: 'id',
        timestampColumn: 'seen',
        identifiers: [
          { column: 'email', type: 'email' },
          { column: 'phone', type: 'phone' },
        ],
      },
      {
        table: { schema: 'qt', name: 'rd_b' },
        keyColumn: 'id',
        timestampColumn: 'seen',
        identifiers: [{ column: 'email', type: 'email' }],
      },
    ];
    const both = (column: string, normalize?: 'email') =>
      [0, 1].map((source) => ({ source, column, ...(normalize ? { normalize } : {}) }));
    const fields = [
      { name: 'email', rule: 'first_non_null' as const, columns: both('email', 'email') },
      { name: 'name', rule: 'most_frequent' as const, columns: both('name') },
      { name: 'latest_name', rule: 'most_recent' as const, columns: both('name') },
      { name: 'preferred_name', rule: 'source_priority' as const, columns: both('name') },
    ];
    // Without guards, and with guards tight enough to flag identifiers as the graph grows.
    const limits = { idg_random: 1000, idg_guarded: 3 };
    // Incrementally in the graph's schema (a full build the first time), or in full beside it.
    const build = async (name: keyof typeof limits, incremental: boolean) => {
      const schema = incremental ? name : `${name}_full`;
      const built = await graphAndProfiles(
        { schema, sources, maxDegree: limits[name], maxClusterSize: 2 * limits[name] },
        { schema, sources, fields, sourcePriority: ['qt.rd_b'] },
        incremental,
      );
      return `${built.graph}/${built.mode}`;
    };
    // Each profile named by its cluster's identifiers: the two builds number clusters differently.
    // The counts the profile build recorded (records in no profile among them) go with them.
    const state = async (schema: string) => ({
      ...(await graphState(schema)),
      counts: await recordedProfileCounts(db, schema),
      profiles: (
        await db.query(
          `select (select string_agg(id_value, ' ' order by id_value) from ${schema}.identity_nodes n
                   where n.cluster_id = p.cluster_id) as members,
             p.identifiers, p.email, p.name, p.latest_name, p.preferred_name, p.lineage
           from ${schema}.unified_profiles p order by members`,
        )
      ).rows,
    });

    await append(12, 6);
    await build('idg_random', true);
    await build('idg_guarded', true);
    const modes: string[] = [];
    const guardedWhileFlagged: string[] = [];
    /** Records in no profile after each incremental refresh under the guards. */
    const guardedWithout: number[] = [];
    for (let round = 0; round < 8; round++) {
      await append(2 + Math.floor(next() * 4), 1 + Math.floor(next() * 4));
      for (const graph of ['idg_random', 'idg_guarded'] as const) {
        const flagged = await db.query(
          `select count(*)::int as n from ${graph}.identity_nodes where flagged is not null`,
        );
        const mode = await build(graph, true);
        await expectRecordedStatistics(graph, `${graph}, round ${round}, ${mode}`);
        const counts = await recordedProfileCounts(db, graph);
        expect(counts!.recordsWithoutProfileBySource, `${graph}, round ${round}, ${mode}`).toEqual(
          await recordsWithOnlyFlaggedIdentifiers(graph),
        );
        if (graph === 'idg_guarded' && mode === 'incremental/incremental')
          guardedWithout.push(counts!.recordsWithoutProfile);
        if (graph === 'idg_random') modes.push(mode);
        else if (flagged.rows[0].n > 0) guardedWhileFlagged.push(mode);
        await build(graph, false);
        expect(await state(graph), `${graph}, round ${round}`).toEqual(await state(`${graph}_full`));
      }
    }
    expect(modes).toEqual(Array(8).fill('incremental/incremental'));
    // Under the guards some builds fall back to full ones; some stay incremental beside flagged identifiers.
    expect(guardedWhileFlagged).toContain('incremental/incremental');
    expect(guardedWhileFlagged).toContain('full/full');
    // Some refreshes carried records in no profile.
    expect(
      guardedWithout.some((n) => n > 0),
      JSON.stringify(guardedWithout),
    ).toBe(true);
  });

  it('counts the records in no profile, those whose every identifier is flagged, incrementally as in full', async () => {
    // A support line over max_degree 2 (three people's e-mails beside it), on two records of hub_a
    // that carry nothing else and on x1 of hub_b, whose key repeats over rows (no unique index).
    // d@ has two neighbours, at max_degree: near the limit, unflagged.
    const support = '555 000 0000';
    await db.query('create table qt.hub_a (id text primary key, email text, phone text, name text)');
    await db.query(
      `insert into qt.hub_a values ('h1', 'a@h.io', $1, 'Ann'), ('h2', 'b@h.io', $1, 'Bob'),
         ('h3', 'c@h.io', $1, 'Cy'), ('h4', null, $1, 'Front desk'), ('h5', ' ', $1, 'Back office'),
         ('n1', 'd@h.io', '555 111 0001', 'Di'), ('n2', 'd@h.io', '555 111 0002', 'Di')`,
      [support],
    );
    await db.query('create table qt.hub_b (id text, phone text, name text)');
    await db.query(`insert into qt.hub_b values ('x1', $1, 'Desk'), ('x2', '555 111 0001', 'Di')`, [support]);
    const hubSources: ProfileSource[] = [
      {
        table: { schema: 'qt', name: 'hub_a' },
        keyColumn: 'id',
        identifiers: [
          { column: 'email', type: 'email' },
          { column: 'phone', type: 'phone' },
        ],
      },
      {
        table: { schema: 'qt', name: 'hub_b' },
        keyColumn: 'id',
        identifiers: [{ column: 'phone', type: 'phone' }],
      },
    ];
    const build = (schema: string, incremental: boolean) =>
      graphAndProfiles(
        { schema, sources: hubSources, maxDegree: 2, maxClusterSize: 10 },
        {
          schema,
          sources: hubSources,
          fields: [
            {
              name: 'name',
              rule: 'most_frequent',
              columns: [
                { source: 0, column: 'name' },
                { source: 1, column: 'name' },
              ],
            },
          ],
        },
        incremental,
      );
    /** The source rows' distinct record keys, by table: every one is in a profile or counted outside. */
    const sourceRecords = async () =>
      (
        await db.query(
          `select (select count(distinct id) from qt.hub_a)::int as a, (select count(distinct id) from qt.hub_b)::int as b`,
        )
      ).rows[0];
    /** Records in profiles: the member records of each profiled cluster (no record spans two here). */
    const profiledRecords = async (schema: string) =>
      (
        await db.query(
          `select coalesce(sum(v.records), 0)::int as n from ${schema}.unified_profiles p
           join ${schema}.identity_profiles v on v.cluster_id = p.cluster_id`,
        )
      ).rows[0].n;

    const full = await build('idg_hub', false);
    expect(full).toMatchObject({
      graph: 'full',
      mode: 'full',
      recordsWithoutProfile: 3,
      recordsWithoutProfileBySource: { 'qt.hub_a': 2, 'qt.hub_b': 1 },
    });
    expect(full.recordsWithoutProfileBySource).toEqual(await recordsWithOnlyFlaggedIdentifiers('idg_hub'));
    const records = await sourceRecords();
    expect((await profiledRecords('idg_hub')) + full.recordsWithoutProfile).toBe(records.a + records.b);
    expect(await recordedProfileCounts(db, 'idg_hub')).toEqual({
      profiles: full.profiles,
      recordsWithoutProfile: 3,
      recordsWithoutProfileBySource: { 'qt.hub_a': 2, 'qt.hub_b': 1 },
    });
    const stats = await identityGraphStats(db, 'idg_hub');
    expect(stats).toMatchObject({ identifiers_near_max_degree: 1, near_max_degree_from: 2 });
    const health = evaluateIdentityHealth('idg_hub', stats, {
      profiles: {
        schema: 'idg_hub',
        table: 'unified_profiles',
        recordsWithoutProfileBySource: full.recordsWithoutProfileBySource,
      },
    });
    expect(health.map((c) => [c.check, c.status, c.measured, c.threshold])).toEqual([
      ['cluster_size_limit', 'pass', 0, 10],
      ['degree_near_limit', 'fail', 1, 2],
      ['records_without_profile', 'fail', 3, 0],
    ]);
    expect(health[2].message).toContain('qt.hub_a: 2, qt.hub_b: 1');

    // Another desk record on the support line only; x1 gets a row with a phone of its own, so it is
    // in a profile now; e@ joins the support line (already flagged: the build stays incremental).
    await db.query(`insert into qt.hub_a values ('h6', null, $1, 'Desk 2'), ('h7', 'e@h.io', $1, 'Eve')`, [
      support,
    ]);
    await db.query(`insert into qt.hub_b values ('x1', '555 222 0001', 'Desk')`);
    const added = await build('idg_hub', true);
    expect(added).toMatchObject({
      graph: 'incremental',
      mode: 'incremental',
      recordsWithoutProfile: 3,
      recordsWithoutProfileBySource: { 'qt.hub_a': 3 },
    });
    expect(added.recordsWithoutProfileBySource).toEqual(await recordsWithOnlyFlaggedIdentifiers('idg_hub'));
    const grown = await sourceRecords();
    expect((await profiledRecords('idg_hub')) + added.recordsWithoutProfile).toBe(grown.a + grown.b);
    // A refresh that touches no flagged identifier carries the count over.
    await db.query(`insert into qt.hub_a values ('n3', 'f@h.io', '555 111 0003', 'Fay')`);
    expect(await build('idg_hub', true)).toMatchObject({
      graph: 'incremental',
      mode: 'incremental',
      recordsWithoutProfile: 3,
      recordsWithoutProfileBySource: { 'qt.hub_a': 3 },
    });
    // The same figures from a full build beside it, and from the incremental one's statistics.
    const rebuilt = await build('idg_hub_full', false);
    expect(rebuilt).toMatchObject({
      recordsWithoutProfile: 3,
      recordsWithoutProfileBySource: { 'qt.hub_a': 3 },
    });
    expect((await identityGraphStats(db, 'idg_hub')).identifiers_near_max_degree).toBe(
      (await identityGraphStats(db, 'idg_hub_full')).identifiers_near_max_degree,
    );
    await expectRecordedStatistics('idg_hub', 'after the incremental builds');
  });

  it('does not merge components beyond the cluster-size limit, and health checks say so', async () => {
    const result = await resolveIdentities(db, { schema, sources, maxDegree: 3, maxClusterSize: 4 });
    expect(result).toMatchObject({
      oversized_components: 1,
      largest_oversized_component: 31,
      largest_cluster: 4,
    });
    const sizes = (await clusters()).map((c) => c.length);
    expect(Math.max(...sizes)).toBe(4);
    const flagged = await db.query(
      `select count(*)::int as n from ${schema}.identity_nodes where flagged = 'oversized_cluster'`,
    );
    expect(flagged.rows[0].n).toBe(31);
    const stats = await identityGraphStats(db, schema);
    expect(stats.recent_runs).toHaveLength(2);
    const health = evaluateIdentityHealth(schema, stats);
    // Identifiers near max_degree 3: from ceil(0.8 × 3) = 3 neighbours, unflagged.
    const near = await db.query(
      `select count(*)::int as n from ${schema}.identity_nodes where flagged is null and degree >= 3`,
    );
    expect(health.map((c) => [c.check_key, c.status, c.measured])).toEqual([
      [`identity:${schema}.identity_clusters::cluster_size_limit`, 'fail', 1],
      [
        `identity:${schema}.identity_nodes::degree_near_limit`,
        near.rows[0].n > 0 ? 'fail' : 'pass',
        near.rows[0].n,
      ],
      // Merged identifiers fell from 44−10 to 44−40: no jump.
      [`identity:${schema}.identity_clusters::merge_jump`, 'pass', (4 - 34) / 34],
    ]);
  });
});
