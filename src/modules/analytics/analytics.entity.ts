import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../users/users.entity.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';
import type { StatTestName, StatTestResult } from '../../stats/result.ts';

export const STAT_TESTS = [
  'welch_t',
  'mann_whitney_u',
  'chi_square',
  'two_proportion_z',
  'pearson',
  'spearman',
] as const satisfies readonly StatTestName[];

/** draft → queued → running → tested | failed; a new test run starts the cycle again. */
export const HYPOTHESIS_STATUSES = ['draft', 'queued', 'running', 'tested', 'failed'] as const;

export interface StoredMetric {
  expression: string;
  kind: 'numeric' | 'boolean';
}

/** A test's outcome as a hypothesis keeps it: with its power at the minimum detectable effect, when one is set. */
export type StoredTestResult = StatTestResult & {
  power?: { effect_size: number; alpha: number; value: number | null };
};

export interface StoredSegment {
  column?: string;
  condition?: string;
  groups?: string[];
}

/**
 * A testable statement about a target table: a metric (row-level expression), a segment that splits
 * the population (or, for correlations, the second variable), the test, alpha and the minimum
 * detectable effect. The last test's outcome is kept on the row (result JSON plus the figures
 * insights and lists need as columns).
 */
export const Hypothesis = defineEntity({
  name: 'Hypothesis',
  tableName: 'hypotheses',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    statement: p.text(),
    targetSchema: p.string(),
    targetTable: p.string(),
    metric: p.json<StoredMetric>(),
    segment: p.json<StoredSegment>(),
    filter: p.text().nullable(),
    test: p.enum(STAT_TESTS),
    alpha: p.double(),
    minimumDetectableEffect: p.double().nullable(),
    miningColumns: p.json<string[]>(),
    origin: p.enum(['manual', 'generated']).default('manual'),
    status: p.enum(HYPOTHESIS_STATUSES).default('draft'),
    lastRunId: p.uuid().nullable(),
    result: p.json<StoredTestResult>().nullable(),
    pValue: p.double().nullable(),
    significant: p.boolean().nullable(),
    testedAt: p.datetime().nullable(),
    lastError: p.text().nullable(),
    createdById: p.uuid().nullable(),
    ...timestamps(),
  },
  indexes: [{ properties: ['organization', 'workspace'] }],
});

export type HypothesisEntity = InferEntity<typeof Hypothesis>;

/** A finding drawn from a significant test result, later scored by how the audiences built on it performed. */
export const Insight = defineEntity({
  name: 'Insight',
  tableName: 'insights',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    hypothesis: () => p.manyToOne(Hypothesis).deleteRule('cascade').index(),
    title: p.string(),
    description: p.text().default(''),
    confidence: p.double(),
    pValue: p.double(),
    test: p.string(),
    effectSize: p.json<{ name: string; value: number }>(),
    performance: p.json<Record<string, unknown>>().nullable(),
    performanceUpdatedAt: p.datetime().nullable(),
    createdById: p.uuid().nullable(),
    ...timestamps(),
  },
  indexes: [{ properties: ['organization', 'workspace', 'confidence'] }],
});

export type InsightEntity = InferEntity<typeof Insight>;

export const analyticsEntities = [Hypothesis, Insight];
