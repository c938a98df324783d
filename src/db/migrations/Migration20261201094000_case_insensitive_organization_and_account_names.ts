import { Migration } from '@mikro-orm/migrations';

/** Each index, and the rows that would break it: groups of names equal but for case, in one scope. */
const INDEXES = [
  {
    create: `create unique index "organizations_lower_name_unique" on "organizations" (lower("name"));`,
    drop: `drop index if exists "organizations_lower_name_unique";`,
    duplicates: `select 'organization names' as scope, string_agg(o.name || ' (organization ' || o.id || ', domain ' || o.domain || ')', ', ' order by o.name, o.domain) as names
      from organizations o
      group by lower(o.name) having count(*) > 1`,
  },
  {
    create: `create unique index "service_accounts_organization_id_lower_name_unique" on "service_accounts" ("organization_id", lower("name"));`,
    drop: `drop index if exists "service_accounts_organization_id_lower_name_unique";`,
    duplicates: `select 'service-account names of organization ' || o.domain as scope, string_agg(s.name || ' (service account ' || s.id || ')', ', ' order by s.name) as names
      from service_accounts s join organizations o on o.id = s.organization_id
      group by o.domain, lower(s.name) having count(*) > 1`,
  },
];

/** Groups named in the message; a deployment with more is told how many are left out. */
const NAMED_GROUPS = 20;

/**
 * Organization names are unique regardless of case across the installation (the login page lists them,
 * and two entries that read the same cannot be told apart; domains were unique already), service-account
 * names per organization regardless of case, like usernames and role names (migration
 * case_insensitive_names): one rule of name identity everywhere. The services check it; these indexes
 * settle concurrent requests.
 *
 * A deployment that already holds such duplicates is refused with a message naming every group (up to
 * 20) and changes nothing, rather than skipping the index: an index left out would never be created by a
 * later start, and which organization or account to rename is the operator's call, not the migration's.
 * Migrations run in a transaction, so the previous version keeps working on the unchanged database until
 * the duplicates are renamed and the server is started again.
 */
export class Migration20261201094000 extends Migration {
  override name = 'Migration20261201094000_case_insensitive_organization_and_account_names';

  override async up(): Promise<void> {
    const groups: { scope: string; names: string }[] = [];
    for (const index of INDEXES) groups.push(...((await this.execute(index.duplicates)) as typeof groups));
    if (groups.length) {
      const named = groups
        .slice(0, NAMED_GROUPS)
        .map((g) => `  ${g.scope}: ${g.names}`)
        .join('\n');
      const more =
        groups.length > NAMED_GROUPS ? `\n  … and ${groups.length - NAMED_GROUPS} more groups` : '';
      throw new Error(
        `Names that differ only by case (or not at all) must be made distinct before this version can start ` +
          `(organization names and service-account names become unique regardless of case). Nothing was changed. ` +
          `Rename all but one of each group (e.g. update organizations set name = '<new name>' where id = '<id>'; ` +
          `update service_accounts set name = '<new name>' where id = '<id>'), then start the server again:\n${named}${more}`,
      );
    }
    for (const index of INDEXES) this.addSql(index.create);
  }

  override down(): void | Promise<void> {
    for (const index of INDEXES) this.addSql(index.drop);
  }
}
