import type { Scope } from '../../deps.ts';
import type { TargetSchema } from '../schemas/schemas.schemas.ts';
import type { WorkspaceEntity } from './workspaces.entity.ts';

export interface WorkspaceFile {
  path: string;
  content: string;
}

/** What later areas know about a workspace; workflow-status and metrics are derived from it. */
export interface WorkspaceFacts {
  mapped_tables: number;
  mapped_fields: number;
  confirmed_connections: number;
  suggested_connections: number;
  open_ambiguities: number;
  project_generated: boolean;
  project_drift: boolean | null;
  materialized_tables: number;
  last_materialized_at: Date | null;
  schema_synced_at: Date | null;
  schema_sync_status: 'not_synced' | 'in_sync' | 'out_of_sync';
}

const NO_FACTS: WorkspaceFacts = {
  mapped_tables: 0,
  mapped_fields: 0,
  confirmed_connections: 0,
  suggested_connections: 0,
  open_ambiguities: 0,
  project_generated: false,
  project_drift: null,
  materialized_tables: 0,
  last_materialized_at: null,
  schema_synced_at: null,
  schema_sync_status: 'not_synced',
};

export interface StaleConnection {
  target_table: string;
  target_field: string;
  source_field: string | null;
  reason: string;
}

/**
 * How the areas built on workspaces (mappings, pipelines, schema sync, materialization) take part in
 * the workspace's files, status and schema saves without this module importing them. An area
 * registers once at module load (e.g. at the top of its service file):
 *
 *   registerWorkspaceExtension({ name: 'mappings', files: …, facts: …, reconcileSchema: … });
 *
 * Counters returned by several extensions are added up; flags are or-ed; dates take the newest.
 */
export interface WorkspaceExtension {
  name: string;
  /** Files this area contributes to the projection (e.g. mappings/<table>.json, models/*.sql). */
  files?(scope: Scope, workspace: WorkspaceEntity): Promise<WorkspaceFile[]>;
  facts?(scope: Scope, workspace: WorkspaceEntity): Promise<Partial<WorkspaceFacts>>;
  /**
   * Called inside the schema save, before the new schema is flushed: flag (never drop) what refers to
   * fields that the new schema no longer has, and report them.
   */
  reconcileSchema?(
    scope: Scope,
    workspace: WorkspaceEntity,
    schema: TargetSchema | null,
  ): Promise<StaleConnection[]>;
}

const extensions = new Map<string, WorkspaceExtension>();

export function registerWorkspaceExtension(extension: WorkspaceExtension): void {
  extensions.set(extension.name, extension);
}

const SYNC_RANK = { not_synced: 0, in_sync: 1, out_of_sync: 2 } as const;

export async function collectFacts(scope: Scope, workspace: WorkspaceEntity): Promise<WorkspaceFacts> {
  const facts: WorkspaceFacts = { ...NO_FACTS };
  for (const extension of extensions.values()) {
    if (!extension.facts) continue;
    const part = await extension.facts(scope, workspace);
    for (const key of [
      'mapped_tables',
      'mapped_fields',
      'confirmed_connections',
      'suggested_connections',
      'open_ambiguities',
      'materialized_tables',
    ] as const)
      facts[key] += part[key] ?? 0;
    facts.project_generated ||= part.project_generated ?? false;
    if (part.project_drift != null)
      facts.project_drift = (facts.project_drift ?? false) || part.project_drift;
    facts.last_materialized_at = newest(facts.last_materialized_at, part.last_materialized_at);
    facts.schema_synced_at = newest(facts.schema_synced_at, part.schema_synced_at);
    if (part.schema_sync_status && SYNC_RANK[part.schema_sync_status] > SYNC_RANK[facts.schema_sync_status])
      facts.schema_sync_status = part.schema_sync_status;
  }
  return facts;
}

function newest(a: Date | null, b: Date | null | undefined): Date | null {
  if (!b) return a;
  if (!a) return b;
  return a > b ? a : b;
}

export async function extensionFiles(scope: Scope, workspace: WorkspaceEntity): Promise<WorkspaceFile[]> {
  const files: WorkspaceFile[] = [];
  for (const extension of extensions.values())
    if (extension.files) files.push(...(await extension.files(scope, workspace)));
  return files;
}

export async function reconcileSchema(
  scope: Scope,
  workspace: WorkspaceEntity,
  schema: TargetSchema | null,
): Promise<StaleConnection[]> {
  const stale: StaleConnection[] = [];
  for (const extension of extensions.values())
    if (extension.reconcileSchema) stale.push(...(await extension.reconcileSchema(scope, workspace, schema)));
  return stale;
}
