import { Migration } from '@mikro-orm/migrations';

/**
 * Each enqueue counts its tenant's active runs of the kind (the fair order between tenants), and
 * `job_runs` keeps every finished run: the count reads only the active ones.
 */
export class Migration20261205090000 extends Migration {
  override name = 'Migration20261205090000_active_job_runs_by_tenant';

  override up(): void | Promise<void> {
    this.addSql(
      `create index "job_runs_active_by_tenant" on "job_runs" ("organization_id", "kind") where "status" in ('queued', 'running');`,
    );
  }

  override down(): void | Promise<void> {
    this.addSql(`drop index "job_runs_active_by_tenant";`);
  }
}
