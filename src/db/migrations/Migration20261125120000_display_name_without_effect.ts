import { Migration } from '@mikro-orm/migrations';

/**
 * The global setting organization_display_name was stored and returned but nothing showed it (issue
 * 21: a setting either has an effect or goes); its stored values go with it.
 */
export class Migration20261125120000 extends Migration {
  override name = 'Migration20261125120000_display_name_without_effect';

  override up(): void | Promise<void> {
    // jsonb_exists is the function behind ?, which would read as a placeholder.
    this.addSql(`update "organization_settings"
      set "global_settings" = "global_settings" - 'organization_display_name'
      where jsonb_exists("global_settings", 'organization_display_name');`);
  }

  override down(): void | Promise<void> {
    // The removed value had no effect; there is nothing to restore.
  }
}
