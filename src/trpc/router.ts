import { router } from './procedures.ts';
import { registerInputRules } from './body-rule.ts';
import { authRouter } from '../modules/auth/auth.router.ts';
import { adminRouter } from '../modules/admin/admin.router.ts';
import { serviceAccountsRouter } from '../modules/service-accounts/service-accounts.router.ts';
import { sourcesRouter } from '../modules/sources/sources.router.ts';
import { workspacesRouter } from '../modules/workspaces/workspaces.router.ts';
import { schemasRouter } from '../modules/schemas/schemas.router.ts';
import { audiencesRouter } from '../modules/audiences/audiences.router.ts';
import { mappingsRouter } from '../modules/mappings/mappings.router.ts';
import { pipelinesRouter } from '../modules/pipelines/pipelines.router.ts';
import { analyticsRouter } from '../modules/analytics/analytics.router.ts';
import { queriesRouter } from '../modules/queries/queries.router.ts';
import { discoveryRouter } from '../modules/discovery/discovery.router.ts';
import { monitoringRouter } from '../modules/monitoring/monitoring.router.ts';
import { alertsRouter } from '../modules/alerts/alerts.router.ts';

export const appRouter = router({
  auth: authRouter,
  admin: adminRouter,
  serviceAccounts: serviceAccountsRouter,
  sources: sourcesRouter,
  workspaces: workspacesRouter,
  schemas: schemasRouter,
  audiences: audiencesRouter,
  mappings: mappingsRouter,
  pipelines: pipelinesRouter,
  analytics: analyticsRouter,
  queries: queriesRouter,
  discovery: discoveryRouter,
  monitoring: monitoringRouter,
  alerts: alertsRouter,
});

registerInputRules(appRouter._def.procedures);

export type AppRouter = typeof appRouter;
