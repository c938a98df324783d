import { connectedComponents, readPairs, type Components } from './components.ts';
import {
  qualified,
  quoteIdent,
  quoteLiteral,
  toNumber,
  type CopyOutRunner,
  type SqlRunner,
  type TableRef,
} from './sql.ts';

/**
 * Identity resolution inside the target warehouse: set-based SQL for staging, numbering and edges,
 * a streamed union-find for the connected components, then these tables:
 *   identity_nodes    one row per normalized identifier (type, value) and its cluster_id
 *   identity_edges    identifier pairs that co-occur in a source row, with the rule and table that produced them
 *   identity_records  which source records carry which identifier (when the source names a key column)
 *   identity_clusters one row per connected component (cluster_id = its smallest node_id)
 *   identity_runs     one row per build: counts, iterations, duration (history for health checks)
 *   identity_profiles view: a cluster with its identifiers grouped by type and its record count
 *
 * Runaway merges are stopped twice: (1) an identifier with more distinct neighbours than
 * `maxDegree` (a shared call-centre phone, test@example.com) is flagged `high_degree` and its edges
 * are kept but marked `ignored`, so it cannot bridge unrelated people; (2) a component that still
 * grows beyond `maxClusterSize` is not merged at all: its identifiers stay singletons, flagged
 * `oversized_cluster`, and the run records it, so no resolved cluster ever exceeds the limit and
 * health checks can raise an alert.
 */

export type Normalizer = 'email' | 'phone' | 'trim';

export interface IdentifierColumn {
  column: string;
  /** Identifier type recorded on the node: email, phone, customer_id, … */
  type: string;
  /** Defaults: email for type "email", phone for type "phone", trim otherwise. */
  normalize?: Normalizer;
}

export interface IdentitySource {
  table: TableRef;
  identifiers: IdentifierColumn[];
  /** Record key column, to link source records to clusters (identity_records / profiles). */
  keyColumn?: string;
  /** Name of the match rule recorded on the edges of this source (default "same_record"). */
  rule?: string;
}

export interface ResolveOptions {
  schema: string;
  sources: IdentitySource[];
  maxDegree?: number;
  maxClusterSize?: number;
  /** work_mem for the build's transaction (default 256MB). */
  workMem?: string;
}

export interface ResolutionResult {
  run_id: number;
  identifiers: number;
  edges: number;
  ignored_edges: number;
  flagged_nodes: number;
  clusters: number;
  largest_cluster: number;
  singletons: number;
  oversized_components: number;
  largest_oversized_component: number;
  iterations: number;
  duration_ms: number;
  built_at: Date;
  /** `incremental` when only the records added since the last build were read. */
  mode: 'full' | 'incremental';
}

const TYPE_NAME = /^[a-z][a-z0-9_]{0,62}$/;

function names(schema: string) {
  const s = quoteIdent(schema);
  return {
    nodes: `${s}.identity_nodes`,
    edges: `${s}.identity_edges`,
    records: `${s}.identity_records`,
    clusters: `${s}.identity_clusters`,
    runs: `${s}.identity_runs`,
    profiles: `${s}.identity_profiles`,
  };
}

/** Idempotent DDL: safe to run on every create-schema call and before every build. */
export function identitySchemaStatements(schema: string): string[] {
  const t = names(schema);
  const prefix = schema.replace(/[^a-zA-Z0-9_]/g, '_').slice(0, 30);
  return [
    `create schema if not exists ${quoteIdent(schema)}`,
    `create table if not exists ${t.nodes} (
      node_id bigint primary key,
      id_type text not null,
      id_value text not null,
      cluster_id bigint not null,
      degree integer not null default 0,
      flagged text check (flagged in ('high_degree', 'oversized_cluster')),
      unique (id_type, id_value))`,
    `create index if not exists ${quoteIdent(`${prefix}_identity_nodes_cluster`)} on ${t.nodes} (cluster_id)`,
    `create table if not exists ${t.edges} (
      node_a bigint not null,
      node_b bigint not null,
      rule text not null,
      source_table text not null,
      occurrences bigint not null,
      ignored boolean not null default false,
      primary key (node_a, node_b, rule, source_table),
      check (node_a < node_b))`,
    `create index if not exists ${quoteIdent(`${prefix}_identity_edges_b`)} on ${t.edges} (node_b)`,
    `create table if not exists ${t.records} (
      source_table text not null,
      record_key text not null,
      node_id bigint not null,
      primary key (source_table, record_key, node_id))`,
    `create index if not exists ${quoteIdent(`${prefix}_identity_records_node`)} on ${t.records} (node_id)`,
    `create table if not exists ${t.clusters} (
      cluster_id bigint primary key,
      size integer not null,
      built_at timestamptz not null)`,
    `create table if not exists ${t.runs} (
      run_id bigint generated always as identity primary key,
      started_at timestamptz not null,
      finished_at timestamptz not null,
      identifiers bigint not null,
      edges bigint not null,
      ignored_edges bigint not null,
      flagged_nodes bigint not null,
      clusters bigint not null,
      largest_cluster bigint not null,
      singletons bigint not null,
      merged_identifiers bigint not null,
      oversized_components bigint not null,
      largest_oversized_component bigint not null,
      iterations integer not null,
      max_degree integer not null,
      max_cluster_size integer not null)`,
    `create or replace view ${t.profiles} as
      select c.cluster_id, c.size,
        (select jsonb_object_agg(g.id_type, g.id_values) from (
          select n.id_type, jsonb_agg(n.id_value order by n.id_value) as id_values
          from ${t.nodes} n where n.cluster_id = c.cluster_id group by n.id_type) g) as identifiers,
        (select count(distinct (r.source_table, r.record_key)) from ${t.records} r
          join ${t.nodes} n on n.node_id = r.node_id where n.cluster_id = c.cluster_id) as records,
        c.built_at
      from ${t.clusters} c`,
  ];
}

/** The keys and indexes of the graph's tables, as `create` made them (names are PostgreSQL's defaults). */
function keyDefinitions(schema: string) {
  const t = names(schema);
  const prefix = schema.replace(/[^a-zA-Z0-9_]/g, '_').slice(0, 30);
  const index = (name: string) => `${quoteIdent(schema)}.${quoteIdent(`${prefix}_${name}`)}`;
  return {
    constraints: [
      [t.nodes, 'identity_nodes_pkey', 'primary key (node_id)'],
      [t.nodes, 'identity_nodes_id_type_id_value_key', 'unique (id_type, id_value)'],
      [t.edges, 'identity_edges_pkey', 'primary key (node_a, node_b, rule, source_table)'],
      [t.records, 'identity_records_pkey', 'primary key (source_table, record_key, node_id)'],
      [t.clusters, 'identity_clusters_pkey', 'primary key (cluster_id)'],
    ],
    indexes: [
      [index('identity_nodes_cluster'), `${t.nodes} (cluster_id)`],
      [index('identity_edges_b'), `${t.edges} (node_b)`],
      [index('identity_records_node'), `${t.records} (node_id)`],
    ],
  };
}

function dropKeysStatements(schema: string): string[] {
  const { constraints, indexes } = keyDefinitions(schema);
  return [
    ...indexes.map(([name]) => `drop index if exists ${name}`),
    ...constraints.map(
      ([table, name]) => `alter table ${table} drop constraint if exists ${quoteIdent(name)}`,
    ),
  ];
}

function addKeysStatements(schema: string): string[] {
  const { constraints, indexes } = keyDefinitions(schema);
  return [
    ...constraints.map(
      ([table, name, definition]) => `alter table ${table} add constraint ${quoteIdent(name)} ${definition}`,
    ),
    ...indexes.map(([name, on]) => `create index ${name.split('.')[1]} on ${on}`),
  ];
}

async function inTransaction<T>(runner: SqlRunner, lockKey: string, work: () => Promise<T>): Promise<T> {
  await runner.query('begin');
  try {
    // Concurrent builds (or create-schema racing a build) of one schema queue up instead of colliding.
    await runner.query('select pg_advisory_xact_lock(hashtext($1))', [lockKey]);
    const result = await work();
    await runner.query('commit');
    return result;
  } catch (error) {
    await runner.query('rollback').catch(() => undefined);
    throw error;
  }
}

/** Creates the identity-resolution tables and view in `schema` (idempotent). Needs a single connection. */
export async function createIdentitySchema(runner: SqlRunner, schema: string): Promise<void> {
  await inTransaction(runner, `dimas.identity:${schema}`, async () => {
    for (const statement of identitySchemaStatements(schema)) await runner.query(statement);
  });
}

export function normalizeSql(expression: string, normalizer: Normalizer): string {
  const text = `${expression}::text`;
  if (normalizer === 'email') {
    const e = `lower(btrim(${text}))`;
    return `case when ${e} ~ '^[^@[:space:]]+@[^@[:space:]]+$' then ${e} end`;
  }
  if (normalizer === 'phone') {
    // Fewer than 6 digits is a placeholder ("0", "n/a" stripped to nothing), not a phone number.
    // Deletes every character that is not a digit: twice as fast as regexp_replace(.., '[^0-9]', '', 'g').
    const digits = `translate(${text}, translate(${text}, '0123456789', ''), '')`;
    return `case when length(${digits}) >= 6 then ${digits} end`;
  }
  return `nullif(btrim(${text}), '')`;
}

function defaultNormalizer(type: string): Normalizer {
  return type === 'email' ? 'email' : type === 'phone' ? 'phone' : 'trim';
}

/** One INSERT per source: a single scan that unpivots the identifier columns of each row. */
export function stageSourceSql(
  source: IdentitySource,
  index: number,
  only?: { newSince: string; sourceTable: string },
): string {
  if (source.identifiers.length === 0)
    throw new Error(`Source ${source.table.name} has no identifier columns`);
  const projections = source.identifiers.map(
    (id, i) => `${normalizeSql(quoteIdent(id.column), id.normalize ?? defaultNormalizer(id.type))} as v${i}`,
  );
  const key = source.keyColumn ? `${quoteIdent(source.keyColumn)}::text` : 'null::text';
  const values = source.identifiers.map((id, i) => `(${quoteLiteral(id.type)}, r.v${i})`).join(', ');
  return (
    `insert into _id_stage (src, rid, record_key, id_type, id_value)\n` +
    `select ${index + 1}, r.rid, r.k, v.id_type, v.id_value\n` +
    `from (select row_number() over () as rid, ${key} as k, ${projections.join(', ')} from ${qualified(source.table)} t\n` +
    (only
      ? `  where not exists (select 1 from ${only.newSince} x where x.source_table = ${quoteLiteral(only.sourceTable)}\n` +
        `    and x.record_key = ${key})`
      : '') +
    `) r\n` +
    `cross join lateral (values ${values}) as v(id_type, id_value)\n` +
    `where v.id_value is not null`
  );
}

function validate(options: ResolveOptions) {
  if (options.sources.length === 0) throw new Error('No identity sources given');
  const tables = options.sources.map((s) => `${s.table.schema}.${s.table.name}`);
  const repeated = tables.find((name, i) => tables.indexOf(name) !== i);
  // Edges are keyed by their source table: one table listed twice would write each edge twice.
  if (repeated) throw new Error(`Identity source ${repeated} is listed twice; list its identifiers once`);
  for (const source of options.sources)
    for (const id of source.identifiers)
      if (!TYPE_NAME.test(id.type)) throw new Error(`Invalid identifier type: ${id.type}`);
  if (options.workMem !== undefined && !/^\d{1,6}(kB|MB|GB)$/.test(options.workMem))
    throw new Error('workMem must look like 64MB');
  for (const [key, value] of Object.entries({
    maxDegree: options.maxDegree,
    maxClusterSize: options.maxClusterSize,
  }))
    if (value !== undefined && (!Number.isInteger(value) || value < 1))
      throw new Error(`${key} must be a positive integer`);
}

/** The distinct node pairs out of `_id_edge`, read by COPY into the union-find. */
const PAIRS_COPY = 'copy (select node_a, node_b from _id_edge group by 1, 2) to stdout';
/** Labels go back in batches of this many nodes (one statement each, arrays as text parameters). */
const LABEL_BATCH = 200_000;

/**
 * Rebuilds the graph from the sources in one transaction (readers see the previous build until
 * commit). Staging, numbering and edge extraction are set-based SQL in temporary tables (no WAL,
 * no index upkeep); connected components are computed by union-find over the distinct node pairs
 * streamed out with COPY (a few bytes per node in typed arrays, one pass, no iteration count that
 * grows with the graph's diameter); the labels go back in large batches and the real tables are
 * written once at the end. A cluster's id is the smallest node id of its members.
 * Needs a single connection (temporary tables, transaction).
 */
export async function resolveIdentities(
  runner: CopyOutRunner,
  options: ResolveOptions,
): Promise<ResolutionResult> {
  validate(options);
  const started = performance.now();
  await createIdentitySchema(runner, options.schema);
  return inTransaction(runner, `dimas.identity:${options.schema}`, () => fullBuild(runner, options, started));
}

type Query = (sql: string, params?: unknown[]) => Promise<{ rows: any[]; rowCount?: number | null }>;

interface BuildContext {
  q: Query;
  t: ReturnType<typeof names>;
  maxDegree: number;
  maxClusterSize: number;
  sourceTables: string[];
  rules: string[];
}

function buildContext(runner: SqlRunner, options: ResolveOptions): BuildContext {
  return {
    q: (sql, params) => runner.query(sql, params),
    t: names(options.schema),
    maxDegree: options.maxDegree ?? 100,
    maxClusterSize: options.maxClusterSize ?? 1000,
    sourceTables: options.sources.map((s) => `${s.table.schema}.${s.table.name}`),
    rules: options.sources.map((s) => s.rule ?? 'same_record'),
  };
}

async function fullBuild(
  runner: CopyOutRunner,
  options: ResolveOptions,
  started: number,
): Promise<ResolutionResult> {
  const { q, t, maxDegree, maxClusterSize, sourceTables, rules } = buildContext(runner, options);
  const startedAt = new Date();
  // Hashes and sorts of a million identifiers spill to disk at the default 4MB; local to this build.
  await q(`set local work_mem = '${options.workMem ?? '256MB'}'`);
  await q(`set local maintenance_work_mem = '${options.workMem ?? '256MB'}'`);
  await q(
    `create temp table _id_stage (src int not null, rid bigint not null, record_key text, id_type text not null,
       id_value text not null) on commit drop`,
  );
  for (const [i, source] of options.sources.entries()) await q(stageSourceSql(source, i));
  // Numbered in (type, value) order, so identical inputs give identical node and cluster ids; both
  // windows share one sort, and the first observation of each identifier stands for its node.
  await q(
    `create temp table _id_obs on commit drop as
     select src, rid, record_key, id_type, id_value,
       dense_rank() over w as node_id,
       row_number() over (partition by id_type collate "C", id_value collate "C") = 1 as first_seen
     from _id_stage
     window w as (order by id_type collate "C", id_value collate "C")`,
  );
  await q(EDGES_FROM_OBS);
  const counted = await q('select coalesce(max(node_id), 0) as n from _id_obs');
  const nodeCount = toNumber(counted.rows[0]?.n) ?? 0;
  const pairs = await readPairs(runner.copyOut(PAIRS_COPY));
  const components = connectedComponents(nodeCount, pairs, { maxDegree, maxClusterSize });
  await writeLabels(q, components, maxDegree);

  await q(`truncate ${t.nodes}, ${t.edges}, ${t.records}, ${t.clusters}`);
  // Loading into tables without their keys and building the keys afterwards (one sort each)
  // costs a third of maintaining them row by row.
  for (const statement of dropKeysStatements(options.schema)) await q(statement);
  await q(
    `insert into ${t.nodes} (node_id, id_type, id_value, cluster_id, degree, flagged)
     select n.node_id, n.id_type, n.id_value, coalesce(l.cluster_id, n.node_id), coalesce(l.degree, 0), l.flagged
     from _id_obs n left join _id_label l on l.node_id = n.node_id
     where n.first_seen`,
  );
  // High-degree identifiers are few: the edges at them are found by a hash lookup, not a join.
  const highDegree: number[] = [];
  components.degree.forEach((d, node) => {
    if (d > maxDegree) highDegree.push(node);
  });
  await q(
    `insert into ${t.edges} (node_a, node_b, rule, source_table, occurrences, ignored)
     select e.node_a, e.node_b, ($1::text[])[e.src], ($2::text[])[e.src], e.occurrences,
       e.node_a = any($3::bigint[]) or e.node_b = any($3::bigint[])
     from _id_edge e`,
    [rules, sourceTables, highDegree],
  );
  await q(
    `insert into ${t.records} (source_table, record_key, node_id)
     select ($1::text[])[src], record_key, node_id
     from (select distinct src, record_key, node_id from _id_obs where record_key is not null) d`,
    [sourceTables],
  );
  await q(
    `insert into ${t.clusters} (cluster_id, size, built_at)
     select cluster_id, count(*), $1 from ${t.nodes} group by cluster_id`,
    [startedAt],
  );
  for (const statement of addKeysStatements(options.schema)) await q(statement);
  return recordRun(buildContext(runner, options), {
    startedAt,
    started,
    oversizedComponents: components.oversizedComponents,
    largestOversized: components.largestOversized,
    mode: 'full',
  });
}

/** Pairs of identifiers seen in one source record, from `_id_obs`. */
const EDGES_FROM_OBS = `create temp table _id_edge on commit drop as
  select a.node_id as node_a, b.node_id as node_b, a.src, count(*) as occurrences
  from _id_obs a join _id_obs b on b.src = a.src and b.rid = a.rid and a.node_id < b.node_id
  group by 1, 2, 3`;

async function recordRun(
  { q, t, maxDegree, maxClusterSize }: BuildContext,
  run: {
    startedAt: Date;
    started: number;
    oversizedComponents: number;
    largestOversized: number;
    mode: 'full' | 'incremental';
  },
): Promise<ResolutionResult> {
  const { rows } = await q(
    `insert into ${t.runs} (started_at, finished_at, identifiers, edges, ignored_edges, flagged_nodes, clusters,
       largest_cluster, singletons, merged_identifiers, oversized_components, largest_oversized_component,
       iterations, max_degree, max_cluster_size)
     select $1, $2, n.identifiers, e.edges, e.ignored, n.flagged, c.clusters, c.largest, c.singletons,
       n.identifiers - c.clusters, $3, $4, 1, $5, $6
     from (select count(*) as identifiers, count(*) filter (where flagged is not null) as flagged from ${t.nodes}) n,
          (select count(*) as edges, count(*) filter (where ignored) as ignored from ${t.edges}) e,
          (select count(*) as clusters, coalesce(max(size), 0) as largest,
                  count(*) filter (where size = 1) as singletons from ${t.clusters}) c
     returning *`,
    [run.startedAt, new Date(), run.oversizedComponents, run.largestOversized, maxDegree, maxClusterSize],
  );
  const r = rows[0];
  return {
    run_id: toNumber(r.run_id)!,
    identifiers: toNumber(r.identifiers)!,
    edges: toNumber(r.edges)!,
    ignored_edges: toNumber(r.ignored_edges)!,
    flagged_nodes: toNumber(r.flagged_nodes)!,
    clusters: toNumber(r.clusters)!,
    largest_cluster: toNumber(r.largest_cluster)!,
    singletons: toNumber(r.singletons)!,
    oversized_components: run.oversizedComponents,
    largest_oversized_component: run.largestOversized,
    iterations: 1,
    duration_ms: Math.round(performance.now() - run.started),
    built_at: run.startedAt,
    mode: run.mode,
  };
}

/**
 * Adds the records that are new since the last build (by record key, per source) to the graph:
 * their identifiers become nodes (or meet existing ones), their pairs become edges, and the
 * clusters they touch merge. Costs in proportion to the new records, not to the graph.
 *
 * What an incremental step cannot express falls back to a full rebuild, in the same transaction:
 * no earlier build, a source without a record key, other limits than the last build's, a node whose
 * new degree crosses `maxDegree` (its old merges must be undone), a new edge at an identifier left
 * unmerged as part of an oversized component, or a merged cluster that would exceed
 * `maxClusterSize`. Changed or deleted records are not seen: a full build picks them up.
 */
export async function updateIdentities(
  runner: CopyOutRunner,
  options: ResolveOptions,
): Promise<ResolutionResult> {
  validate(options);
  const started = performance.now();
  await createIdentitySchema(runner, options.schema);
  return inTransaction(runner, `dimas.identity:${options.schema}`, async () => {
    // A fallback discards what the incremental attempt staged, temporary tables included.
    await runner.query('savepoint incremental');
    const incremental = await incrementalBuild(runner, options, started);
    if (incremental) return incremental;
    await runner.query('rollback to savepoint incremental');
    return fullBuild(runner, options, started);
  });
}

async function incrementalBuild(
  runner: CopyOutRunner,
  options: ResolveOptions,
  started: number,
): Promise<ResolutionResult | null> {
  const ctx = buildContext(runner, options);
  const { q, t, maxDegree, maxClusterSize, sourceTables, rules } = ctx;
  const startedAt = new Date();
  if (options.sources.some((s) => !s.keyColumn)) return null;
  const last = await q(`select max_degree, max_cluster_size from ${t.runs} order by run_id desc limit 1`);
  const previous = last.rows[0];
  if (
    !previous ||
    toNumber(previous.max_degree) !== maxDegree ||
    toNumber(previous.max_cluster_size) !== maxClusterSize
  )
    return null;
  await q(`set local work_mem = '${options.workMem ?? '256MB'}'`);
  await q(
    `create temp table _id_stage (src int not null, rid bigint not null, record_key text, id_type text not null,
       id_value text not null) on commit drop`,
  );
  for (const [i, source] of options.sources.entries())
    await q(stageSourceSql(source, i, { newSince: t.records, sourceTable: sourceTables[i] }));
  // New identifiers are numbered after the existing ones.
  await q(
    `create temp table _id_obs on commit drop as
     with seen as (
       select s.*, n.node_id as known from _id_stage s
       left join ${t.nodes} n on n.id_type = s.id_type and n.id_value = s.id_value),
     top as (select coalesce(max(node_id), 0) as top from ${t.nodes})
     select src, rid, record_key, id_type, id_value,
       coalesce(known, (select top from top) + dense_rank() over (partition by known is null
         order by id_type collate "C", id_value collate "C")) as node_id,
       known is null and row_number() over (partition by id_type, id_value) = 1 as first_seen
     from seen`,
  );
  await q(EDGES_FROM_OBS);
  // Pairs the graph has not seen (under any rule) raise degrees; their ends' clusters may merge.
  const { rows: fresh } = await q(
    `select p.node_a, p.node_b,
       coalesce(na.cluster_id, p.node_a) as cluster_a, coalesce(nb.cluster_id, p.node_b) as cluster_b,
       coalesce(na.degree, 0) as degree_a, coalesce(nb.degree, 0) as degree_b,
       coalesce(na.flagged = 'oversized_cluster', false) or coalesce(nb.flagged = 'oversized_cluster', false) as oversized
     from (select distinct node_a, node_b from _id_edge e
           where not exists (select 1 from ${t.edges} x where x.node_a = e.node_a and x.node_b = e.node_b)) p
     left join ${t.nodes} na on na.node_id = p.node_a
     left join ${t.nodes} nb on nb.node_id = p.node_b`,
  );
  const degreeGain = new Map<number, number>();
  const oldDegree = new Map<number, number>();
  for (const row of fresh) {
    const [a, b] = [Number(row.node_a), Number(row.node_b)];
    if (row.oversized) return null;
    degreeGain.set(a, (degreeGain.get(a) ?? 0) + 1);
    degreeGain.set(b, (degreeGain.get(b) ?? 0) + 1);
    oldDegree.set(a, Number(row.degree_a));
    oldDegree.set(b, Number(row.degree_b));
  }
  const newDegree = (node: number) => (oldDegree.get(node) ?? 0) + (degreeGain.get(node) ?? 0);
  for (const node of degreeGain.keys())
    if ((oldDegree.get(node) ?? 0) <= maxDegree && newDegree(node) > maxDegree) return null;
  // Union-find over cluster ids; a cluster id is its smallest member, so the merged id is the minimum.
  const parent = new Map<number, number>();
  const find = (x: number): number => {
    let root = x;
    while ((parent.get(root) ?? root) !== root) root = parent.get(root)!;
    parent.set(x, root);
    return root;
  };
  for (const row of fresh) {
    const [a, b] = [Number(row.node_a), Number(row.node_b)];
    if (newDegree(a) > maxDegree || newDegree(b) > maxDegree) continue;
    const ra = find(Number(row.cluster_a));
    const rb = find(Number(row.cluster_b));
    if (ra !== rb) parent.set(Math.max(ra, rb), Math.min(ra, rb));
  }
  const remap = [...parent.keys()].map((cluster) => [cluster, find(cluster)] as const);
  await q(`create temp table _id_remap (old bigint primary key, new bigint not null) on commit drop`);
  if (remap.length)
    await q(
      `insert into _id_remap select * from unnest(string_to_array($1, ',')::bigint[], string_to_array($2, ',')::bigint[])`,
      [remap.map(([old]) => old).join(','), remap.map(([, now]) => now).join(',')],
    );
  const sizes = await q(
    `select coalesce(max(size), 0) as largest from (
       select r.new, count(*) as size from (
         select cluster_id as c from ${t.nodes} where cluster_id in (select old from _id_remap)
         union all select node_id from _id_obs where first_seen) m
       join _id_remap r on r.old = m.c group by r.new) s`,
  );
  if ((toNumber(sizes.rows[0]?.largest) ?? 0) > maxClusterSize) return null;

  const gains = [...degreeGain.keys()];
  await q(`create temp table _id_degree (node_id bigint primary key, degree int not null) on commit drop`);
  if (gains.length)
    await q(
      `insert into _id_degree select * from unnest(string_to_array($1, ',')::bigint[], string_to_array($2, ',')::int[])`,
      [gains.join(','), gains.map(newDegree).join(',')],
    );
  await q(
    `insert into ${t.nodes} (node_id, id_type, id_value, cluster_id, degree, flagged)
     select o.node_id, o.id_type, o.id_value, coalesce(r.new, o.node_id), coalesce(d.degree, 0),
       case when d.degree > $1 then 'high_degree' end
     from _id_obs o left join _id_remap r on r.old = o.node_id left join _id_degree d on d.node_id = o.node_id
     where o.first_seen`,
    [maxDegree],
  );
  await q(
    `update ${t.nodes} n set degree = d.degree from _id_degree d
     where n.node_id = d.node_id and n.degree <> d.degree`,
  );
  await q(
    `update ${t.nodes} n set cluster_id = r.new from _id_remap r
     where n.cluster_id = r.old and r.old <> r.new`,
  );
  await q(
    `insert into ${t.edges} (node_a, node_b, rule, source_table, occurrences, ignored)
     select e.node_a, e.node_b, ($1::text[])[e.src], ($2::text[])[e.src], e.occurrences,
       na.degree > $3 or nb.degree > $3
     from _id_edge e join ${t.nodes} na on na.node_id = e.node_a join ${t.nodes} nb on nb.node_id = e.node_b
     on conflict (node_a, node_b, rule, source_table)
     do update set occurrences = ${t.edges}.occurrences + excluded.occurrences`,
    [rules, sourceTables, maxDegree],
  );
  await q(
    `insert into ${t.records} (source_table, record_key, node_id)
     select distinct ($1::text[])[src], record_key, node_id from _id_obs where record_key is not null
     on conflict do nothing`,
    [sourceTables],
  );
  await q(`delete from ${t.clusters} where cluster_id in (select old from _id_remap)`);
  await q(
    `insert into ${t.clusters} (cluster_id, size, built_at)
     select cluster_id, count(*), $1 from ${t.nodes}
     where cluster_id in (select new from _id_remap union select node_id from _id_obs where first_seen)
     group by cluster_id
     on conflict (cluster_id) do update set size = excluded.size, built_at = excluded.built_at`,
    [startedAt],
  );
  return recordRun(ctx, {
    startedAt,
    started,
    oversizedComponents: 0,
    largestOversized: 0,
    mode: 'incremental',
  });
}

/**
 * `_id_label`: cluster, degree and flag of every node that has a neighbour (the others are
 * singletons with degree 0), sent as comma-joined text arrays: no COPY FROM, which not every
 * warehouse front end carries, and one statement per batch.
 */
async function writeLabels(
  q: (sql: string, params?: unknown[]) => Promise<unknown>,
  components: Components,
  maxDegree: number,
) {
  await q(
    `create temp table _id_label (node_id bigint primary key, cluster_id bigint not null, degree int not null,
       flagged text) on commit drop`,
  );
  const { label, degree, oversized } = components;
  let ids: number[] = [];
  let clusters: number[] = [];
  let degrees: number[] = [];
  let flags: string[] = [];
  const flush = async () => {
    if (!ids.length) return;
    await q(
      `insert into _id_label
       select * from unnest(string_to_array($1, ',')::bigint[], string_to_array($2, ',')::bigint[],
         string_to_array($3, ',')::int[], string_to_array($4, ',', ''))`,
      [ids.join(','), clusters.join(','), degrees.join(','), flags.join(',')],
    );
    ids = [];
    clusters = [];
    degrees = [];
    flags = [];
  };
  for (let i = 1; i < label.length; i++) {
    if (degree[i] === 0) continue;
    ids.push(i);
    clusters.push(label[i]);
    degrees.push(degree[i]);
    flags.push(degree[i] > maxDegree ? 'high_degree' : oversized[i] ? 'oversized_cluster' : '');
    if (ids.length >= LABEL_BATCH) await flush();
  }
  await flush();
}

export interface IdentityRunSummary {
  run_id: number;
  started_at: Date;
  finished_at: Date;
  identifiers: number;
  clusters: number;
  merged_identifiers: number;
  largest_cluster: number;
  oversized_components: number;
  iterations: number;
  max_cluster_size: number;
}

export interface IdentityGraphStats {
  built: boolean;
  last_built_at: Date | null;
  identifiers: number;
  identifiers_by_type: Record<string, number>;
  edges: number;
  ignored_edges: number;
  flagged_identifiers: number;
  clusters: number;
  singletons: number;
  largest_cluster: { cluster_id: number; size: number } | null;
  /** Cluster counts by size bucket: "1", "2", "3-5", "6-10", "11-100", "101-1000", ">1000". */
  cluster_size_distribution: Record<string, number>;
  /** Newest first, at most two: the last build and the one before it (for merge-jump checks). */
  recent_runs: IdentityRunSummary[];
}

const SIZE_BUCKETS = ['1', '2', '3-5', '6-10', '11-100', '101-1000', '>1000'];

/** Statistics in one statement; `built: false` when the schema or a build is missing. */
export async function identityGraphStats(runner: SqlRunner, schema: string): Promise<IdentityGraphStats> {
  const t = names(schema);
  const exists = await runner.query('select to_regclass($1) is not null as present', [
    `${quoteIdent(schema)}.identity_runs`,
  ]);
  const empty: IdentityGraphStats = {
    built: false,
    last_built_at: null,
    identifiers: 0,
    identifiers_by_type: {},
    edges: 0,
    ignored_edges: 0,
    flagged_identifiers: 0,
    clusters: 0,
    singletons: 0,
    largest_cluster: null,
    cluster_size_distribution: Object.fromEntries(SIZE_BUCKETS.map((b) => [b, 0])),
    recent_runs: [],
  };
  if (!exists.rows[0]?.present) return empty;
  const { rows } = await runner.query(
    `select
      (select coalesce(json_object_agg(id_type, n), '{}') from
        (select id_type, count(*) as n from ${t.nodes} group by id_type) x) as by_type,
      (select count(*) filter (where flagged is not null) from ${t.nodes}) as flagged,
      (select json_build_object('edges', count(*), 'ignored', count(*) filter (where ignored)) from ${t.edges}) as edges,
      (select json_build_object('clusters', count(*), 'singletons', count(*) filter (where size = 1)) from ${t.clusters}) as clusters,
      (select json_build_object('cluster_id', cluster_id, 'size', size) from ${t.clusters}
        order by size desc, cluster_id limit 1) as largest,
      (select coalesce(json_object_agg(bucket, n), '{}') from (
        select case when size = 1 then '1' when size = 2 then '2' when size <= 5 then '3-5'
          when size <= 10 then '6-10' when size <= 100 then '11-100' when size <= 1000 then '101-1000'
          else '>1000' end as bucket, count(*) as n
        from ${t.clusters} group by 1) b) as distribution,
      (select coalesce(json_agg(r order by r.run_id desc), '[]') from (
        select run_id, started_at, finished_at, identifiers, clusters, merged_identifiers, largest_cluster,
          oversized_components, iterations, max_cluster_size
        from ${t.runs} order by run_id desc limit 2) r) as runs`,
  );
  const row = rows[0];
  const runs = (row.runs as Record<string, unknown>[]).map((r): IdentityRunSummary => ({
    run_id: toNumber(r.run_id)!,
    started_at: new Date(String(r.started_at)),
    finished_at: new Date(String(r.finished_at)),
    identifiers: toNumber(r.identifiers)!,
    clusters: toNumber(r.clusters)!,
    merged_identifiers: toNumber(r.merged_identifiers)!,
    largest_cluster: toNumber(r.largest_cluster)!,
    oversized_components: toNumber(r.oversized_components)!,
    iterations: toNumber(r.iterations)!,
    max_cluster_size: toNumber(r.max_cluster_size)!,
  }));
  const byType = Object.fromEntries(
    Object.entries(row.by_type as Record<string, unknown>).map(([k, v]) => [k, toNumber(v)!]),
  );
  const distribution = { ...empty.cluster_size_distribution };
  for (const [k, v] of Object.entries(row.distribution as Record<string, unknown>))
    distribution[k] = toNumber(v)!;
  return {
    built: runs.length > 0,
    last_built_at: runs[0]?.finished_at ?? null,
    identifiers: Object.values(byType).reduce((a, b) => a + b, 0),
    identifiers_by_type: byType,
    edges: toNumber(row.edges.edges)!,
    ignored_edges: toNumber(row.edges.ignored)!,
    flagged_identifiers: toNumber(row.flagged)!,
    clusters: toNumber(row.clusters.clusters)!,
    singletons: toNumber(row.clusters.singletons)!,
    largest_cluster: row.largest
      ? { cluster_id: toNumber(row.largest.cluster_id)!, size: toNumber(row.largest.size)! }
      : null,
    cluster_size_distribution: distribution,
    recent_runs: runs,
  };
}
