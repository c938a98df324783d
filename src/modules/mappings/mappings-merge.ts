import type { MappingTable } from '../../transform/mapping.ts';
import type { CleaningProposal } from '../discovery/cleaning.ts';
import type {
  Ambiguity,
  MappingDecision,
  StoredConnection,
  StoredTransformation,
  SuggestionEvidence,
} from './mappings.entity.ts';

/** What discovery (the agent, setup-environment) found for one target table. */
export interface DiscoveredMapping {
  tables?: Record<string, MappingTable>;
  connections: {
    source_field: string;
    target_field: string;
    confidence: number | null;
    evidence?: SuggestionEvidence | null;
  }[];
  ambiguities: Ambiguity[];
  /** Cleaning proposals; absent when the caller proposes none (the mapping's transformations stay). */
  transformations?: CleaningProposal[];
}

/** The parts of a mapping a person edits and discovery writes. */
export interface MappingState {
  tables: Record<string, MappingTable>;
  connections: StoredConnection[];
  transformations: Record<string, StoredTransformation>;
  ambiguities: Ambiguity[];
  decisions?: MappingDecision[] | null;
}

/** A person's transformation owns its field; a proposal of an earlier discovery or a stale one does not. */
const ownsField = (t: StoredTransformation) => !t.stale && !t.proposed;

/** Why discovery left a target field (or one of its sources) as a person set it. */
export type KeptDecision = {
  target_field: string;
  source_field: string | null;
  decision: 'confirmed' | 'transformation' | 'no_source' | 'rejected' | 'cleaning_refused';
};

/**
 * Merges discovery's findings under a person's decisions: confirmed connections, hand-written
 * transformations and "no source" answers own their target field, refused sources stay refused,
 * table relationships already set stay as they are. Discovery fills only the rest; `kept` lists
 * every proposal that a decision overrode, so the run can say what it left alone.
 */
export function mergeDiscovery(
  current: MappingState,
  found: DiscoveredMapping,
  options: { autoConfirm?: number | null } = {},
): Pick<MappingState, 'tables' | 'connections' | 'ambiguities' | 'transformations'> & {
  kept: KeptDecision[];
} {
  const pair = (target: string, source: string) => `${target}\u0000${source}`;
  const explained = new Map<string, SuggestionEvidence>();
  for (const c of [
    ...found.connections,
    ...found.ambiguities.flatMap((a) => a.candidates.map((k) => ({ ...k, target_field: a.target_field }))),
  ])
    if (c.evidence) explained.set(pair(c.target_field, c.source_field), c.evidence);
  // A confirmed proposal is explained by this run's evidence when the run finds the same source (the
  // target may hold its values by now); one a person made by hand has no evidence and gets none.
  const confirmed = current.connections
    .filter((c) => c.status === 'confirmed')
    .map((c) => {
      const evidence = c.evidence ? explained.get(pair(c.target_field, c.source_field)) : undefined;
      return evidence ? { ...c, evidence } : c;
    });
  const owner = new Map<string, KeptDecision['decision']>();
  for (const c of confirmed) owner.set(c.target_field, 'confirmed');
  // A proposal of an earlier discovery owns nothing: this run proposes again or drops it.
  for (const [field, t] of Object.entries(current.transformations))
    if (ownsField(t) && !owner.has(field)) owner.set(field, 'transformation');
  const refused = new Set<string>();
  const cleaningRefused = new Set<string>();
  for (const d of current.decisions ?? []) {
    if (d.cleaning === 'refused') cleaningRefused.add(`${d.target_field}\u0000${d.source_field}`);
    else if (d.source_field === null) {
      if (!owner.has(d.target_field)) owner.set(d.target_field, 'no_source');
    } else refused.add(`${d.target_field}\u0000${d.source_field}`);
  }
  const isRefused = (target: string, source: string) => refused.has(`${target}\u0000${source}`);

  const kept: KeptDecision[] = [];
  const keptFields = new Set<string>();
  const keep = (target_field: string, source_field: string | null, decision: KeptDecision['decision']) => {
    if (decision !== 'rejected' && decision !== 'cleaning_refused') {
      if (keptFields.has(target_field)) return;
      keptFields.add(target_field);
      source_field = null;
    }
    kept.push({ target_field, source_field, decision });
  };

  const tables = { ...current.tables };
  const hasPrimary = () => Object.values(tables).some((t) => t.relationship === 'primary');
  for (const [key, relation] of Object.entries(found.tables ?? {})) {
    if (tables[key]) continue;
    if (relation.relationship === 'primary' && hasPrimary()) continue;
    tables[key] = relation;
  }

  const suggestions: StoredConnection[] = [];
  const ambiguities: Ambiguity[] = [];
  const propose = (c: DiscoveredMapping['connections'][number]) => {
    const decision = owner.get(c.target_field);
    if (decision) return keep(c.target_field, null, decision);
    if (isRefused(c.target_field, c.source_field)) return keep(c.target_field, c.source_field, 'rejected');
    suggestions.push({ ...c, status: 'suggested' });
  };
  for (const a of found.ambiguities) {
    const decision = owner.get(a.target_field);
    if (decision) {
      keep(a.target_field, null, decision);
      continue;
    }
    const candidates = a.candidates.filter((c) => {
      if (!isRefused(a.target_field, c.source_field)) return true;
      keep(a.target_field, c.source_field, 'rejected');
      return false;
    });
    // Refusals can settle an ambiguity: one candidate left of several is an ordinary suggestion. An
    // ambiguity discovery raised with one candidate (a column of a one-to-many table, to be joined by
    // hand after aggregation) stays one: its table is not part of the mapping.
    const settledByRefusal = candidates.length === 1 && a.candidates.length > 1;
    if (!settledByRefusal && candidates.length > 0) ambiguities.push({ ...a, candidates });
    else if (settledByRefusal)
      suggestions.push({
        source_field: candidates[0].source_field,
        target_field: a.target_field,
        confidence: candidates[0].confidence ?? null,
        ...(candidates[0].evidence ? { evidence: candidates[0].evidence } : {}),
        status: 'suggested',
      });
  }
  for (const c of found.connections) propose(c);

  const ambiguous = new Set(ambiguities.map((a) => a.target_field));
  const autoConfirm = options.autoConfirm ?? null;
  const connections = [
    ...confirmed,
    ...suggestions.map((c) =>
      autoConfirm !== null && (c.confidence ?? 0) >= autoConfirm && !ambiguous.has(c.target_field)
        ? { ...c, status: 'confirmed' as const }
        : c,
    ),
  ];
  const transformations = mergeCleaning(current, found, connections, owner, cleaningRefused, keep);
  return { tables, connections, ambiguities, transformations, kept };
}

/**
 * A person's transformations stay as they are; discovery's own proposals are replaced by this run's.
 * A proposal lands only on a field whose connection (confirmed, or suggested by this run) is its
 * source, that no person answered with "no source", and whose cleaning no person removed.
 */
function mergeCleaning(
  current: MappingState,
  found: DiscoveredMapping,
  connections: StoredConnection[],
  owner: ReadonlyMap<string, KeptDecision['decision']>,
  cleaningRefused: ReadonlySet<string>,
  keep: (target: string, source: string | null, decision: KeptDecision['decision']) => void,
): Record<string, StoredTransformation> {
  if (!found.transformations) return current.transformations;
  const out: Record<string, StoredTransformation> = {};
  for (const [field, t] of Object.entries(current.transformations))
    if (!t.proposed || t.stale) out[field] = t;
  for (const p of found.transformations) {
    if (out[p.target_field]) continue;
    const decision = owner.get(p.target_field);
    if (decision === 'no_source' || decision === 'transformation') continue;
    const sources = connections.filter((c) => c.target_field === p.target_field);
    const confirmed = sources.filter((c) => c.status === 'confirmed');
    const chosen = confirmed.length ? confirmed : sources;
    if (chosen.length !== 1 || chosen[0].source_field !== p.source_field) continue;
    if (cleaningRefused.has(`${p.target_field}\u0000${p.source_field}`)) {
      keep(p.target_field, p.source_field, 'cleaning_refused');
      continue;
    }
    out[p.target_field] = {
      expression: p.expression,
      description: p.description,
      proposed: { kind: p.kind, source_field: p.source_field, share: p.share, sampled: p.sampled },
    };
  }
  return out;
}

const byKey = <T>(items: T[], key: (item: T) => string) =>
  [...items].sort((a, b) => key(a).localeCompare(key(b)));

/** Object keys sorted at every depth, so equal documents serialize equally. */
function stable(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(stable);
  if (value && typeof value === 'object')
    return Object.fromEntries(
      Object.keys(value)
        .sort()
        .filter((k) => (value as Record<string, unknown>)[k] !== undefined)
        .map((k) => [k, stable((value as Record<string, unknown>)[k])]),
    );
  return value;
}

/**
 * The one comparable form of a mapping: what a commit records and what "changed since the last
 * commit" compares (the mapping view, transformation-diff and drift status all use it). Order of
 * connections and ambiguities carries no meaning, so it is normalised away.
 */
export function canonicalMapping(m: Omit<MappingState, 'decisions'>): string {
  // A field a person's transformation owns is that transformation: discovery's suggestions and
  // ambiguity for it reach no SQL, and a rediscovery drops them (mergeDiscovery), so they are no
  // change either way; a connection a person confirmed there still counts.
  const owned = new Set(
    Object.entries(m.transformations ?? {}).flatMap(([field, t]) => (ownsField(t) ? [field] : [])),
  );
  return JSON.stringify(
    stable({
      tables: m.tables ?? {},
      connections: byKey(
        (m.connections ?? [])
          .filter((c) => c.status === 'confirmed' || !owned.has(c.target_field))
          .map(withoutEvidence),
        (c) => `${c.target_field}\u0000${c.source_field}`,
      ),
      transformations: m.transformations ?? {},
      ambiguities: byKey(
        (m.ambiguities ?? [])
          .filter((a) => !owned.has(a.target_field))
          .map((a) => ({ ...a, candidates: a.candidates.map(withoutEvidence) })),
        (a) => a.target_field,
      ),
    }),
  );
}

/** Evidence explains a proposal; it is not part of the mapping a commit records or a diff compares. */
function withoutEvidence<T extends { evidence?: unknown }>(item: T): Omit<T, 'evidence'> {
  const { evidence: _evidence, ...rest } = item;
  return rest;
}

/**
 * Changed since the last commit: no commit yet, or the mapping differs from the one the newest
 * commit recorded.
 */
export function hasUncommittedChanges(
  mapping: Omit<MappingState, 'decisions'>,
  committed: Record<string, unknown> | null | undefined,
): boolean {
  if (!committed) return true;
  return canonicalMapping(mapping) !== canonicalMapping(committed as unknown as MappingState);
}
