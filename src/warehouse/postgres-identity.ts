import type pg from 'pg';
import { AppError } from '../app-error.ts';
import type { AppDeps } from '../deps.ts';
import type { ConnectionConfig, ConnectionWarning } from './config.ts';
import { quoteIdent } from './postgres-sql.ts';

/**
 * Who a database is: the cluster's system identifier (shared only by the cluster and its physical
 * copies: replicas, restored base backups) and the database's oid inside it. Equal identities are the
 * same data, however the host was written.
 */
export interface ServerIdentity {
  systemIdentifier: string;
  databaseOid: string;
}

/** What the identity check learns about the connection's role. */
export interface RoleFacts {
  superuser: boolean;
  bypassRls: boolean;
}

/** What the identity check learns about a connection: whom it reaches and what its role may do. */
export interface ConnectionFacts extends RoleFacts {
  server: ServerIdentity;
}

// Every name schema-qualified: a function or view the role put earlier on its search_path cannot answer
// instead. pg_control_system() is executable by PUBLIC unless an administrator revoked it.
const IDENTITY_SQL = `select s.system_identifier::text as system_identifier, d.oid::text as database_oid,
    r.rolsuper as superuser, r.rolbypassrls as bypass_rls
  from pg_catalog.pg_control_system() s, pg_catalog.pg_database d, pg_catalog.pg_roles r
  where d.datname = pg_catalog.current_database() and r.rolname = current_user`;

interface IdentityRow {
  system_identifier: string;
  database_oid: string;
  superuser: boolean;
  bypass_rls: boolean;
}

/** The control plane's own identity (read once at start, through the ORM's connection). */
export async function readControlPlaneIdentity(orm: AppDeps['orm']): Promise<ServerIdentity> {
  let rows: IdentityRow[];
  try {
    rows = await orm.em.getConnection().execute<IdentityRow[]>(IDENTITY_SQL);
  } catch (error) {
    throw new Error(
      `dimas cannot read its own database's identity (pg_control_system()), which it needs to refuse workspace connections to that database: ${(error as Error).message}. Grant it: grant execute on function pg_catalog.pg_control_system() to <dimas role>`,
      { cause: error },
    );
  }
  return { systemIdentifier: rows[0].system_identifier, databaseOid: rows[0].database_oid };
}

/** The warnings a role's privileges deserve (shown with the connection's config and test answers). */
export function roleWarnings(facts: RoleFacts | undefined): ConnectionWarning[] {
  const warnings: ConnectionWarning[] = [];
  if (facts?.superuser)
    warnings.push({
      code: 'SUPERUSER',
      message:
        'The connection logs in as a superuser: it can read and change everything on that server. Use a role with only the privileges dimas needs',
    });
  if (facts?.bypassRls)
    warnings.push({
      code: 'BYPASS_RLS',
      message: 'The connection role bypasses row-level security: policies on its tables do not apply to it',
    });
  return warnings;
}

const IDENTITY_TIMEOUT_MS = 10_000;

/**
 * Asks a new physical connection who it is: refused when the server cannot say, or when it is the
 * control plane's own database; otherwise whom it reaches and what its role may do (the caller records
 * and judges it).
 */
export async function checkServerIdentity(
  config: Pick<ConnectionConfig, 'user'>,
  client: pg.ClientBase,
  controlPlaneIdentity: ServerIdentity | Promise<ServerIdentity> | undefined,
): Promise<ConnectionFacts> {
  let row: IdentityRow | undefined;
  let unknown: string | undefined;
  try {
    // Bounded like the connection itself: a server that never answers must not hold the request.
    const query = { text: IDENTITY_SQL, query_timeout: IDENTITY_TIMEOUT_MS } as pg.QueryConfig;
    row = (await client.query<IdentityRow>(query)).rows[0];
  } catch (error) {
    const code = (error as { code?: string }).code;
    // 42501: EXECUTE revoked; 42883/0A000: a PostgreSQL-compatible server without the function.
    if (code === '42501')
      unknown = `Role ${config.user} cannot execute pg_control_system(), which dimas needs to tell this database from its own; grant it with: grant execute on function pg_catalog.pg_control_system() to ${quoteIdent(config.user)}`;
    else if (code === '42883' || code === '0A000')
      unknown = `This server has no pg_control_system(), which dimas needs to tell it from its own database`;
    else throw error;
  }
  // Refused rather than guessed: nothing else an unprivileged role can read tells a replica or a
  // restored copy of dimas's own database from an unrelated server.
  if (!row)
    throw new AppError('UNPROCESSABLE_CONTENT', unknown ?? 'The server did not say who it is', {
      reason: 'SERVER_IDENTITY_UNKNOWN',
    });
  const controlPlane = await controlPlaneIdentity;
  if (
    controlPlane &&
    row.system_identifier === controlPlane.systemIdentifier &&
    row.database_oid === controlPlane.databaseOid
  )
    throw new AppError(
      'UNPROCESSABLE_CONTENT',
      "This connection reaches dimas's own database, which is never reachable through a workspace, however the host is written",
      { reason: 'CONTROL_PLANE_DATABASE' },
    );
  return {
    superuser: row.superuser,
    bypassRls: row.bypass_rls,
    server: { systemIdentifier: row.system_identifier, databaseOid: row.database_oid },
  };
}
