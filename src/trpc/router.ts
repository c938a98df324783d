import { router } from './procedures.ts';
import { authRouter } from '../modules/auth/auth.router.ts';
import { adminRouter } from '../modules/admin/admin.router.ts';
import { serviceAccountsRouter } from '../modules/service-accounts/service-accounts.router.ts';

export const appRouter = router({
  auth: authRouter,
  admin: adminRouter,
  serviceAccounts: serviceAccountsRouter,
});

export type AppRouter = typeof appRouter;
