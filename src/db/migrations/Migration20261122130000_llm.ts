import { Migration } from '@mikro-orm/migrations';

export class Migration20261122130000 extends Migration {
  override name = 'Migration20261122130000_llm';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "llm_usage" ("id" bigserial primary key, "organization_id" uuid not null, "workspace_id" uuid null, "purpose" varchar(255) not null, "model" varchar(255) not null, "outcome" varchar(255) not null, "prompt_tokens" int not null, "completion_tokens" int not null, "total_tokens" int not null, "cost_usd" numeric(14,6) not null, "created_at" timestamptz not null);`,
    );
    this.addSql(
      `create index "llm_usage_organization_id_created_at_index" on "llm_usage" ("organization_id", "created_at");`,
    );
    this.addSql(
      `alter table "llm_usage" add constraint "llm_usage_organization_id_foreign" foreign key ("organization_id") references "organizations" ("id") on delete cascade;`,
    );
    this.addSql(
      `alter table "llm_usage" add constraint "llm_usage_workspace_id_foreign" foreign key ("workspace_id") references "workspaces" ("id") on delete set null;`,
    );
  }

  override down(): void | Promise<void> {
    this.addSql(`drop table if exists "llm_usage" cascade;`);
  }
}
