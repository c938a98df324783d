import { Migration } from '@mikro-orm/migrations';

export class Migration20261122140000 extends Migration {
  override name = 'Migration20261122140000_admin_settings';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "cache_settings" ("id" uuid not null, "organization_id" uuid not null, "caches" jsonb not null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "cache_settings" add constraint "cache_settings_organization_id_unique" unique ("organization_id");`,
    );
    this.addSql(
      `alter table "cache_settings" add constraint "cache_settings_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );

    this.addSql(
      `create table "feature_settings" ("id" uuid not null, "organization_id" uuid not null, "features" jsonb not null, "allow_user_overrides" boolean not null default true, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "feature_settings" add constraint "feature_settings_organization_id_unique" unique ("organization_id");`,
    );
    this.addSql(
      `alter table "feature_settings" add constraint "feature_settings_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );

    this.addSql(
      `create table "user_feature_overrides" ("id" uuid not null, "organization_id" uuid not null, "user_id" uuid not null, "overrides" jsonb not null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "user_feature_overrides" add constraint "user_feature_overrides_user_id_unique" unique ("user_id");`,
    );
    this.addSql(
      `alter table "user_feature_overrides" add constraint "user_feature_overrides_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );
    this.addSql(
      `alter table "user_feature_overrides" add constraint "user_feature_overrides_user_id_foreign" foreign key ("user_id") references "users" ("id") on delete cascade;`,
    );

    this.addSql(
      `create table "vcs_configs" ("id" uuid not null, "organization_id" uuid not null, "enabled" boolean not null default true, "url" text not null, "branch" varchar(255) not null, "author_name" varchar(255) not null, "author_email" varchar(255) not null, "path_prefix" text not null default '', "username" varchar(255) not null, "token_encrypted" text null, "last_push_at" timestamptz null, "last_push_commit" varchar(255) null, "last_push_error" text null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "vcs_configs" add constraint "vcs_configs_organization_id_unique" unique ("organization_id");`,
    );
    this.addSql(
      `alter table "vcs_configs" add constraint "vcs_configs_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );
  }
}
