import { Migration } from '@mikro-orm/migrations';

export class Migration20261122170000 extends Migration {
  override name = 'Migration20261122170000_analytics';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "saved_queries" ("id" uuid not null, "organization_id" uuid not null, "name" varchar(255) not null, "description" text not null default '', "sql" text not null, "schema_identifier" varchar(255) null, "owner_id" uuid not null, "owner_name" varchar(255) not null, "visibility" text check ("visibility" in ('private', 'shared')) not null default 'private', "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `create index "saved_queries_organization_id_schema_identifier_index" on "saved_queries" ("organization_id", "schema_identifier");`,
    );
    this.addSql(
      `alter table "saved_queries" add constraint "saved_queries_organization_id_owner_id_name_unique" unique ("organization_id", "owner_id", "name");`,
    );
    this.addSql(
      `alter table "saved_queries" add constraint "saved_queries_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );

    this.addSql(
      `create table "hypotheses" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "statement" text not null, "target_schema" varchar(255) not null, "target_table" varchar(255) not null, "metric" jsonb not null, "segment" jsonb not null, "filter" text null, "test" text check ("test" in ('welch_t', 'mann_whitney_u', 'chi_square', 'two_proportion_z', 'pearson', 'spearman')) not null, "alpha" double precision not null, "minimum_detectable_effect" double precision null, "mining_columns" jsonb not null, "origin" text check ("origin" in ('manual', 'generated')) not null default 'manual', "status" text check ("status" in ('draft', 'queued', 'running', 'tested', 'failed')) not null default 'draft', "last_run_id" uuid null, "result" jsonb null, "p_value" double precision null, "significant" boolean null, "tested_at" timestamptz null, "last_error" text null, "created_by_id" uuid null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `create index "hypotheses_organization_id_workspace_id_index" on "hypotheses" ("organization_id", "workspace_id");`,
    );
    this.addSql(
      `alter table "hypotheses" add constraint "hypotheses_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );
    this.addSql(
      `alter table "hypotheses" add constraint "hypotheses_workspace_id_foreign" foreign key ("workspace_id") references "workspaces" ("id") on delete cascade;`,
    );

    this.addSql(
      `create table "insights" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "hypothesis_id" uuid not null, "title" varchar(255) not null, "description" text not null default '', "confidence" double precision not null, "p_value" double precision not null, "test" varchar(255) not null, "effect_size" jsonb not null, "performance" jsonb null, "performance_updated_at" timestamptz null, "created_by_id" uuid null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(`create index "insights_hypothesis_id_index" on "insights" ("hypothesis_id");`);
    this.addSql(
      `create index "insights_organization_id_workspace_id_confidence_index" on "insights" ("organization_id", "workspace_id", "confidence");`,
    );
    for (const [column, table] of [
      ['organization_id', 'organizations'],
      ['workspace_id', 'workspaces'],
      ['hypothesis_id', 'hypotheses'],
    ])
      this.addSql(
        `alter table "insights" add constraint "insights_${column}_foreign" foreign key ("${column}") references "${table}" ("id") on delete cascade;`,
      );
  }

  override down(): void | Promise<void> {
    this.addSql(`drop table if exists "insights" cascade;`);
    this.addSql(`drop table if exists "hypotheses" cascade;`);
    this.addSql(`drop table if exists "saved_queries" cascade;`);
  }
}
