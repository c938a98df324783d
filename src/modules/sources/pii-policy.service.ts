import type { CallerScope } from '../../deps.ts';
import { piiMasker } from '../../llm/pii.ts';
import { effectiveAdminSettings } from '../workspaces/workspaces-settings.service.ts';
import { targetSchemaOf, type WorkspaceEntity } from '../workspaces/workspaces.service.ts';

/**
 * The workspace's masking of personal values (admin setting mask_pii_in_samples, default on), with
 * the target schema's `pii` fields: what sample-value and preview routes show, by the same rule
 * (src/llm/pii.ts) that keeps personal values out of LLM prompts.
 */
export async function piiPolicyOf(scope: CallerScope, workspace: WorkspaceEntity) {
  const settings = await effectiveAdminSettings(scope, workspace.name);
  const piiFields = (targetSchemaOf(workspace)?.tables ?? []).flatMap((t) =>
    t.columns.filter((c) => c.pii).map((c) => c.name),
  );
  return piiMasker(settings.mask_pii_in_samples, piiFields);
}
