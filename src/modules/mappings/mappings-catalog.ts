import { AppError, notFound } from '../../app-error.ts';
import type { Scope } from '../../deps.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import {
  parseExpression,
  parseTableKey,
  type ExpressionNode,
  type TargetTable,
} from '../../transform/mapping.ts';
import { mappingCache } from '../workspaces/workspaces-cache.ts';
import {
  requiredConnectionConfig,
  targetSchemaOf,
  type WorkspaceEntity,
} from '../workspaces/workspaces.service.ts';
import { mappedSourceConfig } from '../sources/source-copy.ts';
import type { Warehouse } from '../../warehouse/warehouse.ts';

// ---- the source catalog ----

export interface CatalogTable {
  key: string;
  schema: string;
  name: string;
  /** Each column's base type (a domain's as the type it is over): what joins compare and exports read. */
  columns: Map<string, string>;
}

export interface SourceCatalog {
  tables: CatalogTable[];
  byKey: Map<string, CatalogTable>;
}

const CATALOG_KEY = 'source-catalog';

function buildCatalog(
  tables: { schema: string; name: string; columns: { name: string; base_type: string }[] }[],
) {
  const list = tables.map((t) => ({
    key: `${t.schema}.${t.name}`,
    schema: t.schema,
    name: t.name,
    columns: new Map(t.columns.map((c) => [c.name, c.base_type])),
  }));
  return { tables: list, byKey: new Map(list.map((t) => [t.key, t])) };
}

/**
 * The source database's relations and columns, what every mapping write is checked against. Cached
 * briefly per workspace (config changes invalidate it); `refresh` re-reads it, so a column created a
 * moment ago is found before a write is refused.
 */
export async function sourceCatalog(
  scope: Scope,
  workspace: WorkspaceEntity,
  options: { refresh?: boolean } = {},
): Promise<SourceCatalog> {
  const org = workspace.organization.id;
  if (!options.refresh) {
    const hit = (await mappingCache.get(
      { em: scope.em, organizationId: org },
      `${workspace.id}:${CATALOG_KEY}`,
    )) as SourceCatalog | undefined;
    if (hit) return hit;
  }
  const warehouse = await sourceWarehouseOf(scope, workspace);
  // Every relation of the configured schemas: a mapping may use a table outside the selection.
  const introspected = await warehouse.introspect({ tables: [] });
  const catalog = buildCatalog(introspected.tables);
  await mappingCache.set({ em: scope.em, organizationId: org }, `${workspace.id}:${CATALOG_KEY}`, catalog);
  return catalog;
}

/** `customers` or `shop.customers` → the catalog table; null when the source has none (or several). */
function findSourceTable(catalog: SourceCatalog, written: string): CatalogTable | 'ambiguous' | null {
  const exact = catalog.byKey.get(written);
  if (exact) return exact;
  if (written.includes('.')) return null;
  const matches = catalog.tables.filter((t) => t.name === written);
  if (matches.length > 1) return 'ambiguous';
  return matches[0] ?? null;
}

/** The canonical key (`schema.table`) of a source table, refreshing the catalog once before refusing. */
export async function resolveSourceTable(
  scope: Scope,
  workspace: WorkspaceEntity,
  written: string,
  catalog: SourceCatalog,
): Promise<{ table: CatalogTable; catalog: SourceCatalog }> {
  let found = findSourceTable(catalog, written);
  if (!found) {
    catalog = await sourceCatalog(scope, workspace, { refresh: true });
    found = findSourceTable(catalog, written);
  }
  if (found === 'ambiguous')
    throw new AppError(
      'BAD_REQUEST',
      `Source table ${written} exists in several schemas (${catalog.tables
        .filter((t) => t.name === written)
        .map((t) => t.key)
        .join(', ')}); write it as schema.table`,
    );
  if (!found)
    throw new AppError('BAD_REQUEST', `Source table ${written} does not exist in the source database`);
  return { table: found, catalog };
}

// ---- target schema ----

export function targetTableOf(workspace: WorkspaceEntity, tableName: string): TargetTable {
  const schema = targetSchemaOf(workspace);
  if (!schema)
    throw new AppError(
      'CONFLICT',
      `Workspace ${workspace.name} has no target schema: assign one first (POST /api/workspaces/target-schema/assign)`,
      { reason: 'NO_TARGET_SCHEMA' },
    );
  const table = schema.tables.find((t) => t.name === tableName);
  if (!table) throw notFound(`Table ${tableName} of the target schema ${schema.name}`);
  return table as TargetTable;
}

export function targetColumn(table: TargetTable, field: string) {
  return table.columns.find((c) => c.name === field);
}

/**
 * The source as mappings read it (a MySQL source through its raw copy in the target); 409 when none
 * is configured.
 */
export async function sourceWarehouseOf(scope: Scope, workspace: WorkspaceEntity): Promise<Warehouse> {
  const config = mappedSourceConfig(scope, workspace) ?? requiredConnectionConfig(scope, workspace, 'source');
  return warehouses(scope.deps).open(config, `${workspace.id}:source`);
}

/**
 * Resolves a table written in an expression (by key or bare name) among the mapping's tables, exactly
 * as written (unquoted names arrive folded to lower case), as the database will.
 */
export function mappingTableResolver(keys: string[]) {
  const byName = new Map<string, string>();
  for (const key of keys) {
    byName.set(key, key);
    byName.set(parseTableKey(key).name, key);
  }
  return (written: string) => byName.get(written);
}

/**
 * An expression (transformation or join ON) checked against the mapping's tables and the source
 * columns: 400 with the parser's message and position, or naming the unknown table or column.
 */
export async function checkExpression(
  expression: string,
  tableKeys: string[],
  catalog: SourceCatalog,
  what: string,
): Promise<{ ast: ExpressionNode; tables: Set<string> }> {
  let parsed: Awaited<ReturnType<typeof parseExpression>>;
  try {
    parsed = await parseExpression(expression);
  } catch (error) {
    if (error instanceof AppError)
      throw new AppError('BAD_REQUEST', `${what}: ${error.message}`, error.details);
    throw error;
  }
  const resolve = mappingTableResolver(tableKeys);
  const problems: string[] = [];
  const used = new Set<string>();
  for (const ref of parsed.refs) {
    let key: string | undefined;
    if (ref.length === 1) {
      if (tableKeys.length !== 1) {
        problems.push(
          tableKeys.length === 0
            ? `column ${ref[0]} has no table: add a source table to the mapping first`
            : `qualify column ${ref[0]} with its table`,
        );
        continue;
      }
      key = tableKeys[0];
    } else {
      const written = ref.slice(0, -1).join('.');
      key = resolve(written);
      if (!key) {
        problems.push(
          `${ref.join('.')} names table ${written}, which is not a table of this mapping (${tableKeys.join(', ') || 'none yet'})`,
        );
        continue;
      }
    }
    used.add(key);
    const column = ref.at(-1)!;
    const table = catalog.byKey.get(key);
    if (table && !table.columns.has(column)) problems.push(`source table ${key} has no column ${column}`);
  }
  if (problems.length) throw new AppError('BAD_REQUEST', `${what}: ${problems.join('; ')}`);
  return { ast: parsed.ast, tables: used };
}
