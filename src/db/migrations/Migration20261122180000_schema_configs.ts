import { Migration } from '@mikro-orm/migrations';

export class Migration20261122180000 extends Migration {
  override name = 'Migration20261122180000_schema_configs';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "schema_configs" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "schema_type" text check ("schema_type" in ('target', 'source')) not null, "table_name" varchar(255) not null, "column_name" varchar(255) not null default '', "kind" text check ("kind" in ('column_monitoring', 'table_monitoring', 'reverse_etl_connection')) not null, "config" jsonb not null, "updated_by" varchar(255) null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `alter table "schema_configs" add constraint "schema_configs_unique" unique ("workspace_id", "schema_type", "table_name", "column_name", "kind");`,
    );
    this.addSql(
      `create table "schema_sync_runs" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid not null, "schema_fingerprint" varchar(255) not null, "target_schema" varchar(255) not null, "statements" jsonb not null, "skipped" jsonb not null, "allow_destructive" boolean not null default false, "triggered_by" varchar(255) null, "created_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(`create index "schema_sync_runs_workspace_id_index" on "schema_sync_runs" ("workspace_id");`);
    for (const table of ['schema_configs', 'schema_sync_runs'])
      for (const [column, parent] of [
        ['organization_id', 'organizations'],
        ['workspace_id', 'workspaces'],
      ])
        this.addSql(
          `alter table "${table}" add constraint "${table}_${column}_foreign" foreign key ("${column}") references "${parent}" ("id") on delete cascade;`,
        );
  }
}
