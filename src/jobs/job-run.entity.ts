import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../db/base-entity.ts';

const JOB_RUN_STATUSES = ['queued', 'running', 'succeeded', 'failed', 'cancelled'] as const;
export type JobRunStatus = (typeof JOB_RUN_STATUSES)[number];

/**
 * One run of a long job (materialize, export, hypothesis test, monitoring run). The queue (pg-boss)
 * only schedules; this row is what routes read, so it carries the tenant and outlives pg-boss's own
 * retention; the queue's sweep deletes it JOB_RUNS_RETENTION_DAYS after it finished unless it is still
 * read (see queue.ts). Its id is also the pg-boss job id. The migration adds a partial unique index on
 * (organization, kind, singleton_key) over queued/running rows: one active run per key.
 *
 * The organization and workspace are plain ids, not relations: the queue knows no area's entity
 * (jobs/ imports no module), and the foreign keys with their cascades live in the migration.
 */
export const JobRun = defineEntity({
  name: 'JobRun',
  tableName: 'job_runs',
  properties: {
    id: uuidPrimaryKey(),
    organizationId: p.uuid(),
    workspaceId: p.uuid().nullable(),
    kind: p.string(),
    status: p.enum(() => [...JOB_RUN_STATUSES]).default('queued'),
    singletonKey: p.string().nullable(),
    payload: p.json<Record<string, unknown>>(),
    progress: p.json<Record<string, unknown>>(),
    result: p.json<Record<string, unknown>>().nullable(),
    error: p.text().nullable(),
    retryCount: p.integer().default(0),
    startedAt: p.datetime().nullable(),
    finishedAt: p.datetime().nullable(),
    ...timestamps(),
  },
});

export type JobRunEntity = InferEntity<typeof JobRun>;
