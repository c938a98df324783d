import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { networkInterfaces } from 'node:os';
import { PGlite } from '@electric-sql/pglite';
import { PGLiteSocketServer } from '@electric-sql/pglite-socket';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { AppError } from '../../src/app-error.ts';
import { loadEnv } from '../../src/env.ts';
import type { ConnectionConfig } from '../../src/warehouse/config.ts';
import {
  DEFAULT_BLOCKED_NETWORKS,
  parseNetworkList,
  resolveCheckedAddress,
} from '../../src/warehouse/network-guard.ts';
import { WarehouseRegistry, type ServerIdentity } from '../../src/warehouse/postgres.ts';
import { call, createTenant, unique, type Tenant } from '../helpers/api.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';
import { ADMIN_URL, runSql, scratchDatabase } from '../helpers/scratch-db.ts';

/*
 * Identity, not address: a workspace connection that reaches dimas's own database is refused however
 * its host is written, because the server is asked who it is (system identifier + database oid).
 * Hosts are resolved once and checked against blocked networks; socket paths need the operator's
 * consent; a superuser or RLS-bypassing role is flagged, or refused when the operator says so.
 */

const defaults = { blocked: parseNetworkList(DEFAULT_BLOCKED_NETWORKS.join(',')), allowSocketPaths: false };

async function refusal(promise: Promise<unknown>): Promise<AppError> {
  const error = await promise.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error, 'expected a refusal').toBeInstanceOf(AppError);
  return error as AppError;
}

/** Every way this machine's loopback can be written; which of them reach the server is probed. */
const LOOPBACK_SPELLINGS = [
  '127.0.0.1',
  'localhost',
  '127.1',
  '127.000.000.001',
  '0177.0.0.1',
  '2130706433',
  '0x7f000001',
  '127.0.0.2',
  '0.0.0.0',
  '::1',
  '[::1]',
  '::',
  '::ffff:127.0.0.1',
  '::FFFF:127.0.0.1',
  '::ffff:7f00:1',
  '::FFFF:7F00:1',
  '[::ffff:7f00:1]',
  '0:0:0:0:0:ffff:7f00:1',
  '0000:0000:0000:0000:0000:ffff:7f00:0001',
  '::ffff:0.0.0.0',
];

/** The machine's own addresses (every interface, loopback included): one more way to reach a local server. */
const OWN_ADDRESSES = [
  ...new Set(
    Object.values(networkInterfaces())
      .flat()
      .filter((a) => !!a)
      .map((a) => a.address),
  ),
];
/** Link-local addresses never get as far as a connection: the default blocked networks hold them. */
const LINK_LOCAL = /^fe[89ab][0-9a-f]:/i;

const ADMIN = new URL(ADMIN_URL);
const SERVER_PORT = Number(ADMIN.port || 5432);

interface Route {
  host: string;
  port: number;
}

/**
 * A port forward on every address of this machine (IPv4 and IPv6) to the PostgreSQL server: the
 * server itself listens on loopback only, and a relay is exactly what an address check cannot see.
 */
let relay: Server;
let relayPort: number;
const relayed = new Set<Socket>();

beforeAll(async () => {
  relay = createServer((client) => {
    const upstream = connect(SERVER_PORT, ADMIN.hostname);
    for (const s of [client, upstream]) {
      relayed.add(s);
      s.on('error', () => {});
      s.on('close', () => {
        relayed.delete(s);
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => relay.listen(0, '::', resolve));
  relayPort = (relay.address() as AddressInfo).port;
});

afterAll(async () => {
  for (const s of relayed) s.destroy();
  await new Promise((resolve) => relay.close(resolve));
});

/** Every spelling on the server's port, and every spelling and own address through the relay. */
const candidates = (): Route[] => [
  ...LOOPBACK_SPELLINGS.map((host) => ({ host, port: SERVER_PORT })),
  ...[...LOOPBACK_SPELLINGS, ...OWN_ADDRESSES]
    .filter((host) => !LINK_LOCAL.test(host))
    .map((host) => ({ host, port: relayPort })),
];

/** The routes that actually reach the PostgreSQL server of the tests (a refusal only means something there). */
async function reachable(routes: Route[]): Promise<Route[]> {
  const found: Route[] = [];
  for (const route of routes) {
    const client = new pg.Client({
      host: route.host.replace(/^\[(.*)\]$/, '$1'),
      port: route.port,
      user: decodeURIComponent(ADMIN.username) || 'postgres',
      password: decodeURIComponent(ADMIN.password) || undefined,
      database: 'postgres',
      connectionTimeoutMillis: 3000,
    });
    client.on('error', () => {});
    try {
      await client.connect();
      await client.query('select 1');
      found.push(route);
    } catch {
      // Nothing of that server answers there.
    } finally {
      await client.end().catch(() => {});
    }
  }
  return found;
}

describe('the network guard (no server needed)', () => {
  it('connects to the address it checked: loopback spellings become one canonical address', async () => {
    for (const host of [
      '::ffff:127.0.0.1',
      '::FFFF:7f00:1',
      '0:0:0:0:0:ffff:7f00:1',
      '[::ffff:7f00:1]',
      '2130706433',
      '0x7f000001',
      '127.1',
      'localhost',
    ]) {
      const checked = await resolveCheckedAddress(host, defaults);
      expect(checked.kind).toBe('ip');
      expect(checked.address, host).toBe('127.0.0.1');
    }
    // A name keeps its spelling as the TLS server name; an address has none.
    expect((await resolveCheckedAddress('localhost', defaults)).servername).toBe('localhost');
    expect((await resolveCheckedAddress('127.0.0.1', defaults)).servername).toBeUndefined();
  });

  it('refuses link-local and cloud metadata addresses however they are written', async () => {
    for (const host of [
      '169.254.169.254',
      '169.254.0.1',
      '::ffff:169.254.169.254',
      '::ffff:a9fe:a9fe',
      '[0:0:0:0:0:ffff:a9fe:a9fe]',
      '2852039166',
      'fe80::1',
      'FE80::abcd',
      'fd00:ec2::254',
      '100.100.100.200',
    ]) {
      const error = await refusal(resolveCheckedAddress(host, defaults));
      expect(error.code, host).toBe('UNPROCESSABLE_CONTENT');
      expect(error.details.reason, host).toBe('BLOCKED_NETWORK');
    }
  });

  it("applies the operator's list instead of the default, to every address a name resolves to", async () => {
    const settings = { blocked: parseNetworkList('127.0.0.0/8 10.0.0.0/8'), allowSocketPaths: false };
    for (const host of ['localhost', '127.1', '::ffff:7f00:1', '10.20.30.40'])
      expect((await refusal(resolveCheckedAddress(host, settings))).details.reason, host).toBe(
        'BLOCKED_NETWORK',
      );
    // The default list no longer applies once the operator replaced it.
    const metadata = await resolveCheckedAddress('169.254.169.254', settings);
    expect(metadata.address).toBe('169.254.169.254');
    // An empty list blocks nothing.
    const none = { blocked: parseNetworkList(''), allowSocketPaths: false };
    expect((await resolveCheckedAddress('169.254.169.254', none)).address).toBe('169.254.169.254');
    // A scoped link-local address, once allowed, keeps its zone for the connection.
    expect((await resolveCheckedAddress('fe80::1%lo', none)).address).toBe('fe80::1%lo');
  });

  it('refuses socket paths unless the operator allows them', async () => {
    for (const host of ['/var/run/postgresql', '/tmp', '', '  ']) {
      const error = await refusal(resolveCheckedAddress(host, defaults));
      expect(error.details.reason, JSON.stringify(host)).toBe('SOCKET_PATH_REFUSED');
    }
    const allowed = await resolveCheckedAddress('/var/run/postgresql', {
      ...defaults,
      allowSocketPaths: true,
    });
    expect(allowed).toMatchObject({ kind: 'socket', address: '/var/run/postgresql' });
  });

  it('answers 422 with the reason for a host that does not resolve', async () => {
    const error = await refusal(resolveCheckedAddress('no-such-host.invalid', defaults));
    expect(error.code).toBe('UNPROCESSABLE_CONTENT');
    expect(error.message).toMatch(/unknown host|could not be resolved/);
  });

  it('stops the server at start on a blocked-networks setting that is not a list of networks', () => {
    for (const bad of ['10.0.0.0/33', 'metadata.internal', '10.0.0.0/', '::/129'])
      expect(() => loadEnv({ WAREHOUSE_BLOCKED_NETWORKS: bad }), bad).toThrow(/WAREHOUSE_BLOCKED_NETWORKS/);
    expect(
      loadEnv({ WAREHOUSE_BLOCKED_NETWORKS: '10.0.0.0/8, fd00::/8 192.0.2.1' }).WAREHOUSE_BLOCKED_NETWORKS,
    ).toBe('10.0.0.0/8, fd00::/8 192.0.2.1');
  });
});

/*
 * The registry against the local PostgreSQL server, in both test modes: a scratch database plays the
 * control plane (its identity is what the server reads of itself at start).
 */
describe('the warehouse registry asks the server who it is', () => {
  const controlPlaneDb = scratchDatabase('cpid');
  const otherDb = scratchDatabase('cpother');
  const noIdentityDb = scratchDatabase('cpnoid');
  const plainRole = unique('dimas_plain_').toLowerCase();
  const rlsRole = unique('dimas_rls_').toLowerCase();
  let controlPlane: ServerIdentity;
  let routes: Route[];

  const config = (overrides: Partial<ConnectionConfig> = {}): ConnectionConfig => ({
    type: 'postgres',
    host: '127.0.0.1',
    port: SERVER_PORT,
    database: controlPlaneDb.name,
    user: 'postgres',
    schemas: ['public'],
    ssl: false,
    ...overrides,
  });

  beforeAll(async () => {
    await Promise.all([controlPlaneDb.create(), otherDb.create(), noIdentityDb.create()]);
    [controlPlane] = await controlPlaneDb.sql<{ systemIdentifier: string; databaseOid: string }>(
      `select (select system_identifier::text from pg_control_system()) as "systemIdentifier",
              (select oid::text from pg_database where datname = current_database()) as "databaseOid"`,
    );
    await runSql(ADMIN_URL, `create role ${plainRole} login; create role ${rlsRole} login bypassrls`);
    // Revoked in this database only: the server-wide default (PUBLIC may execute) stays as it is.
    await noIdentityDb.sql('revoke execute on function pg_control_system() from public');
    routes = await reachable(candidates());
  });

  afterAll(async () => {
    await Promise.all([controlPlaneDb.drop(), otherDb.drop(), noIdentityDb.drop()]);
    await runSql(ADMIN_URL, `drop role if exists ${plainRole}; drop role if exists ${rlsRole}`);
  });

  it('refuses the control-plane database through every spelling and own address that reaches the server', async () => {
    const direct = routes.filter((r) => r.port === SERVER_PORT).map((r) => r.host);
    expect(direct).toEqual(
      expect.arrayContaining(['127.0.0.1', 'localhost', '::ffff:127.0.0.1', '::FFFF:7F00:1', '2130706433']),
    );
    for (const address of OWN_ADDRESSES.filter((a) => !LINK_LOCAL.test(a)))
      expect(routes, address).toContainEqual({ host: address, port: relayPort });
    const registry = new WarehouseRegistry({ statementTimeoutMs: 2000, rowCap: 10, controlPlane });
    try {
      for (const { host, port } of routes) {
        const warehouse = await registry.open(config({ host, port }));
        for (const use of [
          () => warehouse.ping(),
          () => warehouse.introspect(),
          () => warehouse.catalogs(),
        ]) {
          const error = await refusal(use());
          expect(error.details.reason, `${host}:${port}`).toBe('CONTROL_PLANE_DATABASE');
        }
      }
      // Another database on the same server is somebody's warehouse.
      for (const { host, port } of routes)
        expect(
          (await (await registry.open(config({ host, port, database: otherDb.name }))).ping()).database,
        ).toBe(otherDb.name);
      // The machine's link-local addresses are refused before any connection.
      for (const address of OWN_ADDRESSES.filter((a) => LINK_LOCAL.test(a))) {
        const error = await refusal((await registry.open(config({ host: address, port: relayPort }))).ping());
        expect(error.details.reason).toBe('BLOCKED_NETWORK');
      }
    } finally {
      await registry.close();
    }
  });

  it('refuses it through the socket directory when sockets are allowed, and accepts other databases there', async () => {
    const registry = new WarehouseRegistry({
      statementTimeoutMs: 2000,
      rowCap: 10,
      controlPlane,
      network: { ...defaults, allowSocketPaths: true },
    });
    try {
      const error = await refusal((await registry.open(config({ host: '/var/run/postgresql' }))).ping());
      expect(error.details.reason).toBe('CONTROL_PLANE_DATABASE');
      const other = await registry.open(config({ host: '/var/run/postgresql', database: otherDb.name }));
      expect((await other.ping()).database).toBe(otherDb.name);
    } finally {
      await registry.close();
    }
  });

  it('checks every new physical connection, not only the first one of a pool', async () => {
    const registry = new WarehouseRegistry({
      statementTimeoutMs: 2000,
      rowCap: 10,
      controlPlane,
      poolMax: 3,
    });
    try {
      const warehouse = await registry.open(config({ host: 'localhost' }));
      // Three at once open three connections; each is refused on its own.
      const errors = await Promise.all([1, 2, 3].map(() => refusal(warehouse.ping())));
      expect(errors.map((e) => e.details.reason)).toEqual(Array(3).fill('CONTROL_PLANE_DATABASE'));
      const again = await refusal(warehouse.readOnlyQuery('select 1'));
      expect(again.details.reason).toBe('CONTROL_PLANE_DATABASE');
    } finally {
      await registry.close();
    }
  });

  it('refuses a role that cannot say which server it is on rather than guessing', async () => {
    const registry = new WarehouseRegistry({ statementTimeoutMs: 2000, rowCap: 10, controlPlane });
    try {
      const blind = await registry.open(config({ database: noIdentityDb.name, user: plainRole }));
      const error = await refusal(blind.ping());
      expect(error.code).toBe('UNPROCESSABLE_CONTENT');
      expect(error.details.reason).toBe('SERVER_IDENTITY_UNKNOWN');
      expect(error.message).toMatch(/grant execute on function pg_catalog.pg_control_system\(\)/);
      // The superuser can still execute it there: that connection is accepted.
      expect((await (await registry.open(config({ database: noIdentityDb.name }))).ping()).database).toBe(
        noIdentityDb.name,
      );
    } finally {
      await registry.close();
    }
  });

  it('flags superuser and RLS-bypassing roles, and refuses them when told to', async () => {
    const registry = new WarehouseRegistry({ statementTimeoutMs: 2000, rowCap: 10, controlPlane });
    const strict = new WarehouseRegistry({ statementTimeoutMs: 2000, rowCap: 10, refuseSuperuser: true });
    try {
      const superuser = config({ database: otherDb.name });
      expect(registry.warningsFor(superuser)).toEqual([]); // never connected yet
      await (await registry.open(superuser)).ping();
      expect(registry.warningsFor(superuser).map((w) => w.code)).toEqual(['SUPERUSER', 'BYPASS_RLS']);
      const rls = config({ database: otherDb.name, user: rlsRole });
      await (await registry.open(rls)).ping();
      expect(registry.warningsFor(rls).map((w) => w.code)).toEqual(['BYPASS_RLS']);
      const plain = config({ database: otherDb.name, user: plainRole });
      await (await registry.open(plain)).ping();
      expect(registry.warningsFor(plain)).toEqual([]);

      for (const privileged of [superuser, rls])
        expect((await refusal((await strict.open(privileged)).ping())).details.reason).toBe(
          'PRIVILEGED_ROLE',
        );
      expect((await (await strict.open(plain)).ping()).user).toBe(plainRole);
    } finally {
      await registry.close();
      await strict.close();
    }
  });
});

/*
 * Through the API, as an org admin of an ordinary organization would try it. The control plane is the
 * server's own database: with TEST_DATABASE_URL a database on the local PostgreSQL server, reachable
 * by host and socket. The embedded database (PGlite) has no address at all, so there is nothing to
 * point a workspace at: these run only with TEST_DATABASE_URL.
 */
const databaseUrl = inject('databaseUrl');

describe.skipIf(!databaseUrl)(
  'the API refuses the control-plane database (needs TEST_DATABASE_URL: the embedded control plane has no address)',
  () => {
    const warehouseDb = scratchDatabase('idwh');
    const plainRole = unique('dimas_api_plain_').toLowerCase();
    let server: TestServer;
    let strictServer: TestServer;
    let tenant: Tenant;
    let strictTenant: Tenant;
    let routes: Route[];
    const workspace = unique('identity');
    const controlPlaneName = () => new URL(databaseUrl).pathname.slice(1);

    const target = (overrides: Record<string, unknown> = {}) => ({
      type: 'postgres',
      host: '127.0.0.1',
      port: SERVER_PORT,
      database: warehouseDb.name,
      user: 'postgres',
      password: 'trust-auth-ignores-it',
      schemas: ['analytics'],
      ...overrides,
    });

    const saveTarget = async (t: Tenant, name: string, config: Record<string, unknown>) => {
      const res = await call(server, 'POST', `/api/workspaces/${name}/config`, {
        token: t.admin.token,
        body: { target_config: config },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      return res.body;
    };

    beforeAll(async () => {
      await warehouseDb.create();
      await runSql(ADMIN_URL, `create role ${plainRole} login`);
      routes = await reachable(candidates());
      server = await startTestServer();
      strictServer = await startTestServer({
        WAREHOUSE_REFUSE_SUPERUSER: 'true',
        WAREHOUSE_ALLOW_SOCKET_PATHS: 'true',
        WAREHOUSE_BLOCKED_NETWORKS: '127.0.0.2/32',
      });
      tenant = await createTenant(server);
      strictTenant = await createTenant(strictServer);
      for (const [s, t] of [
        [server, tenant],
        [strictServer, strictTenant],
      ] as const) {
        const created = await call(s, 'POST', '/api/workspaces/create', {
          token: t.admin.token,
          body: { name: workspace, target_config: target() },
        });
        expect(created.status, JSON.stringify(created.body)).toBe(200);
      }
      const schema = await call(server, 'POST', '/api/schemas/workspace', {
        token: tenant.admin.token,
        body: {
          schema: {
            name: 'identity',
            version: '1.0.0',
            tables: [
              {
                name: 'planted',
                primary_key: ['id'],
                columns: [{ name: 'id', type: 'bigint', nullable: false }],
              },
            ],
          },
        },
      });
      expect(schema.status, JSON.stringify(schema.body)).toBe(200);
    });

    afterAll(async () => {
      await server?.close();
      await strictServer?.close();
      await warehouseDb.drop();
      await runSql(ADMIN_URL, `drop role if exists ${plainRole}`);
    });

    it('refuses the connection test, ad-hoc SQL and schema sync for every spelling that reaches the control plane', async () => {
      expect(routes.length).toBeGreaterThan(10);
      for (const { host, port } of routes) {
        const config = target({ host, port, database: controlPlaneName() });
        const test = await call(server, 'POST', `/api/workspaces/${workspace}/database/test`, {
          token: tenant.admin.token,
          body: { config },
        });
        expect(test.status, `${host}: ${JSON.stringify(test.body)}`).toBe(422);
        expect(test.body.reason, host).toBe('CONTROL_PLANE_DATABASE');

        await saveTarget(tenant, workspace, config);
        const query = await call(server, 'POST', '/api/analytics/execute', {
          token: tenant.admin.token,
          body: { sql: 'select username, password_hash from users' },
        });
        expect(query.status, `${host}: ${JSON.stringify(query.body)}`).toBe(422);
        expect(query.body.reason, host).toBe('CONTROL_PLANE_DATABASE');
        const sync = await call(server, 'POST', '/api/schemas/workspace/sync', {
          token: tenant.admin.token,
          body: {},
        });
        expect(sync.status, `${host}: ${JSON.stringify(sync.body)}`).toBe(422);
        expect(sync.body.reason, host).toBe('CONTROL_PLANE_DATABASE');
      }
      // Nothing was created inside the control plane.
      const planted = await runSql(databaseUrl, `select to_regclass('analytics.planted') as t`);
      expect(planted[0].t).toBeNull();
    });

    it('refuses the socket directory by default and spellings nothing listens on stay refused', async () => {
      for (const host of ['/var/run/postgresql', '/tmp']) {
        const res = await call(server, 'POST', `/api/workspaces/${workspace}/database/test`, {
          token: tenant.admin.token,
          body: { config: target({ host, database: controlPlaneName() }) },
        });
        expect(res.status).toBe(422);
        expect(res.body.reason).toBe('SOCKET_PATH_REFUSED');
      }
      for (const host of ['169.254.169.254', '::ffff:a9fe:a9fe', 'fd00:ec2::254']) {
        const res = await call(server, 'POST', `/api/workspaces/${workspace}/database/test`, {
          token: tenant.admin.token,
          body: { config: target({ host }) },
        });
        expect(res.status, host).toBe(422);
        expect(res.body.reason, host).toBe('BLOCKED_NETWORK');
      }
    });

    it('accepts another database of the same server, with the superuser warning in the test and config answers', async () => {
      for (const host of ['127.0.0.1', 'localhost', '::ffff:7f00:1']) {
        const test = await call(server, 'POST', `/api/workspaces/${workspace}/database/test`, {
          token: tenant.admin.token,
          body: { config: target({ host }) },
        });
        expect(test.status, JSON.stringify(test.body)).toBe(200);
        expect(test.body.database).toBe(warehouseDb.name);
        expect(test.body.warnings.map((w: { code: string }) => w.code)).toEqual(['SUPERUSER', 'BYPASS_RLS']);
      }
      await saveTarget(tenant, workspace, target());
      const query = await call(server, 'POST', '/api/analytics/execute', {
        token: tenant.admin.token,
        body: { sql: 'select current_database() as db' },
      });
      expect(query.status, JSON.stringify(query.body)).toBe(200);
      expect(query.body.rows).toEqual([{ db: warehouseDb.name }]);
      const sync = await call(server, 'POST', '/api/schemas/workspace/sync', {
        token: tenant.admin.token,
        body: {},
      });
      expect(sync.status, JSON.stringify(sync.body)).toBe(200);
      expect((await warehouseDb.sql(`select to_regclass('analytics.planted') as t`))[0].t).toBe(
        'analytics.planted',
      );
      const config = await call(server, 'GET', `/api/workspaces/${workspace}/config`, {
        token: tenant.admin.token,
      });
      expect(config.body.warnings).toEqual([
        expect.objectContaining({ side: 'target', code: 'SUPERUSER' }),
        expect.objectContaining({ side: 'target', code: 'BYPASS_RLS' }),
      ]);
      const check = await call(server, 'GET', `/api/workspaces/${workspace}/database/check`, {
        token: tenant.admin.token,
      });
      expect(check.body.target.warnings.map((w: { code: string }) => w.code)).toEqual([
        'SUPERUSER',
        'BYPASS_RLS',
      ]);

      // The same database as a role with no special rights: no warning anywhere.
      const plain = await call(server, 'POST', `/api/workspaces/${workspace}/database/test`, {
        token: tenant.admin.token,
        body: { config: target({ user: plainRole }) },
      });
      expect(plain.status, JSON.stringify(plain.body)).toBe(200);
      expect(plain.body.warnings).toEqual([]);
      await saveTarget(tenant, workspace, target({ user: plainRole }));
      await call(server, 'POST', '/api/analytics/execute', {
        token: tenant.admin.token,
        body: { sql: 'select 1' },
      });
      const after = await call(server, 'GET', `/api/workspaces/${workspace}/config`, {
        token: tenant.admin.token,
      });
      expect(after.body.warnings).toEqual([]);
    });

    it("follows the operator's settings: refuse superusers, allow sockets, own blocked networks", async () => {
      const test = (config: Record<string, unknown>) =>
        call(strictServer, 'POST', `/api/workspaces/${workspace}/database/test`, {
          token: strictTenant.admin.token,
          body: { config },
        });
      const superuser = await test(target());
      expect(superuser.status).toBe(422);
      expect(superuser.body.reason).toBe('PRIVILEGED_ROLE');
      const plain = await test(target({ user: plainRole }));
      expect(plain.status, JSON.stringify(plain.body)).toBe(200);
      expect(plain.body.warnings).toEqual([]);
      // Sockets allowed: the socket reaches a warehouse, and the control plane is still refused there.
      const socket = await test(target({ host: '/var/run/postgresql', user: plainRole }));
      expect(socket.status, JSON.stringify(socket.body)).toBe(200);
      const ownDatabase = await test(
        target({ host: '/var/run/postgresql', database: controlPlaneName(), user: plainRole }),
      );
      expect(ownDatabase.status).toBe(422);
      expect(ownDatabase.body.reason).toBe('CONTROL_PLANE_DATABASE');
      // Its own list replaces the default one.
      const blocked = await test(target({ host: '127.0.0.2' }));
      expect(blocked.status).toBe(422);
      expect(blocked.body.reason).toBe('BLOCKED_NETWORK');
    });
  },
);

/*
 * The embedded control plane (PGlite) has no address of its own, but a PGlite can be served over the
 * wire (the demo warehouse is): served this way, the server's own database is still recognised by
 * its identity, and another PGlite (its own system identifier) is accepted.
 */
describe.runIf(!databaseUrl)('the embedded control plane is recognised by its identity too', () => {
  let server: TestServer;
  let tenant: Tenant;
  let other: PGlite;
  const sockets: PGLiteSocketServer[] = [];
  const workspace = unique('embedded');

  async function serve(db: PGlite): Promise<number> {
    const socket = new PGLiteSocketServer({ db, host: '127.0.0.1', port: 0, maxConnections: 10 });
    await socket.start();
    sockets.push(socket);
    return Number(socket.getServerConn().split(':').at(-1));
  }

  const test = (port: number, host = '127.0.0.1') =>
    call(server, 'POST', `/api/workspaces/${workspace}/database/test`, {
      token: tenant.admin.token,
      body: {
        config: { type: 'postgres', host, port, database: 'postgres', user: 'postgres', schemas: ['public'] },
      },
    });

  beforeAll(async () => {
    server = await startTestServer();
    tenant = await createTenant(server);
    const created = await call(server, 'POST', '/api/workspaces/create', {
      token: tenant.admin.token,
      body: { name: workspace },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    other = await PGlite.create();
  });

  afterAll(async () => {
    for (const socket of sockets) await socket.stop();
    await server?.close();
    await other?.close();
  });

  it('refuses the control-plane PGlite served on a port, and accepts another PGlite', async () => {
    const ownPort = await serve(server.db.embedded!);
    for (const host of ['127.0.0.1', 'localhost', '::ffff:7f00:1']) {
      const own = await test(ownPort, host);
      expect(own.status, JSON.stringify(own.body)).toBe(422);
      expect(own.body.reason).toBe('CONTROL_PLANE_DATABASE');
    }
    const accepted = await test(await serve(other));
    expect(accepted.status, JSON.stringify(accepted.body)).toBe(200);
    expect(accepted.body.database).toBe('postgres');
  });
});
