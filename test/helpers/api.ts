import type { EntityManager } from '@mikro-orm/postgresql';
import type { TestServer } from './server.ts';
import { SUPERADMIN_PASSWORD, SUPERADMIN_USERNAME, TEST_PASSWORD } from './constants.ts';
import { createOrganizationRecord } from '../../src/modules/auth/auth.service.ts';
import { createUser } from '../../src/modules/users/users.service.ts';

export interface ApiResponse<T = any> {
  status: number;
  body: T;
  headers: Headers;
}

export interface CallOptions {
  token?: string;
  body?: unknown;
  query?: Record<string, string | number | boolean | undefined>;
  headers?: Record<string, string>;
}

/** One REST call through fetch, as an external client makes it. */
export async function call<T = any>(
  server: TestServer,
  method: string,
  path: string,
  options: CallOptions = {},
): Promise<ApiResponse<T>> {
  const url = new URL(path, server.url);
  for (const [k, v] of Object.entries(options.query ?? {}))
    if (v !== undefined) url.searchParams.set(k, String(v));
  const headers: Record<string, string> = { ...options.headers };
  if (options.token) headers.authorization = `Bearer ${options.token}`;
  let body: string | undefined;
  if (options.body !== undefined) {
    headers['content-type'] ??= 'application/json';
    body = typeof options.body === 'string' ? options.body : JSON.stringify(options.body);
  }
  const res = await fetch(url, { method, headers, body });
  const text = await res.text();
  let parsed: unknown = text;
  if ((res.headers.get('content-type') ?? '').includes('json') && text) parsed = JSON.parse(text);
  return { status: res.status, body: parsed as T, headers: res.headers };
}

/** The options of `call`, where `token: null` sends no token instead of the bound caller's. */
type ApiOptions = Omit<CallOptions, 'token'> & { token?: string | null };

export type Api = <T = any>(method: string, path: string, options?: ApiOptions) => Promise<ApiResponse<T>>;

/**
 * `call` bound to a server and a default caller, with `prefix` before every path. Both are read at
 * each call, so a file can bind them at module level before its beforeAll has started the server.
 */
export function bindCall(server: () => TestServer, token: () => string | undefined, prefix = ''): Api {
  return (method, path, options = {}) =>
    call(server(), method, prefix + path, {
      ...options,
      token: options.token === null ? undefined : (options.token ?? token()),
    });
}

/**
 * Polls `read` every `intervalMs` until `done` holds of what it returns; past `timeoutMs`, fails
 * with the last value. An error `read` throws ends the wait at once.
 */
export async function until<T>(
  what: string,
  read: () => Promise<T>,
  done: (value: T) => boolean,
  timeoutMs = 45_000,
  intervalMs = 150,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() > deadline) throw new Error(`${what}: still ${JSON.stringify(value)}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

const RUN_ENDED = ['succeeded', 'failed', 'cancelled'];

/**
 * Starts the materialization of a mapped table (REST) and waits for its run to end: the answer to
 * the start, the run as the mapping reports it, and that mapping.
 */
export async function materializeMapping(server: TestServer, token: string, table: string) {
  const started = await call(server, 'POST', `/api/mappings/${table}/materialize`, { token, body: {} });
  if (started.status !== 200)
    throw new Error(`materialize ${table} answered ${started.status}: ${JSON.stringify(started.body)}`);
  const mapping = await until(
    `materialization of ${table}`,
    async () => (await call(server, 'GET', `/api/mappings/${table}`, { token })).body,
    (body) =>
      body.materialization.last_run?.run_id === started.body.run_id &&
      RUN_ENDED.includes(body.materialization.last_run.status),
    60_000,
  );
  return { started: started.body, run: mapping.materialization.last_run, mapping };
}

export interface WorkspaceSetup {
  /** A unique one by default. */
  name?: string;
  /** Make it the caller's current workspace: the server's default (true) unless false. */
  select?: boolean;
  source_config?: Record<string, unknown>;
  target_config?: Record<string, unknown>;
  target_schema?: unknown;
}

/**
 * A workspace of the caller's organization, created with its connections and then given its
 * target schema through the config route, as a client does; answers its name and throws on any
 * refusal, so a setup step that fails is never mistaken for the behaviour under test.
 */
export async function createWorkspace(
  server: TestServer,
  token: string,
  { name = unique('ws'), target_schema, ...created }: WorkspaceSetup = {},
): Promise<string> {
  const res = await call(server, 'POST', '/api/workspaces/create', { token, body: { name, ...created } });
  if (res.status !== 200)
    throw new Error(`creating workspace ${name} answered ${res.status}: ${JSON.stringify(res.body)}`);
  if (target_schema !== undefined) {
    const saved = await call(server, 'POST', `/api/workspaces/${name}/config`, {
      token,
      body: { target_schema },
    });
    if (saved.status !== 200)
      throw new Error(`the target schema of ${name} answered ${saved.status}: ${JSON.stringify(saved.body)}`);
  }
  return name;
}

let counter = 0;
/** A name no other test (file, run or process) uses. */
export function unique(prefix: string): string {
  return `${prefix}${process.pid.toString(36)}${Date.now().toString(36)}${(counter++).toString(36)}`;
}

export async function login(server: TestServer, username: string, domain: string, password = TEST_PASSWORD) {
  const res = await call(server, 'POST', '/api/auth/login', { body: { username, domain, password } });
  if (res.status !== 200)
    throw new Error(`login ${username}@${domain} answered ${res.status}: ${JSON.stringify(res.body)}`);
  return res.body.token as string;
}

export async function superAdminToken(server: TestServer): Promise<string> {
  const res = await call(server, 'POST', '/api/auth/admin/login', {
    body: { username: SUPERADMIN_USERNAME, password: SUPERADMIN_PASSWORD },
  });
  if (res.status !== 200) throw new Error(`super admin login answered ${res.status}`);
  return res.body.token;
}

export interface TestUser {
  id: string;
  username: string;
  token: string;
}

export interface Tenant {
  organization: { id: string; domain: string; name: string };
  admin: TestUser;
  /** Another user of this organization with the given roles (built-in or custom names). */
  addUser(roles: string[], options?: { mustChangePassword?: boolean }): Promise<TestUser>;
  /** A member whose only role grants nothing: the caller every guard refuses with 403. */
  addUserWithoutPermissions(): Promise<TestUser>;
}

/** A new organization with an admin user, signed in: the unit of isolation between tests. */
export async function createTenant(server: TestServer): Promise<Tenant> {
  const em = server.deps.orm.em.fork() as EntityManager;
  const domain = `${unique('t')}.test`;
  const org = await createOrganizationRecord(em, { name: `Org ${domain}`, domain });
  const scope = { em, deps: server.deps };
  const addUser = async (
    roles: string[],
    options: { mustChangePassword?: boolean } = {},
  ): Promise<TestUser> => {
    const username = unique('u');
    const { user } = await createUser(scope, {
      organizationId: org.id,
      isSuperAdmin: false,
      username,
      password: TEST_PASSWORD,
      roles,
      must_change_password: options.mustChangePassword ?? false,
    });
    return { id: user.id, username, token: await login(server, username, domain) };
  };
  const admin = await addUser(['admin']);
  const addUserWithoutPermissions = async () => {
    const name = unique('role');
    const res = await call(server, 'POST', '/api/admin/roles', {
      token: admin.token,
      body: { name, permissions: [] },
    });
    if (res.status !== 200) throw new Error(`creating an empty role answered ${res.status}`);
    return addUser([name]);
  };
  return { organization: { id: org.id, domain, name: org.name }, admin, addUser, addUserWithoutPermissions };
}
