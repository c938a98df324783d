import type { CallerScope } from '../../deps.ts';
import type { SourceTable, TableMatch, TargetTable } from '../../llm/offline-matcher.ts';
import { MAX_SAMPLE_LENGTH } from '../../llm/profile.ts';
import { qualified, quoteIdent, warehouses } from '../../warehouse/postgres.ts';
import type { IntrospectedTable, Warehouse } from '../../warehouse/warehouse.ts';
import { connectionConfig, type WorkspaceEntity } from '../workspaces/workspaces.service.ts';

/**
 * Sample overlap: of a source column's sampled distinct non-blank values, the share the target
 * column already holds in the target warehouse. It says "this data already went there" (a earlier
 * materialization, a load by other means) far more directly than names or patterns can.
 *
 * Values are compared here, in the process, as trimmed text without regard to case: the source's
 * samples are never sent to the target, and neither side's values are logged or stored; only the
 * share leaves this file.
 */
export type OverlapOf = (targetField: string, sourceField: string) => number | null;

/** What a run knows without a target to compare with. */
export const overlapUnmeasured: OverlapOf = () => null;

const normalized = (value: string) => value.trim().toLowerCase();

/**
 * The share of `samples` (distinct after normalizing, blanks left out) found in `held`; null when
 * there is nothing to compare: no target values read, or no samples (a column profiling could not read).
 */
function overlapShare(
  samples: readonly string[] | undefined,
  held: ReadonlySet<string> | undefined,
): number | null {
  if (!held) return null;
  const sampled = new Set((samples ?? []).map(normalized).filter((v) => v !== ''));
  if (sampled.size === 0) return null;
  let found = 0;
  for (const value of sampled) if (held.has(value)) found++;
  return Math.round((found / sampled.size) * 10_000) / 10_000;
}

interface OpenedTarget {
  warehouse: Warehouse;
  /** The workspace's target tables as they exist in the target schema, by name. */
  tables: ReadonlyMap<string, IntrospectedTable>;
}

/**
 * One discovery run's view of the target warehouse: introspected once (which target tables exist,
 * with which columns), then at most one bounded statement per target table, reading the distinct
 * values of the columns discovery proposes sources for in the table's first `rowLimit` rows, the same
 * row budget the source profile has. A missing target, table or column, an empty table or a failed
 * read leaves the overlap unmeasured (null) rather than failing the run: discovery never needed the
 * target before and must not start depending on it.
 */
export class SampleOverlap {
  readonly #samples = new Map<string, readonly string[]>();
  #target: Promise<OpenedTarget | null> | undefined;

  private readonly scope: CallerScope;
  private readonly workspace: WorkspaceEntity;
  private readonly options: { targetTables: readonly string[]; rowLimit: number };

  constructor(
    scope: CallerScope,
    workspace: WorkspaceEntity,
    sources: readonly SourceTable[],
    options: { targetTables: readonly string[]; rowLimit: number },
  ) {
    this.scope = scope;
    this.workspace = workspace;
    this.options = options;
    for (const table of sources)
      for (const column of table.columns)
        if (column.samples?.length) this.#samples.set(`${table.name}.${column.name}`, column.samples);
  }

  /** The overlap of every pair `match` proposes for `target`. */
  async forTable(target: TargetTable, match: TableMatch): Promise<OverlapOf> {
    // Only fields with a candidate that has samples can have an overlap: the others cost no read.
    const fields = [
      ...new Set(
        [...match.fields, ...match.ambiguities]
          .filter((f) => f.candidates.some((c) => this.#samples.has(c.source_field)))
          .map((f) => f.target_field),
      ),
    ];
    if (fields.length === 0) return overlapUnmeasured;
    const opened = await (this.#target ??= this.#open());
    const table = opened?.tables.get(target.name);
    if (!opened || !table) return overlapUnmeasured;
    const present = new Set(table.columns.map((c) => c.name));
    const readable = fields.filter((f) => present.has(f));
    if (readable.length === 0) return overlapUnmeasured;
    const held = await this.#read(opened.warehouse, table, readable);
    if (!held) return overlapUnmeasured;
    return (targetField, sourceField) => overlapShare(this.#samples.get(sourceField), held.get(targetField));
  }

  async #open(): Promise<OpenedTarget | null> {
    const config = connectionConfig(this.scope, this.workspace, 'target');
    // The read below is PostgreSQL SQL, the one engine a target can be.
    if (!config || config.type !== 'postgres') return null;
    try {
      const warehouse = await warehouses(this.scope.deps).open(config, `${this.workspace.id}:target`);
      const { tables } = await warehouse.introspect({
        schemas: [config.schemas[0]],
        tables: [...this.options.targetTables],
      });
      return { warehouse, tables: new Map(tables.map((t) => [t.name, t])) };
    } catch (error) {
      this.#unmeasured(error, null);
      return null;
    }
  }

  /** Each column's normalized distinct values; null when the table holds no rows or cannot be read. */
  async #read(
    warehouse: Warehouse,
    table: IntrospectedTable,
    columns: readonly string[],
  ): Promise<Map<string, Set<string>> | null> {
    const selected = columns.map((c, i) => `${quoteIdent(c)} as c${i}`).join(', ');
    // Cut like the source's samples, so that a long value compares with its sample.
    const perColumn = columns.map(
      (_, i) =>
        `array_agg(distinct left(c${i}::text, $2::int)) filter (where btrim(c${i}::text) <> '') as v${i}`,
    );
    const sql = `select count(*) as row_count, ${perColumn.join(', ')}
from (select ${selected} from ${qualified(table)} limit $1::int) sampled`;
    try {
      const [row] = await warehouse.aggregate(sql, {
        params: [Math.max(1, Math.floor(this.options.rowLimit)), MAX_SAMPLE_LENGTH],
      });
      if (!row || Number(row.row_count) === 0) return null;
      return new Map(
        columns.map((c, i) => [c, new Set(((row[`v${i}`] as string[] | null) ?? []).map(normalized))]),
      );
    } catch (error) {
      this.#unmeasured(error, table.name);
      return null;
    }
  }

  #unmeasured(error: unknown, table: string | null) {
    // The code only: a database message may quote the values this file keeps to itself.
    const code = (error as { code?: unknown }).code;
    this.scope.deps.logger.warn(
      { workspace: this.workspace.id, table, code: typeof code === 'string' ? code : null },
      'sample overlap not measured: the target could not be read',
    );
  }
}
