import { componentsInProcess, fitsInProcess, mayFitInProcess } from './components.ts';
import { componentsInWarehouse, labelInProcess, temporaryTables } from './components-sql.ts';
import { qualified, toNumber, type CopyOutRunner, type SqlRunner } from './sql.ts';
import {
  type ResolveOptions,
  type ResolutionResult,
  type FullBuildReason,
  type BuildStep,
  type NewRecordsFilter,
  TYPE_NAME,
  names,
  dropKeysStatements,
  addKeysStatements,
  inTransaction,
  createIdentitySchema,
  stageSourceSql,
  stageSelectSql,
  graphStatisticsSql,
  incrementalStatisticsSql,
  nearMaxDegreeFrom,
} from './identity-schema.ts';

// Building the identity graph: a full rebuild, or an incremental update that falls back to one.
// The tables it writes, and how they are read, are in identity-schema.ts.

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
  const limit = options.inProcessLimit;
  if (limit !== undefined && (!Number.isSafeInteger(limit) || limit < 0))
    throw new Error('inProcessLimit must be a non-negative integer');
}

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

type Query = SqlRunner['query'];

/** Times a build's steps: `step(name)` ends the step that has run since the previous call. */
function stepClock() {
  const steps: ResolutionResult['steps'] = [];
  let last = performance.now();
  return {
    steps,
    step(name: BuildStep) {
      const now = performance.now();
      steps.push({ step: name, ms: Math.round(now - last) });
      last = now;
    },
  };
}
type StepClock = ReturnType<typeof stepClock>;

interface BuildContext {
  q: Query;
  t: ReturnType<typeof names>;
  maxDegree: number;
  maxClusterSize: number;
  inProcessLimit: number;
  sourceTables: string[];
  rules: string[];
}

function buildContext(runner: SqlRunner, options: ResolveOptions): BuildContext {
  return {
    q: (sql, params) => runner.query(sql, params),
    t: names(options.schema),
    maxDegree: options.maxDegree ?? 100,
    maxClusterSize: options.maxClusterSize ?? 1000,
    inProcessLimit: options.inProcessLimit ?? DEFAULT_IN_PROCESS_LIMIT,
    sourceTables: options.sources.map((s) => `${s.table.schema}.${s.table.name}`),
    rules: options.sources.map((s) => s.rule ?? 'same_record'),
  };
}

/**
 * Settings local to the build's transaction. Hashes and sorts of a million identifiers spill to disk
 * at the default 4MB. JIT compiling costs a second or more per large statement here and these
 * statements are sorts, hashes and plain scans that it barely speeds up. The graph is derived data: a
 * crash right after commit can lose at most that build, which the next one redoes, so the commit
 * need not wait for its WAL flush.
 */
async function buildSettings(q: Query, options: ResolveOptions) {
  const memory = options.workMem ?? '256MB';
  await q(`set local work_mem = '${memory}'`);
  await q(`set local maintenance_work_mem = '${memory}'`);
  await q('set local jit = off');
  await q('set local synchronous_commit = off');
}

async function fullBuild(
  runner: CopyOutRunner,
  options: ResolveOptions,
  started: number,
): Promise<ResolutionResult> {
  const { q, t, maxDegree, maxClusterSize, inProcessLimit, sourceTables, rules } = buildContext(
    runner,
    options,
  );
  const clock = stepClock();
  const startedAt = new Date();
  await buildSettings(q, options);
  const { sourceXmin } = await sourceSnapshot(q, {});
  // Staged and numbered in one statement (no staging table written and read back). Numbered in
  // (value, type) order, so identical inputs give identical node and cluster ids; the value leads
  // because the sort then compares most rows by an abbreviated key of its first bytes (led by the
  // type, which few identifiers tell apart, it compared whole values: 0.3 s more at a million).
  // The first observation of each identifier (the row whose rank is its row number) stands for its
  // node. The three functions share one window, so one pass over the sorted rows computes them (a
  // window partitioned by the identifier for the first observation took a second pass, 0.3 s).
  // Types are numbered in name order: a narrower row to sort and write (0.7 s of 4.5).
  const types = [...new Set(options.sources.flatMap((s) => s.identifiers.map((id) => id.type)))].sort();
  const typeNumbers = new Map(types.map((type, i) => [type, i + 1]));
  await q(
    `create temp table _id_obs on commit drop as
     select src, rid, record_key, id_type, id_value,
       dense_rank() over w as node_id, rank() over w = row_number() over w as first_seen
     from (${options.sources.map((source, i) => stageSelectSql(source, i, undefined, typeNumbers)).join('\nunion all\n')}) s
     window w as (order by id_value collate "C", id_type)`,
  );
  const snapshot = await snapshotAfterReading(q);
  // Without statistics the planner expects millions of pairs and merge-joins two full sorts; with
  // them it hashes the records once (half the time at a million identifiers).
  await q('analyze _id_obs');
  clock.step('staging');
  await q(EDGES_FROM_OBS);
  // Counted, not taken from the statement's row count, which PGlite does not report for
  // `create table as` (~40 ms at a million identifiers).
  const counted = await q(
    'select (select coalesce(max(node_id), 0) from _id_obs) as nodes, (select count(*) from _id_edge) as edges',
  );
  const nodeCount = toNumber(counted.rows[0]?.nodes) ?? 0;
  const edgeRows = toNumber(counted.rows[0]?.edges) ?? 0;
  // The edge rows (a pair per source that saw it) stand for the pairs: an upper bound, known now.
  const inProcess = fitsInProcess({ nodes: nodeCount, pairs: edgeRows }, inProcessLimit);
  clock.step('edges');
  const components = inProcess
    ? await componentsInProcess(runner, nodeCount, edgeRows, { maxDegree, maxClusterSize })
    : await componentsInWarehouse(runner, { maxDegree, maxClusterSize, inProcessLimit });
  await q('analyze _id_label');
  clock.step('components');

  await q(`truncate ${t.nodes}, ${t.edges}, ${t.records}, ${t.clusters}`);
  // Loading into tables without their keys and building the keys afterwards (one sort each)
  // costs a third of maintaining them row by row.
  for (const statement of dropKeysStatements(options.schema)) await q(statement);
  await q(
    `insert into ${t.nodes} (node_id, id_type, id_value, cluster_id, degree, flagged)
     select n.node_id, ($1::text[])[n.id_type], n.id_value, coalesce(l.cluster_id, n.node_id),
       coalesce(l.degree, 0), l.flagged
     from _id_obs n left join _id_label l on l.node_id = n.node_id
     where n.first_seen`,
    [types],
  );
  // The identifiers over the degree limit are usually none, but with a low limit most of a graph's:
  // a table the edges are joined with when there are any, never a list in this process.
  const high = components.highDegreeNodes > 0;
  if (high)
    await q(
      `create temp table _id_high on commit drop as
       select node_id from _id_label where flagged = 'high_degree'`,
    );
  await q(
    `insert into ${t.edges} (node_a, node_b, rule, source_table, occurrences, ignored)
     select e.node_a, e.node_b, ($1::text[])[e.src], ($2::text[])[e.src], e.occurrences,
       ${high ? 'ha.node_id is not null or hb.node_id is not null' : 'false'}
     from _id_edge e
     ${high ? 'left join _id_high ha on ha.node_id = e.node_a left join _id_high hb on hb.node_id = e.node_b' : ''}`,
    [rules, sourceTables],
  );
  const once = await sourcesWithRecordsOnce(q, options.sources);
  const keyed = '_id_obs where record_key is not null and src';
  const records = [
    ...(once.length ? [`select src, record_key, node_id from ${keyed} = any($2::smallint[])`] : []),
    ...(once.length < options.sources.length
      ? [`select distinct src, record_key, node_id from ${keyed} <> all($2::smallint[])`]
      : []),
  ];
  await q(
    `insert into ${t.records} (source_table, record_key, node_id)
     select ($1::text[])[src], record_key, node_id from (${records.join(' union all ')}) d`,
    [sourceTables, once],
  );
  await q(
    `insert into ${t.clusters} (cluster_id, size, built_at)
     select cluster_id, count(*), $1 from ${t.nodes} group by cluster_id`,
    [startedAt],
  );
  clock.step('tables');
  for (const statement of addKeysStatements(options.schema)) await q(statement);
  clock.step('keys');
  return recordRun(buildContext(runner, options), clock, {
    startedAt,
    started,
    oversizedComponents: components.oversizedComponents,
    largestOversized: components.largestOversized,
    iterations: components.iterations,
    componentsIn: inProcess ? 'process' : 'warehouse',
    mode: 'full',
    sourceXmin,
    snapshot,
  });
}

/**
 * Graphs up to this many identifiers get their components in the job's process: the pairs copied
 * out, the union-find's arrays and the label batches grew a server running the whole job by ~40 MB
 * at 1M (to ~250 MB at its peak). Larger graphs are contracted in the warehouse until what is left
 * fits, which this process then finishes, so the process never holds more than this limit's worth
 * whatever the graph's size.
 */
export const DEFAULT_IN_PROCESS_LIMIT = 1_000_000;

/**
 * An incremental build writes its rows into the graph's keyed tables one by one, a full build loads
 * them unkeyed and builds the keys once: past a batch of new observations about half as many as the
 * graph's identifiers, the full build is the faster (measured at 8,000 to 500,000 identifiers in
 * three sources: 30% more people took 0.7-0.8 of a full build incremental, doubling them 1.6-1.8).
 * Only while the grown graph (at most the graph's identifiers and the new observations) fits the
 * in-process limit: a full build past it is contracted in the warehouse, about twice as slow, and
 * 20% more people at a million identifiers were faster incremental (README). Below the floor either
 * build takes well under a second.
 */
const LARGE_BATCH_MIN_OBSERVATIONS = 10_000;
function isLargeBatch(observations: number, graphIdentifiers: number, inProcessLimit: number): boolean {
  return (
    observations > LARGE_BATCH_MIN_OBSERVATIONS &&
    observations * 2 > graphIdentifiers &&
    graphIdentifiers + observations <= inProcessLimit
  );
}

/** Pairs of identifiers seen in one source record, from `_id_obs`. */
const EDGES_FROM_OBS = `create temp table _id_edge on commit drop as
  select a.node_id as node_a, b.node_id as node_b, a.src, count(*) as occurrences
  from _id_obs a join _id_obs b on b.src = a.src and b.rid = a.rid and a.node_id < b.node_id
  group by 1, 2, 3`;

async function recordRun(
  { q, t, maxDegree, maxClusterSize }: BuildContext,
  clock: StepClock,
  run: {
    startedAt: Date;
    started: number;
    oversizedComponents: number;
    largestOversized: number;
    iterations: number;
    componentsIn: 'process' | 'warehouse' | null;
    mode: 'full' | 'incremental';
    sourceXmin: string;
    snapshot: string;
    /** A SELECT of the run's statistics (`graphStatisticsSql`'s columns); counted from the graph by default. */
    statistics?: string;
  },
): Promise<ResolutionResult> {
  const nearFrom = nearMaxDegreeFrom(maxDegree);
  const { rows } = await q(
    `insert into ${t.runs} (started_at, finished_at, identifiers, edges, ignored_edges, flagged_nodes, clusters,
       largest_cluster, singletons, merged_identifiers, oversized_components, largest_oversized_component,
       iterations, max_degree, max_cluster_size, source_xmin, source_snapshot, identifiers_by_type,
       largest_cluster_id, cluster_size_distribution, identifiers_near_max_degree, near_max_degree_from)
     select $1, $2, s.identifiers, s.edges, s.ignored_edges, s.flagged_nodes, s.clusters, s.largest_cluster,
       s.singletons, s.identifiers - s.clusters, $3, $4, $8, $5, $6, $7, $9, s.identifiers_by_type,
       s.largest_cluster_id, s.cluster_size_distribution, s.identifiers_near_max_degree, $10
     from (${run.statistics ?? graphStatisticsSql(t, nearFrom)}) s
     returning *`,
    [
      run.startedAt,
      new Date(),
      run.oversizedComponents,
      run.largestOversized,
      maxDegree,
      maxClusterSize,
      run.sourceXmin,
      run.iterations,
      run.snapshot,
      nearFrom,
    ],
  );
  const r = rows[0];
  clock.step('statistics');
  return {
    run_id: toNumber(r.run_id)!,
    identifiers: toNumber(r.identifiers)!,
    edges: toNumber(r.edges)!,
    ignored_edges: toNumber(r.ignored_edges)!,
    flagged_nodes: toNumber(r.flagged_nodes)!,
    identifiers_near_max_degree: toNumber(r.identifiers_near_max_degree)!,
    near_max_degree_from: nearFrom,
    clusters: toNumber(r.clusters)!,
    largest_cluster: toNumber(r.largest_cluster)!,
    singletons: toNumber(r.singletons)!,
    oversized_components: run.oversizedComponents,
    largest_oversized_component: run.largestOversized,
    iterations: run.iterations,
    components_in: run.componentsIn,
    duration_ms: Math.round(performance.now() - run.started),
    built_at: run.startedAt,
    mode: run.mode,
    full_reason: null,
    steps: clock.steps,
  };
}

/**
 * After an incremental build, a temporary table of the transaction that lists every cluster it
 * changed: `(cluster_id, gone)`, the clusters that gained identifiers, records or other clusters
 * (`gone` false) and the ids of the clusters merged into another (`gone` true). What derives from
 * clusters (the unified profiles) is brought up to date from it instead of being rebuilt.
 */
export const CHANGED_CLUSTERS = '_id_changed';

/**
 * Adds the rows that are new since the last build to the graph: their identifiers become nodes (or
 * meet existing ones), their pairs become edges, and the clusters they touch merge. Costs in
 * proportion to the new rows, not to the graph. A source whose key the catalog shows unique brings
 * new keys (a row of a known key is that record rewritten); any other table brings new rows, of
 * known keys too; a view or foreign table, whose rows carry no writing transaction, new keys.
 *
 * What an incremental step cannot express falls back to a full rebuild, in the same transaction:
 * no earlier build, a source without a record key, other limits than the last build's, a node whose
 * new degree crosses `maxDegree` (its old merges must be undone), a new edge at an identifier left
 * unmerged as part of an oversized component, a merged cluster that would exceed `maxClusterSize`,
 * or new pairs whose clusters do not fit the in-process limit (`fitsInProcess`); and a batch of new
 * rows large enough that a full build is faster (`isLargeBatch`). Changed or deleted records are not
 * seen: a full build picks them up.
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
    if (typeof incremental !== 'string') return incremental;
    await runner.query('rollback to savepoint incremental');
    const attempt = Math.round(performance.now() - started);
    const full = await fullBuild(runner, options, started);
    return {
      ...full,
      full_reason: incremental,
      steps: [{ step: 'incremental_attempt', ms: attempt }, ...full.steps],
    };
  });
}

async function incrementalBuild(
  runner: CopyOutRunner,
  options: ResolveOptions,
  started: number,
): Promise<ResolutionResult | FullBuildReason> {
  const ctx = buildContext(runner, options);
  const { q, t, maxDegree, maxClusterSize, inProcessLimit, sourceTables, rules } = ctx;
  const clock = stepClock();
  const startedAt = new Date();
  if (options.sources.some((s) => !s.keyColumn)) return 'source_without_record_key';
  const last = await q(
    `select run_id, identifiers, max_degree, max_cluster_size, source_xmin, source_snapshot,
       identifiers_by_type is not null and cluster_size_distribution is not null
         and identifiers_near_max_degree is not null and near_max_degree_from = $1 as has_statistics
     from ${t.runs} order by run_id desc limit 1`,
    [nearMaxDegreeFrom(maxDegree)],
  );
  const previous = last.rows[0];
  if (!previous) return 'no_previous_build';
  if (toNumber(previous.max_degree) !== maxDegree || toNumber(previous.max_cluster_size) !== maxClusterSize)
    return 'limits_changed';
  await buildSettings(q, options);
  const { sourceXmin, writtenWithin, unseen } = await sourceSnapshot(q, previous);
  const heapTables =
    writtenWithin === null ? new Set<string>() : await tablesWithRowVersions(q, options.sources);
  await q(
    `create temp table _id_stage (src int not null, rid bigint not null, record_key text, id_type text not null,
       id_value text not null, fresh boolean not null) on commit drop`,
  );
  for (const [i, source] of options.sources.entries())
    await q(
      stageSourceSql(source, i, {
        newSince: t.records,
        sourceTable: sourceTables[i],
        ...(heapTables.has(sourceTables[i]) ? { writtenWithin: writtenWithin!, unseen } : {}),
      }),
    );
  const snapshot = await snapshotAfterReading(q);
  if (heapTables.size) {
    // The recently written rows include rows the graph already holds (rewritten ones, and those of
    // transactions that ran alongside the last build). Few, each looked up by a subquery per staged
    // row (not a join the planner could turn into a hash of the whole graph).
    const heap = options.sources.flatMap((_, i) => (heapTables.has(sourceTables[i]) ? [i + 1] : []));
    const uniqueKeys = await sourcesWithUniqueKeys(q, options.sources);
    const [keyed, rowed] = [
      heap.filter((src) => uniqueKeys.includes(src)),
      heap.filter((src) => !uniqueKeys.includes(src)),
    ];
    // Where the catalog shows the key unique, a row whose key the graph holds is that record,
    // rewritten: skipped, as append-only sources promise no rewrites.
    if (keyed.length)
      await q(
        `delete from _id_stage s where s.src = any($2::int[]) and (select true from ${t.records} x
           where x.source_table = ($1::text[])[s.src] and x.record_key = s.record_key limit 1)`,
        [sourceTables, keyed],
      );
    // Elsewhere a key may repeat over rows, and a new row of a known key is new: a row goes only if
    // the last build may have read it (not fresh) and the graph holds each of its identifiers
    // under its key.
    if (rowed.length)
      await q(
        `delete from _id_stage s using (
         select g.src, g.rid from _id_stage g where g.src = any($2::int[]) and not g.fresh
         group by g.src, g.rid
         having bool_and((select true from ${t.records} x
           where x.record_key = g.record_key and x.source_table = ($1::text[])[g.src]
             and x.node_id = (select n.node_id from ${t.nodes} n where n.id_value = g.id_value and n.id_type = g.id_type)
           limit 1) is not null)) held
       where s.src = held.src and s.rid = held.rid`,
        [sourceTables, rowed],
      );
  }
  const staged = toNumber((await q('select count(*) as observations from _id_stage')).rows[0].observations);
  if (isLargeBatch(staged ?? 0, toNumber(previous.identifiers) ?? 0, inProcessLimit)) return 'large_batch';
  // New identifiers are numbered after the existing ones, in the full build's order.
  //
  // Here and below, the graph is read by a lookup per new row (a scalar subquery, a lateral one with
  // a limit, or `= any(array(...))` on an indexed column), never by a join: with statistics on the
  // graph's tables, as a warehouse running autovacuum has, the planner hashed the whole graph for
  // each join instead (0.1-0.2 s a statement at a million identifiers, 1.3-1.4 s in all against
  // 0.96 s without statistics). `seen` is materialized so that its lookup runs once per row, not
  // once per reference.
  await q(
    `create temp table _id_obs on commit drop as
     with seen as materialized (
       select s.*, (select n.node_id from ${t.nodes} n
                    where n.id_value = s.id_value and n.id_type = s.id_type) as known
       from _id_stage s),
     top as (select coalesce(max(node_id), 0) as top from ${t.nodes})
     select src, rid, record_key, id_type, id_value,
       coalesce(known, (select top from top) + dense_rank() over (partition by known is null
         order by id_value collate "C", id_type)) as node_id,
       known is null and row_number() over (partition by id_type, id_value) = 1 as first_seen
     from seen`,
  );
  // The new rows are few: with statistics on them the planner probes the graph's keys instead of
  // scanning the graph's tables (a third of an incremental build at a million identifiers).
  await q('analyze _id_obs');
  clock.step('staging');
  await q(EDGES_FROM_OBS);
  await q('analyze _id_edge');
  // Pairs the graph has not seen (under any rule) raise degrees; their ends' clusters may merge.
  await q(
    `create temp table _id_fresh on commit drop as
     select p.node_a, p.node_b,
       coalesce(na.cluster_id, p.node_a) as cluster_a, coalesce(nb.cluster_id, p.node_b) as cluster_b,
       coalesce(na.degree, 0) as degree_a, coalesce(nb.degree, 0) as degree_b,
       coalesce(na.flagged = 'oversized_cluster', false) or coalesce(nb.flagged = 'oversized_cluster', false) as oversized
     from (select distinct node_a, node_b from _id_edge e
           where (select true from ${t.edges} x where x.node_a = e.node_a and x.node_b = e.node_b limit 1)
             is null) p
     left join lateral (select * from ${t.nodes} n where n.node_id = p.node_a limit 1) na on true
     left join lateral (select * from ${t.nodes} n where n.node_id = p.node_b limit 1) nb on true`,
  );
  const { rows: freshRows } = await q(
    'select count(*) as pairs, coalesce(bool_or(oversized), false) as oversized from _id_fresh',
  );
  if (freshRows[0].oversized) return 'oversized_component_touched';
  // Their clusters merge by the full build's union-find in this process, under the same limit.
  if (!mayFitInProcess(toNumber(freshRows[0].pairs) ?? 0, inProcessLimit)) return 'too_many_new_pairs';
  await q(
    `create temp table _id_degree (node_id bigint primary key, old_degree int not null, degree int not null)
     on commit drop`,
  );
  await q(
    `insert into _id_degree
     select node_id, max(old), max(old) + count(*)
     from (select node_a as node_id, degree_a as old from _id_fresh
           union all select node_b, degree_b from _id_fresh) d
     group by node_id`,
  );
  await q('analyze _id_degree');
  const crossed = await q(
    'select exists (select 1 from _id_degree where old_degree <= $1 and degree > $1) as crossed',
    [maxDegree],
  );
  if (crossed.rows[0].crossed) return 'degree_limit_crossed';
  // Every cluster a new pair touches (both ends under the degree limit) → the cluster it becomes:
  // the smallest cluster id of its component, as a full build names a cluster by its smallest node.
  const tables = temporaryTables(runner, '_id_merge');
  const joined = await tables.counted(
    await tables.materialize(
      `select f.cluster_a as v, f.cluster_b as w
       from _id_fresh f join _id_degree a on a.node_id = f.node_a join _id_degree b on b.node_id = f.node_b
       where a.degree <= $1 and b.degree <= $1`,
      [maxDegree],
    ),
  );
  const merged = await labelInProcess(runner, joined, tables, inProcessLimit);
  if (!merged) return 'too_many_new_pairs';
  await q(`create temp table _id_remap (old bigint primary key, new bigint not null) on commit drop`);
  await q(`insert into _id_remap select v, l from ${merged}`);
  await q('analyze _id_remap');
  const sizes = await q(
    `select coalesce(max(size), 0) as largest from (
       select new, sum(n) as size from (
         select r.new, k.n from _id_remap r
         cross join lateral (select count(*) as n from ${t.nodes} x where x.cluster_id = r.old) k
         union all
         select r.new, 1 from _id_obs o join _id_remap r on r.old = o.node_id where o.first_seen) m
       group by new) s`,
  );
  if ((toNumber(sizes.rows[0]?.largest) ?? 0) > maxClusterSize) return 'cluster_limit_crossed';
  clock.step('merge');
  // The clusters this build grows or merges, with their sizes before (for the run's statistics).
  await q(
    `create temp table _id_before on commit drop as
     select cluster_id, size from ${t.clusters} where cluster_id = any(array(select old from _id_remap))`,
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
     where n.node_id = any(array(select node_id from _id_degree))
       and n.node_id = d.node_id and n.degree <> d.degree`,
  );
  await q(
    `update ${t.nodes} n set cluster_id = r.new from _id_remap r
     where n.cluster_id = any(array(select old from _id_remap where old <> new))
       and n.cluster_id = r.old and r.old <> r.new`,
  );
  const edgeRows = `select e.node_a, e.node_b, ($1::text[])[e.src] as rule, ($2::text[])[e.src] as source_table,
       e.occurrences, na.degree > $3 or nb.degree > $3 as ignored
     from _id_edge e
     cross join lateral (select degree from ${t.nodes} n where n.node_id = e.node_a limit 1) na
     cross join lateral (select degree from ${t.nodes} n where n.node_id = e.node_b limit 1) nb`;
  const { rows: newEdges } = await q(
    `select count(*) as edges, count(*) filter (where ignored) as ignored from (${edgeRows}) e
     where (select true from ${t.edges} x where x.node_a = e.node_a and x.node_b = e.node_b
              and x.rule = e.rule and x.source_table = e.source_table) is null`,
    [rules, sourceTables, maxDegree],
  );
  await q(
    `insert into ${t.edges} (node_a, node_b, rule, source_table, occurrences, ignored) ${edgeRows}
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
  await q(`delete from ${t.clusters} where cluster_id = any(array(select old from _id_remap))`);
  await q(
    `insert into ${t.clusters} (cluster_id, size, built_at)
     select cluster_id, count(*), $1 from ${t.nodes}
     where cluster_id = any(array(select new from _id_remap union select node_id from _id_obs where first_seen))
     group by cluster_id
     on conflict (cluster_id) do update set size = excluded.size, built_at = excluded.built_at`,
    [startedAt],
  );
  await q(
    `create temp table ${CHANGED_CLUSTERS} on commit drop as
     select cluster_id, false as gone from (
       select new as cluster_id from _id_remap
       union select n.cluster_id from (select distinct node_id from _id_obs) o
       cross join lateral (select cluster_id from ${t.nodes} n where n.node_id = o.node_id limit 1) n) c
     union all select old, true from _id_remap where old <> new`,
  );
  clock.step('tables');
  // Recorded from the previous run's statistics and the changes; counted when that run has none.
  const statistics = previous.has_statistics
    ? incrementalStatisticsSql(t, {
        previousRun: toNumber(previous.run_id)!,
        newNodes: '_id_obs where first_seen',
        before: '_id_before',
        after: `${t.clusters} where cluster_id = any(array(
          select new from _id_remap union select node_id from _id_obs where first_seen))`,
        degrees: '_id_degree',
        maxDegree,
        nearFrom: nearMaxDegreeFrom(maxDegree),
        newEdges: toNumber(newEdges[0].edges) ?? 0,
        newIgnoredEdges: toNumber(newEdges[0].ignored) ?? 0,
      })
    : undefined;
  return recordRun(ctx, clock, {
    statistics,
    startedAt,
    started,
    oversizedComponents: 0,
    largestOversized: 0,
    iterations: 1,
    componentsIn: null,
    mode: 'incremental',
    sourceXmin,
    snapshot,
  });
}

/**
 * The sources (numbered from 1, as `src` in `_id_obs`) whose rows cannot bring one identifier under
 * one record key twice, by the catalog: a key column with a unique index of its own (a constraint or
 * not, valid, not partial) and no identifier type listed twice. Their records are loaded as staged;
 * the others are made distinct first (1.5M records loaded in 0.8 s as staged, 1.8–2.1 s made distinct).
 * The key must be of a type whose values the index tells apart exactly when their text differs
 * (a float's text depends on `extra_float_digits`, for one), and the table a plain one without
 * inheriting tables, whose rows a read of it includes but its index does not cover (the catalog's
 * `relhassubclass` may stay set after the last one is dropped: the distinct then, still right).
 */
async function sourcesWithRecordsOnce(q: Query, sources: ResolveOptions['sources']): Promise<number[]> {
  const once = sources.flatMap((source, i) => {
    const types = source.identifiers.map((id) => id.type);
    return new Set(types).size === types.length ? [i + 1] : [];
  });
  return (await sourcesWithUniqueKeys(q, sources)).filter((src) => once.includes(src));
}

/** The sources (numbered from 1) whose record key the catalog shows unique (see above). */
async function sourcesWithUniqueKeys(q: Query, sources: ResolveOptions['sources']): Promise<number[]> {
  const candidates = sources.flatMap((source, i) => (source.keyColumn ? [i] : []));
  if (!candidates.length) return [];
  const { rows } = await q(
    `select t.src from unnest($1::text[], $2::text[], $3::int[]) t(quoted, key_column, src)
     where exists (select 1 from pg_index x
       join pg_class c on c.oid = x.indrelid
       join pg_attribute a on a.attrelid = x.indrelid and a.attnum = x.indkey[0]
       where x.indrelid = to_regclass(t.quoted) and x.indisunique and x.indisvalid and x.indnkeyatts = 1
         and x.indpred is null and a.attname = t.key_column
         and a.atttypid = any('{int2,int4,int8,numeric,text,varchar,uuid}'::regtype[])
         and c.relkind = 'r' and not c.relhassubclass)`,
    [
      candidates.map((i) => qualified(sources[i].table)),
      candidates.map((i) => sources[i].keyColumn),
      candidates.map((i) => i + 1),
    ],
  );
  return rows.map((row) => Number(row.src));
}

/** Transaction ids further apart than this no longer compare by `age()` (which wraps at 2^31). */
const XID_HORIZON = 2_000_000_000;

/**
 * Where this build starts reading the sources, recorded with its run: the oldest transaction still
 * running (`pg_snapshot_xmin`, as a 64-bit id that never wraps): every row this build's statements
 * cannot see was written by it or a later one. The next incremental build reads only rows written
 * since (`writtenWithin`: their `age(xmin)` is at most its age), or, without a recorded id or when
 * too many transactions have passed to compare, every row (null); and it tells apart, among them,
 * the rows the last build cannot have read (`unseen`: see `snapshotAfterReading`), when the last
 * build recorded its snapshot.
 */
async function sourceSnapshot(
  q: Query,
  previous: { source_xmin?: unknown; source_snapshot?: unknown },
): Promise<{
  sourceXmin: string;
  writtenWithin: number | null;
  unseen: NewRecordsFilter['unseen'];
}> {
  const text = (value: unknown) => (value === null || value === undefined ? null : String(value));
  // One statement: `age()` counts from a transaction id fixed at its first call in the transaction.
  const { rows } = await q(
    `select pg_snapshot_xmin(s)::text as xmin, w.within as written_within,
       case when w.within is not null and $3::text is not null then age(xid(pg_snapshot_xmax($3::pg_snapshot))) end
         as unseen_within,
       case when w.within is not null and $3::text is not null then
         array(select xid(x)::text from pg_snapshot_xip($3::pg_snapshot) x) end as in_progress
     from pg_current_snapshot() s
     cross join lateral (select case when $1::text is not null
       and pg_snapshot_xmax(s)::text::numeric - $1::text::numeric < $2 then age(xid($1::text::xid8)) end as within) w`,
    [text(previous.source_xmin), XID_HORIZON, text(previous.source_snapshot)],
  );
  const row = rows[0];
  const unseenWithin = toNumber(row.unseen_within);
  return {
    sourceXmin: row.xmin,
    writtenWithin: toNumber(row.written_within),
    unseen:
      unseenWithin === null
        ? undefined
        : { within: unseenWithin, inProgress: (row.in_progress as string[]).map(String) },
  };
}

/**
 * A snapshot taken once the build's statements have read the sources, recorded with its run. Each
 * statement reads with its own snapshot (read committed), so one taken before could call a row
 * committed in between unread. A transaction running in this one, or starting after it, wrote rows
 * this build did not read: the next build takes them as new (`fresh`). A row this one calls visible
 * may still have been committed after the build read its source: it is judged by what the graph
 * holds.
 */
async function snapshotAfterReading(q: Query): Promise<string> {
  const { rows } = await q('select pg_current_snapshot()::text as snapshot');
  return String(rows[0].snapshot);
}

/**
 * The sources (`schema.table`) whose rows carry the transaction that wrote them: tables,
 * partitioned tables and materialized views, by the catalog (views and foreign tables do not).
 */
async function tablesWithRowVersions(q: Query, sources: ResolveOptions['sources']): Promise<Set<string>> {
  const { rows } = await q(
    `select t.name from unnest($1::text[], $2::text[]) t(name, quoted)
     join pg_class c on c.oid = to_regclass(t.quoted) where c.relkind in ('r', 'p', 'm')`,
    [sources.map((s) => `${s.table.schema}.${s.table.name}`), sources.map((s) => qualified(s.table))],
  );
  return new Set(rows.map((r) => String(r.name)));
}
