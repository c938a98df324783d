import { Migration } from '@mikro-orm/migrations';

export class Migration20261122190000 extends Migration {
  override name = 'Migration20261122190000_discovery';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "llm_parameters" ("id" uuid not null, "organization_id" uuid not null, "parameters" jsonb not null, "api_key_encrypted" text null, "api_key_hint" varchar(255) null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "llm_parameters" add constraint "llm_parameters_organization_id_unique" unique ("organization_id");`,
    );
    this.addSql(
      `alter table "llm_parameters" add constraint "llm_parameters_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );

    this.addSql(
      `create table "discovery_runs" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "started_by" uuid not null, "status" varchar(255) not null default 'running', "mode" varchar(255) not null, "cancel_requested_at" timestamptz null, "reason" text null, "summary" jsonb null, "started_at" timestamptz not null, "heartbeat_at" timestamptz not null, "finished_at" timestamptz null, primary key ("id"));`,
    );
    this.addSql(
      `create index "discovery_runs_organization_id_started_by_status_index" on "discovery_runs" ("organization_id", "started_by", "status");`,
    );
    // The lock: one running discovery per workspace, whichever API process started it.
    this.addSql(
      `create unique index "discovery_runs_one_running" on "discovery_runs" ("workspace_id") where "status" = 'running';`,
    );
    this.addSql(
      `alter table "discovery_runs" add constraint "discovery_runs_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );
    this.addSql(
      `alter table "discovery_runs" add constraint "discovery_runs_workspace_id_foreign" foreign key ("workspace_id") references "workspaces" ("id") on delete cascade;`,
    );
  }

  override down(): void | Promise<void> {
    this.addSql(`drop table if exists "discovery_runs" cascade;`);
    this.addSql(`drop table if exists "llm_parameters" cascade;`);
  }
}
