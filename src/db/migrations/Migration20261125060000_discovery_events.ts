import { Migration } from '@mikro-orm/migrations';

const TENANT = `nullif(current_setting('dimas.organization_id', true), '')::uuid`;

/**
 * The events of each discovery run, kept so that a client that lost its stream can resume it
 * (`Last-Event-ID` on REST, `lastEventId` of tRPC's tracked events) and get what it missed.
 */
export class Migration20261125060000 extends Migration {
  override name = 'Migration20261125060000_discovery_events';

  override up(): void | Promise<void> {
    this.addSql(
      `create table "discovery_run_events" ("run_id" uuid not null references "discovery_runs" ("id") on delete cascade, "seq" integer not null, "organization_id" uuid not null references "organizations" ("id") on delete cascade, "event" jsonb not null, primary key ("run_id", "seq"));`,
    );
    this.addSql(`alter table "discovery_run_events" enable row level security;`);
    this.addSql(
      `create policy tenant_isolation on "discovery_run_events" to dimas_tenant using ("organization_id" = ${TENANT}) with check ("organization_id" = ${TENANT});`,
    );
  }

  override down(): void | Promise<void> {
    this.addSql(`drop table if exists "discovery_run_events" cascade;`);
  }
}
