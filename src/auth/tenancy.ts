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
