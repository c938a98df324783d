import type { AppDeps } from '../deps.ts';
import { ensureAudienceJobs } from '../modules/audiences/audiences.service.ts';
import { startExportScheduler } from '../modules/audiences/audiences-exports.service.ts';
import { ensureMonitoringRunJob, startMonitoringScheduler } from './monitoring-run.ts';
import { ensureIdentityResolutionJob } from './identity-resolution.ts';
import { ensureHypothesisTestJob } from './hypothesis-test.ts';
import { ensureMaterializeJob } from './materialize.ts';
import { ensureSourceLoadJob } from '../modules/sources/sources.jobs.ts';

/**
 * Every kind of long work is registered before the queue starts, so that runs queued before a
 * restart are picked up at once rather than on the next enqueue of the same kind.
 */
export async function registerJobHandlers(deps: AppDeps): Promise<void> {
  await ensureAudienceJobs(deps);
  await ensureMonitoringRunJob(deps);
  await ensureIdentityResolutionJob(deps);
  await ensureHypothesisTestJob(deps);
  await ensureMaterializeJob(deps);
  await ensureSourceLoadJob(deps);
}

/** Periodic work (scheduled exports); returns the function that stops it. */
export function startSchedulers(deps: AppDeps): () => void {
  const stops = [startExportScheduler(deps), startMonitoringScheduler(deps)];
  return () => stops.forEach((stop) => stop());
}
