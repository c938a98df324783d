import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import * as s from './alerts.schemas.ts';
import * as alerts from './alerts.service.ts';

const tag = 'alerts';
const base = '/api/api/alerts';

export const alertsRouter = router({
  active: permissionProcedure('workspace.read')
    .meta(rest('GET', `${base}/active`, 'Active data-quality alerts of a workspace, most severe first', tag))
    .input(s.activeAlertsInput)
    .output(s.activeAlertsOutput)
    .query(({ ctx, input }) => alerts.activeAlerts(ctx, input)),

  dismiss: permissionProcedure('workspace.write')
    .meta(
      rest(
        'POST',
        `${base}/{alert_id}/dismiss`,
        'Dismiss an alert with a reason, optionally for a snooze period',
        tag,
      ),
    )
    .input(s.dismissInput)
    .output(s.alertView)
    .mutation(({ ctx, input }) => alerts.dismissAlert(ctx, input)),
});
