/**
 * Connected components of an identity graph whose nodes are numbered 1..n, by union-find over
 * typed arrays: edges arrive as COPY text lines (`a\tb\n`) and are parsed straight from the bytes,
 * so a million identifiers cost a few megabytes and no per-edge object.
 */

/** A growable list of (a, b) node pairs kept in one Int32Array. */
export class PairList {
  #data: Int32Array;
  length = 0;

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

/** Reads `a\tb\n` lines of non-negative integers from COPY text output, chunk by chunk. */
export async function readPairs(chunks: AsyncIterable<Buffer>, expected?: number): Promise<PairList> {
  const pairs = new PairList(expected);
  let first = 0;
  let current = 0;
  let inSecond = false;
  for await (const chunk of chunks) {
    for (let i = 0; i < chunk.length; i++) {
      const c = chunk[i];
      if (c >= 48 && c <= 57) current = current * 10 + (c - 48);
      else if (c === 9) {
        first = current;
        current = 0;
        inSecond = true;
      } else if (c === 10) {
        if (inSecond) pairs.push(first, current);
        current = 0;
        inSecond = false;
      }
    }
  }
  return pairs;
}

/** The mark of a component over the size limit (sizes and −smallest are never this). */
const OVERSIZED = -0x80000000;

export interface Components {
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
export function connectedComponents(
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
  return { label, degree, oversized, oversizedComponents, largestOversized };
}
