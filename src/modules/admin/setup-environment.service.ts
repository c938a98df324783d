import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError } from '../../app-error.ts';
import type { AppDeps, CallerScope, Scope } from '../../deps.ts';
import { matchTable, type SourceTable, type TargetTable } from '../../llm/offline-matcher.ts';
import { profileTable, sourceTableOf, type ColumnProfile } from '../../llm/profile.ts';
import type { ConnectionConfig } from '../../warehouse/config.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import type { IntrospectedTable } from '../../warehouse/warehouse.ts';
import { User } from '../users/users.entity.ts';
import { assertOrganizationFree, createOrganizationRecord, organizationView } from '../auth/auth.service.ts';
import { createUser } from '../users/users.service.ts';
import { planMapping, tableKey } from '../discovery/discovery-plan.ts';
import { explainPlan } from '../discovery/discovery-evidence.ts';
import { DiscoveryRun, type DiscoveryRunEntity } from '../discovery/discovery.entity.ts';
import type { TableMappingEntity } from '../mappings/mappings.entity.ts';
import { mappingDocument, writeSuggestions } from '../mappings/mappings.service.ts';
import { libraryTemplate, libraryTemplates, schemaSummary } from '../schemas/schema-library.ts';
import { ADMIN_SETTINGS_DEFAULTS } from '../workspaces/workspaces.schemas.ts';
import { Workspace } from '../workspaces/workspaces.entity.ts';
import { storeConnectionConfig, workspaceDetail } from '../workspaces/workspaces.service.ts';

export interface SetupEnvironmentInput {
  organization: { name: string; domain: string };
  admin: { username: string; email?: string };
  workspace: { name: string; description?: string };
  source: ConnectionConfig;
  template: string;
  discover: boolean;
}

/** What the source looked like, read before anything is written. */
interface SourceSnapshot {
  sources: SourceTable[];
  byKey: Map<string, IntrospectedTable>;
  columns: number;
  unprofiled: string[];
}

/**
 * Introspects and profiles the source outside the control-plane transaction: it is network work on
 * another database, and a source that cannot be read must fail the request before anything exists.
 * A table that cannot be profiled is matched on names and types only, as the discovery agent does.
 */
async function readSource(deps: AppDeps, config: ConnectionConfig): Promise<SourceSnapshot> {
  const warehouse = await warehouses(deps).open(config);
  const introspected = await warehouse.introspect();
  const tables = introspected.tables.filter((t) => t.columns.length > 0);
  const run = async (sql: string, params: unknown[]) =>
    (await warehouse.readOnlyQuery(sql, { params, limit: 1 })).rows;
  const sources: SourceTable[] = [];
  const unprofiled: string[] = [];
  for (const table of tables) {
    const key = tableKey(table);
    let profiles: ColumnProfile[] = [];
    try {
      profiles = await profileTable(
        run,
        table.schema,
        table.name,
        table.columns.map((c) => ({ name: c.name, type: c.type })),
        { rowLimit: ADMIN_SETTINGS_DEFAULTS.sample_size },
      );
    } catch {
      unprofiled.push(key);
    }
    sources.push(sourceTableOf(table, profiles, key));
  }
  return {
    sources,
    byKey: new Map(tables.map((t) => [tableKey(t), t])),
    columns: tables.reduce((n, t) => n + t.columns.length, 0),
    unprofiled,
  };
}

/**
 * POST /api/admin/setup-environment: an organization, its admin (temporary password), a workspace
 * with its source, a library schema and the mappings of an offline discovery run — all written in
 * one control-plane transaction, so any failure leaves none of it behind.
 */
export async function setupEnvironment(scope: CallerScope, input: SetupEnvironmentInput) {
  // Cheap refusals first, before the source is contacted.
  const template = await libraryTemplate(input.template);
  if (!template)
    throw new AppError('BAD_REQUEST', `Unknown library template ${input.template}`, {
      issues: [
        { path: ['template'], message: `one of ${[...(await libraryTemplates()).keys()].join(', ')}` },
      ],
    });
  await assertOrganizationFree(scope.em, input.organization);

  const startedAt = new Date();
  const snapshot = input.discover ? await readSource(scope.deps, input.source) : null;

  return scope.em.transactional(async (txEm) => {
    const em = txEm as EntityManager;
    const tx: Scope = { em, deps: scope.deps };
    // Checked again here: the unique domain and name indexes settle a concurrent request (409 as well).
    const org = await createOrganizationRecord(em, input.organization);
    const admin = await createUser(tx, {
      organizationId: org.id,
      isSuperAdmin: false,
      username: input.admin.username,
      email: input.admin.email,
      roles: ['admin'],
      must_change_password: true,
    });
    // Built here rather than by createWorkspace: that one reads through raw connection queries and
    // the caches, which run outside this transaction (a deadlock on the embedded database). The
    // organization is new, so the name cannot be taken; reserved names were refused by the input.
    const workspace = em.create(Workspace, {
      organization: org.id,
      name: input.workspace.name,
      description: input.workspace.description ?? '',
      sourceConfig: storeConnectionConfig(tx, input.source, null),
      targetConfig: null,
      targetSchema: template,
      schemaTemplate: input.template,
      schemaCustomized: false,
      settings: {},
      workflowState: {},
    });
    await em.flush();
    // Selected for the new admin, so their first session starts in it (keys as workspaces.service).
    const selectedAt = new Date().toISOString();
    const adminUser = await em.findOneOrFail(User, { id: admin.user.id });
    adminUser.preferences = {
      ...adminUser.preferences,
      current_workspace: workspace.id,
      workspace_last_used: { [workspace.id]: selectedAt },
    };

    const mappings: TableMappingEntity[] = [];
    const suggested = () => mappings.reduce((n, m) => n + m.connections.length, 0);
    const ambiguous = () => mappings.reduce((n, m) => n + m.ambiguities.length, 0);
    let run: DiscoveryRunEntity | null = null;
    if (snapshot) {
      const options = {
        threshold: ADMIN_SETTINGS_DEFAULTS.discovery_confidence_threshold,
        ambiguityMargin: ADMIN_SETTINGS_DEFAULTS.ambiguity_margin,
      };
      for (const target of template.tables as unknown as TargetTable[]) {
        const match = matchTable(target, snapshot.sources, options);
        const plan = explainPlan(planMapping(match, snapshot.byKey), match, new Map());
        if (plan.connections.length === 0 && plan.ambiguities.length === 0) continue;
        mappings.push((await writeSuggestions(tx, workspace, target.name, plan)).mapping);
      }
      const summary = {
        tables: snapshot.sources.length,
        columns: snapshot.columns,
        target_tables: mappings.length,
        fields_suggested: suggested(),
        ambiguities: ambiguous(),
        llm_calls: 0,
        llm_fallbacks: 0,
        duration_ms: Date.now() - startedAt.getTime(),
      };
      // The history of the workspace shows where its first mappings came from.
      run = em.create(DiscoveryRun, {
        organization: org.id,
        workspace: workspace.id,
        startedBy: scope.principal.id,
        status: 'completed',
        mode: 'offline',
        summary,
        startedAt,
        heartbeatAt: new Date(),
        finishedAt: new Date(),
      });
    }
    await em.flush();

    return {
      organization: organizationView(org),
      admin: { user: admin.user, temporary_password: admin.temporary_password! },
      workspace: await workspaceDetail({ ...tx, principal: scope.principal }, workspace, {
        currentId: workspace.id,
        lastUsed: { [workspace.id]: selectedAt },
      }),
      schema: { template_name: input.template, ...schemaSummary(input.template, template) },
      discovery: {
        ran: !!snapshot,
        run_id: run?.id ?? null,
        mode: 'offline' as const,
        source_tables: snapshot?.sources.length ?? 0,
        source_columns: snapshot?.columns ?? 0,
        unprofiled_tables: snapshot?.unprofiled ?? [],
        fields_suggested: suggested(),
        ambiguities: ambiguous(),
        mappings: mappings.map(mappingDocument),
      },
    };
  });
}
