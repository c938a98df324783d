import type { AppDeps } from '../../deps.ts';
import { registerExportJob } from './audience-export.job.ts';
import { registerMaterializeJob } from './audience-materialize.job.ts';
import { runDueExports, sealLegacyWebhookUrls } from './audiences-exports.service.ts';

/** The look for scheduled exports that are due (UTC): every minute, the finest schedule an export has. */
const DUE_EXPORTS_CRON = '* * * * *';

/** The audience area's job kinds and its periodic work; called once per server before the queue starts. */
export async function registerAudienceJobs(deps: AppDeps): Promise<void> {
  // Before any export runs or is shown: URLs saved before their query values were sealed.
  await sealLegacyWebhookUrls(deps);
  await registerMaterializeJob(deps);
  await registerExportJob(deps);
  // One look per minute in the whole cluster (the queue's scheduler), whichever process takes it.
  await deps.jobs.schedule('audience-exports-due', DUE_EXPORTS_CRON, async () => {
    await runDueExports(deps);
  });
}
