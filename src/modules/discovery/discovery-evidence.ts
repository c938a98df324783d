import type { TableMatch } from '../../llm/offline-matcher.ts';
import type { SuggestionEvidence } from '../mappings/mappings.entity.ts';
import type { DiscoveredMapping } from '../mappings/mappings-merge.ts';
import type { PlannedMapping } from './discovery-plan.ts';
import { overlapUnmeasured, type OverlapOf } from './discovery-overlap.ts';

/**
 * Every proposal discovery writes explains itself: the matcher's evidence for the pair (names,
 * types, value patterns), how many of its sampled values the target already holds, and whether the
 * LLM named this very source. The same object goes into the mapping (connections and ambiguity
 * candidates) and into the stream's suggestion events.
 */
export function evidenceOf(
  match: TableMatch,
  modelPicks: ReadonlyMap<string, string>,
  overlapOf: OverlapOf,
  targetField: string,
  sourceField: string,
): SuggestionEvidence {
  const llm = modelPicks.get(targetField) === sourceField;
  const candidate = match.fields
    .find((f) => f.target_field === targetField)
    ?.candidates.find((c) => c.source_field === sourceField);
  const e = candidate?.evidence ?? { name: 0, type: 0, pattern: 0 };
  const overlap = overlapOf(targetField, sourceField);
  const signals: SuggestionEvidence['signals'] = (['name', 'type', 'pattern'] as const).filter(
    (k) => e[k] > 0,
  );
  if (overlap !== null && overlap > 0) signals.push('overlap');
  return {
    name: e.name,
    type: e.type,
    pattern: e.pattern,
    value_pattern: e.value_pattern ?? null,
    overlap,
    llm,
    matched_by: llm ? 'openai' : 'offline',
    signals: llm ? [...signals, 'model'] : signals,
  };
}

/**
 * The plan with the evidence of each proposed connection and ambiguity candidate attached; without
 * `overlapOf` (no target values were read) overlap is null.
 */
export function explainPlan(
  plan: PlannedMapping,
  match: TableMatch,
  modelPicks: ReadonlyMap<string, string>,
  overlapOf: OverlapOf = overlapUnmeasured,
): DiscoveredMapping & Pick<PlannedMapping, 'tables'> {
  const explain = (target: string, source: string) =>
    evidenceOf(match, modelPicks, overlapOf, target, source);
  return {
    ...plan,
    connections: plan.connections.map((c) => ({
      ...c,
      evidence: explain(c.target_field, c.source_field),
    })),
    ambiguities: plan.ambiguities.map((a) => ({
      ...a,
      candidates: a.candidates.map((c) => ({ ...c, evidence: explain(a.target_field, c.source_field) })),
    })),
  };
}
