import { createHash } from 'node:crypto';
import { POSTGRES_TYPES, type PortableType } from '../warehouse/types.ts';
import { quoteIdent } from '../warehouse/postgres.ts';
import { quoteLiteral } from '../quality/sql.ts';
import type { TableRef } from '../warehouse/warehouse.ts';
import {
  planMapping,
  type Mapping,
  type MappingPlan,
  type PlanOptions,
  type PlannedColumn,
  type SourceTable,
  type TargetTable,
} from './mapping.ts';

export function sourceTableSql(table: Pick<SourceTable, 'schema' | 'name'>): string {
  return table.schema ? `${quoteIdent(table.schema)}.${quoteIdent(table.name)}` : quoteIdent(table.name);
}

function tableRefSql(table: TableRef): string {
  return `${quoteIdent(table.schema)}.${quoteIdent(table.name)}`;
}

const JOIN_KEYWORDS = {
  inner: 'INNER JOIN',
  left: 'LEFT JOIN',
  right: 'RIGHT JOIN',
  full: 'FULL JOIN',
} as const;

/** A user expression inside our SQL: parenthesized, and a trailing `--` comment cannot swallow the rest. */
function embed(expression: string): string {
  return expression.includes('--') ? `(${expression}\n)` : `(${expression})`;
}

/** The SQL of one target column, cast to its type (what `field-transform` shows). */
export function columnSql(plan: MappingPlan, column: PlannedColumn): string {
  const type = POSTGRES_TYPES[column.type];
  const { source } = column;
  if (source.kind === 'null') return `CAST(NULL AS ${type})`;
  if (source.kind === 'expression') return `CAST(${embed(source.expression)} AS ${type})`;
  const table =
    source.table === plan.primary.key ? plan.primary : plan.joins.find((j) => j.key === source.table)!;
  return `CAST(${sourceTableSql(table)}.${quoteIdent(source.column)} AS ${type})`;
}

export interface GeneratedSql {
  sql: string;
  columns: { name: string; type: PortableType; sql: string; source: PlannedColumn['source']['kind'] }[];
}

export interface SelectSqlOptions {
  /** How FROM/JOIN name a source table (dbt models use `{{ source(…) }}`); default the quoted name. */
  renderTable?: (table: SourceTable) => string;
}

/** The SELECT of a plan: primary table, joins in dependency order, one cast expression per column in schema order. */
export function selectSqlFromPlan(plan: MappingPlan, options: SelectSqlOptions = {}): GeneratedSql {
  const renderTable = options.renderTable ?? sourceTableSql;
  const columns = plan.columns.map((column) => ({
    name: column.name,
    type: column.type,
    sql: columnSql(plan, column),
    source: column.source.kind,
  }));
  const lines = ['SELECT'];
  columns.forEach((c, i) =>
    lines.push(`  ${c.sql} AS ${quoteIdent(c.name)}${i < columns.length - 1 ? ',' : ''}`),
  );
  lines.push(`FROM ${renderTable(plan.primary)}`);
  for (const join of plan.joins)
    lines.push(`${JOIN_KEYWORDS[join.joinType]} ${renderTable(join)} ON ${embed(join.joinOn)}`);
  return { sql: lines.join('\n'), columns };
}

/**
 * The transformation SQL of a mapping: deterministic for the same mapping and schema. BAD_REQUEST
 * (with every issue) for unmapped NOT NULL fields, bad expressions, unknown tables or fields.
 */
export async function generateSelectSql(
  mapping: Mapping,
  target: TargetTable,
  options: PlanOptions = {},
): Promise<GeneratedSql & { plan: MappingPlan }> {
  const plan = await planMapping(mapping, target, options);
  return { ...selectSqlFromPlan(plan), plan };
}

const MAX_IDENTIFIER = 63;
const RUN_DIGITS = 8;

/** `base` cut to fit PostgreSQL's identifiers, `__<tag>_`, then the run's digits (`orders__stg_1a2b3c4d`). */
function derivedPrefix(base: string, tag: string): string {
  const tagPart = `__${tag}_`;
  return base.slice(0, MAX_IDENTIFIER - tagPart.length - RUN_DIGITS) + tagPart;
}

const runDigits = (runId: string) => createHash('sha256').update(runId).digest('hex').slice(0, RUN_DIGITS);

function derivedName(base: string, tag: string, runId: string): string {
  return derivedPrefix(base, tag) + runDigits(runId);
}

/**
 * How the staging tables of a target's runs are named: `prefix` is common to all of them, `of` names
 * one run's. `digitsSql` computes in PostgreSQL the digits that end a run's name from its id column,
 * so that the runs a table name may belong to are found without reading every run of the table.
 */
export function stagingTableNames(targetName: string) {
  return {
    prefix: derivedPrefix(targetName, 'stg'),
    of: (runId: string) => derivedName(targetName, 'stg', runId),
    digitsSql: (idColumn: string) =>
      `left(encode(sha256(convert_to(${idColumn}::text, 'UTF8')), 'hex'), ${RUN_DIGITS})`,
  };
}

export interface MaterializeOptions {
  target: TableRef;
  /** Target columns in the order the SELECT produces them. */
  columns: string[];
  selectSql: string;
  /** Names the staging table, so concurrent or leftover runs never collide. */
  runId: string;
}

/**
 * How a run replaces a target table's content without readers ever seeing a half table:
 *  1. `prepare` (one transaction): a staging table shaped LIKE the target (defaults, NOT NULL, checks,
 *     indexes, primary key), leftovers of the same run dropped first;
 *  2. `load`: INSERT … SELECT into the staging table (a cross-database copy COPYs into it instead),
 *     while readers still read the old table undisturbed;
 *  3. `swap` (one transaction, a short exclusive lock): rename target → old, staging → target, drop old,
 *     and give the indexes the target's names back.
 * On any failure run `cleanup`: the target was never touched. If other objects depend on the target
 * (views, foreign keys of other tables), `DROP` in the swap fails and rolls the whole swap back; the
 * materialize job then replaces the rows in place from the staging table. Grants on the target are not
 * copied to the staging table either.
 */
export interface MaterializePlan {
  staging: TableRef;
  prepare: string[];
  load: string;
  swap: string[];
  cleanup: string[];
}

/**
 * The swapped-in table's indexes (its primary key's among them) take the target's names again: made
 * by LIKE, they are named after the staging table (`orders__stg_1a2b3c4d_pkey`), a new name every
 * run, which tools and people that name a constraint cannot follow. Renaming an index renames the
 * constraint it backs.
 */
function restoreIndexNames(target: TableRef, stagingName: string): string {
  return `DO $rename$ DECLARE r record; BEGIN
  FOR r IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = ${quoteLiteral(tableRefSql(target))}::regclass AND starts_with(c.relname, ${quoteLiteral(stagingName)})
  LOOP
    EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', ${quoteLiteral(target.schema)}, r.relname,
      ${quoteLiteral(target.name)} || substr(r.relname, ${stagingName.length + 1}));
  END LOOP;
END $rename$`;
}

export function materializeSql(options: MaterializeOptions): MaterializePlan {
  const { target, columns, selectSql, runId } = options;
  const staging = { schema: target.schema, name: stagingTableNames(target.name).of(runId) };
  const old = derivedName(target.name, 'old', runId);
  const columnList = columns.map(quoteIdent).join(', ');
  return {
    staging,
    prepare: [
      `DROP TABLE IF EXISTS ${tableRefSql(staging)}`,
      `CREATE TABLE ${tableRefSql(staging)} (LIKE ${tableRefSql(target)} INCLUDING ALL)`,
    ],
    load: `INSERT INTO ${tableRefSql(staging)} (${columnList})\n${selectSql}`,
    swap: [
      `LOCK TABLE ${tableRefSql(target)} IN ACCESS EXCLUSIVE MODE`,
      `ALTER TABLE ${tableRefSql(target)} RENAME TO ${quoteIdent(old)}`,
      `ALTER TABLE ${tableRefSql(staging)} RENAME TO ${quoteIdent(target.name)}`,
      `DROP TABLE ${quoteIdent(target.schema)}.${quoteIdent(old)}`,
      restoreIndexNames(target, staging.name),
    ],
    cleanup: [`DROP TABLE IF EXISTS ${tableRefSql(staging)}`],
  };
}
