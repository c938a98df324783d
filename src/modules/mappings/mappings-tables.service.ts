import { AppError, notFound, type AppErrorIssue } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { portableFamily } from '../../warehouse/types.ts';
import {
  parseExpression,
  planMapping,
  splitSourceField,
  type ExpressionNode,
  type JoinType,
  type MappingTable,
} from '../../transform/mapping.ts';
import { currentWorkspace } from '../workspaces/workspaces.service.ts';
import { type TableMappingEntity } from './mappings.entity.ts';
import { fanOutProblems, measureFanOut } from './mappings-fanout.ts';
import {
  checkExpression,
  mappingTableResolver,
  resolveSourceTable,
  sourceCatalog,
  sourceWarehouseOf,
  targetTableOf,
} from './mappings-catalog.ts';
import { editMapping, findMapping, mappingView } from './mappings.service.ts';

// ---- table relationships ----

function tablesList(mapping: TableMappingEntity | null) {
  const entries = Object.entries(mapping?.tables ?? {}).map(([key, t]) => ({
    source_table: key,
    relationship: t.relationship,
    join_type: t.relationship === 'join' ? (t.join_type ?? 'left') : null,
    join_on: t.relationship === 'join' ? (t.join_on ?? null) : null,
    accept_fan_out: t.relationship === 'join' && t.accept_fan_out === true,
  }));
  return entries.sort(
    (a, b) =>
      Number(a.relationship === 'join') - Number(b.relationship === 'join') ||
      a.source_table.localeCompare(b.source_table),
  );
}

export async function getTables(scope: CallerScope, tableName: string) {
  const workspace = await currentWorkspace(scope);
  targetTableOf(workspace, tableName);
  const mapping = await findMapping(scope.em, workspace, tableName);
  const tables = tablesList(mapping);
  return {
    table_name: tableName,
    primary_table: tables.find((t) => t.relationship === 'primary')?.source_table ?? null,
    tables,
  };
}

export async function setTable(
  scope: CallerScope,
  input: {
    table_name: string;
    source_table: string;
    relationship: 'primary' | 'join';
    join_type?: string;
    join_on?: string;
    accept_fan_out?: boolean;
  },
) {
  await editMapping(scope, input.table_name, async ({ workspace, mapping }) => {
    const { table, catalog } = await resolveSourceTable(
      scope,
      workspace,
      input.source_table,
      await sourceCatalog(scope, workspace),
    );
    const entry: MappingTable = { relationship: input.relationship };
    if (input.relationship === 'join') {
      if (!input.join_on)
        throw new AppError(
          'BAD_REQUEST',
          `A join needs join_on: a condition such as customers.id = orders.customer_id`,
        );
      const keys = [...new Set([...Object.keys(mapping.tables), table.key])];
      const { tables } = await checkExpression(input.join_on, keys, catalog, `Join ON of ${table.key}`);
      if (!tables.has(table.key))
        throw new AppError('BAD_REQUEST', `Join ON of ${table.key} does not use ${table.key}`);
      entry.join_type = (input.join_type ?? 'left') as JoinType;
      entry.join_on = input.join_on;
      if (input.accept_fan_out) entry.accept_fan_out = true;
    } else if (input.join_type || input.join_on || input.accept_fan_out !== undefined) {
      throw new AppError(
        'BAD_REQUEST',
        'join_type, join_on and accept_fan_out apply to a join, not to the primary table',
      );
    }
    const tables = { ...mapping.tables };
    // A table written by its bare name replaces the same table stored under its qualified key.
    delete tables[input.source_table];
    tables[table.key] = entry;
    mapping.tables = tables;
  });
  return getTables(scope, input.table_name);
}

export async function removeTable(scope: CallerScope, input: { table_name: string; source_table: string }) {
  const { mapping, workspace, result } = await editMapping(
    scope,
    input.table_name,
    async ({ mapping }) => {
      const key = mappingTableResolver(Object.keys(mapping.tables))(input.source_table);
      if (!key) throw notFound(`Source table ${input.source_table} in the mapping of ${input.table_name}`);
      const { [key]: _removed, ...rest } = mapping.tables;
      mapping.tables = rest;
      const removed = mapping.connections.filter((c) => splitSourceField(c.source_field)?.table === key);
      mapping.connections = mapping.connections.filter((c) => !removed.includes(c));
      return removed;
    },
    { create: false },
  );
  return { ...(await mappingView(scope, workspace, mapping)), removed_connections: result };
}

function walkNodes(node: unknown, visit: (kind: string, value: Record<string, any>) => void) {
  if (Array.isArray(node)) {
    for (const item of node) walkNodes(item, visit);
    return;
  }
  if (!node || typeof node !== 'object') return;
  for (const [kind, value] of Object.entries(node as Record<string, unknown>)) {
    if (value && typeof value === 'object' && /^[A-Z]/.test(kind)) visit(kind, value as Record<string, any>);
    walkNodes(value, visit);
  }
}

const NUMERIC = new Set(['integer', 'bigint', 'numeric']);
const TIMES = new Set(['date', 'timestamp', 'timestamptz']);
function comparable(a: string, b: string): boolean {
  const fa = portableFamily(a);
  const fb = portableFamily(b);
  return fa === fb || (NUMERIC.has(fa) && NUMERIC.has(fb)) || (TIMES.has(fa) && TIMES.has(fb));
}

/**
 * Every problem of the table relationships at once: exactly one primary, joins reachable, tables
 * and join columns present in the source, the columns compared by `=` of comparable types.
 */
export async function validateTables(scope: CallerScope, tableName: string) {
  const workspace = await currentWorkspace(scope);
  targetTableOf(workspace, tableName);
  const mapping = await findMapping(scope.em, workspace, tableName);
  const problems: AppErrorIssue[] = [];
  const tables = mapping?.tables ?? {};
  if (Object.keys(tables).length === 0)
    problems.push({ path: ['tables'], message: 'The mapping has no tables' });
  const catalog = await sourceCatalog(scope, workspace, { refresh: true });
  for (const key of Object.keys(tables))
    if (!catalog.byKey.has(key))
      problems.push({
        path: ['tables', key],
        message: `Source table ${key} does not exist in the source database`,
      });
  // The relationship rules of the generator, on the tables alone.
  try {
    await planMapping({ table_name: tableName, tables, connections: [] }, { name: tableName, columns: [] });
  } catch (error) {
    if (!(error instanceof AppError)) throw error;
    problems.push(...(error.details.issues ?? [{ path: ['tables'], message: error.message }]));
  }
  const resolve = mappingTableResolver(Object.keys(tables));
  const columnType = (fields: string[]): { name: string; type: string | null; problem?: string } => {
    const column = fields.at(-1)!;
    const written = fields.slice(0, -1).join('.');
    const key =
      fields.length === 1
        ? Object.keys(tables).length === 1
          ? Object.keys(tables)[0]
          : undefined
        : resolve(written);
    const name = fields.join('.');
    if (!key) return { name, type: null };
    const table = catalog.byKey.get(key);
    if (!table) return { name, type: null };
    const type = table.columns.get(column);
    return type
      ? { name, type }
      : { name, type: null, problem: `Source table ${key} has no column ${column}` };
  };
  for (const [key, relation] of Object.entries(tables)) {
    if (relation.relationship !== 'join' || !relation.join_on) continue;
    let ast: ExpressionNode;
    try {
      ast = (await parseExpression(relation.join_on)).ast;
    } catch {
      continue; // reported by the generator's rules above
    }
    const columnRefs: string[][] = [];
    walkNodes(ast, (kind, value) => {
      if (kind === 'ColumnRef')
        columnRefs.push((value.fields as any[]).filter((f) => f.String).map((f) => f.String.sval));
    });
    for (const fields of columnRefs) {
      const { problem } = columnType(fields);
      if (problem)
        problems.push({ path: ['tables', key, 'join_on'], message: `Join ON of ${key}: ${problem}` });
    }
    walkNodes(ast, (kind, value) => {
      if (kind !== 'A_Expr' || value.kind !== 'AEXPR_OP') return;
      const op = value.name?.[0]?.String?.sval;
      if (!['=', '<>', '!=', '<', '>', '<=', '>='].includes(op)) return;
      const side = (n: any) =>
        n?.ColumnRef
          ? columnType(n.ColumnRef.fields.filter((f: any) => f.String).map((f: any) => f.String.sval))
          : null;
      const left = side(value.lexpr);
      const right = side(value.rexpr);
      if (left?.type && right?.type && !comparable(left.type, right.type))
        problems.push({
          path: ['tables', key, 'join_on'],
          message: `Join ON of ${key}: ${left.name} (${left.type}) and ${right.name} (${right.type}) are not comparable types`,
        });
    });
  }
  // Fan-out only means something for joins that are otherwise sound.
  const fanOut = problems.length
    ? []
    : await measureFanOut(await sourceWarehouseOf(scope, workspace), tableName, tables);
  problems.push(...fanOutProblems(fanOut));
  return { table_name: tableName, valid: problems.length === 0, problems, fan_out: fanOut };
}
