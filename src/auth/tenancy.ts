import { AppError } from '../app-error.ts';
import type { Principal } from './principal.ts';

/**
 * The tenant rule: every query of an organization's data filters by the caller's organization,
 * taken from here. A caller without one (a super admin) cannot act inside an organization.
 */
export function organizationOf(principal: Principal): string {
  if (!principal.organizationId) throw new AppError('FORBIDDEN', 'This route acts inside an organization');
  return principal.organizationId;
}

/**
 * The second wall behind those filters: every statement of a member's request runs in a transaction as
 * the role `dimas_tenant` with the caller's organization set, and the row-level security policies
 * (migration row_level_security) then show and accept only that organization's rows. The role rides in
 * the same `set_config` as the organization, which saves a round trip over `set local role`. Super
 * admins work across organizations and stay on the connecting role.
 */
export function tenantSession(organizationId: string) {
  return { variables: { role: 'dimas_tenant', 'dimas.organization_id': organizationId } };
}
