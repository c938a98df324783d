import { Migration } from '@mikro-orm/migrations';

/**
 * Workspaces, mappings and organization settings hold documents (target schema, settings,
 * connections) that requests read, change and write back whole: a revision per row lets a write
 * notice that another one came first instead of overwriting it (optimistic locking; see
 * src/db/concurrent-edit.ts).
 */
export class Migration20261129100000 extends Migration {
  override name = 'Migration20261129100000_document_revisions';

  override up(): void | Promise<void> {
    this.addSql(`alter table "workspaces" add column "revision" integer not null default 1;`);
    this.addSql(`alter table "mappings" add column "revision" integer not null default 1;`);
    this.addSql(`alter table "organization_settings" add column "revision" integer not null default 1;`);
  }

  override down(): void | Promise<void> {
    this.addSql(`alter table "workspaces" drop column "revision";`);
    this.addSql(`alter table "mappings" drop column "revision";`);
    this.addSql(`alter table "organization_settings" drop column "revision";`);
  }
}
