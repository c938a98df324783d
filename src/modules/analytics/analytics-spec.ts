import { AppError } from '../../app-error.ts';
import type { StatTestSpec } from '../../stats/engine.ts';
import type { MiningInput } from '../../stats/mining.ts';
import type { MetricSpec, SegmentSpec, StatsQuery, StatsSource } from '../../stats/sql.ts';
import { quoteIdent } from '../../warehouse/postgres.ts';
import type { Warehouse } from '../../warehouse/warehouse.ts';
import type { HypothesisEntity, StoredSegment } from './analytics.entity.ts';

/** The subset of a hypothesis the engine needs; also what validation builds before anything is stored. */
export interface HypothesisShape {
  targetSchema: string;
  targetTable: string;
  metric: { expression: string; kind: 'numeric' | 'boolean' };
  segment: StoredSegment;
  filter?: string | null;
  test: HypothesisEntity['test'];
  /** double precision columns type as string | number; the value is a number. */
  alpha: number | string;
}

const sourceOf = (h: HypothesisShape): StatsSource => ({
  schema: h.targetSchema,
  table: h.targetTable,
  ...(h.filter ? { filter: h.filter } : {}),
});

const metricOf = (h: HypothesisShape): MetricSpec => ({ sql: h.metric.expression, kind: h.metric.kind });

function segmentOf(h: HypothesisShape): SegmentSpec {
  const groups = h.segment.groups?.length ? { groups: h.segment.groups } : {};
  if (h.segment.column) return { column: h.segment.column, ...groups };
  if (h.segment.condition) return { condition: h.segment.condition, ...groups };
  throw new AppError('BAD_REQUEST', 'the segment names neither a column nor a condition');
}

/**
 * The engine's input for a hypothesis. For the correlation tests the segment is the second variable:
 * a column read as a number, or a condition read as 1/0.
 */
export function statSpecOf(h: HypothesisShape): StatTestSpec {
  const source = sourceOf(h);
  const metric = metricOf(h);
  switch (h.test) {
    case 'pearson':
    case 'spearman': {
      const x: MetricSpec = h.segment.column
        ? { sql: quoteIdent(h.segment.column), kind: 'numeric' }
        : { sql: h.segment.condition!, kind: 'boolean' };
      return { test: h.test, source, x, y: metric, alpha: Number(h.alpha) };
    }
    case 'chi_square':
      return { test: 'chi_square', source, metric, segment: segmentOf(h) };
    default:
      return { test: h.test, source, metric, segment: segmentOf(h), alpha: Number(h.alpha) };
  }
}

export function miningSpecOf(
  h: HypothesisShape & { miningColumns: string[] },
  options: Pick<MiningInput, 'minSupport' | 'depth' | 'direction' | 'limit'>,
): MiningInput {
  return { source: sourceOf(h), metric: metricOf(h), columns: h.miningColumns, ...options };
}

/**
 * The engine's query function over a warehouse: its generated SQL (the user's expressions in it were
 * checked at creation and again by the engine) runs read-only with a timeout, without the user-SQL
 * guard. Every engine query bounds its own rows (LIMIT), so no row cap is needed.
 */
export function warehouseStatsQuery(warehouse: Warehouse, options: { timeoutMs?: number } = {}): StatsQuery {
  return (sql, params) => warehouse.aggregate(sql, { params, timeoutMs: options.timeoutMs });
}
