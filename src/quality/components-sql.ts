import { fitsInProcess, labelBySmallestMember, mayFitInProcess, type GraphComponents } from './components.ts';
import type { CopyOutRunner } from './sql.ts';

/**
 * Connected components of the identity graph for graphs too large to hold in the job's process:
 * the warehouse contracts the graph round by round until what is left fits the process's limit,
 * and the process finishes it with the union-find of components.ts. Same input and output as the
 * in-process union-find: the distinct pairs of `_id_edge` in, `_id_label` (cluster, degree and flag
 * of every node with a neighbour) out, with the same guards (an identifier with more than
 * `maxDegree` neighbours links nothing; a component over `maxClusterSize` is not merged) and the
 * same cluster ids (a component's smallest node id). The process holds the arrays of at most
 * `inProcessLimit` nodes, whatever the graph's size; with a limit of 0 the warehouse does it all.
 *
 * A round: every node points at the smallest node among itself and its neighbours, pointers jump
 * to their target's target until none moves, and every node is replaced by the node it points at,
 * so that each group becomes one node and its pairs the pairs between groups. A group is connected
 * and named by one of its members, and a component's smallest node points at itself, so the
 * contracted graph has the same components with the same smallest members. A group left without a
 * pair is a finished component and leaves the graph: most identity clusters are finished by the
 * first round, and the rest shrinks by a factor of two or more per round (a long chain to about a
 * third), so rounds grow with the logarithm of a component's size, not with its diameter.
 */

/** A round bound far above what any graph needs (it shrinks geometrically), against a bug looping forever. */
const MAX_ROUNDS = 200;

export async function componentsInWarehouse(
  runner: CopyOutRunner,
  options: { maxDegree: number; maxClusterSize: number; inProcessLimit: number },
): Promise<GraphComponents> {
  const q = (sql: string, params?: unknown[]) => runner.query(sql, params);
  // Every step writes a new temporary table and drops the one it replaces: at a million identifiers
  // rewriting the rows costs less than updating them in place (new row versions, even HOT ones).
  const tables = temporaryTables(runner, '_cc');
  const { materialize, counted } = tables;
  const pairs = await materialize('select node_a as v, node_b as w from _id_edge group by 1, 2');
  // Each node's degree and the smallest node among it and its neighbours: the first round's
  // pointers, when no pair is left out for a node over the degree limit.
  await q(
    `create temp table _cc_degree on commit drop as
     select v, count(*)::int as degree, least(v, min(w)) as l
     from (select v, w from ${pairs} union all select w, v from ${pairs}) p
     group by v`,
  );
  // Counted, not listed: with a low degree limit most of a large graph's identifiers may be over it.
  const { rows: overLimit } = await q('select count(*)::int as n from _cc_degree where degree > $1', [
    options.maxDegree,
  ]);
  const highDegreeNodes: number = overLimit[0].n;
  const anyHighDegree = highDegreeNodes > 0;
  // The graph: every pair whose two ends stay under the degree limit, once (v < w); the pairs
  // themselves when no identifier is over it.
  let linkedPairs = pairs;
  if (anyHighDegree) {
    linkedPairs = await materialize(
      `select v, w from ${pairs} p
       where not exists (select 1 from _cc_degree d where d.v = p.v and d.degree > $1)
         and not exists (select 1 from _cc_degree d where d.v = p.w and d.degree > $1)`,
      [options.maxDegree],
    );
    await q(`drop table ${pairs}`);
  }
  let graph = await counted(linkedPairs);
  /** Every linked node → the node its group is now (null until the first round). */
  let groups: string | null = null;
  const regroup = async (labels: string) => {
    if (!groups) groups = labels;
    else {
      const previous: string = groups;
      groups = await materialize(
        `select g.v, coalesce(l.l, g.l) as l from ${previous} g left join ${labels} l on l.v = g.l`,
      );
      await q(`drop table ${previous}`);
      await q(`drop table ${labels}`);
    }
  };
  let iterations = 0;
  while (graph.rows > 0) {
    if (++iterations > MAX_ROUNDS)
      throw new Error(`Identity components did not settle in ${MAX_ROUNDS} rounds`);
    await q(`analyze ${graph.name}`);
    const finished = await labelInProcess(runner, graph, tables, options.inProcessLimit);
    if (finished) {
      await regroup(finished);
      break;
    }
    let labels =
      iterations === 1 && !anyHighDegree
        ? '_cc_degree'
        : await materialize(
            `select v, least(v, min(w)) as l
               from (select v, w from ${graph.name} union all select w, v from ${graph.name}) d
               group by v`,
          );
    // Every label is a node of the graph (the node itself or a neighbour), so the self-join keeps every row.
    for (let moved = true; moved;) {
      const jumped = await materialize(
        `select t.v, p.l, p.l < t.l as moved from ${labels} t join ${labels} p on p.v = t.l`,
      );
      if (labels !== '_cc_degree') await q(`drop table ${labels}`);
      labels = jumped;
      moved =
        (await q(`select exists (select 1 from ${labels} where moved) as moved`)).rows[0].moved === true;
    }
    const contracted = await materialize(
      `select least(x.l, y.l) as v, greatest(x.l, y.l) as w
       from ${graph.name} a join ${labels} x on x.v = a.v join ${labels} y on y.v = a.w
       where x.l <> y.l group by 1, 2`,
    );
    await q(`drop table ${graph.name}`);
    graph = await counted(contracted);
    await regroup(labels);
  }
  const linked = groups ?? (await materialize('select v, v as l from _cc_degree where false'));
  await q(
    `create temp table _cc_oversized on commit drop as
     select l, count(*)::int as size from ${linked} group by l having count(*) > $1`,
    [options.maxClusterSize],
  );
  const { rows: summary } = await q(
    `select count(*)::int as components, coalesce(max(size), 0)::int as largest from _cc_oversized`,
  );
  await q(
    `create temp table _id_label on commit drop as
     select d.v as node_id, case when o.l is null then coalesce(g.l, d.v) else d.v end as cluster_id, d.degree,
       case when d.degree > $1 then 'high_degree' when o.l is not null then 'oversized_cluster' end as flagged
     from _cc_degree d left join ${linked} g on g.v = d.v left join _cc_oversized o on o.l = g.l`,
    [options.maxDegree],
  );
  return {
    oversizedComponents: summary[0].components,
    largestOversized: summary[0].largest,
    highDegreeNodes,
    iterations,
  };
}

/** Temporary tables `<prefix>_1`, `<prefix>_2`, … of one transaction, made from queries. */
export function temporaryTables(runner: CopyOutRunner, prefix: string) {
  let generation = 0;
  return {
    async materialize(select: string, params?: unknown[]) {
      const name = `${prefix}_${++generation}`;
      await runner.query(`create temp table ${name} on commit drop as ${select}`, params);
      return name;
    },
    /** Counted, not taken from the creating statement's row count, which not every front end reports. */
    async counted(name: string) {
      const { rows } = await runner.query(`select count(*)::bigint as n from ${name}`);
      return { name, rows: Number(rows[0].n) };
    },
  };
}

/**
 * The components of the pairs of `graph` (columns v, w) by union-find in this process, when they
 * fit its limit (`fitsInProcess`; else null, nothing left behind): its nodes numbered 1..n in id
 * order (so the smallest number of a component is its smallest node), the pairs copied out, the
 * labels of the nodes that move written back. Answers a table (v, l) of every node and its
 * component's smallest node.
 */
export async function labelInProcess(
  runner: CopyOutRunner,
  graph: { name: string; rows: number },
  { materialize, counted }: ReturnType<typeof temporaryTables>,
  limit: number,
): Promise<string | null> {
  if (!mayFitInProcess(graph.rows, limit)) return null;
  const numbered = await counted(
    await materialize(
      `select v, row_number() over (order by v)::int as i from (select v from ${graph.name} union select w from ${graph.name}) d`,
    ),
  );
  if (!fitsInProcess({ nodes: numbered.rows, pairs: graph.rows }, limit)) {
    await runner.query(`drop table ${numbered.name}`);
    return null;
  }
  const settled = await labelBySmallestMember(
    runner,
    `select x.i, y.i from ${graph.name} a join ${numbered.name} x on x.v = a.v
     join ${numbered.name} y on y.v = a.w`,
    numbered.rows,
  );
  return materialize(
    `select n.v, coalesce(s.v, n.v) as l
     from ${numbered.name} n left join ${settled} m on m.i = n.i left join ${numbered.name} s on s.i = m.label`,
  );
}
