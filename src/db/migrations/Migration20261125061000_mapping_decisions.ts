import { Migration } from '@mikro-orm/migrations';

export class Migration20261125061000 extends Migration {
  override name = 'Migration20261125061000_mapping_decisions';

  override up(): void | Promise<void> {
    // What a person refused (a source for a field, or any source at all), so discovery does not propose it again.
    this.addSql(`alter table "mappings" add column "decisions" jsonb null;`);
  }

  override down(): void | Promise<void> {
    this.addSql(`alter table "mappings" drop column "decisions";`);
  }
}
