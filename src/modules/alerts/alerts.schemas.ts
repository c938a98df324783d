import { z } from 'zod';
import { pageInput, timestamp } from '../../trpc/common-schemas.ts';
import { severitySchema } from '../../quality/rules.ts';

export const alertView = z.object({
  id: z.string(),
  workspace_id: z.string(),
  check_key: z.string().describe('Dedup key: one open alert per check'),
  kind: z.enum(['test', 'monitor', 'identity']),
  check: z.string().describe('not_null, unique, null_rate, freshness, cluster_size_limit, …'),
  table_name: z.string().describe('schema.table'),
  column_name: z.string().nullable(),
  severity: severitySchema,
  status: z.enum(['active', 'dismissed', 'resolved']),
  measured: z.union([z.number(), z.string()]).nullable().describe('The measured value of the last failure'),
  threshold: z.union([z.number(), z.string(), z.record(z.string(), z.unknown())]).nullable(),
  message: z.string(),
  occurrences: z.number().int().describe('Failing runs since the alert was raised'),
  first_seen_at: timestamp,
  last_seen_at: timestamp,
  resolved_at: timestamp.nullable(),
  dismissal: z
    .object({
      dismissed_at: timestamp,
      dismissed_by: z.string().nullable(),
      reason: z.string(),
      snoozed_until: timestamp.nullable(),
    })
    .nullable()
    .describe('Set while the alert is dismissed'),
  last_run_id: z.string().nullable(),
});

export const activeAlertsInput = z.object({
  workspace: z.string().min(1).max(100).describe('Workspace name (of your organization)'),
  severity: severitySchema.optional().describe('Only this severity: info, warning, error or critical'),
  ...pageInput,
});

export const activeAlertsOutput = z.object({
  workspace_name: z.string(),
  total: z.number().int(),
  counts: z.object({
    info: z.number().int(),
    warning: z.number().int(),
    error: z.number().int(),
    critical: z.number().int(),
  }),
  alerts: z.array(alertView),
});

export const dismissInput = z.object({
  alert_id: z.string().min(1).max(64),
  reason: z.string().trim().min(1).max(2000).describe('Why the alert is dismissed (required)'),
  snooze_minutes: z
    .number()
    .int()
    .min(1)
    .max(366 * 24 * 60)
    .optional()
    .describe(
      'Snooze period: the alert comes back after it if the check still fails; without it, only when the failure changes',
    ),
});
