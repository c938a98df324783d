import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../users/users.entity.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';
import type { MappingTable, MappingTransformation } from '../../transform/mapping.ts';
import type { ProposedBy } from '../discovery/cleaning-kinds.ts';

/**
 * Why discovery proposed a source for a field, kept beside the proposal so a reviewer sees it.
 * Explanation only: it is not part of what "changed since the last commit" compares.
 */
export interface SuggestionEvidence {
  /** How much the names mean the same, in [0, 1]. */
  name: number;
  /** How well the source type can feed the target type, values considered, in [0, 1]. */
  type: number;
  /** Share of sampled values with the pattern the field expects; negative when they contradict it. */
  pattern: number;
  /** The value pattern that spoke, e.g. "email" or "country_code"; null when values said nothing. */
  value_pattern: string | null;
  /**
   * Share of the source's sampled distinct values the target column already holds, 0–1; null when
   * not measured (no target table or column, an empty table, or no samples).
   */
  overlap: number | null;
  /** Whether the LLM named this very source for this field. */
  llm: boolean;
  matched_by: 'offline' | 'openai';
  /** The pieces of evidence that spoke for the suggestion. */
  signals: ('name' | 'type' | 'pattern' | 'overlap' | 'model')[];
}

export interface StoredConnection {
  source_field: string;
  target_field: string;
  status: 'suggested' | 'confirmed';
  confidence: number | null;
  /** Set by discovery; absent for a connection a person made. */
  evidence?: SuggestionEvidence | null;
  /** Set when the target field vanished from the schema (flagged, never silently dropped). */
  stale?: string | null;
}

export interface StoredTransformation extends MappingTransformation {
  description: string | null;
  stale?: string | null;
  /**
   * Set on a cleaning discovery proposed (and refreshes on each run); absent on one a person wrote or
   * accepted, which discovery never touches.
   */
  proposed?: ProposedBy | null;
}

/**
 * A person's refusal that discovery must respect: `source_field` null means the target field has
 * no source at all (an ambiguity resolved to "none"); otherwise that one source was refused.
 */
export interface MappingDecision {
  target_field: string;
  source_field: string | null;
  /** `refused`: the person removed discovery's cleaning of this source for this field (not the source). */
  cleaning?: 'refused' | null;
}

interface AmbiguityCandidate {
  source_field: string;
  confidence: number | null;
  evidence?: SuggestionEvidence | null;
  reason?: string | null;
}

export interface Ambiguity {
  target_field: string;
  candidates: AmbiguityCandidate[];
  reason?: string | null;
}

/**
 * The mapping of one target table in one workspace (DESIGN §5). `version` counts every change;
 * `committed_version` is the version of the newest commit (null before the first).
 */
export const TableMapping = defineEntity({
  name: 'TableMapping',
  tableName: 'mappings',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    tableName: p.string(),
    tables: p.json<Record<string, MappingTable>>(),
    connections: p.json<StoredConnection[]>(),
    transformations: p.json<Record<string, StoredTransformation>>(),
    ambiguities: p.json<Ambiguity[]>(),
    decisions: p.json<MappingDecision[]>().nullable(),
    version: p.integer().default(1),
    /**
     * Bumped by every write of the row, unlike `version`, which counts edits of the mapping itself; a
     * write of an older revision fails (src/db/concurrent-edit.ts).
     */
    revision: p.integer().version(),
    committedVersion: p.integer().nullable(),
    materializedVersion: p.integer().nullable(),
    materializedAt: p.datetime().nullable(),
    materializedRows: p.bigint('number').nullable(),
    lastRunId: p.uuid().nullable(),
    ...timestamps(),
  },
  uniques: [{ properties: ['workspace', 'tableName'] }],
});

export type TableMappingEntity = InferEntity<typeof TableMapping>;

/** A committed transformation: the SQL and the mapping it came from, who committed it and why. */
export const MappingCommit = defineEntity({
  name: 'MappingCommit',
  tableName: 'mapping_commits',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    tableName: p.string(),
    version: p.integer(),
    sql: p.text(),
    /** Target columns in the order the SQL produces them. */
    columns: p.json<{ name: string; type: string }[]>(),
    mapping: p.json<Record<string, unknown>>(),
    /** The target table definition (schema.json) the SQL was generated against. */
    targetTable: p.json<Record<string, unknown>>(),
    author: p.string().nullable(),
    message: p.text(),
    createdAt: p.datetime().onCreate(() => new Date()),
  },
  uniques: [{ properties: ['workspace', 'tableName', 'version'] }],
});

export const mappingEntities = [TableMapping, MappingCommit];
