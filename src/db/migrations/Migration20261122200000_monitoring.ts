import { Migration } from '@mikro-orm/migrations';

export class Migration20261122200000 extends Migration {
  override name = 'Migration20261122200000_monitoring';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "monitoring_metric_snapshots" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "data_source" varchar(255) not null, "table_name" varchar(255) not null, "row_count" bigint not null, "metrics" jsonb not null, "measured_at" timestamptz not null, "run_id" uuid null, "created_at" timestamptz not null, primary key ("id"));`,
    );
    // Trends and the previous measurement of a table are read newest first.
    this.addSql(
      `create index "monitoring_metric_snapshots_trend_index" on "monitoring_metric_snapshots" ("workspace_id", "data_source", "table_name", "measured_at" desc);`,
    );

    this.addSql(
      `create table "identity_graphs" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "database" varchar(255) not null, "schema_name" varchar(255) not null, "created_by" varchar(255) null, "last_run_id" uuid null, "last_built_at" timestamptz null, "last_result" jsonb null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "identity_graphs" add constraint "identity_graphs_workspace_id_unique" unique ("workspace_id");`,
    );

    this.addSql(
      `create table "monitoring_default_monitors" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "monitor_key" varchar(512) not null, "config" jsonb not null, "created_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "monitoring_default_monitors" add constraint "monitoring_default_monitors_workspace_id_monitor_key_unique" unique ("workspace_id", "monitor_key");`,
    );

    this.addSql(
      `create table "alerts" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "check_key" varchar(1024) not null, "kind" text check ("kind" in ('test', 'monitor', 'identity')) not null, "check_name" varchar(255) not null, "table_name" varchar(255) not null, "column_name" varchar(255) null, "severity" text check ("severity" in ('info', 'warning', 'error', 'critical')) not null, "status" text check ("status" in ('active', 'dismissed', 'resolved')) not null default 'active', "measured" jsonb null, "threshold" jsonb null, "message" text not null, "occurrences" int not null default 1, "first_seen_at" timestamptz not null, "last_seen_at" timestamptz not null, "resolved_at" timestamptz null, "dismissed_at" timestamptz null, "dismissed_by" varchar(255) null, "dismiss_reason" text null, "snoozed_until" timestamptz null, "dismissed_signature" varchar(1024) null, "last_run_id" uuid null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    // The dedup rule: at most one open (active or dismissed) alert per check of a workspace.
    this.addSql(
      `create unique index "alerts_open_check_unique" on "alerts" ("workspace_id", "check_key") where "status" in ('active', 'dismissed');`,
    );
    this.addSql(
      `create index "alerts_organization_id_workspace_id_status_index" on "alerts" ("organization_id", "workspace_id", "status");`,
    );

    for (const table of [
      'monitoring_metric_snapshots',
      'identity_graphs',
      'monitoring_default_monitors',
      'alerts',
    ])
      for (const [column, parent] of [
        ['organization_id', 'organizations'],
        ['workspace_id', 'workspaces'],
      ])
        this.addSql(
          `alter table "${table}" add constraint "${table}_${column}_foreign" foreign key ("${column}") references "${parent}" ("id") on delete cascade;`,
        );
  }
}
