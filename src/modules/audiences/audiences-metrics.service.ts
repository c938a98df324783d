import { randomUUID } from 'node:crypto';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { UUID, currentWorkspace, selectedWorkspaceIdOrFail } from '../workspaces/workspaces.service.ts';
import type { WorkspaceEntity } from '../workspaces/workspaces.service.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import {
  CONVERSION_FIGURES_SQL,
  RATIOS_SQL,
  audienceWarehouseConfig,
  figuresOf,
  findAudience,
} from './audiences.service.ts';
import { memberExistsSql } from './audiences-sql.ts';
import type { AudienceEntity } from './audiences.entity.ts';

const asDate = (v: unknown) => (v instanceof Date ? v : new Date(v as string));

const METRIC_COLUMNS = `id, audience_id, ad_platform, campaign_id, date::text as date, impressions, clicks, spend,
  conversions, revenue, currency, created_at, updated_at`;

function metricView(r: Record<string, unknown>) {
  return {
    id: String(r.id),
    audience_segment_id: String(r.audience_id),
    ad_platform: String(r.ad_platform),
    campaign_id: String(r.campaign_id),
    date: String(r.date),
    impressions: Number(r.impressions),
    clicks: Number(r.clicks),
    spend: Number(r.spend),
    conversions: Number(r.conversions),
    revenue: Number(r.revenue),
    currency: String(r.currency),
    created_at: asDate(r.created_at),
    updated_at: asDate(r.updated_at),
  };
}

/** Idempotent: the same (segment, platform, campaign, date) posted again replaces the figures. */
export async function recordMetric(
  scope: CallerScope,
  input: {
    audience_segment_id: string;
    ad_platform: string;
    campaign_id: string;
    date: string;
    impressions: number;
    clicks: number;
    spend: number;
    conversions: number;
    revenue: number;
    currency: string;
  },
) {
  if (input.clicks > input.impressions)
    throw new AppError(
      'BAD_REQUEST',
      `clicks (${input.clicks}) cannot exceed impressions (${input.impressions})`,
      {
        issues: [
          {
            path: ['clicks'],
            message: `clicks (${input.clicks}) cannot exceed impressions (${input.impressions})`,
          },
        ],
      },
    );
  const organization = organizationOf(scope.principal);
  const workspaceId = await selectedWorkspaceIdOrFail(scope);
  if (!UUID.test(input.audience_segment_id)) throw notFound('Audience');
  // One statement: the audience is looked up (in the selected workspace) by the insert itself.
  const [row] = await scope.em.execute(
    `insert into audience_performance_metrics
       (id, organization_id, workspace_id, audience_id, ad_platform, campaign_id, date, impressions, clicks, spend,
        conversions, revenue, currency, created_at, updated_at)
     select ?, a.organization_id, a.workspace_id, a.id, ?, ?, ?::date, ?, ?, ?, ?, ?, ?, now(), now()
       from audiences a
      where a.id = ? and a.organization_id = ? and a.workspace_id = ?
     on conflict (audience_id, ad_platform, campaign_id, date) do update set
       impressions = excluded.impressions, clicks = excluded.clicks, spend = excluded.spend,
       conversions = excluded.conversions, revenue = excluded.revenue, currency = excluded.currency,
       updated_at = now()
     returning ${METRIC_COLUMNS}, (xmax = 0) as inserted`,
    [
      randomUUID(),
      input.ad_platform,
      input.campaign_id,
      input.date,
      input.impressions,
      input.clicks,
      input.spend,
      input.conversions,
      input.revenue,
      input.currency,
      input.audience_segment_id,
      organization,
      workspaceId,
    ],
  );
  if (!row) {
    // Nothing written: a selected workspace that is gone answers 409, otherwise the audience is unknown.
    await currentWorkspace(scope);
    throw notFound('Audience');
  }
  return { metric: metricView(row), created: row.inserted === true || row.inserted === 't' };
}

export async function listMetrics(
  scope: CallerScope,
  input: {
    audience_segment_id?: string;
    ad_platform?: string;
    campaign_id?: string;
    start_date?: string;
    end_date?: string;
    limit: number;
    offset: number;
  },
) {
  const workspace = await currentWorkspace(scope);
  if (input.start_date && input.end_date && input.start_date > input.end_date)
    throw new AppError('BAD_REQUEST', 'start_date is after end_date', {
      issues: [{ path: ['start_date'], message: 'start_date is after end_date' }],
    });
  // A segment id that is not even a uuid matches nothing (and must not reach a uuid comparison).
  if (input.audience_segment_id && !UUID.test(input.audience_segment_id)) return { total: 0, metrics: [] };
  const where = ['organization_id = ?', 'workspace_id = ?'];
  const params: unknown[] = [organizationOf(scope.principal), workspace.id];
  const filters: [string, unknown][] = [
    ['audience_id = ?', input.audience_segment_id],
    ['ad_platform = ?', input.ad_platform],
    ['campaign_id = ?', input.campaign_id],
    ['date >= ?::date', input.start_date],
    ['date <= ?::date', input.end_date],
  ];
  for (const [clause, value] of filters)
    if (value !== undefined && value !== '') {
      where.push(clause);
      params.push(value);
    }
  const [{ total }] = await scope.em.execute(
    `select count(*) as total from audience_performance_metrics where ${where.join(' and ')}`,
    params,
  );
  const rows = await scope.em.execute(
    `select ${METRIC_COLUMNS} from audience_performance_metrics where ${where.join(' and ')}
      order by date desc, ad_platform, campaign_id, id limit ? offset ?`,
    [...params, input.limit, input.offset],
  );
  return { total: Number(total), metrics: rows.map(metricView) };
}

function conversionView(r: Record<string, unknown>) {
  return {
    id: String(r.id),
    audience_id: String(r.audience_id),
    customer_id: String(r.customer_id),
    event: String(r.event),
    value: Number(r.value),
    currency: String(r.currency),
    occurred_at: asDate(r.occurred_at),
    external_id: String(r.external_id),
    ad_platform: (r.ad_platform as string | null) ?? null,
    campaign_id: (r.campaign_id as string | null) ?? null,
    member: r.member == null ? null : r.member === true || r.member === 't',
    created_at: asDate(r.created_at),
  };
}

/**
 * Whether `customerId` is an identifier value of a member of the audience's current materialization:
 * one indexed look-up in the warehouse. Not materialized, the audience has no members to match.
 */
async function isMember(
  scope: CallerScope,
  workspace: WorkspaceEntity,
  audience: AudienceEntity,
  customerId: string,
) {
  if (!audience.materializedView || !audience.materializedSchema) return false;
  const warehouse = await warehouses(scope.deps).open(
    audienceWarehouseConfig(scope, workspace, audience),
    `${workspace.id}:target`,
  );
  const [row] = await warehouse.aggregate(
    memberExistsSql(
      { schema: audience.materializedSchema, name: audience.materializedView },
      audience.identifierColumns,
    ),
    { params: [customerId] },
  );
  return row?.member === true || row?.member === 't';
}

/** Why a conversion does not count among the audience's: its customer is not a member. */
function unmatchedWarning(audience: AudienceEntity, customerId: string) {
  return audience.materializedAt
    ? `Customer ${customerId} is not a member of audience ${audience.name} (none of its identifier columns ${audience.identifierColumns.join(', ')} holds it in the materialization of ${audience.materializedAt.toISOString()}): recorded as an unmatched conversion, counted apart from the audience's`
    : `Audience ${audience.name} has not been materialized, so customer ${customerId} is no member of it: recorded as an unmatched conversion, counted apart from the audience's`;
}

/**
 * Deduplicated on external_id within the organization: a repeated post returns the first record. A
 * conversion whose customer is no member of the audience when it is posted (a wrong id, or someone the
 * audience never held) is kept, marked as no member and counted apart (unmatched_conversions), so
 * that it inflates none of the audience's figures and the caller sees at once that the id matched nothing.
 */
export async function recordConversion(
  scope: CallerScope,
  input: {
    audience_id: string;
    customer_id: string;
    event: string;
    value: number;
    currency: string;
    occurred_at: string;
    external_id: string;
    ad_platform?: string;
    campaign_id?: string;
  },
) {
  const { audience, workspace } = await findAudience(scope, input.audience_id);
  const organization = organizationOf(scope.principal);
  const member = await isMember(scope, workspace, audience, input.customer_id);
  const [inserted] = await scope.em.execute(
    `insert into audience_conversions
       (id, organization_id, workspace_id, audience_id, customer_id, event, value, currency, occurred_at, external_id,
        ad_platform, campaign_id, member, created_at)
     values (?, ?, ?, ?, ?, ?, ?, ?, ?::timestamptz, ?, ?, ?, ?, now())
     on conflict (organization_id, external_id) do nothing
     returning *`,
    [
      randomUUID(),
      organization,
      workspace.id,
      audience.id,
      input.customer_id,
      input.event,
      input.value,
      input.currency,
      input.occurred_at,
      input.external_id,
      input.ad_platform ?? null,
      input.campaign_id ?? null,
      member,
    ],
  );
  const written = (row: Record<string, unknown>, created: boolean) => {
    const conversion = conversionView(row);
    const warning = conversion.member === false ? unmatchedWarning(audience, conversion.customer_id) : null;
    return { conversion, created, warning };
  };
  if (inserted) return written(inserted, true);
  const [existing] = await scope.em.execute(
    'select * from audience_conversions where organization_id = ? and external_id = ?',
    [organization, input.external_id],
  );
  if (existing.audience_id !== audience.id)
    throw new AppError(
      'CONFLICT',
      `Conversion ${input.external_id} is already recorded for another audience`,
      {
        reason: 'DUPLICATE_EXTERNAL_ID',
      },
    );
  return written(existing, false);
}

/**
 * Overall, per platform and per day in one statement: both tables are aggregated with grouping sets
 * and the two results joined on (grouping, key). Ratios are computed on the sums, not averaged.
 */
export async function performanceSummary(scope: CallerScope, audienceId: string) {
  const { audience } = await findAudience(scope, audienceId);
  const organization = organizationOf(scope.principal);
  const rows = await scope.em.execute(
    `with m as (
        select case when grouping(ad_platform) = 0 then 'platform' when grouping(date) = 0 then 'day' else 'overall' end as kind,
               case when grouping(ad_platform) = 0 then ad_platform when grouping(date) = 0 then date::text end as key,
               sum(impressions) as impressions, sum(clicks) as clicks, sum(spend) as spend,
               sum(conversions) as conversions, sum(revenue) as revenue
          from audience_performance_metrics
         where organization_id = ? and audience_id = ?
         group by grouping sets ((), (ad_platform), (date))
      ), c as (
        select case when grouping(ad_platform) = 0 then 'platform' when grouping(day) = 0 then 'day' else 'overall' end as kind,
               case when grouping(ad_platform) = 0 then ad_platform when grouping(day) = 0 then day end as key,
               ${CONVERSION_FIGURES_SQL}
          from (select ad_platform, to_char(occurred_at at time zone 'UTC', 'YYYY-MM-DD') as day, value, member
                  from audience_conversions where organization_id = ? and audience_id = ?) x
         group by grouping sets ((), (ad_platform), (day))
      ), currencies as (
        select string_agg(distinct currency, ',' order by currency) as list from (
          select currency from audience_performance_metrics where organization_id = ? and audience_id = ?
          union select currency from audience_conversions where organization_id = ? and audience_id = ?) u
      )
      select s.*, ${RATIOS_SQL}, (select list from currencies) as currencies
        from (
          select coalesce(m.kind, c.kind) as kind, coalesce(m.key, c.key) as key,
                 coalesce(m.impressions, 0) as impressions, coalesce(m.clicks, 0) as clicks,
                 coalesce(m.spend, 0) as spend, coalesce(m.conversions, 0) as conversions,
                 coalesce(m.revenue, 0) as revenue,
                 coalesce(c.recorded_conversions, 0) as recorded_conversions,
                 coalesce(c.recorded_conversion_value, 0) as recorded_conversion_value,
                 coalesce(c.unmatched_conversions, 0) as unmatched_conversions,
                 coalesce(c.unmatched_conversion_value, 0) as unmatched_conversion_value
            from m full join c on m.kind = c.kind and coalesce(m.key, '') = coalesce(c.key, '')
        ) s
       order by s.kind, s.key nulls first`,
    [
      organization,
      audience.id,
      organization,
      audience.id,
      organization,
      audience.id,
      organization,
      audience.id,
    ],
  );
  const overall = rows.find((r: Record<string, unknown>) => r.kind === 'overall') ?? {};
  const currencies = rows[0]?.currencies ? String(rows[0].currencies).split(',') : [];
  return {
    audience_id: audience.id,
    currencies,
    overall: figuresOf(overall),
    by_platform: rows
      .filter((r: Record<string, unknown>) => r.kind === 'platform')
      .map((r: Record<string, unknown>) => ({
        ad_platform: (r.key as string | null) ?? null,
        ...figuresOf(r),
      })),
    by_day: rows
      .filter((r: Record<string, unknown>) => r.kind === 'day')
      .map((r: Record<string, unknown>) => ({ date: String(r.key), ...figuresOf(r) })),
  };
}
