import { appendFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../deps.ts';
import { generatePassword } from '../auth/password.ts';
import { Organization, User } from '../modules/users/users.entity.ts';
import { Workspace } from '../modules/workspaces/workspaces.entity.ts';
import { createOrganizationRecord } from '../modules/auth/auth.service.ts';
import { createUser } from '../modules/users/users.service.ts';
import { nameTaken, ORGANIZATION_NAMES } from '../modules/users/names.ts';

export const DEMO_DOMAIN = 'demo.local';
export const DEMO_WORKSPACE = 'demo';

export interface SeedReport {
  lines: string[];
}

/** Credentials generated at first start are printed once and kept beside the data, readable by the owner only. */
function remember(deps: AppDeps, line: string) {
  mkdirSync(deps.env.dataDir, { recursive: true });
  appendFileSync(join(deps.env.dataDir, 'credentials.txt'), line + '\n', { mode: 0o600 });
}

async function ensureSuperAdmin(deps: AppDeps, em: EntityManager, report: SeedReport) {
  if (await em.count(User, { isSuperAdmin: true, organization: null })) return;
  const username = deps.env.SUPERADMIN_USERNAME;
  const password = deps.env.SUPERADMIN_PASSWORD ?? generatePassword({ username });
  await createUser(
    { em, deps },
    { username, password, isSuperAdmin: true, roles: [], must_change_password: false },
  );
  const line = `super admin: POST /api/auth/admin/login {"username":"${username}","password":"${password}"}`;
  if (!deps.env.SUPERADMIN_PASSWORD) {
    report.lines.push(line);
    remember(deps, line);
  } else report.lines.push(`super admin: ${username} (password from SUPERADMIN_PASSWORD)`);
}

async function ensureDemo(deps: AppDeps, em: EntityManager, report: SeedReport) {
  if (await em.count(Organization, { domain: DEMO_DOMAIN })) return;
  const password = generatePassword({ username: 'admin', domain: DEMO_DOMAIN }, 10);
  await em.transactional(async (tx) => {
    // Organization names are unique regardless of case, and another organization may be called Demo.
    const name = (await nameTaken(tx as EntityManager, ORGANIZATION_NAMES, 'Demo'))
      ? `Demo (${DEMO_DOMAIN})`
      : 'Demo';
    const org = await createOrganizationRecord(tx as EntityManager, { name, domain: DEMO_DOMAIN });
    await createUser(
      { em: tx as EntityManager, deps },
      {
        organizationId: org.id,
        isSuperAdmin: false,
        username: 'admin',
        password,
        roles: ['admin'],
        must_change_password: false,
      },
    );
    tx.create(Workspace, { organization: org.id, name: DEMO_WORKSPACE, description: 'Demo workspace' });
  });
  const line = `demo admin: POST /api/auth/login {"username":"admin","domain":"${DEMO_DOMAIN}","password":"${password}"}`;
  report.lines.push(line);
  remember(deps, line);
}

/** First start: the super admin, and in embedded mode a demo organization with a workspace. */
export async function seed(deps: AppDeps): Promise<SeedReport> {
  const report: SeedReport = { lines: [] };
  const em = deps.orm.em.fork() as EntityManager;
  await ensureSuperAdmin(deps, em, report);
  if (deps.dbKind === 'embedded' && deps.env.SEED_DEMO) await ensureDemo(deps, em, report);
  return report;
}
