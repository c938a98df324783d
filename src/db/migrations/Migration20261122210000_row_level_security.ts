import { Migration } from '@mikro-orm/migrations';

/** Tables whose rows belong to one organization through their own `organization_id`. */
const OWNED_BY_ORGANIZATION = [
  'alerts',
  'audience_conversions',
  'audience_exports',
  'audience_performance_metrics',
  'audiences',
  'cache_settings',
  'discovery_runs',
  'feature_settings',
  'hypotheses',
  'identity_graphs',
  'insights',
  'job_runs',
  'llm_parameters',
  'llm_usage',
  'mapping_commits',
  'mappings',
  'monitoring_default_monitors',
  'monitoring_metric_snapshots',
  'organization_settings',
  'roles',
  'saved_queries',
  'schema_configs',
  'schema_sync_runs',
  'service_accounts',
  'transformation_projects',
  'user_feature_overrides',
  'users',
  'vcs_configs',
  'workspace_commits',
  'workspaces',
];

/** Tables whose rows belong to an organization through a parent row (the parent's policy applies inside). */
const OWNED_THROUGH_PARENT: [table: string, parent: string, column: string][] = [
  ['sessions', 'users', 'user_id'],
  ['user_roles', 'users', 'user_id'],
  ['service_account_roles', 'service_accounts', 'service_account_id'],
];

const TENANT = `nullif(current_setting('dimas.organization_id', true), '')::uuid`;

/**
 * Row-level security as a second wall behind the services' tenant filters. Requests of an organization's
 * members run as the role `dimas_tenant` with `dimas.organization_id` set for each transaction
 * (src/trpc/procedures.ts); under that role every tenant-owned table shows and accepts only the rows of
 * that organization, so a query that forgets its filter finds nothing of another tenant. Work that spans
 * organizations by design (login, super-admin routes, background jobs) runs as the connecting role, the
 * tables' owner, which the policies do not restrict.
 */
export class Migration20261122210000 extends Migration {
  override name = 'Migration20261122210000_row_level_security';

  override up(): void | Promise<void> {
    // Roles belong to the whole PostgreSQL server: another database of it may have created this one, or
    // an administrator beforehand (`create role dimas_tenant nologin; grant dimas_tenant to <app user>`),
    // so that the application's user needs no CREATEROLE. Only what is missing is created or granted.
    this.addSql(
      `do $$ begin
        if not exists (select 1 from pg_roles where rolname = 'dimas_tenant') then create role dimas_tenant nologin; end if;
      exception when duplicate_object then null; end $$;`,
    );
    // A connecting role that is not a superuser needs membership to switch to it.
    this.addSql(
      `do $$ begin
        if not pg_has_role(current_user, 'dimas_tenant', 'member') then execute format('grant dimas_tenant to %I', current_user); end if;
      end $$;`,
    );
    this.addSql(`grant usage on schema public to dimas_tenant;`);
    this.addSql(`grant select, insert, update, delete on all tables in schema public to dimas_tenant;`);
    this.addSql(`grant usage, select on all sequences in schema public to dimas_tenant;`);
    this.addSql(
      `alter default privileges in schema public grant select, insert, update, delete on tables to dimas_tenant;`,
    );
    this.addSql(
      `alter default privileges in schema public grant usage, select on sequences to dimas_tenant;`,
    );

    this.addSql(`alter table "organizations" enable row level security;`);
    this.addSql(
      `create policy tenant_isolation on "organizations" to dimas_tenant using ("id" = ${TENANT}) with check ("id" = ${TENANT});`,
    );
    for (const table of OWNED_BY_ORGANIZATION) {
      this.addSql(`alter table "${table}" enable row level security;`);
      this.addSql(
        `create policy tenant_isolation on "${table}" to dimas_tenant using ("organization_id" = ${TENANT}) with check ("organization_id" = ${TENANT});`,
      );
    }
    for (const [table, parent, column] of OWNED_THROUGH_PARENT) {
      const owned = `exists (select 1 from "${parent}" p where p."id" = "${table}"."${column}")`;
      this.addSql(`alter table "${table}" enable row level security;`);
      this.addSql(
        `create policy tenant_isolation on "${table}" to dimas_tenant using (${owned}) with check (${owned});`,
      );
    }
  }

  override down(): void | Promise<void> {
    for (const table of [
      'organizations',
      ...OWNED_BY_ORGANIZATION,
      ...OWNED_THROUGH_PARENT.map(([t]) => t),
    ]) {
      this.addSql(`drop policy if exists tenant_isolation on "${table}";`);
      this.addSql(`alter table "${table}" disable row level security;`);
    }
    this.addSql(`revoke all on all tables in schema public from dimas_tenant;`);
    this.addSql(`revoke all on all sequences in schema public from dimas_tenant;`);
    this.addSql(
      `alter default privileges in schema public revoke select, insert, update, delete on tables from dimas_tenant;`,
    );
    this.addSql(
      `alter default privileges in schema public revoke usage, select on sequences from dimas_tenant;`,
    );
    this.addSql(`revoke usage on schema public from dimas_tenant;`);
  }
}
