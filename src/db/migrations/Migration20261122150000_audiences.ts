import { Migration } from '@mikro-orm/migrations';

export class Migration20261122150000 extends Migration {
  override name = 'Migration20261122150000_audiences';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "audiences" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "name" varchar(255) not null, "description" text not null default '', "target_database" varchar(255) not null, "target_schema" varchar(255) not null, "target_table" varchar(255) not null, "definition_type" text check ("definition_type" in ('rules', 'sql')) not null, "rules" jsonb null, "sql" text null, "identifier_columns" jsonb not null, "attribute_columns" jsonb not null, "definition_version" int not null default 1, "materialization_status" text check ("materialization_status" in ('never', 'queued', 'running', 'succeeded', 'failed')) not null default 'never', "materialized_version" int null, "materialized_table" varchar(255) null, "materialized_view" varchar(255) null, "materialized_schema" varchar(255) null, "materialized_columns" jsonb null, "row_count" bigint null, "materialized_at" timestamptz null, "last_duration_ms" int null, "last_error" text null, "last_run_id" uuid null, "created_by_id" uuid null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "audiences" add constraint "audiences_workspace_id_name_unique" unique ("workspace_id", "name");`,
    );
    this.addSql(
      `create index "audiences_organization_id_workspace_id_index" on "audiences" ("organization_id", "workspace_id");`,
    );
    this.addSql(
      `alter table "audiences" add constraint "audiences_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );
    this.addSql(
      `alter table "audiences" add constraint "audiences_workspace_id_foreign" foreign key ("workspace_id") references "workspaces" ("id") on delete cascade;`,
    );
    this.addSql(
      `alter table "audiences" add constraint "audiences_created_by_id_foreign" foreign key ("created_by_id") references "users" ("id") on delete set null;`,
    );

    this.addSql(
      `create table "audience_exports" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "audience_id" uuid not null, "name" varchar(255) not null, "destination_type" text check ("destination_type" in ('csv', 'postgres', 'webhook')) not null, "destination_config" jsonb not null, "field_mapping" jsonb not null, "schedule" text check ("schedule" in ('manual', 'hourly', 'daily', 'weekly')) not null default 'manual', "status" text check ("status" in ('active', 'paused')) not null default 'active', "next_run_at" timestamptz null, "last_run_id" uuid null, "last_run_status" varchar(255) null, "last_run_at" timestamptz null, "last_error" text null, "rows_exported" bigint null, "file_path" text null, "file_size" bigint null, "created_by_id" uuid null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(`create index "audience_exports_audience_id_index" on "audience_exports" ("audience_id");`);
    // The scheduler's sweep reads only exports that are due.
    this.addSql(
      `create index "audience_exports_due_index" on "audience_exports" ("next_run_at") where "status" = 'active' and "schedule" <> 'manual';`,
    );
    for (const [column, table, rule] of [
      ['organization_id', 'organizations', 'cascade'],
      ['workspace_id', 'workspaces', 'cascade'],
      ['audience_id', 'audiences', 'cascade'],
      ['created_by_id', 'users', 'set null'],
    ])
      this.addSql(
        `alter table "audience_exports" add constraint "audience_exports_${column}_foreign" foreign key ("${column}") references "${table}" ("id") on delete ${rule};`,
      );

    this.addSql(
      `create table "audience_performance_metrics" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "audience_id" uuid not null, "ad_platform" varchar(255) not null, "campaign_id" varchar(255) not null, "date" date not null, "impressions" bigint not null default 0, "clicks" bigint not null default 0, "spend" numeric(20,4) not null default 0, "conversions" numeric(20,4) not null default 0, "revenue" numeric(20,4) not null default 0, "currency" varchar(255) not null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "audience_performance_metrics" add constraint "audience_performance_metrics_audience_id_ad_platform_campaign_id_date_unique" unique ("audience_id", "ad_platform", "campaign_id", "date");`,
    );
    this.addSql(
      `create index "audience_performance_metrics_organization_id_workspace_id_date_index" on "audience_performance_metrics" ("organization_id", "workspace_id", "date");`,
    );
    for (const [column, table] of [
      ['organization_id', 'organizations'],
      ['workspace_id', 'workspaces'],
      ['audience_id', 'audiences'],
    ])
      this.addSql(
        `alter table "audience_performance_metrics" add constraint "audience_performance_metrics_${column}_foreign" foreign key ("${column}") references "${table}" ("id") on delete cascade;`,
      );

    this.addSql(
      `create table "audience_conversions" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "audience_id" uuid not null, "customer_id" varchar(255) not null, "event" varchar(255) not null, "value" numeric(20,4) not null default 0, "currency" varchar(255) not null, "occurred_at" timestamptz not null, "external_id" varchar(255) not null, "ad_platform" varchar(255) null, "campaign_id" varchar(255) null, "created_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "audience_conversions" add constraint "audience_conversions_organization_id_external_id_unique" unique ("organization_id", "external_id");`,
    );
    this.addSql(
      `create index "audience_conversions_audience_id_index" on "audience_conversions" ("audience_id");`,
    );
    for (const [column, table] of [
      ['organization_id', 'organizations'],
      ['workspace_id', 'workspaces'],
      ['audience_id', 'audiences'],
    ])
      this.addSql(
        `alter table "audience_conversions" add constraint "audience_conversions_${column}_foreign" foreign key ("${column}") references "${table}" ("id") on delete cascade;`,
      );
  }
}
