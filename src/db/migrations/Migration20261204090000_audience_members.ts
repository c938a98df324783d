import { Migration } from '@mikro-orm/migrations';

/**
 * An audience's members are distinct identifiers: `rows_merged` counts the matching rows folded into
 * another member for sharing its identifier values (null for a materialization made before). A
 * conversion records whether its customer was a member when it was posted (`member`; null for those
 * posted before this was checked, which the figures keep counting as before).
 */
export class Migration20261204090000 extends Migration {
  override name = 'Migration20261204090000_audience_members';

  override up(): void | Promise<void> {
    this.addSql(`alter table "audiences" add column "rows_merged" bigint null;`);
    this.addSql(`alter table "audience_conversions" add column "member" boolean null;`);
  }

  override down(): void | Promise<void> {
    this.addSql(`alter table "audience_conversions" drop column "member";`);
    this.addSql(`alter table "audiences" drop column "rows_merged";`);
  }
}
