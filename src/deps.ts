import type { EntityManager, MikroORM } from '@mikro-orm/postgresql';
import type { Principal } from './auth/principal.ts';
import type { Env } from './env.ts';
import type { Logger } from './logger.ts';
import type { Authenticator } from './auth/principal.ts';
import type { SecretBox } from './auth/secret-box.ts';
import type { DatabaseKind } from './db/orm.ts';
import type { JobQueue } from './jobs/queue.ts';
import type { DemoWarehouse } from './warehouse/demo.ts';
import type { ServerIdentity } from './warehouse/postgres.ts';

/** What a running server is made of; built once in main.ts (or a test) and handed to createApp. */
export interface AppDeps {
  env: Env;
  orm: MikroORM;
  dbKind: DatabaseKind;
  logger: Logger;
  authenticator: Authenticator;
  secrets: SecretBox;
  jobs: JobQueue;
  startedAt: Date;
  /** Embedded mode with SEED_DEMO: the demo warehouse (a second PGlite on 127.0.0.1). */
  demoWarehouse?: DemoWarehouse;
  /** Who the control-plane database is (read once at start): workspace connections that reach it are refused. */
  controlPlane?: ServerIdentity;
}

/** What a service is handed: the request's unit of work and the server's parts. */
export interface Scope {
  em: EntityManager;
  deps: AppDeps;
}

/** A scope with a known caller; every tenant-owned query filters by its organization. */
export interface CallerScope extends Scope {
  principal: Principal;
}

/** A scope that knows where an anonymous request came from (login). */
export interface ClientScope extends Scope {
  ipAddress: string;
  userAgent: string | null;
}
