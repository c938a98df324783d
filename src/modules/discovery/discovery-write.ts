import type { EntityManager } from '@mikro-orm/postgresql';
import type { CallerScope } from '../../deps.ts';
import { concurrentEdit } from '../../db/concurrent-edit.ts';
import type { SourceTable, TargetTable } from '../../llm/offline-matcher.ts';
import type { MatchOutcome } from '../../llm/provider.ts';
import type { QueryRunner } from '../../llm/profile.ts';
import type { IntrospectedTable } from '../../warehouse/warehouse.ts';
import { findMapping, writeSuggestions } from '../mappings/mappings.service.ts';
import type { KeptDecision } from '../mappings/mappings-merge.ts';
import type { StoredTransformation, SuggestionEvidence } from '../mappings/mappings.entity.ts';
import type { WorkspaceEntity } from '../workspaces/workspaces.service.ts';
import { proposeCleaning } from './cleaning.ts';
import { planMapping } from './discovery-plan.ts';
import { explainPlan } from './discovery-evidence.ts';
import type { OverlapOf } from './discovery-overlap.ts';

// What discovery writes for one target table: its suggestions, ambiguities and cleaning proposals.

/** The cleaning discovery proposed on a suggested field, as its suggestion event shows it. */
export function cleaningOf(t: StoredTransformation | undefined, sourceField: string) {
  const p = t?.proposed;
  if (!t || !p || p.source_field !== sourceField) return null;
  return {
    kind: p.kind,
    expression: t.expression,
    description: t.description,
    share: p.share,
    sampled: p.sampled,
  };
}

export interface WrittenTable {
  /** False when the run found what the mapping already says: its version stays. */
  changed: boolean;
  version: number;
  kept: KeptDecision[];
  connections: {
    source_field: string;
    target_field: string;
    confidence: number;
    status: 'suggested' | 'confirmed';
    evidence: SuggestionEvidence | null;
  }[];
  ambiguities: {
    target_field: string;
    candidates: { source_field: string; confidence: number | null; evidence?: SuggestionEvidence | null }[];
    reason?: string | null;
  }[];
  transformations: Record<string, StoredTransformation>;
}

/**
 * One complete unit: the table's mapping gets the run's suggestions in one transaction. Confirmed
 * connections stay as they are (writeSuggestions keeps them); null when there was nothing to say
 * and no mapping to refresh.
 */
export const writeTable = concurrentEdit(async function writeTable(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  target: TargetTable,
  outcome: Pick<MatchOutcome, 'match' | 'modelPicks'> & { overlapOf: OverlapOf },
  sources: ReadonlyMap<string, IntrospectedTable>,
  autoConfirm: number | null,
  cleaning: { run: QueryRunner; sources: SourceTable[]; rowLimit: number | null } | null,
): Promise<WrittenTable | null> {
  const { match } = outcome;
  // Cleaning is measured on the source before the transaction, for the connections the mapping will
  // have: the person's confirmed ones and this run's suggestions for the other fields.
  const before = await findMapping(scope.em, workspace, target.name);
  const planned = planMapping(match, sources, before?.tables ?? {});
  const confirmed = (before?.connections ?? []).filter((c) => c.status === 'confirmed');
  const proposals = cleaning
    ? await proposeCleaning({
        target,
        connections: [
          ...confirmed,
          ...planned.connections.filter((c) => !confirmed.some((k) => k.target_field === c.target_field)),
        ],
        sources: new Map(cleaning.sources.map((s) => [s.name, s])),
        run: cleaning.run,
        rowLimit: cleaning.rowLimit,
      })
    : undefined;
  return scope.em.transactional(async (em) => {
    const tx = { em: em as EntityManager, deps: scope.deps };
    const existing = await findMapping(tx.em, workspace, target.name);
    const plan = {
      ...explainPlan(
        planMapping(match, sources, existing?.tables ?? {}),
        match,
        outcome.modelPicks,
        outcome.overlapOf,
      ),
      transformations: proposals,
    };
    if (!existing && plan.connections.length === 0 && plan.ambiguities.length === 0) return null;
    // Read before writing: writeSuggestions changes this same entity.
    const confirmedBefore = new Set(
      (existing?.connections ?? []).filter((c) => c.status === 'confirmed').map((c) => c.target_field),
    );
    const { mapping, changed, kept } = await writeSuggestions(tx, workspace, target.name, plan, {
      autoConfirm,
    });
    return {
      changed,
      version: mapping.version,
      kept,
      connections: mapping.connections
        .filter((c) => !confirmedBefore.has(c.target_field))
        .map((c) => ({
          source_field: c.source_field,
          target_field: c.target_field,
          confidence: c.confidence ?? 0,
          status: c.status,
          evidence: c.evidence ?? null,
        })),
      ambiguities: mapping.ambiguities,
      transformations: mapping.transformations,
    };
  });
});
