import { Migration } from '@mikro-orm/migrations';

export class Migration20261122160000 extends Migration {
  override name = 'Migration20261122160000_mappings';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "mappings" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "table_name" varchar(255) not null, "tables" jsonb not null, "connections" jsonb not null, "transformations" jsonb not null, "ambiguities" jsonb not null, "version" int not null default 1, "committed_version" int null, "materialized_version" int null, "materialized_at" timestamptz null, "materialized_rows" bigint null, "last_run_id" uuid null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "mappings" add constraint "mappings_workspace_id_table_name_unique" unique ("workspace_id", "table_name");`,
    );
    this.addSql(
      `create table "mapping_commits" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "table_name" varchar(255) not null, "version" int not null, "sql" text not null, "columns" jsonb not null, "mapping" jsonb not null, "target_table" jsonb not null, "author" varchar(255) null, "message" text not null, "created_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "mapping_commits" add constraint "mapping_commits_workspace_id_table_name_version_unique" unique ("workspace_id", "table_name", "version");`,
    );
    this.addSql(
      `create table "transformation_projects" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "files" jsonb not null, "fingerprint" varchar(255) not null, "models" jsonb not null, "generated_by" varchar(255) null, "generated_at" timestamptz not null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "transformation_projects" add constraint "transformation_projects_workspace_id_unique" unique ("workspace_id");`,
    );
    for (const table of ['mappings', 'mapping_commits', 'transformation_projects'])
      for (const [column, parent] of [
        ['organization_id', 'organizations'],
        ['workspace_id', 'workspaces'],
      ])
        this.addSql(
          `alter table "${table}" add constraint "${table}_${column}_foreign" foreign key ("${column}") references "${parent}" ("id") on delete cascade;`,
        );
  }
}
