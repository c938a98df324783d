import { Migration } from '@mikro-orm/migrations';

/** The tables whose `last_run_id` names a run that the retention sweep keeps (the kinds' `retain.namedBy`). */
const NAMING_RUNS = ['alerts', 'audience_exports', 'audiences', 'hypotheses', 'identity_graphs', 'mappings'];

/**
 * The retention sweep of `job_runs` (JOB_RUNS_RETENTION_DAYS) reads each kind's finished runs in the
 * order they ended, and asks of each whether a newer run of its singleton key ended (also what a key's
 * "latest run" reads: a mapping's, an export's latest delivery) and whether an area's `last_run_id`
 * names it: without these, each batch would read every run of a tenant, or every row of those tables.
 */
export class Migration20261206090000 extends Migration {
  override name = 'Migration20261206090000_job_runs_retention';

  override up(): void | Promise<void> {
    this.addSql(
      `create index "job_runs_finished_by_kind" on "job_runs" ("kind", "finished_at", "id") where "status" not in ('queued', 'running');`,
    );
    this.addSql(
      `create index "job_runs_by_singleton_key" on "job_runs" ("organization_id", "kind", "singleton_key", "created_at");`,
    );
    for (const table of NAMING_RUNS)
      this.addSql(
        `create index "${table}_last_run_id_index" on "${table}" ("last_run_id") where "last_run_id" is not null;`,
      );
  }

  override down(): void | Promise<void> {
    for (const table of NAMING_RUNS) this.addSql(`drop index "${table}_last_run_id_index";`);
    this.addSql(`drop index "job_runs_by_singleton_key";`);
    this.addSql(`drop index "job_runs_finished_by_kind";`);
  }
}
