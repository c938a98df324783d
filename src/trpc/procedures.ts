import { AppError } from '../app-error.ts';
import { hasPermission, type Permission } from '../auth/permissions.ts';
import type { Principal } from '../auth/principal.ts';
import type { AuthedContext } from './context.ts';
import { organizationOf } from '../auth/tenancy.ts';
import { t } from './init.ts';
import { toTRPCError } from './errors.ts';
import { refuseUnknownFields } from './body-rule.ts';

/** Every procedure's errors pass through here: AppError → its status, anything unknown → a bare 500. */
const translateErrors = t.middleware(async ({ next, path, getRawInput }) => {
  try {
    await refuseUnknownFields(path, await getRawInput());
  } catch (error) {
    throw toTRPCError(error);
  }
  const result = await next();
  if (!result.ok) throw toTRPCError(result.error);
  return result;
});

export const router = t.router;
export const createCallerFactory = t.createCallerFactory;

export const publicProcedure = t.procedure.use(translateErrors);

/**
 * A guard: authenticates the caller, applies `check`, and translates errors, all in one middleware.
 * tRPC copies the context once per middleware, which was a measurable share of every request
 * (bench/api-overhead.ts), so each guarded procedure has exactly one.
 */
function guarded(check?: (principal: Principal) => void) {
  return t.procedure.use(async ({ ctx, meta, next, path, getRawInput }) => {
    let principal: Principal | null;
    try {
      principal = ctx.bearer ? await ctx.deps.authenticator.authenticate(ctx, ctx.bearer) : null;
      if (!principal) throw new AppError('UNAUTHORIZED', 'Missing or invalid credentials');
      if (principal.mustChangePassword && !meta?.allowPendingPasswordChange)
        throw new AppError('FORBIDDEN', 'Change your temporary password first', {
          reason: 'PASSWORD_CHANGE_REQUIRED',
        });
      check?.(principal);
      await refuseUnknownFields(path, await getRawInput());
      if (principal.organizationId && !principal.isSuperAdmin) ctx.setTenant(principal.organizationId);
    } catch (error) {
      throw toTRPCError(error);
    }
    // The principal joins the request's own context object rather than a copy: tRPC copies the context
    // for `next({ ctx })` (reading every property, so the lazily forked entity manager would be forked),
    // and passes it on unchanged for `next()` — which an absent `ctx` here amounts to.
    (ctx as AuthedContext).principal = principal;
    const result = await next({ ctx: undefined as unknown as { principal: Principal } });
    if (!result.ok) throw toTRPCError(result.error);
    return result;
  });
}

/** Guard `user`: any signed-in user or service account. The one place credentials are checked. */
export const authedProcedure = guarded();

/** Guard `<permission>`: a member of an organization whose roles grant it (org.admin grants all). */
export const permissionProcedure = (permission: Permission) =>
  guarded((principal) => {
    organizationOf(principal);
    if (!hasPermission(principal.permissions, permission))
      throw new AppError('FORBIDDEN', `Missing permission ${permission}`);
  });

/** Guard `super_admin`. */
export const superAdminProcedure = guarded((principal) => {
  if (!principal.isSuperAdmin) throw new AppError('FORBIDDEN', 'Super admin only');
});
