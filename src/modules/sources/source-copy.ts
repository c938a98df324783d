import { AppError } from '../../app-error.ts';
import type { Scope } from '../../deps.ts';
import type { ConnectionConfig } from '../../warehouse/config.ts';
import { rawSchemaOf } from '../../warehouse/mysql-load.ts';
import { connectionConfig, type WorkspaceEntity } from '../workspaces/workspaces.service.ts';

/**
 * The source as mappings, previews, model tests, materialization and the generated project read it.
 * A PostgreSQL source is read where it is; a MySQL / MariaDB source through its raw copy in the
 * target warehouse (extract–load, then transform), so every generated statement stays PostgreSQL.
 */
export function mappedSourceConfig(scope: Scope, workspace: WorkspaceEntity): ConnectionConfig | null {
  const source = connectionConfig(scope, workspace, 'source');
  if (source?.type !== 'mysql') return source;
  const target = connectionConfig(scope, workspace, 'target');
  if (!target)
    throw new AppError(
      'CONFLICT',
      `Workspace ${workspace.name} reads its MySQL source from a raw copy in the target warehouse: configure a target, then load the source into it (schema sync with load_source)`,
      { reason: 'NO_TARGET_CONFIG' },
    );
  return { ...target, schemas: [rawSchemaOf(source)], tables: source.tables, ctes: undefined };
}
