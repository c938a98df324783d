import { randomUUID } from 'node:crypto';
import { createTRPCClient, httpLink, TRPCClientError } from '@trpc/client';
import superjson from 'superjson';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  bindCall,
  call,
  createTenant,
  createWorkspace,
  login,
  superAdminToken,
  unique,
  type Tenant,
} from './helpers/api.ts';
import type { AppRouter } from '../src/trpc/router.ts';

/*
 * No route drops a field it does not know. Every operation of the OpenAPI document the server serves
 * gets a body (or, for GET and DELETE, a query) with one unknown key, at the top level and inside each
 * nested object its schema declares, and answers 400 naming that key at its place; without
 * credentials a guarded route still answers 401 first. Objects that are documented as open (free-form
 * maps, target schema documents that keep extra keys) are the exceptions, listed below: a new one
 * fails this test until it is listed.
 */
type Schema = Record<string, any>;

const KEY = 'zz_not_a_field';

/** Request-body objects whose extra keys are data, not fields (additionalProperties in the document). */
const OPEN_OBJECTS = [
  // Free-form JSON (DESIGN §4: z.record(z.string(), z.unknown())).
  'PUT /api/auth/preferences .preferences',
  'POST /api/workspaces/{workspace_name}/config .settings',
  'POST /api/workspaces/{workspace_name}/workflow/complete .task_data.data',
  'POST /api/workspaces/{workspace_name}/workflow/incomplete .task_data.data',
  'POST /api/workspaces/{workspace_name}/config .workflow_state.*.data',
  'POST /api/api/audiences .definition.rules',
  'PUT /api/api/audiences/{audience_id} .definition.rules',
  'PUT /api/analytics/insights/{insight_id}/performance .metrics',
  // Maps keyed by a name (a cache, a feature, a table, a header), their values typed.
  'POST /api/admin/cache-settings .caches',
  'POST /api/admin/feature-settings .features',
  'POST /api/admin/user-feature-overrides .overrides',
  'POST /api/admin/setup-environment .source.cursor_columns',
  'POST /api/workspaces/source-config .source_config.cursor_columns',
  'POST /api/workspaces/create .source_config.cursor_columns',
  'POST /api/workspaces/create .target_config.cursor_columns',
  'POST /api/workspaces/{workspace}/database/test .config.cursor_columns',
  'POST /api/workspaces/{workspace}/database/catalogs .config.cursor_columns',
  'POST /api/workspaces/{workspace_name}/config .source_config.cursor_columns',
  'POST /api/workspaces/{workspace_name}/config .target_config.cursor_columns',
  'POST /api/workspaces/{workspace_name}/config .workflow_state',
  'POST /api/api/audiences/exports .destination.headers',
  'PUT /api/api/audiences/exports/{export_id} .destination.headers',
  // Target schema documents (schema.json) keep extra keys as given (README "Target schema").
  'POST /api/workspaces/{workspace_name}/config .target_schema',
  'POST /api/workspaces/{workspace_name}/config .target_schema.tables.[]',
  'POST /api/workspaces/{workspace_name}/config .target_schema.tables.[].columns.[]',
  'POST /api/schemas/workspace .schema',
  'POST /api/schemas/workspace .schema.tables.[]',
  'POST /api/schemas/workspace .schema.tables.[].columns.[]',
  'POST /api/schemas/workspace/tables/{table_name}/columns .column',
].sort();

let server: TestServer;
let tenant: Tenant;
let superToken: string;
let logoutToken: string;
let workspaceName: string;
let doc: Schema;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
  superToken = await superAdminToken(server);
  logoutToken = await login(server, tenant.admin.username, tenant.organization.domain);
  workspaceName = await createWorkspace(server, tenant.admin.token, { name: unique('strict') });
  doc = (await call(server, 'GET', '/api/openapi.json')).body;
});
afterAll(async () => server?.close());

const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

function resolve(schema: Schema | undefined): Schema {
  let s = schema ?? {};
  for (let i = 0; s.$ref && i < 20; i++)
    s = String(s.$ref)
      .replace(/^#\//, '')
      .split('/')
      .reduce((node: any, key) => node?.[key], doc);
  return s ?? {};
}

/** The options of a union, the schema itself otherwise; `null` options left out. */
function options(schema: Schema): Schema[] {
  const s = resolve(schema);
  const list = s.anyOf ?? s.oneOf;
  if (!list) return [s];
  return list.map(resolve).filter((o: Schema) => o.type !== 'null');
}

const isObject = (s: Schema) => s.type === 'object' || (s.properties && !s.type);

/** A plausible value, so that the unknown key is the only thing wrong where it is put. */
function sample(schema: Schema | undefined, depth = 0): unknown {
  const s = options(schema ?? {})[0] ?? {};
  if (s.const !== undefined) return s.const;
  if (s.enum) return s.enum[0];
  if (s.default !== undefined) return s.default;
  if (s.allOf) return sample(s.allOf[0], depth);
  const type = Array.isArray(s.type) ? s.type.find((t: string) => t !== 'null') : s.type;
  if (type === 'string') {
    if (s.format === 'uuid') return randomUUID();
    if (s.format === 'date-time') return new Date().toISOString();
    if (s.format === 'date') return new Date().toISOString().slice(0, 10);
    if (s.format === 'email') return 'strict@example.com';
    if (s.format === 'uri') return 'https://example.invalid/x';
    return 'x'.repeat(Math.max(s.minLength ?? 1, 1));
  }
  if (type === 'integer' || type === 'number') return s.minimum ?? 1;
  if (type === 'boolean') return true;
  if (type === 'array')
    return depth > 5 ? [] : Array.from({ length: s.minItems ?? 0 }, () => sample(s.items, depth + 1));
  if (isObject(s)) {
    const out: Record<string, unknown> = {};
    if (depth > 5) return out;
    for (const key of s.required ?? []) out[key] = sample(s.properties?.[key], depth + 1);
    return out;
  }
  return 'x';
}

interface Place {
  /** Where in the body, as keys and array indexes (`[]` is index 0). */
  path: (string | number)[];
  schema: Schema;
}

/** Every object a body schema declares (strict ones to probe, open ones to compare with the list). */
function objectsOf(
  schema: Schema,
  path: (string | number)[] = [],
  depth = 0,
): { strict: Place[]; open: Place[] } {
  const found = { strict: [] as Place[], open: [] as Place[] };
  if (depth > 6) return found;
  for (const s of options(schema)) {
    if (s.type === 'array' && s.items) {
      const inner = objectsOf(s.items, [...path, 0], depth + 1);
      found.strict.push(...inner.strict);
      found.open.push(...inner.open);
    }
    if (!isObject(s)) continue;
    const extra = s.additionalProperties;
    if (extra === undefined || extra === false) found.strict.push({ path, schema: s });
    else found.open.push({ path, schema: s });
    for (const [key, child] of Object.entries<Schema>(s.properties ?? {})) {
      const inner = objectsOf(child, [...path, key], depth + 1);
      found.strict.push(...inner.strict);
      found.open.push(...inner.open);
    }
    if (extra && typeof extra === 'object') {
      const inner = objectsOf(extra, [...path, '*'], depth + 1);
      found.open.push(...inner.open);
    }
  }
  return found;
}

/** `body` with the object at `path` replaced by `value` (arrays get it as their first element). */
function setAt(body: unknown, path: (string | number)[], value: unknown): unknown {
  if (!path.length) return value;
  const [head, ...rest] = path;
  if (typeof head === 'number') {
    const list = Array.isArray(body) ? [...body] : [];
    list[0] = setAt(list[0], rest, value);
    return list;
  }
  const object = body && typeof body === 'object' && !Array.isArray(body) ? { ...body } : {};
  (object as Record<string, unknown>)[head] = setAt((object as Record<string, unknown>)[head], rest, value);
  return object;
}

interface Operation {
  method: string;
  path: string;
  guarded: boolean;
  parameters: { name: string; in: string; required?: boolean; schema: Schema }[];
  body?: Schema;
}

function operations(): Operation[] {
  const ops: Operation[] = [];
  for (const [path, item] of Object.entries<Schema>(doc.paths))
    for (const [method, op] of Object.entries<Schema>(item)) {
      if (!['get', 'post', 'put', 'patch', 'delete'].includes(method)) continue;
      const body = op.requestBody ? resolve(op.requestBody).content?.['application/json']?.schema : undefined;
      ops.push({
        method: method.toUpperCase(),
        path,
        guarded: (op.security ?? doc.security ?? []).length > 0,
        parameters: (op.parameters ?? []).map(resolve),
        body,
      });
    }
  return ops;
}

function urlOf(op: Operation, query: Record<string, string>): string {
  const path = op.path.replace(/\{([^}]+)\}/g, (_, name: string) => {
    // Identifiers of things that do not exist for destructive calls, so nothing is ever removed.
    if ((name === 'workspace_name' || name === 'workspace') && op.method !== 'DELETE') return workspaceName;
    const param = op.parameters.find((p) => p.in === 'path' && p.name === name);
    return encodeURIComponent(String(sample(param?.schema)));
  });
  const url = new URL(path, server.url);
  for (const [k, v] of Object.entries(query)) url.searchParams.set(k, v);
  return url.toString();
}

async function send(op: Operation, query: Record<string, string>, body: unknown, token?: string) {
  const headers: Record<string, string> = token ? { authorization: `Bearer ${token}` } : {};
  if (body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(urlOf(op, query), {
    method: op.method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  const text = await res.text();
  let parsed: any = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // an SSE or file answer: kept as text for the failure message
  }
  return { status: res.status, body: parsed };
}

/** What is wrong with the answer to a request carrying KEY at `path` (null: refused as it should be). */
function problemOf(answer: { status: number; body: any }, path: (string | number)[]): string | null {
  if (answer.status !== 400) return `answered ${answer.status}: ${JSON.stringify(answer.body).slice(0, 300)}`;
  const named = (answer.body.issues ?? []).some(
    (i: { path?: unknown[]; keys?: string[] }) =>
      JSON.stringify(i.path) === JSON.stringify([...path, KEY]) && i.keys?.includes(KEY),
  );
  const dotted = [...path, KEY].join('.');
  if (!named || !String(answer.body.message).includes(`"${dotted}"`))
    return `400 without naming ${dotted}: ${JSON.stringify(answer.body).slice(0, 300)}`;
  return null;
}

describe('unknown keys, on every operation of the OpenAPI document', () => {
  it('open objects in request bodies are exactly the documented free-form ones; the others say they are closed', () => {
    const open: string[] = [];
    const unsaid: string[] = [];
    for (const op of operations()) {
      if (!op.body) continue;
      const { strict, open: opened } = objectsOf(op.body);
      for (const place of strict)
        if (place.schema.additionalProperties !== false)
          unsaid.push(`${op.method} ${op.path} ${place.path.join('.')}`);
      for (const place of opened)
        open.push(`${op.method} ${op.path} ${['', ...place.path].join('.').replace(/\.0(?=\.|$)/g, '.[]')}`);
    }
    expect([...new Set(open)].sort()).toEqual(OPEN_OBJECTS);
    expect(unsaid).toEqual([]);
  });

  it(
    'a body with an unknown key at the top level or in any nested object is a 400 naming it; 401 first without credentials',
    { timeout: 300_000 },
    async () => {
      const failures: string[] = [];
      let probes = 0;
      for (const op of operations()) {
        if (!op.body || !['POST', 'PUT', 'PATCH'].includes(op.method)) continue;
        const query = Object.fromEntries(
          op.parameters
            .filter((p) => p.in === 'query' && p.required)
            .map((p) => [p.name, String(sample(p.schema))]),
        );
        const base = sample(op.body);
        let token = op.path === '/api/auth/logout' ? logoutToken : tenant.admin.token;
        for (const place of objectsOf(op.body).strict) {
          const object = sample(place.schema);
          const body = setAt(base, place.path, { ...(object as object), [KEY]: 1 });
          probes++;
          let answer = await send(op, query, body, token);
          // A super-admin route refuses the tenant admin before reading the body.
          if (answer.status === 403 && token !== superToken) {
            token = superToken;
            answer = await send(op, query, body, token);
          }
          const problem = problemOf(answer, place.path);
          if (problem)
            failures.push(`${op.method} ${op.path} at ${place.path.join('.') || 'top'}: ${problem}`);
          if (op.guarded && !place.path.length) {
            const anonymous = await send(op, query, body);
            if (anonymous.status !== 401)
              failures.push(`${op.method} ${op.path} without credentials answered ${anonymous.status}`);
          }
        }
      }
      expect(failures).toEqual([]);
      // Every body route was reached (79 routes, 139 objects in them when this was written).
      expect(probes).toBeGreaterThan(120);
    },
  );

  it(
    'a query with an unknown parameter is a 400 naming it, on every GET and DELETE',
    { timeout: 300_000 },
    async () => {
      const failures: string[] = [];
      let probes = 0;
      for (const op of operations()) {
        if (op.method !== 'GET' && op.method !== 'DELETE') continue;
        const query = Object.fromEntries(
          op.parameters
            .filter((p) => p.in === 'query' && p.required)
            .map((p) => [p.name, String(sample(p.schema))]),
        );
        query[KEY] = '1';
        let token = tenant.admin.token;
        probes++;
        let answer = await send(op, query, undefined, token);
        if (answer.status === 403) {
          token = superToken;
          answer = await send(op, query, undefined, token);
        }
        const problem = problemOf(answer, []);
        if (problem) failures.push(`${op.method} ${op.path}: ${problem}`);
      }
      expect(failures).toEqual([]);
      expect(probes).toBeGreaterThan(50);
    },
  );
});

describe('what a client sees', () => {
  it('POST /api/workspaces/create with a target_schema is a 400 naming it, and creates nothing', async () => {
    const name = unique('nots');
    const res = await api('POST', '/api/workspaces/create', {
      body: { name, target_schema: { name: 'x', tables: [] } },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(
      /Unknown field "target_schema" in the body of POST \/api\/workspaces\/create/,
    );
    expect(res.body.issues).toEqual([
      expect.objectContaining({
        code: 'unrecognized_keys',
        path: ['target_schema'],
        keys: ['target_schema'],
      }),
    ]);
    expect((await api('GET', `/api/workspaces/${name}`)).status).toBe(404);
  });

  it('an unknown key does not hide the other problems of the request', async () => {
    const res = await api('POST', '/api/workspaces/create', { body: { target_schema: {}, select: 'yes' } });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(
      /Unknown field "target_schema" .* \(and 2 other problems: see issues\)$/,
    );
    expect(res.body.issues.map((i: { path: string[] }) => i.path.join('.')).sort()).toEqual([
      'name',
      'select',
      'target_schema',
    ]);
  });

  it('a misspelt field inside a connection is named at its place and nothing is stored', async () => {
    const name = unique('nested');
    const res = await api('POST', '/api/workspaces/create', {
      body: {
        name,
        source_config: {
          type: 'postgres',
          host: 'db.invalid',
          database: 'd',
          user: 'u',
          ssl_mode: 'require',
        },
      },
    });
    expect(res.status).toBe(400);
    expect(res.body.message).toContain('"source_config.ssl_mode"');
    expect(res.body.issues).toEqual([
      expect.objectContaining({ path: ['source_config', 'ssl_mode'], keys: ['ssl_mode'] }),
    ]);
    expect((await api('GET', `/api/workspaces/${name}`)).status).toBe(404);
    // The same body without the stray key is taken.
    const ok = await api('POST', '/api/workspaces/create', {
      body: { name, source_config: { type: 'postgres', host: 'db.invalid', database: 'd', user: 'u' } },
    });
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
  });

  it('a GET with an unknown query parameter names it and what the route takes', async () => {
    const res = await api('GET', '/api/workspaces', { query: { limit: 5, page: 2 } });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(
      /Unknown parameter "page" in the query of GET \/api\/workspaces: it takes limit, offset/,
    );
    const ok = await api('GET', '/api/workspaces', { query: { limit: 5 } });
    expect(ok.status).toBe(200);
  });

  it('a free-form object keeps any key: preferences store what was sent', async () => {
    const res = await api('PUT', '/api/auth/preferences', { body: { preferences: { [KEY]: { a: 1 } } } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const after = await api('GET', '/api/auth/preferences');
    expect(after.body.preferences[KEY]).toEqual({ a: 1 });
  });

  it('over tRPC the same: an unknown key is a BAD_REQUEST naming it, before anything runs', async () => {
    const trpc = createTRPCClient<AppRouter>({
      links: [
        httpLink({
          url: `${server.url}/trpc`,
          transformer: superjson,
          headers: () => ({ authorization: `Bearer ${tenant.admin.token}` }),
        }),
      ],
    });
    const name = unique('trpc');
    const error = await trpc.workspaces.create
      .mutate({ name, target_schema: { tables: [] } } as never)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TRPCClientError);
    expect((error as TRPCClientError<AppRouter>).data).toMatchObject({
      code: 'BAD_REQUEST',
      httpStatus: 400,
    });
    expect((error as Error).message).toContain('"target_schema"');
    const list = trpc.workspaces.list.query({ limit: 5, sort: 'name' } as never);
    await expect(list).rejects.toMatchObject({ message: expect.stringContaining('"sort"') });
    expect((await api('GET', `/api/workspaces/${name}`)).status).toBe(404);
  });
});
