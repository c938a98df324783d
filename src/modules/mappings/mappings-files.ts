import type { EntityManager } from '@mikro-orm/postgresql';
import type { Scope } from '../../deps.ts';
import { type WorkspaceEntity } from '../workspaces/workspaces.service.ts';
import {
  registerWorkspaceExtension,
  type StaleConnection,
  type WorkspaceFile,
} from '../workspaces/workspace-extensions.ts';
import { MappingCommit, TableMapping } from './mappings.entity.ts';
import { mappingDocument, WILDCARD_FIELD } from './mappings.service.ts';

// ---- the workspace's files, facts and schema reconciliation ----

export async function latestCommits(em: EntityManager, workspace: WorkspaceEntity) {
  const commits = await em.find(
    MappingCommit,
    { organization: workspace.organization.id, workspace: workspace.id },
    { orderBy: { tableName: 'asc', version: 'desc' } },
  );
  const latest = new Map<string, (typeof commits)[number]>();
  for (const c of commits) if (!latest.has(c.tableName)) latest.set(c.tableName, c);
  return latest;
}

const mappingFilePath = (tableName: string) => `mappings/${tableName}.json`;
const sqlFilePath = (tableName: string) => `mappings/${tableName}.sql`;

async function mappingFiles(scope: Scope, workspace: WorkspaceEntity): Promise<WorkspaceFile[]> {
  const mappings = await scope.em.find(TableMapping, {
    organization: workspace.organization.id,
    workspace: workspace.id,
  });
  const files: WorkspaceFile[] = mappings.map((m) => ({
    path: mappingFilePath(m.tableName),
    content: JSON.stringify(mappingDocument(m), null, 2) + '\n',
  }));
  for (const [table, commit] of await latestCommits(scope.em, workspace))
    files.push({
      path: sqlFilePath(table),
      // A carriage return ends a SQL comment too: the rest of a message's line would run as SQL.
      content: `-- ${table}, committed version ${commit.version}: ${commit.message.split(/[\r\n]/)[0]}\n${commit.sql}\n`,
    });
  return files;
}

registerWorkspaceExtension({
  name: 'mappings',
  files: mappingFiles,
  async facts(scope, workspace) {
    const mappings = await scope.em.find(TableMapping, {
      organization: workspace.organization.id,
      workspace: workspace.id,
    });
    let mappedTables = 0;
    let mappedFields = 0;
    let confirmed = 0;
    let suggested = 0;
    let ambiguities = 0;
    let materialized = 0;
    let last: Date | null = null;
    for (const m of mappings) {
      const fields = new Set<string>();
      for (const c of m.connections) {
        if (c.stale) continue;
        if (c.status === 'confirmed') confirmed++;
        else suggested++;
        if (c.target_field !== WILDCARD_FIELD) fields.add(c.target_field);
      }
      for (const [field, t] of Object.entries(m.transformations)) if (!t.stale) fields.add(field);
      if (fields.size) mappedTables++;
      mappedFields += fields.size;
      ambiguities += m.ambiguities.length;
      if (m.materializedAt) {
        materialized++;
        if (!last || m.materializedAt > last) last = m.materializedAt;
      }
    }
    return {
      mapped_tables: mappedTables,
      mapped_fields: mappedFields,
      confirmed_connections: confirmed,
      suggested_connections: suggested,
      open_ambiguities: ambiguities,
      materialized_tables: materialized,
      last_materialized_at: last,
    };
  },
  async reconcileSchema(scope, workspace, schema) {
    const mappings = await scope.em.find(TableMapping, {
      organization: workspace.organization.id,
      workspace: workspace.id,
    });
    const stale: StaleConnection[] = [];
    for (const m of mappings) {
      const table = schema?.tables.find((t) => t.name === m.tableName);
      const columns = new Set(table?.columns.map((c) => c.name) ?? []);
      const why = (field: string) =>
        !table
          ? `table ${m.tableName} is no longer in the schema`
          : columns.has(field)
            ? null
            : `column ${m.tableName}.${field} is no longer in the schema`;
      let changed = false;
      const connections = m.connections.map((c) => {
        const reason =
          c.target_field === WILDCARD_FIELD ? (table ? null : why(c.target_field)) : why(c.target_field);
        if (reason)
          stale.push({
            target_table: m.tableName,
            target_field: c.target_field,
            source_field: c.source_field,
            reason,
          });
        if ((c.stale ?? null) !== reason) changed = true;
        return reason ? { ...c, stale: reason } : (({ stale: _s, ...rest }) => rest)(c);
      });
      const transformations = Object.fromEntries(
        Object.entries(m.transformations).map(([field, t]) => {
          const reason = why(field);
          if (reason)
            stale.push({ target_table: m.tableName, target_field: field, source_field: null, reason });
          if ((t.stale ?? null) !== reason) changed = true;
          return [field, reason ? { ...t, stale: reason } : (({ stale: _s, ...rest }) => rest)(t)];
        }),
      );
      if (changed) {
        m.connections = connections;
        m.transformations = transformations;
        m.version += 1;
      }
    }
    return stale;
  },
});
