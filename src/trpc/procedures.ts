import { AppError } from '../app-error.ts';
import { hasPermission, type Permission } from '../auth/permissions.ts';
import { organizationOf } from '../auth/tenancy.ts';
import { t } from './init.ts';
import { toTRPCError } from './errors.ts';

/** Every procedure's errors pass through here: AppError → its status, anything unknown → a bare 500. */
const translateErrors = t.middleware(async ({ next }) => {
  const result = await next();
  if (!result.ok) throw toTRPCError(result.error);
  return result;
});

export const router = t.router;
export const createCallerFactory = t.createCallerFactory;

export const publicProcedure = t.procedure.use(translateErrors);

/** Guard `user`: any signed-in user or service account. The one place credentials are checked. */
export const authedProcedure = publicProcedure.use(async ({ ctx, meta, next }) => {
  const principal = ctx.bearer ? await ctx.deps.authenticator.authenticate(ctx.em, ctx.bearer) : null;
  if (!principal) throw new AppError('UNAUTHORIZED', 'Missing or invalid credentials');
  if (principal.mustChangePassword && !meta?.allowPendingPasswordChange)
    throw new AppError('FORBIDDEN', 'Change your temporary password first (POST /api/auth/change-password)', {
      reason: 'PASSWORD_CHANGE_REQUIRED',
    });
  return next({ ctx: { ...ctx, principal } });
});

/** Guard `<permission>`: a member of an organization whose roles grant it (org.admin grants all). */
export const permissionProcedure = (permission: Permission) =>
  authedProcedure.use(({ ctx, next }) => {
    organizationOf(ctx.principal);
    if (!hasPermission(ctx.principal.permissions, permission))
      throw new AppError('FORBIDDEN', `Missing permission ${permission}`);
    return next();
  });

/** Guard `super_admin`. */
export const superAdminProcedure = authedProcedure.use(({ ctx, next }) => {
  if (!ctx.principal.isSuperAdmin) throw new AppError('FORBIDDEN', 'Super admin only');
  return next();
});
