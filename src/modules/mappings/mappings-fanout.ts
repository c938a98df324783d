import { AppError, type AppErrorIssue } from '../../app-error.ts';
import { planMapping, type MappingTable, type SourceTable } from '../../transform/mapping.ts';
import { sourceTableSql } from '../../transform/sql.ts';
import type { Warehouse } from '../../warehouse/warehouse.ts';

/** How many rows one join gives each row of the primary table, measured on the source. */
export interface FanOut {
  source_table: string;
  join_on: string;
  /** Rows of the primary table. */
  primary_rows: number | null;
  /** Rows the primary table and the joins up to this one produce (LEFT joined). */
  joined_rows: number | null;
  /** Primary rows that match more than one row (null on a view, where rows have no identity). */
  multiplied_rows: number | null;
  max_rows_per_primary_row: number | null;
  /** False when the count ran past the statement timeout; the figures are then null. */
  measured: boolean;
  accepted: boolean;
}

const embed = (expression: string) => (expression.includes('--') ? `(${expression}\n)` : `(${expression})`);
const int = (v: unknown) => (v === null || v === undefined ? null : Number(v));

/**
 * Measures every join of a mapping exactly, on the whole source: each primary row is grouped by its
 * row identity (ctid), so a duplicated join key on either side shows as rows per primary row > 1.
 * Joins are measured as LEFT joins, in order, each with the joins before it (an ON may use them).
 * A view has no ctid: then only the row counts are compared. A count that runs past the statement
 * timeout is reported as not measured rather than failing validation.
 */
export async function measureFanOut(
  warehouse: Warehouse,
  tableName: string,
  tables: Record<string, MappingTable>,
): Promise<FanOut[]> {
  if (!Object.values(tables).some((t) => t.relationship === 'join')) return [];
  let plan;
  try {
    plan = await planMapping(
      { table_name: tableName, tables, connections: [] },
      { name: tableName, columns: [] },
    );
  } catch (error) {
    if (error instanceof AppError) return []; // the relationship rules report it
    throw error;
  }
  const primary = sourceTableSql(plan.primary);
  const figures: FanOut[] = [];
  const joined: SourceTable[] = [];
  for (const join of plan.joins) {
    joined.push(join);
    const from = [
      `FROM ${primary}`,
      ...plan.joins
        .slice(0, joined.length)
        .map((j) => `LEFT JOIN ${sourceTableSql(j)} ON ${embed(j.joinOn)}`),
    ].join('\n');
    const figure: FanOut = {
      source_table: join.key,
      join_on: join.joinOn,
      primary_rows: null,
      joined_rows: null,
      multiplied_rows: null,
      max_rows_per_primary_row: null,
      measured: true,
      accepted: tables[join.key]?.accept_fan_out === true,
    };
    try {
      try {
        const { rows } = await warehouse.readOnlyQuery(
          `SELECT count(*) AS primary_rows, count(*) FILTER (WHERE n > 1) AS multiplied_rows,
                  coalesce(max(n), 0) AS max_rows, coalesce(sum(n), 0) AS joined_rows
           FROM (SELECT count(*) AS n ${from} GROUP BY ${primary}.ctid) AS per_primary_row`,
          { limit: 1 },
        );
        figure.primary_rows = int(rows[0].primary_rows);
        figure.joined_rows = int(rows[0].joined_rows);
        figure.multiplied_rows = int(rows[0].multiplied_rows);
        figure.max_rows_per_primary_row = int(rows[0].max_rows);
      } catch (error) {
        // 42703: no ctid (a view): compare the counts alone.
        if (!(error instanceof AppError) || error.details.reason !== '42703') throw error;
        const { rows } = await warehouse.readOnlyQuery(
          `SELECT (SELECT count(*) FROM ${primary}) AS primary_rows, (SELECT count(*) ${from}) AS joined_rows`,
          { limit: 1 },
        );
        figure.primary_rows = int(rows[0].primary_rows);
        figure.joined_rows = int(rows[0].joined_rows);
      }
    } catch (error) {
      if (!(error instanceof AppError) || error.details.reason !== 'STATEMENT_TIMEOUT') throw error;
      figure.measured = false;
    }
    figures.push(figure);
  }
  return figures;
}

const multiplies = (f: FanOut) =>
  f.measured && f.primary_rows !== null && f.joined_rows !== null && f.joined_rows > f.primary_rows;

/** The figure in words: what a reviewer needs to decide between aggregating and accepting. */
function fanOutMessage(f: FanOut): string {
  const per =
    f.multiplied_rows !== null
      ? `${f.multiplied_rows} of ${f.primary_rows} primary rows match more than one row (up to ${f.max_rows_per_primary_row})`
      : `the primary table has ${f.primary_rows} rows`;
  return `The join of ${f.source_table} multiplies rows: ${per}; the joined result has ${f.joined_rows} rows instead of ${f.primary_rows}. Join on a unique key, aggregate the joined table, or accept the fan-out explicitly (accept_fan_out: true on the table).`;
}

/** Problems for validate: every join that multiplies rows and was not accepted. */
export function fanOutProblems(figures: FanOut[]): AppErrorIssue[] {
  return figures
    .filter((f) => multiplies(f) && !f.accepted)
    .map((f) => ({ path: ['tables', f.source_table, 'fan_out'], message: fanOutMessage(f) }));
}
