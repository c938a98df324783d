import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../users/users.entity.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';

export type DiscoveryStatus = 'running' | 'completed' | 'cancelled' | 'failed';

/**
 * One discovery run. The row is the lock: a partial unique index allows one `running` row per
 * workspace, which holds across API processes; `heartbeat_at` lets a run whose process died be
 * taken over; `cancel_requested_at` is how a cancel from any process reaches the generator.
 */
export const DiscoveryRun = defineEntity({
  name: 'DiscoveryRun',
  tableName: 'discovery_runs',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    workspace: () => p.manyToOne(Workspace).deleteRule('cascade'),
    /** The user or service account that started it (cancel acts on the caller's own runs). */
    startedBy: p.uuid(),
    status: p.string().default('running'),
    mode: p.string(),
    cancelRequestedAt: p.datetime().nullable(),
    /** Why it ended when it did not complete: cancel requested, client gone, error message. */
    reason: p.text().nullable(),
    summary: p.json<Record<string, unknown>>().nullable(),
    startedAt: p.datetime().onCreate(() => new Date()),
    heartbeatAt: p.datetime().onCreate(() => new Date()),
    finishedAt: p.datetime().nullable(),
  },
  indexes: [{ properties: ['organization', 'startedBy', 'status'] }],
});

export type DiscoveryRunEntity = InferEntity<typeof DiscoveryRun>;

export const discoveryEntities = [DiscoveryRun];
