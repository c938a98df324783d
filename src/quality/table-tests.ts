import { columnTestConfigSchema, type ColumnTests, type KeyTest } from './rules.ts';

/*
 * The tests of a target table: the one list that the transformation project writes into schema.yml
 * (src/transform/dbt.ts) and the monitoring runner runs (listQualityConfigs → runColumnTests), so that
 * `dbt test` and dimas's alerts report the same tests.
 *
 * A column's tests are its `tests` in schema.json plus what the table definition itself says, which
 * the database enforces on a synced table: a primary-key column and a `nullable: false` column are
 * not_null, a one-column key is unique. A composite key is unique only as a combination (one order has
 * several lines): a table test of its own (the project's `tests/<table>_primary_key.sql`).
 */

export interface TableTestsInput {
  name: string;
  primary_key?: string[] | null;
  columns: { name: string; nullable?: boolean | null; tests?: unknown }[];
}

export type ImpliedTest = 'not_null' | 'unique';

export interface TableColumnTests extends ColumnTests {
  /** What schema.json's key and nullability add, whatever `tests` says. */
  implied: ImpliedTest[];
  /** The column has `tests` of its own (a config a user or a default monitor stored). */
  configured: boolean;
}

export interface TableTests {
  columns: TableColumnTests[];
  /** A key of several columns, unique as a combination; null for none or one column. */
  key: KeyTest | null;
}

export function impliedTests(table: TableTestsInput, column: string): ImpliedTest[] {
  const key = table.primary_key ?? [];
  const inKey = key.includes(column);
  const implied: ImpliedTest[] = [];
  if (inKey && key.length === 1) implied.push('unique');
  if (inKey || table.columns.find((c) => c.name === column)?.nullable === false) implied.push('not_null');
  return implied;
}

/**
 * Stored tests that do not parse (a document older than their schema) run nowhere: neither here nor
 * in the project, which reads this same list.
 */
export function tableTests(table: TableTestsInput): TableTests {
  const columns: TableColumnTests[] = [];
  for (const column of table.columns) {
    const parsed = column.tests === undefined ? null : columnTestConfigSchema.safeParse(column.tests);
    const stored = parsed?.success ? parsed.data : null;
    const implied = impliedTests(table, column.name);
    if (!stored && implied.length === 0) continue;
    const config = { ...(stored ?? columnTestConfigSchema.parse({})) };
    for (const test of implied) config[test] = true;
    columns.push({ column: column.name, config, implied, configured: !!stored });
  }
  const key = table.primary_key ?? [];
  return { columns, key: key.length > 1 ? { columns: [...key], severity: 'error' } : null };
}
