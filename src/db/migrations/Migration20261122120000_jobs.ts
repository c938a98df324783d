import { Migration } from '@mikro-orm/migrations';

export class Migration20261122120000 extends Migration {
  override name = 'Migration20261122120000_jobs';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "job_runs" ("id" uuid not null, "organization_id" uuid not null, "workspace_id" uuid null, "kind" varchar(255) not null, "status" text check ("status" in ('queued', 'running', 'succeeded', 'failed', 'cancelled')) not null default 'queued', "singleton_key" varchar(255) null, "payload" jsonb not null, "progress" jsonb not null, "result" jsonb null, "error" text null, "retry_count" int not null default 0, "started_at" timestamptz null, "finished_at" timestamptz null, "created_at" timestamptz not null, "updated_at" timestamptz not null, primary key ("id"));`,
    );
    this.addSql(
      `create index "job_runs_organization_id_kind_created_at_index" on "job_runs" ("organization_id", "kind", "created_at");`,
    );
    this.addSql(`create index "job_runs_workspace_id_index" on "job_runs" ("workspace_id");`);
    // The singleton rule lives in the database so that it holds across API processes and restarts.
    this.addSql(
      `create unique index "job_runs_active_singleton_unique" on "job_runs" ("organization_id", "kind", "singleton_key") where "status" in ('queued', 'running') and "singleton_key" is not null;`,
    );
    this.addSql(
      `alter table "job_runs" add constraint "job_runs_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );
    this.addSql(
      `alter table "job_runs" add constraint "job_runs_workspace_id_foreign" foreign key ("workspace_id") references "workspaces" ("id") on delete cascade;`,
    );
  }
}
