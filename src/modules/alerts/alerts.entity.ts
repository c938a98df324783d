import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../users/users.entity.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';

const ALERT_STATUSES = ['active', 'dismissed', 'resolved'] as const;

/**
 * A failing data-quality check. `check_key` is the dedup key: the migration's partial unique index
 * allows one open (active or dismissed) alert per check of a workspace, so a failure that persists
 * updates its alert; a passing check resolves it and the next failure opens a new one.
 */
export const Alert = defineEntity({
  name: 'Alert',
  tableName: 'alerts',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    checkKey: p.string().length(1024),
    kind: p.enum(['test', 'monitor', 'identity'] as const),
    checkName: p.string(),
    tableName: p.string(),
    columnName: p.string().nullable(),
    severity: p.enum(['info', 'warning', 'error', 'critical'] as const),
    status: p.enum([...ALERT_STATUSES]).default('active'),
    measured: p.json<unknown>().nullable(),
    threshold: p.json<unknown>().nullable(),
    message: p.text(),
    occurrences: p.integer().default(1),
    firstSeenAt: p.datetime(),
    lastSeenAt: p.datetime(),
    resolvedAt: p.datetime().nullable(),
    dismissedAt: p.datetime().nullable(),
    dismissedBy: p.string().nullable(),
    dismissReason: p.text().nullable(),
    snoozedUntil: p.datetime().nullable(),
    /** What the failure looked like when dismissed (severity and threshold): a change brings it back. */
    dismissedSignature: p.string().length(1024).nullable(),
    lastRunId: p.uuid().nullable(),
    ...timestamps(),
  },
});
export type AlertEntity = InferEntity<typeof Alert>;

export const alertEntities = [Alert];
