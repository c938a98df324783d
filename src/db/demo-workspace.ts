import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../deps.ts';
import type { Principal } from '../auth/principal.ts';
import { Organization, User } from '../modules/users/users.entity.ts';
import { currentWorkspace, selectWorkspace } from '../modules/workspaces/workspaces.service.ts';
import { Workspace } from '../modules/workspaces/workspaces.entity.ts';
import type { DemoWarehouse } from '../warehouse/demo.ts';
import { DEMO_DOMAIN, DEMO_WORKSPACE } from './seed.ts';

// The demo organization's side of the embedded mode: its workspace follows the demo warehouse.

/** Does `stored` name where the demo warehouse listened last time (so it should follow the new port)? */
function pointsAtPreviousDemo(stored: Record<string, unknown>, demo: DemoWarehouse): boolean {
  return (
    demo.previousPort !== 0 &&
    stored.port === demo.previousPort &&
    stored.host === demo.host &&
    stored.database === demo.database &&
    stored.user === demo.user
  );
}

/**
 * Points the demo organization's workspace at the demo warehouse: sets the configs when unset, and
 * follows a changed port; a config the user changed to another database is left alone.
 */
export async function connectDemoWorkspace(deps: AppDeps, demo: DemoWarehouse): Promise<void> {
  const em = deps.orm.em.fork() as EntityManager;
  const org = await em.findOne(Organization, { domain: DEMO_DOMAIN });
  if (!org) return;
  const workspace = await em.findOne(Workspace, { organization: org.id, name: DEMO_WORKSPACE });
  if (!workspace) return;
  const firstConnection = !workspace.sourceConfig;
  const sealed = deps.secrets.encrypt(demo.password);
  for (const [field, config] of [
    ['sourceConfig', demo.sourceConfig],
    ['targetConfig', demo.targetConfig],
  ] as const) {
    const stored = workspace[field] as Record<string, unknown> | null | undefined;
    if (!stored) workspace[field] = { ...config, password: sealed };
    else if (
      (stored.port === demo.port && stored.host === demo.host && stored.user === demo.user) ||
      pointsAtPreviousDemo(stored, demo)
    )
      // Still the demo warehouse: follow its port and its password (configs of older starts had none).
      workspace[field] = { ...stored, port: demo.port, password: sealed };
  }
  await em.flush();
  if (firstConnection) await selectForDemoAdmin(deps, em, org.id);
}

/** Out of the box, the demo admin works in the demo workspace (unless it already chose one). */
async function selectForDemoAdmin(deps: AppDeps, em: EntityManager, organizationId: string) {
  const admin = await em.findOne(User, { organization: organizationId, username: 'admin' });
  if (!admin) return;
  const principal: Principal = {
    kind: 'user',
    id: admin.id,
    organizationId,
    username: admin.username,
    isSuperAdmin: false,
    mustChangePassword: false,
    permissions: new Set(),
    expiresAt: null,
  };
  const scope = { em, deps, principal };
  try {
    await currentWorkspace(scope);
  } catch {
    await selectWorkspace(scope, DEMO_WORKSPACE);
  }
}
