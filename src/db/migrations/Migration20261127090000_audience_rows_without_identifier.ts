import { Migration } from '@mikro-orm/migrations';

/**
 * An audience's members need an identifier; a materialization records how many rows matched its
 * definition without one. Audiences materialized before stay null (not counted) until their next run.
 */
export class Migration20261127090000 extends Migration {
  override name = 'Migration20261127090000_audience_rows_without_identifier';

  override up(): void | Promise<void> {
    this.addSql(`alter table "audiences" add column "rows_without_identifier" bigint null;`);
  }

  override down(): void | Promise<void> {
    this.addSql(`alter table "audiences" drop column "rows_without_identifier";`);
  }
}
