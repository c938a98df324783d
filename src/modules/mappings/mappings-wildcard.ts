import type { CallerScope, Scope } from '../../deps.ts';
import { splitSourceField, type Mapping, type TargetTable } from '../../transform/mapping.ts';
import type { WorkspaceEntity } from '../workspaces/workspaces.service.ts';
import type { TableMappingEntity } from './mappings.entity.ts';
import { sourceCatalog, targetTableOf, type SourceCatalog } from './mappings-catalog.ts';

import { requireMapping, WILDCARD_FIELD } from './mappings.service.ts';

// ---- wildcard ----

/** Target columns filled by name from the wildcard tables; explicit connections and transformations win. */
function wildcardFields(mapping: TableMappingEntity, target: TargetTable, catalog: SourceCatalog | null) {
  const wildcards = mapping.connections
    .filter((c) => c.target_field === WILDCARD_FIELD && !c.stale)
    .map((c) => splitSourceField(c.source_field)!.table);
  return target.columns.map((column) => {
    const transformation = mapping.transformations[column.name];
    if (transformation && !transformation.stale)
      return {
        target_field: column.name,
        source_field: null,
        expression: transformation.expression,
        origin: 'transformation' as const,
        status: 'confirmed' as const,
      };
    const explicit = mapping.connections.filter((c) => c.target_field === column.name && !c.stale);
    const best =
      explicit.find((c) => c.status === 'confirmed') ??
      [...explicit].sort((a, b) => (b.confidence ?? 0) - (a.confidence ?? 0))[0];
    if (best)
      return {
        target_field: column.name,
        source_field: best.source_field,
        expression: null,
        origin: 'connection' as const,
        status: best.status,
      };
    for (const key of wildcards) {
      const columns = catalog?.byKey.get(key)?.columns;
      const match = columns && [...columns.keys()].find((c) => c.toLowerCase() === column.name.toLowerCase());
      if (match)
        return {
          target_field: column.name,
          source_field: `${key}.${match}`,
          expression: null,
          origin: 'wildcard' as const,
          status: 'confirmed' as const,
        };
    }
    return {
      target_field: column.name,
      source_field: null,
      expression: null,
      origin: 'unmapped' as const,
      status: null,
    };
  });
}

export async function effectiveWildcard(scope: CallerScope, tableName: string) {
  const { workspace, mapping } = await requireMapping(scope, tableName);
  const target = targetTableOf(workspace, tableName);
  const wildcardTables = mapping.connections
    .filter((c) => c.target_field === WILDCARD_FIELD)
    .map((c) => splitSourceField(c.source_field)!.table);
  const catalog = wildcardTables.length ? await sourceCatalog(scope, workspace) : null;
  return {
    table_name: tableName,
    wildcard_tables: wildcardTables,
    fields: wildcardFields(mapping, target, catalog),
  };
}

/**
 * The mapping as the generators take it: wildcards expanded into connections, stale entries (fields
 * the schema no longer has) left out.
 */
export async function generationInput(
  scope: Scope,
  workspace: WorkspaceEntity,
  mapping: TableMappingEntity,
): Promise<{ mapping: Mapping; target: TargetTable }> {
  const target = targetTableOf(workspace, mapping.tableName);
  const hasWildcard = mapping.connections.some((c) => c.target_field === WILDCARD_FIELD);
  const connections = mapping.connections
    .filter((c) => !c.stale && c.target_field !== WILDCARD_FIELD)
    .map(({ source_field, target_field, status, confidence }) => ({
      source_field,
      target_field,
      status,
      confidence,
    }));
  if (hasWildcard) {
    const catalog = await sourceCatalog(scope, workspace);
    for (const field of wildcardFields(mapping, target, catalog))
      if (field.origin === 'wildcard')
        connections.push({
          source_field: field.source_field!,
          target_field: field.target_field,
          status: 'confirmed',
          confidence: 1,
        });
  }
  const transformations = Object.fromEntries(
    Object.entries(mapping.transformations)
      .filter(([, t]) => !t.stale)
      .map(([field, t]) => [field, { expression: t.expression, description: t.description }]),
  );
  return {
    mapping: { table_name: mapping.tableName, tables: mapping.tables, connections, transformations },
    target,
  };
}
