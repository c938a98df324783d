import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../../deps.ts';
import type { JobContext } from '../../jobs/queue.ts';
import { baseTypeSql } from '../../warehouse/introspect.ts';
import { quoteIdent, warehouses } from '../../warehouse/postgres.ts';
import { requiredConnectionConfig, targetSchemaOf } from '../workspaces/workspaces.service.ts';
import { Audience, type AudienceEntity } from './audiences.entity.ts';
import {
  MATERIALIZED_SCHEMA,
  audienceTableName,
  audienceViewName,
  memberLookup,
  memberSelect,
  qualifiedName,
} from './audiences-sql.ts';
import type { ConnectionConfig } from '../../warehouse/config.ts';

export const MATERIALIZE_KIND = 'audience-materialize';

interface MaterializePayload extends Record<string, unknown> {
  audience_id: string;
}

/** The warehouse an audience belongs to: its workspace's target, as long as it still points there. */
export function audienceTarget(deps: AppDeps, em: EntityManager, audience: AudienceEntity): ConnectionConfig {
  const config = requiredConnectionConfig({ em, deps }, audience.workspace, 'target');
  if (config.database !== audience.targetDatabase || config.schemas[0] !== audience.targetSchema)
    throw new Error(
      `The workspace target is now ${config.database}/${config.schemas[0]}; this audience was defined on ${audience.targetDatabase}/${audience.targetSchema}`,
    );
  return config;
}

/**
 * Starts a materialization of the audience, or returns the one under way (one per audience). The
 * audience reads `queued` until the run starts and sets its own status.
 */
export async function enqueueMaterialization(
  deps: AppDeps,
  em: EntityManager,
  target: { audienceId: string; organizationId: string; workspaceId: string },
) {
  const { run, created } = await deps.jobs.enqueue(
    MATERIALIZE_KIND,
    { audience_id: target.audienceId },
    {
      organizationId: target.organizationId,
      workspaceId: target.workspaceId,
      singletonKey: target.audienceId,
    },
  );
  if (created)
    // Only while the run has not started: it sets its own status (and run id) when it does.
    await em.execute(
      `update audiences set materialization_status = 'queued', last_run_id = ?, updated_at = now()
          where id = ? and last_run_id is distinct from ?`,
      [run.id, target.audienceId, run.id],
    );
  return { run, created };
}

/**
 * Writes the members into a new versioned table and swaps the stable view onto it in the same
 * warehouse transaction, so readers see the old members or the new ones, never a half-written table;
 * the previous version is dropped in that transaction too.
 */
async function materializeAudience(deps: AppDeps, payload: MaterializePayload, context: JobContext) {
  const em = deps.orm.em.fork() as EntityManager;
  const audience = await em.findOne(
    Audience,
    { id: payload.audience_id, organization: context.organizationId },
    { populate: ['workspace'] },
  );
  if (!audience) return { skipped: 'the audience was deleted' };
  const started = performance.now();
  const version = audience.definitionVersion;
  audience.materializationStatus = 'running';
  audience.lastRunId = context.runId;
  await em.flush();
  try {
    const config = audienceTarget(deps, em, audience);
    const select = await memberSelect(audience, targetSchemaOf(audience.workspace));
    const warehouse = await warehouses(deps).open(config, `${audience.workspace.id}:target`);
    // The audience's SQL runs inside a write (CREATE TABLE … AS): it must pass the read-only rules first.
    // The count of rows without an identifier wraps the same statement in count(*) and null tests only.
    await warehouse.assertUserSqlAllowed(select.sql);
    const table = audienceTableName(audience.id, version, context.runId);
    const view = audienceViewName(audience.id);
    const previous = audience.materializedTable;
    const outcome = await warehouse.transaction(async (tx) => {
      // One snapshot for both statements: the members and the rows left out add up to the rows that
      // matched, even while the source table is being written.
      await tx.query('set transaction isolation level repeatable read');
      await tx.query(`create schema if not exists ${quoteIdent(MATERIALIZED_SCHEMA)}`);
      await tx.query(`drop table if exists ${qualifiedName(MATERIALIZED_SCHEMA, table)}`);
      const created = await tx.query(
        `create table ${qualifiedName(MATERIALIZED_SCHEMA, table)} as ${select.sql}`,
        select.params,
      );
      // A second read of the matched rows: a count cannot come out of CREATE TABLE … AS. Those with
      // an identifier beyond the members were merged into a member sharing their identifier values.
      const [counts] = (
        await tx.query<{ without_identifier: string; identified: string }>(select.countsSql, select.params)
      ).rows;
      // A conversion names its customer by one identifier value: the look-up reads an index.
      for (const column of audience.identifierColumns)
        await tx.query(
          `create index on ${qualifiedName(MATERIALIZED_SCHEMA, table)} (${memberLookup(column)})`,
        );
      // CREATE TABLE … AS keeps a domain column's domain.
      const columns = await tx.query<{ name: string; type: string; base_type: string }>(
        `select a.attname as name, format_type(a.atttypid, a.atttypmod) as type,
                ${baseTypeSql('a.atttypid', 'a.atttypmod')} as base_type
           from pg_attribute a
          where a.attrelid = $1::regclass and a.attnum > 0 and not a.attisdropped
          order by a.attnum`,
        [qualifiedName(MATERIALIZED_SCHEMA, table)],
      );
      // A view's columns cannot change in place; dropping and creating it inside the transaction is atomic.
      await tx.query(`drop view if exists ${qualifiedName(MATERIALIZED_SCHEMA, view)}`);
      await tx.query(
        `create view ${qualifiedName(MATERIALIZED_SCHEMA, view)} as select * from ${qualifiedName(MATERIALIZED_SCHEMA, table)}`,
      );
      if (previous && previous !== table)
        await tx.query(`drop table if exists ${qualifiedName(MATERIALIZED_SCHEMA, previous)}`);
      return {
        rowCount: created.rowCount,
        withoutIdentifier: Number(counts.without_identifier),
        merged: Number(counts.identified) - Number(created.rowCount),
        columns: columns.rows,
      };
    });
    const durationMs = Math.round(performance.now() - started);
    const fresh = em.fork() as EntityManager;
    const current = await fresh.findOne(Audience, { id: audience.id, organization: context.organizationId });
    if (!current) {
      // Deleted while the run wrote: leave nothing behind in the warehouse.
      await warehouse.transaction(async (tx) => {
        await tx.query(`drop view if exists ${qualifiedName(MATERIALIZED_SCHEMA, view)}`);
        await tx.query(`drop table if exists ${qualifiedName(MATERIALIZED_SCHEMA, table)}`);
      });
      return { skipped: 'the audience was deleted during the run' };
    }
    Object.assign(current, {
      materializationStatus: 'succeeded' as const,
      materializedVersion: version,
      materializedSchema: MATERIALIZED_SCHEMA,
      materializedTable: table,
      materializedView: view,
      materializedColumns: outcome.columns,
      rowCount: outcome.rowCount,
      rowsWithoutIdentifier: outcome.withoutIdentifier,
      rowsMerged: outcome.merged,
      materializedAt: new Date(),
      lastDurationMs: durationMs,
      lastError: null,
      lastRunId: context.runId,
    });
    await fresh.flush();
    return {
      row_count: outcome.rowCount,
      rows_without_identifier: outcome.withoutIdentifier,
      rows_merged: outcome.merged,
      table: `${MATERIALIZED_SCHEMA}.${view}`,
      versioned_table: `${MATERIALIZED_SCHEMA}.${table}`,
      definition_version: version,
      duration_ms: durationMs,
    };
  } catch (error) {
    const fresh = em.fork() as EntityManager;
    const current = await fresh.findOne(Audience, { id: audience.id, organization: context.organizationId });
    if (current) {
      current.materializationStatus = 'failed';
      current.lastError = error instanceof Error ? error.message : String(error);
      current.lastDurationMs = Math.round(performance.now() - started);
      current.lastRunId = context.runId;
      await fresh.flush();
    }
    throw error;
  }
}

export async function registerMaterializeJob(deps: AppDeps): Promise<void> {
  await deps.jobs.register<MaterializePayload>(
    MATERIALIZE_KIND,
    (payload, context) => materializeAudience(deps, payload, context),
    {
      retryLimit: 1,
      retryDelaySeconds: 5,
      timeoutSeconds: 6 * 3600,
      retain: { namedBy: ['audiences'] },
      // Its worker died on the last attempt: the audience must not show that run as running forever.
      async onAbandoned(run, em) {
        await em.nativeUpdate(
          Audience,
          {
            id: String(run.payload.audience_id),
            organization: run.organizationId,
            lastRunId: run.runId,
            materializationStatus: { $in: ['queued', 'running'] },
          },
          { materializationStatus: 'failed', lastError: run.error, updatedAt: new Date() },
        );
      },
    },
  );
}
