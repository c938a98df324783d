import { Migration } from '@mikro-orm/migrations';

/** Each index, and the rows that would break it: groups of names equal but for case, in one scope. */
const INDEXES = [
  {
    create: `create unique index "users_organization_id_lower_username_unique" on "users" ("organization_id", lower("username")) where "organization_id" is not null;`,
    drop: `drop index if exists "users_organization_id_lower_username_unique";`,
    duplicates: `select 'usernames of organization ' || o.domain as scope, string_agg(u.username || ' (user ' || u.id || ')', ', ' order by u.username) as names
      from users u join organizations o on o.id = u.organization_id
      group by o.domain, lower(u.username) having count(*) > 1`,
  },
  {
    create: `create unique index "users_super_admin_lower_username_unique" on "users" (lower("username")) where "organization_id" is null;`,
    drop: `drop index if exists "users_super_admin_lower_username_unique";`,
    duplicates: `select 'super-admin usernames' as scope, string_agg(u.username || ' (user ' || u.id || ')', ', ' order by u.username) as names
      from users u where u.organization_id is null
      group by lower(u.username) having count(*) > 1`,
  },
  {
    create: `create unique index "roles_organization_id_lower_name_unique" on "roles" ("organization_id", lower("name"));`,
    drop: `drop index if exists "roles_organization_id_lower_name_unique";`,
    duplicates: `select 'role names of organization ' || o.domain as scope, string_agg(r.name || ' (role ' || r.id || ')', ', ' order by r.name) as names
      from roles r join organizations o on o.id = r.organization_id
      group by o.domain, lower(r.name) having count(*) > 1`,
  },
];

/** Groups named in the message; a deployment with more is told how many are left out. */
const NAMED_GROUPS = 20;

/**
 * Usernames are unique per organization regardless of case (and among super admins), role names per
 * organization regardless of case, built-in roles included: login and the failed-login counter match
 * usernames case-insensitively, so `U_Editor` beside `u_editor` would be one name for two people, and
 * `Admin` beside `admin` a role that passes for another. The services check it; these indexes settle
 * concurrent requests.
 *
 * A deployment that already holds such duplicates is refused with a message naming every group (up
 * to 20) and changes nothing, rather than skipping the index: the code now relies on one user per
 * case-insensitive name (a login would otherwise match two people), an index left out would never be
 * created by a later start, and which of two users to rename is the operator's call, not the
 * migration's (it would change someone's login). Migrations run in a transaction, so the previous
 * version keeps working on the unchanged database until the duplicates are renamed and the server is
 * started again.
 */
export class Migration20261130090000 extends Migration {
  override name = 'Migration20261130090000_case_insensitive_names';

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
        `Names that differ only by case must be made distinct before this version can start ` +
          `(usernames and role names become unique regardless of case). Nothing was changed. ` +
          `Rename all but one of each group, keeping the names of built-in roles (e.g. update users set username = '<new name>' where id = '<id>'; ` +
          `update roles set name = '<new name>' where id = <id>), then start the server again:\n${named}${more}`,
      );
    }
    for (const index of INDEXES) this.addSql(index.create);
  }

  override down(): void | Promise<void> {
    for (const index of INDEXES) this.addSql(index.drop);
  }
}
