import { Migration } from '@mikro-orm/migrations';

/**
 * Rows created without these documents got the entity's old default '{}' stored as the JSON string
 * "{}" (the demo workspace among them), which the API cannot read as settings: the string is parsed
 * back into the document it spells.
 */
export class Migration20261129110000 extends Migration {
  override name = 'Migration20261129110000_json_documents_as_objects';

  override up(): void | Promise<void> {
    for (const [table, column] of [
      ['workspaces', 'settings'],
      ['workspaces', 'workflow_state'],
      ['organization_settings', 'global_settings'],
      ['organization_settings', 'admin_settings'],
      ['users', 'preferences'],
    ])
      this.addSql(
        `update "${table}" set "${column}" = ("${column}" #>> '{}')::jsonb where jsonb_typeof("${column}") = 'string';`,
      );
  }

  override down(): void | Promise<void> {}
}
