import { Migration } from '@mikro-orm/migrations';

/**
 * Settings that nothing read were removed from their schemas (issue 21: a setting either has an
 * effect or goes). Reads already ignore unknown keys; this drops them from the stored documents so
 * that no row keeps a value that looks as if it did something.
 */
export class Migration20261125093713 extends Migration {
  override name = 'Migration20261125093713_settings_without_effect';

  override up(): void | Promise<void> {
    // jsonb_exists/jsonb_exists_any are the functions behind ? and ?|, which would read as placeholders.
    this.addSql(`update "workspaces" set "settings" = "settings" - 'materialize_batch_size'
      where jsonb_exists("settings", 'materialize_batch_size');`);
    this.addSql(`update "organization_settings"
      set "admin_settings" = "admin_settings" - 'materialize_batch_size',
          "global_settings" = "global_settings" - array['timezone', 'locale', 'currency_code', 'default_schema_template', 'data_retention_days']
      where jsonb_exists("admin_settings", 'materialize_batch_size')
         or jsonb_exists_any("global_settings", array['timezone', 'locale', 'currency_code', 'default_schema_template', 'data_retention_days']);`);
    this.addSql(`update "users" set "preferences" = "preferences" - array['email_notifications', 'show_pii']
      where jsonb_exists_any("preferences", array['email_notifications', 'show_pii']);`);
  }

  override down(): void | Promise<void> {
    // The removed values had no effect; there is nothing to restore.
  }
}
