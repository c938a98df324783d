import { Migration } from '@mikro-orm/migrations';

/**
 * When an audience's definition last changed, so an export of a stale audience can say when it was
 * materialized and when its definition changed since. Known for audiences still at their first
 * version (their creation); unknown (null) for those changed before it was recorded.
 */
export class Migration20261202090000 extends Migration {
  override name = 'Migration20261202090000_audience_definition_changed_at';

  override up(): void | Promise<void> {
    this.addSql(`alter table "audiences" add column "definition_changed_at" timestamptz null;`);
    this.addSql(
      `update "audiences" set "definition_changed_at" = "created_at" where "definition_version" = 1;`,
    );
  }

  override down(): void | Promise<void> {
    this.addSql(`alter table "audiences" drop column "definition_changed_at";`);
  }
}
