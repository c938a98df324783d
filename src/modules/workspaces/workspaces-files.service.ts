import { createTwoFilesPatch, structuredPatch } from 'diff';
import type { CallerScope, Scope } from '../../deps.ts';
import { extensionFiles, type WorkspaceFile } from './workspace-extensions.ts';
import { WorkspaceCommit, type WorkspaceEntity } from './workspaces.entity.ts';
import { maskedConfig, targetSchemaOf, workspaceByName } from './workspaces.service.ts';
import { maskSettingsSecrets } from '../schemas/reverse-etl.service.ts';

const json = (value: unknown) => JSON.stringify(value, null, 2) + '\n';

/**
 * The workspace as files (DESIGN §5): schema.json, prompts, the config without secrets, plus what the
 * registered extensions contribute (mappings/*.json, the transformation project). Sorted by path.
 */
export async function workspaceFiles(scope: Scope, workspace: WorkspaceEntity): Promise<WorkspaceFile[]> {
  const files: WorkspaceFile[] = [];
  const schema = targetSchemaOf(workspace);
  if (schema) files.push({ path: 'schema.json', content: json(schema) });
  if (workspace.systemPrompt != null)
    files.push({ path: 'prompts/system_prompt.md', content: workspace.systemPrompt });
  if (workspace.successCriteriaPrompt != null)
    files.push({ path: 'prompts/success_criteria.md', content: workspace.successCriteriaPrompt });
  files.push({
    path: 'workspace.json',
    content: json({
      name: workspace.name,
      description: workspace.description,
      schema_template: workspace.schemaTemplate ?? null,
      source_config: maskedConfig(workspace, 'source'),
      target_config: maskedConfig(workspace, 'target'),
      settings: maskSettingsSecrets(workspace.settings),
    }),
  });
  files.push(...(await extensionFiles(scope, workspace)));
  return files.sort((a, b) => a.path.localeCompare(b.path));
}

async function lastCommit(scope: Scope, workspace: WorkspaceEntity) {
  return scope.em.findOne(
    WorkspaceCommit,
    { workspace: workspace.id, organization: workspace.organization.id },
    { orderBy: { createdAt: 'desc' } },
  );
}

/** Records the current projection as a commit (mappings commit, VCS push). */
export async function recordWorkspaceCommit(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  message: string,
): Promise<{ id: string; created_at: Date }> {
  const commit = scope.em.create(WorkspaceCommit, {
    organization: workspace.organization.id,
    workspace: workspace.id,
    message,
    author: scope.principal.username,
    files: await workspaceFiles(scope, workspace),
  });
  await scope.em.flush();
  return { id: commit.id, created_at: commit.createdAt };
}

function countLines(patch: ReturnType<typeof structuredPatch>) {
  let additions = 0;
  let deletions = 0;
  for (const hunk of patch.hunks)
    for (const line of hunk.lines) {
      if (line.startsWith('+')) additions++;
      else if (line.startsWith('-')) deletions++;
    }
  return { additions, deletions };
}

export async function gitDiff(scope: CallerScope, name: string) {
  const workspace = await workspaceByName(scope, name);
  const base = await lastCommit(scope, workspace);
  const before = new Map((base?.files ?? []).map((f) => [f.path, f.content]));
  const after = new Map((await workspaceFiles(scope, workspace)).map((f) => [f.path, f.content]));
  const paths = [...new Set([...before.keys(), ...after.keys()])].sort();
  const files = [];
  let diff = '';
  for (const path of paths) {
    const old = before.get(path);
    const now = after.get(path);
    if (old === now) continue;
    const status: 'added' | 'deleted' | 'modified' =
      old === undefined ? 'added' : now === undefined ? 'deleted' : 'modified';
    const oldName = old === undefined ? '/dev/null' : `a/${path}`;
    const newName = now === undefined ? '/dev/null' : `b/${path}`;
    diff += `diff --git a/${path} b/${path}\n`;
    if (status === 'added') diff += 'new file mode 100644\n';
    if (status === 'deleted') diff += 'deleted file mode 100644\n';
    // createTwoFilesPatch starts with an "Index"/"====" header git does not write; drop it.
    diff += createTwoFilesPatch(oldName, newName, old ?? '', now ?? '', '', '', { context: 3 })
      .split('\n')
      .filter((line, i) => !(i === 0 && line.startsWith('=')))
      .join('\n')
      .replace(/^(---|\+\+\+) (\S+)\t$/gm, '$1 $2');
    files.push({ path, status, ...countLines(structuredPatch(oldName, newName, old ?? '', now ?? '')) });
  }
  return {
    workspace_name: workspace.name,
    base_commit: base ? { id: base.id, message: base.message, created_at: base.createdAt } : null,
    has_changes: files.length > 0,
    files,
    diff,
  };
}

export async function downloadFiles(scope: CallerScope, name: string) {
  const workspace = await workspaceByName(scope, name);
  return {
    filename: `${workspace.name}-${new Date().toISOString().slice(0, 10)}.zip`,
    files: await workspaceFiles(scope, workspace),
  };
}
