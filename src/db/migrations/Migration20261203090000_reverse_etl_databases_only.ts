import { Migration } from '@mikro-orm/migrations';

/**
 * Reverse-ETL webhook and CSV destinations, and the write mode of a table's assignment, were accepted
 * and stored but nothing ever sent rows anywhere: they were removed from the schemas (a setting either
 * has an effect or goes). This drops them from the stored documents, which the API could no longer
 * show; an assignment to a dropped destination stays and is listed with `connection_missing`.
 */
export class Migration20261203090000 extends Migration {
  override name = 'Migration20261203090000_reverse_etl_databases_only';

  override up(): void | Promise<void> {
    for (const [table, column] of [
      ['workspaces', 'settings'],
      ['organization_settings', 'admin_settings'],
    ]) {
      const list = `"${column}"->'reverse_etl_connections'`;
      this.addSql(`update "${table}" set "${column}" = jsonb_set("${column}", '{reverse_etl_connections}',
          coalesce((select jsonb_agg(e.d order by e.i) from jsonb_array_elements(${list}) with ordinality as e(d, i)
            where e.d->>'type' = 'postgres'), '[]'::jsonb))
        where jsonb_typeof(${list}) = 'array'
          and exists (select 1 from jsonb_array_elements(${list}) as e(d) where e.d->>'type' is distinct from 'postgres');`);
    }
    this.addSql(`update "schema_configs" set "config" = "config" - 'mode'
      where "kind" = 'reverse_etl_connection' and jsonb_exists("config", 'mode');`);
  }

  override down(): void | Promise<void> {
    // The removed destinations and modes had no effect; there is nothing to restore.
  }
}
