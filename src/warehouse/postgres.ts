import { createHash } from 'node:crypto';
import pg from 'pg';
import { AppError } from '../app-error.ts';
import type { AppDeps } from '../deps.ts';
import type { ConnectionConfig, ConnectionWarning } from './config.ts';
import { MysqlPools } from './mysql.ts';
import {
  DEFAULT_BLOCKED_NETWORKS,
  networkGuardSettings,
  parseNetworkList,
  resolveCheckedAddress,
  type CheckedAddress,
  type NetworkGuardSettings,
} from './network-guard.ts';
import {
  checkServerIdentity,
  readControlPlaneIdentity,
  type RoleFacts,
  roleWarnings,
  type ServerIdentity,
} from './postgres-identity.ts';
import { typeParsers } from './postgres-sql.ts';
import { type PoolEntry, PostgresWarehouse } from './postgres-warehouse.ts';
import type { Warehouse } from './warehouse.ts';

export { qualified, quoteIdent, SAMPLE_LIMIT_DEFAULT, SAMPLE_LIMIT_MAX } from './postgres-sql.ts';
export { readControlPlaneIdentity, type RoleFacts, type ServerIdentity } from './postgres-identity.ts';

export interface WarehouseSettings {
  statementTimeoutMs: number;
  rowCap: number;
  /** Most bytes of row values a read-only query may return (default 16 MiB); more answers 413. */
  resultByteCap?: number;
  /** The control plane's identity: a workspace connection that reaches that database is refused. */
  controlPlane?: ServerIdentity | Promise<ServerIdentity>;
  /** Networks refused and whether socket paths are allowed (default: the built-in blocked networks, no sockets). */
  network?: NetworkGuardSettings;
  /** Refuse roles that are superusers or bypass row-level security (otherwise they are only flagged). */
  refuseSuperuser?: boolean;
  /** Connections per pool. */
  poolMax?: number;
  /** A pool nobody used for this long is closed. */
  poolIdleMs?: number;
}

function poolKey(config: ConnectionConfig): string {
  const identity = [
    config.host,
    config.port,
    config.database,
    config.user,
    config.password ?? '',
    config.ssl,
  ];
  return createHash('sha256').update(JSON.stringify(identity)).digest('hex');
}

/** A role on a database (no password: what a role may do does not depend on how it logged in). */
function roleKey(config: Pick<ConnectionConfig, 'host' | 'port' | 'database' | 'user'>): string {
  return JSON.stringify([config.host, Number(config.port), config.database, config.user]);
}

const ROLE_FACTS_KEPT = 1000;

/**
 * One bounded pool per distinct connection (keyed by a hash of what the connection is made of, so a
 * source and a target on the same database share it). A pool unused for a while is closed; so is an
 * owner's previous pool when its config changes.
 *
 * The trust boundary lives here, the one gate every area opens user connections through: a pool's
 * host is resolved once and checked (network-guard.ts), the pool connects to that address, and every
 * new physical connection asks the server who it is before anyone can use it.
 */
export class WarehouseRegistry {
  readonly settings: Required<Omit<WarehouseSettings, 'controlPlane'>> & {
    controlPlane?: ServerIdentity | Promise<ServerIdentity>;
  };
  #pools = new Map<string, PoolEntry>();
  #owners = new Map<string, string>();
  /** What the last identity check saw of each connection's role (outlives its pool, bounded). */
  #roles = new Map<string, RoleFacts>();
  #sweeper: NodeJS.Timeout;
  /** MySQL / MariaDB sources: pools of their own, behind the same network guard and settings. */
  #mysql: MysqlPools;

  constructor(settings: WarehouseSettings) {
    this.settings = {
      poolMax: 5,
      poolIdleMs: 10 * 60_000,
      resultByteCap: 16 * 1024 * 1024,
      refuseSuperuser: false,
      network: { blocked: parseNetworkList(DEFAULT_BLOCKED_NETWORKS.join(',')), allowSocketPaths: false },
      ...settings,
    };
    this.#mysql = new MysqlPools(this.settings);
    this.#sweeper = setInterval(() => void this.#sweep(), Math.min(60_000, this.settings.poolIdleMs)).unref();
  }

  /**
   * A warehouse over `config`; `owner` (e.g. `<workspace id>:source`) lets a changed config close the
   * old pool. Nothing connects yet: the checks run on first use and refuse with a 422 there.
   */
  async open(config: ConnectionConfig, owner?: string): Promise<Warehouse> {
    if (config.type === 'mysql') return this.#mysql.open(config);
    const key = poolKey(config);
    let entry = this.#pools.get(key);
    if (!entry) {
      entry = { key, config, lastUsed: Date.now(), typeNames: new Map() };
      this.#pools.set(key, entry);
    }
    if (owner) {
      const previous = this.#owners.get(owner);
      this.#owners.set(owner, key);
      if (previous && previous !== key && ![...this.#owners.values()].includes(previous))
        await this.#end(previous);
    }
    entry.lastUsed = Date.now();
    return new PostgresWarehouse(config, entry, this.settings, () => this.#pool(entry));
  }

  /**
   * Warnings about the role of `config` as its last identity check saw it (superuser, bypasses RLS):
   * no connection is made, so a connection not used since the server started has none yet.
   */
  warningsFor(config: Pick<ConnectionConfig, 'host' | 'port' | 'database' | 'user'>): ConnectionWarning[] {
    if ('type' in config && config.type === 'mysql')
      return this.#mysql.warningsFor(config as ConnectionConfig);
    return roleWarnings(this.#roles.get(roleKey(config)));
  }

  /** Pools currently open (for tests and system info). */
  get size(): number {
    return this.#pools.size;
  }

  async close(): Promise<void> {
    clearInterval(this.#sweeper);
    await this.#mysql.close();
    await Promise.all([...this.#pools.keys()].map((key) => this.#end(key)));
    this.#owners.clear();
  }

  /** The entry's pool, created on first use once its host resolved to allowed addresses. */
  #pool(entry: PoolEntry): Promise<pg.Pool> {
    if (entry.pool) return Promise.resolve(entry.pool);
    entry.opening ??= resolveCheckedAddress(entry.config.host, this.settings.network).then(
      (address) => {
        entry.opening = undefined;
        // A pool closed (config changed, idle sweep) while its host was being resolved stays closed.
        if (this.#pools.get(entry.key) !== entry)
          throw new AppError('UNPROCESSABLE_CONTENT', 'The connection was closed while it was being opened', {
            reason: 'CONNECTION_CLOSED',
          });
        entry.pool = this.#createPool(entry, address);
        return entry.pool;
      },
      (error: unknown) => {
        // Not remembered: a host that failed to resolve is looked up again on the next use.
        entry.opening = undefined;
        throw error;
      },
    );
    return entry.opening;
  }

  #createPool(entry: PoolEntry, address: CheckedAddress): pg.Pool {
    const { config } = entry;
    const pool = new pg.Pool({
      host: address.address,
      port: config.port,
      database: config.database,
      user: config.user,
      password: config.password,
      // Connected by address; the certificate is still verified against the name that was written.
      ssl: config.ssl ? { rejectUnauthorized: true, servername: address.servername } : undefined,
      max: this.settings.poolMax,
      idleTimeoutMillis: 30_000,
      connectionTimeoutMillis: 10_000,
      application_name: 'dimas',
      keepAlive: true,
      types: typeParsers,
      // Every new physical connection, before anyone uses it: the address a pool keeps may later
      // belong to another server. One query per connection, none per statement.
      onConnect: (client) => {
        // A connection lost while it is checked out (an export's stream mid-read) fails its query,
        // and pg also emits the error on the client, where pg-pool listens only while the client is
        // idle: unheard, it would end the whole process.
        client.on('error', () => {});
        return this.#checkIdentity(entry, client);
      },
    });
    // An idle connection dropped by the server must not crash the process; the next query reconnects.
    pool.on('error', () => {});
    return pool;
  }

  async #checkIdentity(entry: PoolEntry, client: pg.ClientBase): Promise<void> {
    const { server, ...facts } = await checkServerIdentity(entry.config, client, this.settings.controlPlane);
    entry.server = server;
    const key = roleKey(entry.config);
    this.#roles.delete(key);
    this.#roles.set(key, facts);
    if (this.#roles.size > ROLE_FACTS_KEPT) this.#roles.delete(this.#roles.keys().next().value!);
    if (this.settings.refuseSuperuser && (facts.superuser || facts.bypassRls))
      throw new AppError(
        'UNPROCESSABLE_CONTENT',
        `Role ${entry.config.user} is a superuser or bypasses row-level security, which this server refuses for warehouse connections (WAREHOUSE_REFUSE_SUPERUSER)`,
        { reason: 'PRIVILEGED_ROLE' },
      );
  }

  async #end(key: string) {
    const entry = this.#pools.get(key);
    if (!entry) return;
    this.#pools.delete(key);
    for (const [owner, k] of this.#owners) if (k === key) this.#owners.delete(owner);
    await entry.pool?.end().catch(() => {});
  }

  async #sweep() {
    const cutoff = Date.now() - this.settings.poolIdleMs;
    for (const entry of [...this.#pools.values()])
      if (
        entry.lastUsed < cutoff &&
        !entry.opening &&
        (!entry.pool || (entry.pool.waitingCount === 0 && entry.pool.idleCount === entry.pool.totalCount))
      )
        await this.#end(entry.key);
  }
}

const registries = new WeakMap<AppDeps, WarehouseRegistry>();

/** The server's warehouse pools (one registry per running server, created on first use). */
export function warehouses(deps: AppDeps): WarehouseRegistry {
  let registry = registries.get(deps);
  if (!registry) {
    // Servers read it at start; deps built without startServer (scripts) read it on first use.
    const controlPlane = deps.controlPlane ?? readControlPlaneIdentity(deps.orm);
    if (controlPlane instanceof Promise) controlPlane.catch(() => {});
    registry = new WarehouseRegistry({
      statementTimeoutMs: deps.env.WAREHOUSE_STATEMENT_TIMEOUT_MS,
      rowCap: deps.env.WAREHOUSE_ROW_CAP,
      resultByteCap: deps.env.WAREHOUSE_RESULT_BYTE_CAP,
      controlPlane,
      network: networkGuardSettings(deps.env),
      refuseSuperuser: deps.env.WAREHOUSE_REFUSE_SUPERUSER,
    });
    registries.set(deps, registry);
  }
  return registry;
}

/** Closes every pool the server opened (server shutdown). */
export async function closeWarehouses(deps: AppDeps): Promise<void> {
  await registries.get(deps)?.close();
  registries.delete(deps);
}
