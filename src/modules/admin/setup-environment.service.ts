import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError } from '../../app-error.ts';
import type { AppDeps, CallerScope, Scope } from '../../deps.ts';
import { ALL_PERMISSIONS } from '../../auth/permissions.ts';
import { matchTable, type SourceTable, type TargetTable } from '../../llm/offline-matcher.ts';
import { profileTable, sourceTableOf, type ColumnProfile } from '../../llm/profile.ts';
import type { ConnectionConfig } from '../../warehouse/config.ts';
import { warehouses } from '../../warehouse/postgres.ts';
import type { IntrospectedTable } from '../../warehouse/warehouse.ts';
import { Organization } from '../auth/auth.entity.ts';
import { createOrganizationRecord, createUser, organizationView } from '../auth/auth.service.ts';
import { planMapping, tableKey } from '../discovery/discovery-plan.ts';
import { DiscoveryRun, type DiscoveryRunEntity } from '../discovery/discovery.entity.ts';
import { mappingDocument, writeSuggestions } from '../mappings/mappings.service.ts';
import { libraryTemplate, libraryTemplates, schemaSummary } from '../schemas/schema-library.ts';
import { ADMIN_SETTINGS_DEFAULTS } from '../workspaces/workspaces.schemas.ts';
import { createWorkspace, workspaceByName } from '../workspaces/workspaces.service.ts';

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
  if (await scope.em.count(Organization, { domain: input.organization.domain }))
    throw new AppError(
      'CONFLICT',
      `An organization with domain ${input.organization.domain} already exists`,
    );

  const snapshot = input.discover ? await readSource(scope.deps, input.source) : null;
  const startedAt = new Date();

  return scope.em.transactional(async (txEm) => {
    const em = txEm as EntityManager;
    const tx: Scope = { em, deps: scope.deps };
    // Checked again here: the unique domain constraint settles a concurrent request (409 as well).
    const org = await createOrganizationRecord(em, input.organization);
    const admin = await createUser(tx, {
      organizationId: org.id,
      isSuperAdmin: false,
      username: input.admin.username,
      email: input.admin.email,
      roles: ['admin'],
      must_change_password: true,
    });
    // The workspace is the new admin's: created and selected as if they had done it themselves.
    const asAdmin: CallerScope = {
      em,
      deps: scope.deps,
      principal: {
        kind: 'user',
        id: admin.user.id,
        organizationId: org.id,
        username: admin.user.username,
        isSuperAdmin: false,
        mustChangePassword: true,
        permissions: new Set(ALL_PERMISSIONS),
        expiresAt: null,
      },
    };
    const workspaceView = await createWorkspace(asAdmin, {
      name: input.workspace.name,
      description: input.workspace.description,
      source_config: input.source,
      template_name: input.template,
      select: true,
    });

    const mappings = [];
    let run: DiscoveryRunEntity | null = null;
    if (snapshot) {
      const workspace = await workspaceByName(asAdmin, input.workspace.name);
      const options = {
        threshold: ADMIN_SETTINGS_DEFAULTS.discovery_confidence_threshold,
        ambiguityMargin: ADMIN_SETTINGS_DEFAULTS.ambiguity_margin,
      };
      for (const target of template.tables as unknown as TargetTable[]) {
        const plan = planMapping(matchTable(target, snapshot.sources, options), snapshot.byKey);
        if (plan.connections.length === 0 && plan.ambiguities.length === 0) continue;
        mappings.push(await writeSuggestions(tx, workspace, target.name, plan));
      }
      const summary = {
        tables: snapshot.sources.length,
        columns: snapshot.columns,
        target_tables: mappings.length,
        fields_suggested: mappings.reduce((n, m) => n + m.connections.length, 0),
        ambiguities: mappings.reduce((n, m) => n + m.ambiguities.length, 0),
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
      workspace: workspaceView,
      schema: { template_name: input.template, ...schemaSummary(input.template, template) },
      discovery: {
        ran: !!snapshot,
        run_id: run?.id ?? null,
        mode: 'offline' as const,
        source_tables: snapshot?.sources.length ?? 0,
        source_columns: snapshot?.columns ?? 0,
        unprofiled_tables: snapshot?.unprofiled ?? [],
        fields_suggested: mappings.reduce((n, m) => n + m.connections.length, 0),
        ambiguities: mappings.reduce((n, m) => n + m.ambiguities.length, 0),
        mappings: mappings.map(mappingDocument),
      },
    };
  });
}
