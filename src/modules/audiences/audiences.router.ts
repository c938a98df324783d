import { z } from 'zod';
import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import * as s from './audiences.schemas.ts';
import * as audiences from './audiences.service.ts';
import * as exportsService from './audiences-exports.service.ts';
import * as metrics from './audiences-metrics.service.ts';

const tag = 'audiences';
const read = permissionProcedure('workspace.read');
const write = permissionProcedure('audience.write');
const base = '/api/api/audiences';

/* Static paths (dashboard, performance-metrics, exports, conversions) come before /{audience_id}. */
export const audiencesRouter = router({
  /** Internal: the plain CSV download route in app.ts calls this for the guard and the file. */
  exportFile: read
    .input(z.object({ export_id: z.string() }))
    .query(({ ctx, input }) => exportsService.exportFile(ctx, input.export_id)),

  list: read
    .meta(rest('GET', base, 'List audiences filtered by the current target database/schema', tag))
    .input(s.audienceListInput)
    .output(s.audienceListOutput)
    .query(({ ctx, input }) => audiences.listAudiences(ctx, input)),

  create: write
    .meta(
      rest('POST', base, 'Create an audience: a rule tree or a read-only SELECT over a target table', tag),
    )
    .input(s.createAudienceInput)
    .output(s.audienceOutput)
    .mutation(({ ctx, input }) => audiences.createAudience(ctx, input)),

  dashboard: read
    .meta(
      rest(
        'GET',
        `${base}/dashboard`,
        'All audiences of the workspace with size, freshness, exports and performance (one query)',
        tag,
      ),
    )
    .input(z.object({}))
    .output(s.dashboardOutput)
    .query(({ ctx }) => audiences.dashboard(ctx)),

  metricsList: read
    .meta(
      rest(
        'GET',
        `${base}/performance-metrics`,
        'Performance metrics, filtered by segment, platform, campaign and dates',
        tag,
      ),
    )
    .input(s.metricsQuery)
    .output(s.metricsListOutput)
    .query(({ ctx, input }) => metrics.listMetrics(ctx, input)),

  metricsCreate: write
    .meta(
      rest(
        'POST',
        `${base}/performance-metrics`,
        'Create or update the performance-metrics record of (segment, platform, campaign, date)',
        tag,
      ),
    )
    .input(s.metricInput)
    .output(s.metricWriteOutput)
    .mutation(({ ctx, input }) => metrics.recordMetric(ctx, input)),

  exportCreate: write
    .meta(
      rest(
        'POST',
        `${base}/exports`,
        'Create an audience export (CSV file, PostgreSQL table or webhook)',
        tag,
      ),
    )
    .input(s.createExportInput)
    .output(s.exportWithRunOutput)
    .mutation(({ ctx, input }) => exportsService.createExport(ctx, input)),

  exportUpdate: write
    .meta(
      rest(
        'PUT',
        `${base}/exports/{export_id}`,
        'Update an audience export: schedule, field mapping, destination, pause/resume, run now',
        tag,
      ),
    )
    .input(s.updateExportInput)
    .output(s.exportWithRunOutput)
    .mutation(({ ctx, input }) => exportsService.updateExport(ctx, input)),

  conversionCreate: write
    .meta(rest('POST', `${base}/conversions`, 'Record a conversion (deduplicated on external_id)', tag))
    .input(s.conversionInput)
    .output(s.conversionWriteOutput)
    .mutation(({ ctx, input }) => metrics.recordConversion(ctx, input)),

  get: read
    .meta(rest('GET', `${base}/{audience_id}`, 'Get an audience', tag))
    .input(s.audienceIdInput)
    .output(s.audienceOutput)
    .query(({ ctx, input }) => audiences.getAudience(ctx, input.audience_id)),

  update: write
    .meta(rest('PUT', `${base}/{audience_id}`, 'Update an audience; a definition change marks it stale', tag))
    .input(s.updateAudienceInput)
    .output(s.audienceOutput)
    .mutation(({ ctx, input }) => audiences.updateAudience(ctx, input)),

  delete: write
    .meta(rest('DELETE', `${base}/{audience_id}`, 'Delete an audience and drop its materialized table', tag))
    .input(s.audienceIdInput)
    .output(s.deleteAudienceOutput)
    .mutation(({ ctx, input }) => audiences.deleteAudience(ctx, input.audience_id)),

  materialize: write
    .meta(
      rest(
        'POST',
        `${base}/{audience_id}/materialize`,
        'Materialize the audience into a versioned table of the target warehouse (a job)',
        tag,
      ),
    )
    .input(s.audienceIdInput)
    .output(s.materializeOutput)
    .mutation(({ ctx, input }) => audiences.materialize(ctx, input.audience_id)),

  exportsList: read
    .meta(rest('GET', `${base}/{audience_id}/exports`, 'Exports of an audience with their last run', tag))
    .input(s.audienceIdInput)
    .output(s.exportListOutput)
    .query(({ ctx, input }) => exportsService.listExports(ctx, input.audience_id)),

  exportPreview: read
    .meta(
      rest(
        'GET',
        `${base}/{audience_id}/exports/{export_id}/preview`,
        'Preview of the data of an export in destination field names (limit default 100, max 1000)',
        tag,
      ),
    )
    .input(s.previewInput)
    .output(s.previewOutput)
    .query(({ ctx, input }) => exportsService.previewExport(ctx, input)),

  performanceSummary: read
    .meta(
      rest(
        'GET',
        `${base}/{audience_id}/performance-summary`,
        'Performance summary of an audience: totals, CTR, CPC, CPA, conversion rate, ROAS; overall, by platform, by day',
        tag,
      ),
    )
    .input(s.audienceIdInput)
    .output(s.summaryOutput)
    .query(({ ctx, input }) => metrics.performanceSummary(ctx, input.audience_id)),

  size: read
    .meta(rest('GET', `${base}/{audience_id}/size`, 'Number of materialized rows of an audience', tag))
    .input(s.audienceIdInput)
    .output(s.sizeOutput)
    .query(({ ctx, input }) => audiences.audienceSize(ctx, input.audience_id)),
});
