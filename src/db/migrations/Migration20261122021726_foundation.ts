import { Migration } from '@mikro-orm/migrations';

export class Migration20261122021726 extends Migration {
  override name = 'Migration20261122021726_foundation';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "login_failures" ("id" bigserial primary key, "username" varchar(255) not null, "ip_address" varchar(255) not null, "at" timestamptz not null);`,
    );
    this.addSql(`create index "login_failures_username_index" on "login_failures" ("username");`);
    this.addSql(`create index "login_failures_ip_address_index" on "login_failures" ("ip_address");`);

    this.addSql(
      `create table "organizations" ("id" uuid not null, "name" varchar(255) not null, "domain" varchar(255) not null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "organizations" add constraint "organizations_domain_unique" unique ("domain");`,
    );

    this.addSql(
      `create table "roles" ("id" serial primary key, "organization_id" uuid not null, "name" varchar(255) not null, "description" text not null default '', "permissions" text[] not null, "is_builtin" boolean not null default false, "created_at" timestamptz not null, "updated_at" timestamptz not null);`,
    );
    this.addSql(
      `alter table "roles" add constraint "roles_organization_id_name_unique" unique ("organization_id", "name");`,
    );

    this.addSql(
      `create table "users" ("id" uuid not null, "organization_id" uuid null, "username" varchar(255) not null, "email" varchar(255) null, "password_hash" text not null, "is_super_admin" boolean not null default false, "must_change_password" boolean not null default false, "is_active" boolean not null default true, "preferences" jsonb not null default '{}', "last_login_at" timestamptz null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "users" add constraint "users_organization_id_username_unique" unique ("organization_id", "username");`,
    );
    // organization_id is null for super admins, and NULLs never collide in a unique constraint.
    this.addSql(
      `create unique index "users_super_admin_username_unique" on "users" ("username") where "organization_id" is null;`,
    );

    this.addSql(
      `create table "sessions" ("id" varchar(255) not null, "user_id" uuid not null, "expires_at" timestamptz not null, "created_at" timestamptz not null, "ip_address" varchar(255) null, "user_agent" text null, primary key ("id"));`,
    );
    this.addSql(`create index "sessions_user_id_index" on "sessions" ("user_id");`);

    this.addSql(
      `create table "service_accounts" ("id" uuid not null, "organization_id" uuid not null, "name" varchar(255) not null, "description" text not null default '', "is_active" boolean not null default true, "key_prefix" varchar(255) not null, "key_hash" varchar(255) not null, "key_created_at" timestamptz not null, "key_expires_at" timestamptz null, "previous_key_prefix" varchar(255) null, "previous_key_hash" varchar(255) null, "previous_key_expires_at" timestamptz null, "last_used_at" timestamptz null, "created_by_id" uuid null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "service_accounts" add constraint "service_accounts_key_prefix_unique" unique ("key_prefix");`,
    );
    this.addSql(
      `create index "service_accounts_previous_key_prefix_index" on "service_accounts" ("previous_key_prefix");`,
    );
    this.addSql(
      `alter table "service_accounts" add constraint "service_accounts_organization_id_name_unique" unique ("organization_id", "name");`,
    );

    this.addSql(
      `create table "service_account_roles" ("service_account_id" uuid not null, "role_id" int not null, primary key ("service_account_id", "role_id"));`,
    );

    this.addSql(
      `create table "user_roles" ("user_id" uuid not null, "role_id" int not null, primary key ("user_id", "role_id"));`,
    );

    this.addSql(
      `create table "workspaces" ("id" uuid not null, "organization_id" uuid not null, "name" varchar(255) not null, "description" text not null default '', "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "workspaces" add constraint "workspaces_organization_id_name_unique" unique ("organization_id", "name");`,
    );

    this.addSql(
      `alter table "roles" add constraint "roles_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );

    this.addSql(
      `alter table "users" add constraint "users_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );

    this.addSql(
      `alter table "sessions" add constraint "sessions_user_id_foreign" foreign key ("user_id") references "users" ("id") on delete cascade;`,
    );

    this.addSql(
      `alter table "service_accounts" add constraint "service_accounts_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );
    this.addSql(
      `alter table "service_accounts" add constraint "service_accounts_created_by_id_foreign" foreign key ("created_by_id") references "users" ("id") on delete set null;`,
    );

    this.addSql(
      `alter table "service_account_roles" add constraint "service_account_roles_service_account_id_foreign" foreign key ("service_account_id") references "service_accounts" ("id") on update cascade on delete cascade;`,
    );
    this.addSql(
      `alter table "service_account_roles" add constraint "service_account_roles_role_id_foreign" foreign key ("role_id") references "roles" ("id") on update cascade on delete cascade;`,
    );

    this.addSql(
      `alter table "user_roles" add constraint "user_roles_user_id_foreign" foreign key ("user_id") references "users" ("id") on update cascade on delete cascade;`,
    );
    this.addSql(
      `alter table "user_roles" add constraint "user_roles_role_id_foreign" foreign key ("role_id") references "roles" ("id") on update cascade on delete cascade;`,
    );

    this.addSql(
      `alter table "workspaces" add constraint "workspaces_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );
  }
}
