import type { SqlRunner } from './sql.ts';

/**
 * Connected components of the identity graph computed inside the warehouse, for graphs too large
 * to hold in the job's process: the process sends a few statements per round and holds nothing
 * in proportion to the graph. Same input and output as the in-process union-find: the distinct
 * pairs of `_id_edge` in, `_id_label` (cluster, degree and flag of every node with a neighbour) out,
 * with the same guards (an identifier with more than `maxDegree` neighbours links nothing; a
 * component over `maxClusterSize` is not merged) and the same cluster ids (a component's smallest
 * node id).
 *
 * Each round, every node takes the smallest label among its neighbours, and the label a node's
 * label points at takes the smallest label among the neighbours of the nodes pointing at it
 * (hooking whole trees, not only single nodes); then labels jump to their label's label until
 * none moves. Labels only ever name nodes of the same component and only decrease, so when a
 * round moves nothing, or every pair's ends carry one label, every component carries its smallest
 * node id. Rounds grow with the logarithm of a component's size rather than with its diameter.
 */

/** What either way of computing the components reports (the labels themselves are in `_id_label`). */
export interface GraphComponents {
  oversizedComponents: number;
  largestOversized: number;
  /** Nodes with more than `maxDegree` neighbours. */
  highDegree: number[];
  /** Rounds until no label moved. */
  iterations: number;
}

/** A round bound far above what any graph needs (~2·log2 of the largest component), against a bug looping forever. */
const MAX_ROUNDS = 200;

export async function componentsInWarehouse(
  q: SqlRunner['query'],
  options: { maxDegree: number; maxClusterSize: number },
): Promise<GraphComponents> {
  await q(
    'create temp table _cc_pair on commit drop as select node_a as a, node_b as b from _id_edge group by 1, 2',
  );
  await q(
    `create temp table _cc_degree on commit drop as
     select v, count(*)::int as degree from (select a as v from _cc_pair union all select b from _cc_pair) p
     group by v`,
  );
  // Both directions of every pair whose two ends stay under the degree limit.
  await q(
    `create temp table _cc_adj on commit drop as
     with linked as (
       select p.a, p.b from _cc_pair p join _cc_degree da on da.v = p.a join _cc_degree db on db.v = p.b
       where da.degree <= $1 and db.degree <= $1)
     select a as v, b as w from linked union all select b, a from linked`,
    [options.maxDegree],
  );
  await q('analyze _cc_adj');
  // Every step writes the labels into a new table (and drops the old one) instead of updating them
  // in place: at a million identifiers a step that rewrites them all costs 0.6–5 s where UPDATEs
  // (new row versions, even HOT ones) took 1–7 s, and the rounds half as long overall. `moved` says
  // whether the step lowered any label.
  let generation = 0;
  let labels = '_cc_label0';
  await q(`create temp table ${labels} on commit drop as select v, v as l, false as moved from _cc_degree`);
  const step = async (select: (from: string) => string): Promise<boolean> => {
    const next = `_cc_label${++generation}`;
    await q(`create temp table ${next} on commit drop as ${select(labels)}`);
    await q(`drop table ${labels}`);
    labels = next;
    const { rows } = await q(`select exists (select 1 from ${labels} where moved) as moved`);
    return rows[0].moved === true;
  };
  let iterations = 0;
  for (;;) {
    if (++iterations > MAX_ROUNDS)
      throw new Error(`Identity components did not settle in ${MAX_ROUNDS} rounds`);
    const hooked = await step(
      (l) => `select l.v, coalesce(least(l.l, m.l), l.l) as l, coalesce(m.l < l.l, false) as moved
       from ${l} l left join (
         select a.v, min(n.l) as l from _cc_adj a join ${l} n on n.v = a.w group by a.v) m on m.v = l.v`,
    );
    const trees = await step(
      (l) => `select l.v, coalesce(least(l.l, m.l), l.l) as l, coalesce(m.l < l.l, false) as moved
       from ${l} l left join (
         select s.l as root, min(n.l) as l from _cc_adj a join ${l} s on s.v = a.v join ${l} n on n.v = a.w
         group by s.l) m on m.root = l.v`,
    );
    // Every label names a node of the table, so the self-join keeps every row.
    while (
      await step(
        (l) => `select t.v, least(t.l, p.l) as l, p.l < t.l as moved from ${l} t join ${l} p on p.v = t.l`,
      )
    );
    if (!hooked && !trees) break;
    // When every pair's two ends carry one label, each component carries one label, and it is the
    // component's smallest node id (labels only decrease and name nodes of the component): the round
    // that would find nothing to move is skipped. Most graphs settle in their first round, which the
    // check finds in a fraction of a round's time (a join, nothing written). An aggregate over the
    // whole join, not `exists`: for `exists` the planner picks a fast-start nested loop over these
    // tables without statistics, which ran for minutes at a million identifiers.
    const { rows } = await q(
      `select coalesce(bool_or(x.l <> y.l), false) as split
       from _cc_adj a join ${labels} x on x.v = a.v join ${labels} y on y.v = a.w where a.v < a.w`,
    );
    if (rows[0].split !== true) break;
  }
  await q(
    `create temp table _cc_oversized on commit drop as
     select l, count(*)::int as size from ${labels} group by l having count(*) > $1`,
    [options.maxClusterSize],
  );
  const { rows: summary } = await q(
    `select count(*)::int as components, coalesce(max(size), 0)::int as largest from _cc_oversized`,
  );
  await q(
    `create temp table _id_label on commit drop as
     select c.v as node_id, case when o.l is null then c.l else c.v end as cluster_id, d.degree,
       case when d.degree > $1 then 'high_degree' when o.l is not null then 'oversized_cluster' end as flagged
     from ${labels} c join _cc_degree d on d.v = c.v left join _cc_oversized o on o.l = c.l`,
    [options.maxDegree],
  );
  const { rows: high } = await q('select v from _cc_degree where degree > $1 order by v', [
    options.maxDegree,
  ]);
  return {
    oversizedComponents: summary[0].components,
    largestOversized: summary[0].largest,
    highDegree: high.map((r) => Number(r.v)),
    iterations,
  };
}
