import { qualified, quoteIdent, quoteLiteral, toNumber, type SqlRunner, type TableRef } from './sql.ts';

/**
 * Identity resolution inside the target warehouse, all in SQL:
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
  /** Safety net only: propagation with pointer jumping converges in O(log diameter) rounds. */
  maxIterations?: number;
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
export function stageSourceSql(source: IdentitySource, index: number): string {
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
    `from (select row_number() over () as rid, ${key} as k, ${projections.join(', ')} from ${qualified(source.table)}) r\n` +
    `cross join lateral (values ${values}) as v(id_type, id_value)\n` +
    `where v.id_value is not null`
  );
}

function validate(options: ResolveOptions) {
  if (options.sources.length === 0) throw new Error('No identity sources given');
  for (const source of options.sources)
    for (const id of source.identifiers)
      if (!TYPE_NAME.test(id.type)) throw new Error(`Invalid identifier type: ${id.type}`);
  if (options.workMem !== undefined && !/^\d{1,6}(kB|MB|GB)$/.test(options.workMem))
    throw new Error('workMem must look like 64MB');
  for (const [key, value] of Object.entries({
    maxDegree: options.maxDegree,
    maxClusterSize: options.maxClusterSize,
    maxIterations: options.maxIterations,
  }))
    if (value !== undefined && (!Number.isInteger(value) || value < 1))
      throw new Error(`${key} must be a positive integer`);
}

/**
 * Rebuilds the graph from the sources in one transaction (readers see the previous build until
 * commit). Clusters are connected components by label propagation: every node starts with its
 * own id as label; each round (an iteration) UPDATEs each node's label to the smallest label among
 * its neighbours, then lets nodes adopt their label's label (pointer jumping, which cuts the rounds
 * of plain propagation, about the component diameter, down sharply); it stops when a round
 * changes no row. A label is always the id of a node of the same component and only decreases,
 * so the fixpoint is the smallest node id of each component.
 * Needs a single connection (temporary tables, transaction).
 */
export async function resolveIdentities(
  runner: SqlRunner,
  options: ResolveOptions,
): Promise<ResolutionResult> {
  validate(options);
  const maxDegree = options.maxDegree ?? 100;
  const maxClusterSize = options.maxClusterSize ?? 1000;
  const maxIterations = options.maxIterations ?? 1000;
  const t = names(options.schema);
  const sourceTables = options.sources.map((s) => `${s.table.schema}.${s.table.name}`);
  const rules = options.sources.map((s) => s.rule ?? 'same_record');
  const started = performance.now();
  const startedAt = new Date();

  await createIdentitySchema(runner, options.schema);
  return inTransaction(runner, `dimas.identity:${options.schema}`, async () => {
    const q = (sql: string, params?: unknown[]) => runner.query(sql, params);
    // Hashes and sorts of a million identifiers spill to disk at the default 4MB; local to this build.
    await q(`set local work_mem = '${options.workMem ?? '256MB'}'`);
    // The graph is worked on in temporary tables (no WAL, no index upkeep, no bloat of the real
    // tables) and written to the real tables once at the end.
    await q(
      `create temp table _id_stage (src int not null, rid bigint not null, record_key text, id_type text not null,
         id_value text not null) on commit drop`,
    );
    for (const [i, source] of options.sources.entries()) await q(stageSourceSql(source, i));
    await q(
      `create temp table _id_node on commit drop as
       select row_number() over (order by id_type collate "C", id_value collate "C") as node_id, id_type, id_value
       from (select distinct id_type, id_value from _id_stage) d`,
    );
    await q(
      `create temp table _id_obs on commit drop as
       select s.src, s.rid, s.record_key, n.node_id
       from _id_stage s join _id_node n on n.id_type = s.id_type and n.id_value = s.id_value`,
    );
    await q('analyze _id_obs');
    await q(
      `create temp table _id_edge on commit drop as
       select a.node_id as node_a, b.node_id as node_b, a.src, count(*) as occurrences
       from _id_obs a join _id_obs b on b.src = a.src and b.rid = a.rid and a.node_id < b.node_id
       group by 1, 2, 3`,
    );
    // Degree = distinct neighbours, whatever the number of sources or rules that link them.
    await q(
      `create temp table _id_pair on commit drop as select distinct node_a as a, node_b as b from _id_edge`,
    );
    await q(
      `create temp table _id_degree on commit drop as
       select node_id, count(*) as degree
       from (select a as node_id from _id_pair union all select b from _id_pair) e group by node_id`,
    );
    await q('alter table _id_degree add primary key (node_id)');
    await q(
      `create temp table _id_adj on commit drop as
       select p.a, p.b from _id_pair p
       join _id_degree da on da.node_id = p.a and da.degree <= $1
       join _id_degree db on db.node_id = p.b and db.degree <= $1`,
      [maxDegree],
    );
    await q('insert into _id_adj select b, a from _id_adj');
    await q(
      // Half-empty pages and no index: every label update stays a cheap in-page (HOT) write, which
      // measured 6x faster than updating a packed, primary-keyed table.
      `create temp table _id_label with (fillfactor = 50) on commit drop as
       select distinct a as node_id, a as label, 0 as changed_in from _id_adj`,
    );
    await q('create index on _id_adj (a)');
    await q('analyze _id_adj');
    let iterations = 0;
    for (;;) {
      if (iterations >= maxIterations)
        throw new Error(`Label propagation did not converge in ${maxIterations} iterations`);
      iterations++;
      // Planner estimates of the shrinking frontier must stay current (hash join early, index later).
      await q('analyze _id_label');
      // A node's label is the min over its neighbours' labels. Only neighbours whose label changed
      // in the previous round can lower it (the others were already taken into account), so the
      // labels are pushed from that frontier instead of recomputing every node each round.
      const spread = await q(
        `update _id_label l set label = m.label, changed_in = $1
         from (select j.b as node_id, min(f.label) as label
               from _id_label f join _id_adj j on j.a = f.node_id
               where f.changed_in = $1 - 1 group by j.b) m
         where l.node_id = m.node_id and m.label < l.label`,
        [iterations],
      );
      // Pointer jumping: adopt the label of one's label (same component, never larger). Only an
      // accelerator, so it looks at recently changed targets only.
      const jumped = await q(
        `update _id_label l set label = p.label, changed_in = $1 from _id_label p
         where p.node_id = l.label and p.label < l.label and p.changed_in >= $1 - 1`,
        [iterations],
      );
      if ((spread.rowCount ?? 0) === 0 && (jumped.rowCount ?? 0) === 0) break;
    }

    const sizes = await q(
      `select count(*) as components, coalesce(max(size), 0) as largest
       from (select count(*) as size from _id_label group by label having count(*) > $1) s`,
      [maxClusterSize],
    );
    const components = toNumber(sizes.rows[0]?.components) ?? 0;
    const largestOversized = toNumber(sizes.rows[0]?.largest) ?? 0;
    // label <> node_id afterwards marks the nodes that were merged; oversized components are not.
    await q(
      `create temp table _id_oversized on commit drop as
       select label from _id_label group by label having count(*) > $1`,
      [maxClusterSize],
    );

    await q(`truncate ${t.nodes}, ${t.edges}, ${t.records}, ${t.clusters}`);
    await q(
      `insert into ${t.nodes} (node_id, id_type, id_value, cluster_id, degree, flagged)
       select n.node_id, n.id_type, n.id_value,
         case when o.label is null then coalesce(l.label, n.node_id) else n.node_id end,
         coalesce(d.degree, 0),
         case when d.degree > $1 then 'high_degree' when o.label is not null then 'oversized_cluster' end
       from _id_node n
       left join _id_degree d on d.node_id = n.node_id
       left join _id_label l on l.node_id = n.node_id
       left join _id_oversized o on o.label = l.label`,
      [maxDegree],
    );
    await q(
      `insert into ${t.edges} (node_a, node_b, rule, source_table, occurrences, ignored)
       select e.node_a, e.node_b, ($1::text[])[e.src], ($2::text[])[e.src], sum(e.occurrences),
         bool_or(da.degree > $3 or db.degree > $3)
       from _id_edge e
       join _id_degree da on da.node_id = e.node_a
       join _id_degree db on db.node_id = e.node_b
       group by 1, 2, 3, 4`,
      [rules, sourceTables, maxDegree],
    );
    await q(
      `insert into ${t.records} (source_table, record_key, node_id)
       select distinct ($1::text[])[src], record_key, node_id from _id_obs where record_key is not null`,
      [sourceTables],
    );
    await q(
      `insert into ${t.clusters} (cluster_id, size, built_at)
       select cluster_id, count(*), $1 from ${t.nodes} group by cluster_id`,
      [startedAt],
    );
    const finishedAt = new Date();
    const run = await q(
      `insert into ${t.runs} (started_at, finished_at, identifiers, edges, ignored_edges, flagged_nodes, clusters,
         largest_cluster, singletons, merged_identifiers, oversized_components, largest_oversized_component,
         iterations, max_degree, max_cluster_size)
       select $1, $2, n.identifiers, e.edges, e.ignored, n.flagged, c.clusters, c.largest, c.singletons,
         n.identifiers - c.clusters, $3, $4, $5, $6, $7
       from (select count(*) as identifiers, count(*) filter (where flagged is not null) as flagged from ${t.nodes}) n,
            (select count(*) as edges, count(*) filter (where ignored) as ignored from ${t.edges}) e,
            (select count(*) as clusters, coalesce(max(size), 0) as largest,
                    count(*) filter (where size = 1) as singletons from ${t.clusters}) c
       returning *`,
      [startedAt, finishedAt, components, largestOversized, iterations, maxDegree, maxClusterSize],
    );
    const r = run.rows[0];
    return {
      run_id: toNumber(r.run_id)!,
      identifiers: toNumber(r.identifiers)!,
      edges: toNumber(r.edges)!,
      ignored_edges: toNumber(r.ignored_edges)!,
      flagged_nodes: toNumber(r.flagged_nodes)!,
      clusters: toNumber(r.clusters)!,
      largest_cluster: toNumber(r.largest_cluster)!,
      singletons: toNumber(r.singletons)!,
      oversized_components: components,
      largest_oversized_component: largestOversized,
      iterations,
      duration_ms: Math.round(performance.now() - started),
      built_at: startedAt,
    };
  });
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
