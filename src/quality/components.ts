import type { CopyOutRunner } from './sql.ts';

/**
 * Connected components of an identity graph whose nodes are numbered 1..n, computed in this process
 * by union-find over typed arrays: edges arrive by COPY as long rows of numbers and are parsed
 * straight from the bytes, so a million identifiers cost a few megabytes and no per-edge object;
 * the labels go back as `_id_label`. The same tables as components-sql.ts, which contracts graphs
 * too large for this in the warehouse until they fit, and finishes them here.
 */

/** What either way of computing the components reports (the labels themselves are in `_id_label`). */
export interface GraphComponents {
  oversizedComponents: number;
  largestOversized: number;
  /** How many nodes have more than `maxDegree` neighbours (flagged `high_degree` in `_id_label`). */
  highDegreeNodes: number;
  /** Rounds: 1 in this process; in the warehouse its contraction rounds, plus one when this process finished the graph. */
  iterations: number;
}

const PAIRS_PER_NODE_IN_PROCESS = 2;

/**
 * Whether a graph's components may be computed in this process under `limit` (identifiers, the
 * IDENTITY_IN_PROCESS_IDENTIFIERS setting): the process holds 13 bytes per node and 8 per pair, so
 * at most `limit` nodes and twice as many pairs (identity graphs have one to two pairs per
 * identifier: 1.4 in the metrics benchmark's, with 17 identifiers per person). The one rule for
 * every graph this process labels: a full build's, what the warehouse's contraction leaves of a
 * larger one, and the clusters an incremental build merges.
 */
export function fitsInProcess(graph: { nodes: number; pairs: number }, limit: number): boolean {
  return graph.nodes <= limit && graph.pairs <= PAIRS_PER_NODE_IN_PROCESS * limit;
}

/** Whether a graph of `pairs` pairs may fit (its nodes, not yet counted, deciding). */
export function mayFitInProcess(pairs: number, limit: number): boolean {
  return fitsInProcess({ nodes: 0, pairs }, limit);
}

/** A growable list of (a, b) node pairs kept in one Int32Array. */
class PairList {
  #data: Int32Array;
  length = 0;

  /** The pairs' storage (a, b, a, b, …), for `release`. */
  get data(): Int32Array {
    return this.#data;
  }

  /** `capacity` pairs are held without growing (a list that grows doubles, and holds both copies meanwhile). */
  constructor(capacity = 1 << 15) {
    this.#data = new Int32Array(Math.max(1, capacity) * 2);
  }

  push(a: number, b: number) {
    if (this.length * 2 + 2 > this.#data.length) {
      const grown = new Int32Array(this.#data.length * 2);
      grown.set(this.#data);
      this.#data = grown;
    }
    this.#data[this.length * 2] = a;
    this.#data[this.length * 2 + 1] = b;
    this.length++;
  }

  a(i: number) {
    return this.#data[i * 2];
  }

  b(i: number) {
    return this.#data[i * 2 + 1];
  }
}

/**
 * The pairs of `select` (two non-negative integer columns) copied out as a few long rows of
 * space-separated numbers, `a b a b …`, rows of node pairs grouped by the first node's high bits: a
 * COPY of one row per pair made the COPY stream allocate a buffer slice per row (750,000 at a
 * million identifiers), which grew the process's heap by ~20 MB until a major collection.
 */
async function readPairs(runner: CopyOutRunner, select: string, expected?: number): Promise<PairList> {
  const chunks = runner.copyOut(
    `copy (select string_agg(p.a || ' ' || p.b, ' ') from (${select}) p(a, b) group by p.a >> 13) to stdout`,
  );
  const pairs = new PairList(expected);
  let first = 0;
  let current = 0;
  let inNumber = false;
  let haveFirst = false;
  for await (const chunk of chunks) {
    for (let i = 0; i < chunk.length; i++) {
      const c = chunk[i];
      if (c >= 48 && c <= 57) {
        current = current * 10 + (c - 48);
        inNumber = true;
      } else if (inNumber) {
        if (haveFirst) pairs.push(first, current);
        else first = current;
        haveFirst = !haveFirst;
        current = 0;
        inNumber = false;
      }
    }
  }
  return pairs;
}

/** The mark of a component over the size limit (sizes and −smallest are never this). */
const OVERSIZED = -0x80000000;

interface Components {
  /** label[i] = the smallest node id of i's component (i itself for a singleton or an unmerged node). */
  label: Int32Array;
  /** Distinct neighbours of each node (the pairs are distinct). */
  degree: Int32Array;
  /** Nodes whose component exceeded the size limit and were therefore left unmerged. */
  oversized: Uint8Array;
  oversizedComponents: number;
  largestOversized: number;
}

/**
 * Components over the pairs whose two ends have at most `maxDegree` neighbours (a high-degree
 * identifier, e.g. a shared call-centre phone, links nothing); a component larger than
 * `maxClusterSize` is not merged at all.
 */
function connectedComponents(
  nodeCount: number,
  pairs: PairList,
  options: { maxDegree: number; maxClusterSize: number },
): Components {
  const n = nodeCount + 1;
  const degree = new Int32Array(n);
  for (let i = 0; i < pairs.length; i++) {
    degree[pairs.a(i)]++;
    degree[pairs.b(i)]++;
  }
  const parent = new Int32Array(n);
  const size = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    parent[i] = i;
    size[i] = 1;
  }
  const find = (x: number) => {
    while (parent[x] !== x) {
      parent[x] = parent[parent[x]];
      x = parent[x];
    }
    return x;
  };
  for (let i = 0; i < pairs.length; i++) {
    const a = pairs.a(i);
    const b = pairs.b(i);
    if (degree[a] > options.maxDegree || degree[b] > options.maxDegree) continue;
    let ra = find(a);
    let rb = find(b);
    if (ra === rb) continue;
    if (size[ra] < size[rb]) [ra, rb] = [rb, ra];
    parent[rb] = ra;
    size[ra] += size[rb];
  }
  // Every node's parent becomes its root; then, visiting nodes in increasing order, the first member
  // seen of a component is its smallest: its root's `size` becomes the component's mark (−smallest,
  // or OVERSIZED), and `parent` becomes the labels. Two arrays fewer than a label and a smallest
  // array of their own (8 MB at a million identifiers).
  for (let i = 1; i < n; i++) parent[i] = find(i);
  const label = parent;
  const oversized = new Uint8Array(n);
  let oversizedComponents = 0;
  let largestOversized = 0;
  for (let i = 1; i < n; i++) {
    const root = parent[i];
    let mark = size[root];
    if (mark > 0) {
      if (mark > options.maxClusterSize) {
        oversizedComponents++;
        largestOversized = Math.max(largestOversized, mark);
        mark = OVERSIZED;
      } else mark = -i;
      size[root] = mark;
    }
    if (mark === OVERSIZED) {
      label[i] = i;
      oversized[i] = 1;
    } else label[i] = -mark;
  }
  release(size);
  return { label, degree, oversized, oversizedComponents, largestOversized };
}

/**
 * Frees the memory of typed arrays that are no longer read, now: an array unreachable is freed only
 * by V8's next major collection, which an idle server may not run for the rest of the build (the
 * process waits on the warehouse meanwhile), so a million nodes' arrays (~25 MB) stayed in its RSS
 * until then. Transferring the buffer to a zero-length one releases it at once and leaves the
 * array empty.
 */
function release(...arrays: ArrayBufferView[]) {
  for (const array of arrays) (array.buffer as ArrayBuffer).transfer(0);
}

/** The distinct node pairs of `_id_edge`, read by COPY into the union-find. */
const PAIRS = 'select node_a, node_b from _id_edge group by 1, 2';
/** Labels go back in batches of this many nodes (one statement each, arrays as text parameters). */
const LABEL_BATCH = 100_000;

/** The union-find over the distinct pairs copied out, its labels written back as `_id_label`. */
export async function componentsInProcess(
  runner: CopyOutRunner,
  nodeCount: number,
  edgeRows: number | undefined,
  limits: { maxDegree: number; maxClusterSize: number },
): Promise<GraphComponents> {
  // The distinct pairs are at most the rows of `_id_edge` (a pair per source that saw it).
  const pairs = await readPairs(runner, PAIRS, edgeRows);
  const components = connectedComponents(nodeCount, pairs, limits);
  release(pairs.data);
  await writeLabels((sql, params) => runner.query(sql, params), components, limits.maxDegree);
  let highDegreeNodes = 0;
  for (const d of components.degree) if (d > limits.maxDegree) highDegreeNodes++;
  release(components.label, components.degree, components.oversized);
  return {
    oversizedComponents: components.oversizedComponents,
    largestOversized: components.largestOversized,
    highDegreeNodes,
    iterations: 1,
  };
}

/**
 * The components of a graph whose nodes are numbered 1..`nodeCount`, its pairs read by
 * `pairsSelect` (a query of two non-negative integer columns), without guards: answers a temporary
 * table `_cc_settled (i, label)` of every node whose component's smallest node is another one.
 */
export async function labelBySmallestMember(runner: CopyOutRunner, pairsSelect: string, nodeCount: number) {
  const pairs = await readPairs(runner, pairsSelect);
  const { label, degree, oversized } = connectedComponents(nodeCount, pairs, {
    maxDegree: Infinity,
    maxClusterSize: Infinity,
  });
  release(pairs.data, degree, oversized);
  await runner.query('create temp table _cc_settled (i int not null, label int not null) on commit drop');
  // A node labelled by itself is sent as 0 and not kept.
  const rows = new NodeBatches(
    (sql, params) => runner.query(sql, params),
    `insert into _cc_settled
     select $1::int + l.ord::int - 1, l.label
     from unnest(string_to_array($2, ',')::int[]) with ordinality l(label, ord)
     where l.label <> 0`,
    1,
  );
  for (let i = 1; i < label.length; i++) if (rows.add(label[i] === i ? 0 : label[i])) await rows.flush();
  await rows.flush();
  release(label);
  return '_cc_settled';
}

/** Comma-separated decimal integers written into one reused buffer: no string per number. */
class IntListText {
  #bytes: Buffer;
  #length = 0;

  constructor(capacity: number) {
    // Up to 11 characters per int32 and its comma.
    this.#bytes = Buffer.allocUnsafe(capacity * 12);
  }

  push(value: number) {
    if (this.#length) this.#bytes[this.#length++] = 44;
    let n = value;
    if (n < 0) {
      this.#bytes[this.#length++] = 45;
      n = -n;
    }
    let digits = 1;
    for (let rest = n; rest >= 10; rest = Math.floor(rest / 10)) digits++;
    this.#length += digits;
    let at = this.#length;
    do {
      this.#bytes[--at] = 48 + (n % 10);
      n = Math.floor(n / 10);
    } while (n > 0);
  }

  /**
   * The text so far as bytes, emptied for the next batch. node-postgres sends a Buffer parameter in
   * binary format, which for a text parameter is its bytes: the batch never becomes a JS string
   * (megabyte strings that survive a scavenge while their statement runs made V8 grow the young
   * generation by ~30 MB). The bytes are a view of the reused buffer, not a copy: they hold until
   * the next `push`, which comes after the statement that sends them has returned.
   */
  take(): Buffer {
    const bytes = this.#bytes.subarray(0, this.#length);
    this.#length = 0;
    return bytes;
  }
}

/**
 * Values of the nodes 1, 2, 3, … in order, sent to one statement `LABEL_BATCH` nodes at a time: $1
 * is the batch's first node, $2 (and $3) its columns as comma-separated text, then `params`. A
 * node's id is its position, so it is not sent (half the bytes of sending it), and the process
 * holds one batch whatever the number of nodes.
 */
class NodeBatches {
  #q: (sql: string, params?: unknown[]) => Promise<unknown>;
  #statement: string;
  #columns: IntListText[];
  #params: unknown[];
  #next = 1;
  #count = 0;

  constructor(
    q: (sql: string, params?: unknown[]) => Promise<unknown>,
    statement: string,
    columns: 1 | 2,
    params: unknown[] = [],
  ) {
    this.#q = q;
    this.#statement = statement;
    this.#columns = Array.from({ length: columns }, () => new IntListText(LABEL_BATCH));
    this.#params = params;
  }

  /**
   * The next node's values (fixed arguments, so that no array is made per node). True when the
   * batch is full and must be flushed before the next node: not an async method, which would make a
   * promise per node.
   */
  add(a: number, b = 0): boolean {
    this.#columns[0].push(a);
    if (this.#columns.length > 1) this.#columns[1].push(b);
    return ++this.#count >= LABEL_BATCH;
  }

  async flush() {
    if (!this.#count) return;
    const first = this.#next;
    this.#next += this.#count;
    this.#count = 0;
    await this.#q(this.#statement, [first, ...this.#columns.map((column) => column.take()), ...this.#params]);
  }
}

/**
 * `_id_label`: cluster, degree and flag of every node that has a neighbour (the others are
 * singletons with degree 0), sent as comma-separated text arrays: no COPY FROM, which not every
 * warehouse front end carries, and one statement per batch. Each node is sent as its cluster (0 when
 * its component was too large to merge: it is its own) and its degree; the flags follow from those
 * in SQL. The text is written straight from the typed arrays into reused buffers; node-postgres
 * copies each statement's parameters into new buffers that only a garbage collection frees, so what
 * the process grows by while the labels go out follows the bytes sent (~10 MB of text at a million
 * nodes, copied a few times over).
 * The table has no key: it is read once, by a hash join.
 */
async function writeLabels(
  q: (sql: string, params?: unknown[]) => Promise<unknown>,
  components: Components,
  maxDegree: number,
) {
  await q(
    `create temp table _id_label (node_id bigint not null, cluster_id bigint not null, degree int not null,
       flagged text) on commit drop`,
  );
  const { label, degree, oversized } = components;
  const rows = new NodeBatches(
    q,
    `insert into _id_label
     select n.id, case when l.cluster = 0 then n.id else l.cluster end, l.degree,
       case when l.degree > $4 then 'high_degree' when l.cluster = 0 then 'oversized_cluster' end
     from unnest(string_to_array($2, ',')::bigint[], string_to_array($3, ',')::int[])
       with ordinality l(cluster, degree, ord)
     cross join lateral (select $1::bigint + l.ord - 1 as id) n
     where l.degree > 0`,
    2,
    [maxDegree],
  );
  for (let i = 1; i < label.length; i++) {
    // A singleton's values are dropped by the statement: the shortest text stands for them.
    const cluster = degree[i] === 0 || oversized[i] ? 0 : label[i];
    if (rows.add(cluster, degree[i])) await rows.flush();
  }
  await rows.flush();
}
