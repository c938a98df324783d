import { Migration } from '@mikro-orm/migrations';

/**
 * The foundation's exact-case unique constraints on usernames, role names and service-account names,
 * now implied by the unique indexes on lower(…) (migrations case_insensitive_names and
 * case_insensitive_organization_and_account_names): names equal but for case are one name, so exactly
 * equal ones are too. Kept, they only made a concurrent duplicate fail on one constraint or another,
 * which the services had to know both of. Each lower(…) index leads with organization_id as these did,
 * so the reads by organization keep an index.
 */
const CONSTRAINTS = [
  {
    drop: `alter table "users" drop constraint if exists "users_organization_id_username_unique";`,
    restore: `alter table "users" add constraint "users_organization_id_username_unique" unique ("organization_id", "username");`,
  },
  {
    drop: `drop index if exists "users_super_admin_username_unique";`,
    restore: `create unique index "users_super_admin_username_unique" on "users" ("username") where "organization_id" is null;`,
  },
  {
    drop: `alter table "roles" drop constraint if exists "roles_organization_id_name_unique";`,
    restore: `alter table "roles" add constraint "roles_organization_id_name_unique" unique ("organization_id", "name");`,
  },
  {
    drop: `alter table "service_accounts" drop constraint if exists "service_accounts_organization_id_name_unique";`,
    restore: `alter table "service_accounts" add constraint "service_accounts_organization_id_name_unique" unique ("organization_id", "name");`,
  },
];

export class Migration20261201095000 extends Migration {
  override name = 'Migration20261201095000_drop_exact_case_name_constraints';

  override up(): void | Promise<void> {
    for (const constraint of CONSTRAINTS) this.addSql(constraint.drop);
  }

  override down(): void | Promise<void> {
    for (const constraint of CONSTRAINTS) this.addSql(constraint.restore);
  }
}
