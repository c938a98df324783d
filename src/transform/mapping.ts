import { loadModule, parseSync } from 'libpg-query';
import { AppError, type AppErrorIssue } from '../app-error.ts';
import { parseSqlExpression } from '../warehouse/sql-guard.ts';
import { PORTABLE_TYPES, type PortableType } from '../warehouse/types.ts';

/*
 * A mapping (DESIGN §5) turned into a plan that the SQL, Python and dbt generators share, so the
 * three agree on which expression fills which column.
 *
 * Table keys: a key of `tables` names a source relation the way introspection and the source config
 * do: `schema.table` (e.g. `shop.customers`), or a bare `table` that the source's search_path
 * resolves. A field is `<table key>.<column>` (`shop.customers.email`): the column is after the last
 * dot, so names containing dots are not supported. Expressions (transformations, join ON) may name
 * a table by its key or by its bare name (`customers.email`), which is why two tables of one mapping
 * may not share a bare name across schemas. The generated SQL uses no aliases: PostgreSQL resolves
 * both spellings against `FROM "shop"."customers"`.
 */

export type JoinType = 'inner' | 'left' | 'right' | 'full';
export const JOIN_TYPES: readonly JoinType[] = ['inner', 'left', 'right', 'full'];

export interface MappingTable {
  relationship: 'primary' | 'join';
  join_type?: JoinType | null;
  /** A boolean SQL expression over the mapping's tables, e.g. `customers.id = orders.customer_id`. */
  join_on?: string | null;
  /** A person accepted that this join gives some primary rows more than one row. */
  accept_fan_out?: boolean | null;
}

interface MappingConnection {
  source_field: string;
  target_field: string;
  status?: 'suggested' | 'confirmed';
  confidence?: number | null;
}

export interface MappingTransformation {
  expression: string;
  description?: string | null;
}

export interface Mapping {
  table_name: string;
  tables: Record<string, MappingTable>;
  connections: MappingConnection[];
  transformations?: Record<string, MappingTransformation>;
  [key: string]: unknown;
}

/** @public The declarations of `dimas/client` (npm run build:types) name it in a procedure's output. */
export interface TargetColumn {
  name: string;
  type: string;
  nullable?: boolean;
  description?: string | null;
  [key: string]: unknown;
}

export interface TargetTable {
  name: string;
  description?: string | null;
  primary_key?: string[];
  columns: TargetColumn[];
  [key: string]: unknown;
}

export interface SourceTable {
  key: string;
  schema: string | null;
  name: string;
}

interface PlannedJoin extends SourceTable {
  joinType: JoinType;
  joinOn: string;
  /** libpg-query node of the ON expression. */
  joinOnAst: ExpressionNode;
}

type ColumnSource =
  | { kind: 'expression'; expression: string; ast: ExpressionNode; description: string | null }
  | { kind: 'column'; table: string; column: string }
  | { kind: 'null' };

export interface PlannedColumn {
  name: string;
  type: PortableType;
  nullable: boolean;
  description: string | null;
  source: ColumnSource;
}

export interface MappingPlan {
  target: TargetTable;
  primary: SourceTable;
  joins: PlannedJoin[];
  columns: PlannedColumn[];
}

export interface PlanOptions {
  /**
   * Whether `suggested` connections count. Default true: right after discovery every connection is a
   * suggestion and the generated SQL should already show them; confirmed ones win over suggestions.
   */
  includeSuggested?: boolean;
}

export type ExpressionNode = Record<string, any>;

/** `shop.customers` → { schema: 'shop', name: 'customers' }; `customers` → { schema: null, … }. */
export function parseTableKey(key: string): SourceTable {
  const parts = key.split('.');
  if (parts.length > 2 || parts.some((p) => p.length === 0))
    throw new AppError('BAD_REQUEST', `Source table ${key} must be "table" or "schema.table"`);
  return parts.length === 2
    ? { key, schema: parts[0], name: parts[1] }
    : { key, schema: null, name: parts[0] };
}

/** `shop.customers.email` → { table: 'shop.customers', column: 'email' }; null without a table. */
export function splitSourceField(field: string): { table: string; column: string } | null {
  const dot = field.lastIndexOf('.');
  if (dot <= 0 || dot === field.length - 1) return null;
  return { table: field.slice(0, dot), column: field.slice(dot + 1) };
}

let parserReady: Promise<void> | undefined;

/**
 * Parses one SQL expression: the SQL guard validates it (single expression, nothing unsafe, errors
 * with positions), then the raw libpg-query node is returned for the generators.
 */
export async function parseExpression(
  expression: string,
): Promise<{ ast: ExpressionNode; refs: string[][] }> {
  const { columns } = await parseSqlExpression(expression);
  parserReady ??= loadModule();
  await parserReady;
  const tree = parseSync(`SELECT ${expression}`);
  const ast = tree.stmts[0].stmt.SelectStmt.targetList[0].ResTarget.val as ExpressionNode;
  return { ast, refs: columns.map((c) => c.ref.split('.')) };
}

class Issues {
  readonly list: AppErrorIssue[] = [];
  add(path: (string | number)[], message: string) {
    this.list.push({ path, message });
  }
  throwIfAny(what: string) {
    if (this.list.length === 0) return;
    const head = this.list
      .slice(0, 5)
      .map((i) => i.message)
      .join('; ');
    const more = this.list.length > 5 ? ` (and ${this.list.length - 5} more)` : '';
    throw new AppError('BAD_REQUEST', `${what}: ${head}${more}`, { issues: this.list });
  }
}

/**
 * Resolves a table written in an expression (`shop.customers` or `customers`) to its key. Exactly as
 * written: the parser has already folded unquoted names to lower case, and the generated SQL names
 * the table as the expression does, so `"CUSTOMERS".id` for a table `customers` would pass here and
 * fail in the database.
 */
function tableResolver(tables: SourceTable[]) {
  const byName = new Map<string, SourceTable>();
  for (const t of tables) {
    byName.set(t.key, t);
    byName.set(t.name, t);
  }
  return (written: string): SourceTable | undefined => byName.get(written);
}

/**
 * Checks a mapping against its target table and orders its joins; every problem is reported in one
 * BAD_REQUEST (issues with paths), not only the first.
 */
export async function planMapping(
  mapping: Mapping,
  target: TargetTable,
  options: PlanOptions = {},
): Promise<MappingPlan> {
  const includeSuggested = options.includeSuggested ?? true;
  const issues = new Issues();

  // Tables.
  const tables: (SourceTable & { relation: MappingTable })[] = [];
  for (const [key, relation] of Object.entries(mapping.tables ?? {})) {
    try {
      tables.push({ ...parseTableKey(key), relation });
    } catch (error) {
      issues.add(['tables', key], (error as Error).message);
    }
  }
  const bareNames = new Map<string, string>();
  for (const t of tables) {
    const other = bareNames.get(t.name.toLowerCase());
    if (other) issues.add(['tables', t.key], `Source tables ${other} and ${t.key} share the name ${t.name}`);
    bareNames.set(t.name.toLowerCase(), t.key);
  }
  const primaries = tables.filter((t) => t.relation.relationship === 'primary');
  if (primaries.length === 0) issues.add(['tables'], 'The mapping has no primary table');
  if (primaries.length > 1)
    issues.add(
      ['tables'],
      `The mapping has ${primaries.length} primary tables (${primaries.map((t) => t.key).join(', ')}); exactly one is allowed`,
    );
  const resolve = tableResolver(tables);

  const checkRefs = (refs: string[][], path: (string | number)[], what: string): Set<string> => {
    const used = new Set<string>();
    for (const ref of refs) {
      if (ref.length === 1) {
        if (tables.length === 1) used.add(tables[0].key);
        else
          issues.add(
            path,
            `${what}: qualify column ${ref[0]} with its table (e.g. ${tables[0]?.name ?? 'table'}.${ref[0]})`,
          );
        continue;
      }
      const written = ref.slice(0, -1).join('.');
      const table = resolve(written);
      if (table) used.add(table.key);
      else
        issues.add(
          path,
          `${what}: ${ref.join('.')} names table ${written}, which is not a table of this mapping`,
        );
    }
    return used;
  };

  // Joins: each ON may only use tables already joined (and itself); order them so it does.
  const pending: (PlannedJoin & { uses: Set<string> })[] = [];
  for (const t of tables) {
    if (t.relation.relationship !== 'join') continue;
    const joinType = (t.relation.join_type ?? 'left') as JoinType;
    if (!JOIN_TYPES.includes(joinType)) {
      issues.add(
        ['tables', t.key, 'join_type'],
        `Join type ${joinType} of ${t.key} is not one of ${JOIN_TYPES.join(', ')}`,
      );
      continue;
    }
    const joinOn = t.relation.join_on?.trim();
    if (!joinOn) {
      issues.add(['tables', t.key, 'join_on'], `Join ${t.key} has no ON expression`);
      continue;
    }
    try {
      const { ast, refs } = await parseExpression(joinOn);
      const uses = checkRefs(refs, ['tables', t.key, 'join_on'], `Join ON of ${t.key}`);
      if (!uses.has(t.key))
        issues.add(['tables', t.key, 'join_on'], `Join ON of ${t.key} does not use ${t.key}`);
      pending.push({ key: t.key, schema: t.schema, name: t.name, joinType, joinOn, joinOnAst: ast, uses });
    } catch (error) {
      issues.add(['tables', t.key, 'join_on'], `Join ON of ${t.key}: ${(error as Error).message}`);
    }
  }
  const joins: PlannedJoin[] = [];
  if (primaries.length === 1) {
    const present = new Set([primaries[0].key]);
    pending.sort((a, b) => a.key.localeCompare(b.key));
    for (let progressed = true; progressed;) {
      progressed = false;
      for (const join of pending) {
        if (present.has(join.key) || ![...join.uses].every((k) => k === join.key || present.has(k))) continue;
        present.add(join.key);
        const { uses: _uses, ...planned } = join;
        joins.push(planned);
        progressed = true;
        break;
      }
    }
    for (const join of pending)
      if (!present.has(join.key))
        issues.add(
          ['tables', join.key],
          `Join ${join.key} is not reachable from the primary table ${primaries[0].key} through ON expressions`,
        );
  }

  // Columns.
  const targetColumns = new Map(target.columns.map((c) => [c.name, c]));
  const primaryKey = new Set(target.primary_key ?? []);
  const transformations = mapping.transformations ?? {};
  for (const field of Object.keys(transformations))
    if (!targetColumns.has(field))
      issues.add(
        ['transformations', field],
        `Transformation for ${field}: ${target.name} has no column ${field}`,
      );
  const connectionsByField = new Map<
    string,
    { connection: MappingConnection; table: string; column: string }[]
  >();
  (mapping.connections ?? []).forEach((connection, i) => {
    if (!targetColumns.has(connection.target_field)) {
      issues.add(
        ['connections', i, 'target_field'],
        `Connection ${connection.source_field} → ${connection.target_field}: ${target.name} has no column ${connection.target_field}`,
      );
      return;
    }
    const split = splitSourceField(connection.source_field);
    if (!split) {
      issues.add(
        ['connections', i, 'source_field'],
        `Connection source ${connection.source_field} must be "table.column"`,
      );
      return;
    }
    const table = resolve(split.table);
    if (!table) {
      issues.add(
        ['connections', i, 'source_field'],
        `Connection source ${connection.source_field} names table ${split.table}, which is not a table of this mapping`,
      );
      return;
    }
    if (connection.status === 'suggested' && !includeSuggested) return;
    const list = connectionsByField.get(connection.target_field) ?? [];
    list.push({ connection, table: table.key, column: split.column });
    connectionsByField.set(connection.target_field, list);
  });

  const columns: PlannedColumn[] = [];
  const unmappedRequired: string[] = [];
  for (const column of target.columns) {
    const type = column.type as PortableType;
    if (!PORTABLE_TYPES.includes(type))
      issues.add(['target', column.name], `Column ${column.name} has unknown type ${column.type}`);
    const nullable = column.nullable !== false && !primaryKey.has(column.name);
    const description = column.description ?? null;
    const transformation = transformations[column.name];
    let source: ColumnSource | undefined;
    if (transformation?.expression?.trim()) {
      const expression = transformation.expression.trim();
      try {
        const { ast, refs } = await parseExpression(expression);
        checkRefs(refs, ['transformations', column.name, 'expression'], `Transformation for ${column.name}`);
        source = { kind: 'expression', expression, ast, description: transformation.description ?? null };
      } catch (error) {
        issues.add(
          ['transformations', column.name, 'expression'],
          `Transformation for ${column.name}: ${(error as Error).message}`,
        );
      }
    } else {
      const candidates = connectionsByField.get(column.name) ?? [];
      const confirmed = candidates.filter((c) => c.connection.status !== 'suggested');
      if (confirmed.length > 1) {
        issues.add(
          ['connections'],
          `${column.name} has ${confirmed.length} confirmed connections (${confirmed.map((c) => c.connection.source_field).join(', ')}) and no transformation combining them`,
        );
      } else {
        const chosen =
          confirmed[0] ??
          [...candidates].sort(
            (a, b) =>
              (b.connection.confidence ?? 0) - (a.connection.confidence ?? 0) ||
              a.connection.source_field.localeCompare(b.connection.source_field),
          )[0];
        if (chosen) source = { kind: 'column', table: chosen.table, column: chosen.column };
      }
    }
    if (!source) {
      // A transformation that failed to parse is already reported above.
      if (!nullable && !transformation?.expression?.trim()) unmappedRequired.push(column.name);
      source = { kind: 'null' };
    }
    columns.push({ name: column.name, type, nullable, description, source });
  }
  if (unmappedRequired.length)
    issues.add(['connections'], `Unmapped NOT NULL fields of ${target.name}: ${unmappedRequired.join(', ')}`);
  issues.throwIfAny(`The mapping of ${target.name} cannot be generated`);

  const primary = primaries[0];
  return {
    target,
    primary: { key: primary.key, schema: primary.schema, name: primary.name },
    joins,
    columns,
  };
}
