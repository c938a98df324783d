import { Migration } from '@mikro-orm/migrations';

export class Migration20261122100000 extends Migration {
  override name = 'Migration20261122100000_workspaces';

  override up(): void | Promise<void> {
    this.addSql(
      `alter table "workspaces" add column "source_config" jsonb null, add column "target_config" jsonb null, add column "target_schema" jsonb null, add column "schema_template" varchar(255) null, add column "schema_customized" boolean not null default false, add column "settings" jsonb not null default '{}', add column "workflow_state" jsonb not null default '{}', add column "system_prompt" text null, add column "success_criteria_prompt" text null;`,
    );
    // Names are matched case-insensitively by the REST adapter, so they are unique that way too.
    this.addSql(
      `create unique index "workspaces_organization_id_lower_name_unique" on "workspaces" ("organization_id", lower("name"));`,
    );

    this.addSql(
      `create table "organization_settings" ("organization_id" uuid not null, "global_settings" jsonb not null default '{}', "admin_settings" jsonb not null default '{}', "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("organization_id"));`,
    );
    this.addSql(
      `alter table "organization_settings" add constraint "organization_settings_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );

    this.addSql(
      `create table "workspace_commits" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "message" text not null, "author" varchar(255) null, "files" jsonb not null, "created_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `create index "workspace_commits_workspace_id_created_at_index" on "workspace_commits" ("workspace_id", "created_at");`,
    );
    this.addSql(
      `alter table "workspace_commits" add constraint "workspace_commits_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );
    this.addSql(
      `alter table "workspace_commits" add constraint "workspace_commits_workspace_id_foreign" foreign key ("workspace_id") references "workspaces" ("id") on delete cascade;`,
    );

    // A service account has no preferences; its selected workspace lives here.
    this.addSql(
      `alter table "service_accounts" add column "current_workspace_id" uuid null references "workspaces" ("id") on delete set null;`,
    );
  }
}
