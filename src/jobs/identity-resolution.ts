import type { AppDeps } from '../deps.ts';
import { buildIdentityGraph } from '../modules/monitoring/identity.service.ts';

export const IDENTITY_RESOLUTION_KIND = 'identity-resolution';

export interface IdentityResolutionPayload extends Record<string, unknown> {
  workspace_id: string;
  reason: string;
}

const registered = new WeakMap<AppDeps, Promise<void>>();

/** Registers the job kind once per server, before the first enqueue. */
export function ensureIdentityResolutionJob(deps: AppDeps): Promise<void> {
  let ready = registered.get(deps);
  if (!ready) {
    ready = deps.jobs.register<IdentityResolutionPayload>(
      IDENTITY_RESOLUTION_KIND,
      async (payload, context) => {
        await context.progress({ phase: 'resolving' });
        return buildIdentityGraph(deps, {
          organizationId: context.organizationId,
          workspaceId: payload.workspace_id,
          runId: context.runId,
        });
      },
      // A build replaces the graph in one transaction, so a retry starts from a clean state.
      { retryLimit: 1, retryDelaySeconds: 10, timeoutSeconds: 4 * 3600 },
    );
    registered.set(deps, ready);
  }
  return ready;
}

/** One build at a time per workspace: a second request while one is queued or running joins it. */
export async function enqueueIdentityResolution(
  deps: AppDeps,
  input: { organizationId: string; workspaceId: string; reason: string },
) {
  await ensureIdentityResolutionJob(deps);
  const { run, created } = await deps.jobs.enqueue(
    IDENTITY_RESOLUTION_KIND,
    { workspace_id: input.workspaceId, reason: input.reason },
    { organizationId: input.organizationId, workspaceId: input.workspaceId, singletonKey: input.workspaceId },
  );
  return { run_id: run.id, status: run.status, created };
}
