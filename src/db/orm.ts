import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { PGlite } from '@electric-sql/pglite';
import { MikroORM, defineConfig, type Options } from '@mikro-orm/postgresql';
import { Migrator } from '@mikro-orm/migrations';
import { createEmbeddedDialect, openEmbeddedPostgres } from './embedded.ts';
import { CONNECTION_WAIT_MS, releaseClientsWhoseConnectionDied } from './pool.ts';
import { LoginFailure, Session } from '../modules/auth/auth.entity.ts';
import { Organization, User } from '../modules/users/users.entity.ts';
import { Role } from '../modules/users/users.entity.ts';
import {
  CacheSettings,
  FeatureSettings,
  UserFeatureOverride,
  VcsConfig,
} from '../modules/admin/admin.entity.ts';
import { ServiceAccount } from '../modules/service-accounts/service-accounts.entity.ts';
import { OrganizationSettings, Workspace, WorkspaceCommit } from '../modules/workspaces/workspaces.entity.ts';
import { JobRun } from '../jobs/job-run.entity.ts';
import { LlmUsage } from '../llm/llm-usage.entity.ts';
import { audienceEntities } from '../modules/audiences/audiences.entity.ts';
import { mappingEntities } from '../modules/mappings/mappings.entity.ts';
import { pipelineEntities } from '../modules/pipelines/pipelines.entity.ts';
import { analyticsEntities } from '../modules/analytics/analytics.entity.ts';
import { SavedQuery } from '../modules/queries/queries.entity.ts';
import { schemaEntities } from '../modules/schemas/schemas.entity.ts';
import { discoveryEntities } from '../modules/discovery/discovery.entity.ts';
import { LlmSettings } from '../modules/admin/llm-settings.entity.ts';
import { monitoringEntities } from '../modules/monitoring/monitoring.entity.ts';
import { alertEntities } from '../modules/alerts/alerts.entity.ts';

// Annotated: the inferred tuple of every entity is too long for declaration emit (npm run build:types).
const entities: NonNullable<Options['entities']> = [
  Organization,
  User,
  Session,
  LoginFailure,
  Role,
  ServiceAccount,
  Workspace,
  OrganizationSettings,
  WorkspaceCommit,
  CacheSettings,
  FeatureSettings,
  UserFeatureOverride,
  VcsConfig,
  JobRun,
  LlmUsage,
  ...audienceEntities,
  ...mappingEntities,
  ...pipelineEntities,
  ...analyticsEntities,
  SavedQuery,
  ...schemaEntities,
  LlmSettings,
  ...discoveryEntities,
  ...monitoringEntities,
  ...alertEntities,
];

const migrationsPath = join(dirname(fileURLToPath(import.meta.url)), 'migrations');

export type DatabaseKind = 'embedded' | 'server';

function ormConfig(connection: { clientUrl: string } | { driverOptions: unknown }): Options {
  const server =
    'clientUrl' in connection
      ? {
          driverOptions: {
            onPoolCreated: releaseClientsWhoseConnectionDied,
            connectionTimeoutMillis: CONNECTION_WAIT_MS,
          },
        }
      : {};
  return defineConfig({
    ...connection,
    ...server,
    dbName: 'clientUrl' in connection ? undefined : 'postgres',
    entities,
    extensions: [Migrator],
    migrations: { path: migrationsPath, glob: '!(*.d).ts', snapshot: false, transactional: true },
    pool: { min: 0, max: 10, idleTimeoutMillis: 10_000 },
    // Entities are read through explicit em.find calls scoped to a tenant; no global identity map.
    allowGlobalContext: false,
    ensureDatabase: false,
    debug: false,
  } as Options);
}

export interface Database {
  orm: MikroORM;
  kind: DatabaseKind;
  /** The embedded PGlite instance, when there is one (for dumps and direct access in tests). */
  embedded?: PGlite;
  close(): Promise<void>;
}

export interface DatabaseOptions {
  databaseUrl?: string;
  /** Directory for the embedded database; omitted = in memory. */
  dataDir?: string;
  /** A tarball of a data directory to start the embedded database from (tests). */
  loadDataDir?: Blob;
}

export async function openDatabase(options: DatabaseOptions): Promise<Database> {
  if (options.databaseUrl) {
    const orm = await MikroORM.init(ormConfig({ clientUrl: options.databaseUrl }));
    return { orm, kind: 'server', close: () => orm.close(true) };
  }
  const pg = await openEmbeddedPostgres(options.dataDir, options.loadDataDir);
  const orm = await MikroORM.init(ormConfig({ driverOptions: createEmbeddedDialect(pg) }));
  return {
    orm,
    kind: 'embedded',
    embedded: pg,
    async close() {
      await orm.close(true);
      await pg.close();
    },
  };
}

export async function migrate(orm: MikroORM): Promise<void> {
  await orm.migrator.up();
}
