import { randomUUID } from 'node:crypto';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import {
  call,
  createTenant,
  createWorkspace,
  login,
  superAdminToken,
  unique,
  type Tenant,
  type TestUser,
} from './helpers/api.ts';

/**
 * Every operation of the OpenAPI document gets bad inputs generated from its own parameter and body
 * schemas. Whatever arrives, the server answers below 500 and every error in the shape
 * { message, code, issues? }. The seed is fixed so a failure reproduces.
 */

type Schema = Record<string, any>;
type Operation = {
  method: string;
  path: string;
  parameters: { name: string; in: 'path' | 'query'; required?: boolean; schema: Schema }[];
  body?: Schema;
};
type Case = {
  kind: string;
  path: Record<string, string>;
  /** Path params sent as given (already percent-encoded or deliberately malformed). */
  rawPath?: Record<string, string>;
  query: Record<string, string>;
  body?: unknown;
  /** A body sent as text, not JSON-encoded. */
  rawBody?: string;
};

const SEED = 20261122;
const CASES_PER_OPERATION = 20;
const METHODS = ['get', 'post', 'put', 'patch', 'delete'];

/**
 * Streams, binary downloads and the minutes-long benchmark answer something other than JSON on
 * success; their validation and guards are the same procedures the other tests cover.
 */
const SKIPPED = new Set([
  'POST /api/workspaces/discover',
  'POST /api/workspaces/benchmark',
  'GET /api/auth/admin/logs/download',
  'GET /api/workspaces/{workspace_name}/download',
]);

const HUGE = 'A'.repeat(100_000);
/** Path and query values travel in the request line, which Node caps at 16 KB of headers. */
const LONG = 'B'.repeat(4_000);
const NASTY = [
  "'; drop table x; --",
  '" or 1=1 --',
  '../../etc/passwd',
  '..\\..\\windows\\win.ini',
  '%00',
  '\u0000',
  'a\u0000b',
  '{}',
  '[]',
  '${jndi:ldap://x}',
  '{{7*7}}',
  '<script>alert(1)</script>',
  '😀👩‍👩‍👧‍👦',
  'مرحبا\u202Eabc',
  '\uFEFF\u200B',
  '\uD800',
  ' ',
  '',
  'null',
  '-1',
  '1e308',
  'NaN',
  '00000000-0000-0000-0000-000000000000',
  'x'.repeat(64),
  'pg_catalog.pg_class',
  'public."Tab""le"',
  '*',
  '\\',
  '$1',
  '?',
  '%',
];
const NUMBERS = [1e308, -1e308, -1, 0, 2 ** 53, 2 ** 53 + 2, -(2 ** 63), 1.5, 0.000001, 2 ** 31];
/** Malformed percent-encoding and traversal sent unescaped in a path segment. */
const RAW_SEGMENTS = ['%00', '%', '%E0%A4%A', '..%2F..%2Fetc%2Fpasswd', '%2e%2e', '%C0%AE'];

let server: TestServer;
let tenant: Tenant;
let superToken: string;
let victim: TestUser;
let logoutToken: string;
let workspaceName: string;
let doc: Schema;

function resolveRef(schema: Schema | undefined): Schema {
  let s = schema ?? {};
  for (let i = 0; s.$ref && i < 20; i++) {
    const parts = String(s.$ref).replace(/^#\//, '').split('/');
    s = parts.reduce((node: any, key) => node?.[key], doc) ?? {};
  }
  return s;
}

function typeOf(schema: Schema): string | undefined {
  const s = resolveRef(schema);
  if (Array.isArray(s.type)) return s.type.find((t: string) => t !== 'null');
  if (s.type) return s.type;
  const option = (s.anyOf ?? s.oneOf ?? s.allOf)?.find((o: Schema) => resolveRef(o).type !== 'null');
  return option ? typeOf(option) : undefined;
}

/** A plausible valid value, so one mutated field at a time reaches the logic behind validation. */
function sample(schema: Schema | undefined, depth = 0): unknown {
  const s = resolveRef(schema);
  if (s.const !== undefined) return s.const;
  if (s.enum) return s.enum[0];
  if (s.default !== undefined) return s.default;
  const options = s.anyOf ?? s.oneOf;
  if (options) return sample(options.find((o: Schema) => resolveRef(o).type !== 'null') ?? options[0], depth);
  if (s.allOf) return sample(s.allOf[0], depth);
  switch (typeOf(s)) {
    case 'string':
      if (s.format === 'uuid') return randomUUID();
      if (s.format === 'date-time') return new Date().toISOString();
      if (s.format === 'date') return new Date().toISOString().slice(0, 10);
      if (s.format === 'email') return 'fuzz@example.com';
      if (s.format === 'uri') return 'https://example.invalid/x';
      return 'x'.repeat(Math.max(s.minLength ?? 1, 1));
    case 'integer':
    case 'number':
      return s.minimum ?? (s.exclusiveMinimum !== undefined ? s.exclusiveMinimum + 1 : 1);
    case 'boolean':
      return true;
    case 'array':
      return depth > 4 ? [] : Array.from({ length: s.minItems ?? 0 }, () => sample(s.items, depth + 1));
    case 'object': {
      const out: Record<string, unknown> = {};
      if (depth > 4) return out;
      for (const key of s.required ?? []) out[key] = sample(s.properties?.[key], depth + 1);
      return out;
    }
    default:
      return 'x';
  }
}

/** Paths (as key lists) to the fields of a body schema, nested objects up to two levels. */
function fieldsOf(
  schema: Schema | undefined,
  prefix: string[] = [],
): { path: string[]; schema: Schema; required: boolean }[] {
  const s = resolveRef(schema);
  if (typeOf(s) !== 'object' || !s.properties || prefix.length >= 2) return [];
  const out: { path: string[]; schema: Schema; required: boolean }[] = [];
  for (const [key, child] of Object.entries<Schema>(s.properties)) {
    const path = [...prefix, key];
    out.push({ path, schema: child, required: (s.required ?? []).includes(key) });
    out.push(...fieldsOf(child, path));
  }
  return out;
}

function setIn(target: unknown, path: string[], value: unknown, remove = false): unknown {
  const root = structuredClone(target ?? {}) as Record<string, any>;
  let node = root;
  for (const key of path.slice(0, -1)) {
    if (typeof node[key] !== 'object' || node[key] === null || Array.isArray(node[key])) node[key] = {};
    node = node[key];
  }
  const last = path[path.length - 1];
  if (remove) delete node[last];
  else node[last] = value;
  return root;
}

const WRONG_TYPED: Record<string, unknown[]> = {
  string: [123, true, null, [], {}, ['x'], 1e308],
  integer: ['1', 'abc', true, null, [], {}, 1.5, '1e308'],
  number: ['1', 'abc', true, null, [], {}],
  boolean: ['true', 'yes', 1, 0, null, [], {}],
  array: ['x', 1, {}, null, true, [null], [{}]],
  object: ['x', 1, [], null, true, [{}]],
};

/** Real identifiers for path params, so body mutations reach the logic behind the lookup. */
function basePathValue(name: string, schema: Schema, method: string): string {
  // A destructive call must never hit the fixture it depends on.
  if (method === 'delete') return String(sample(schema));
  if (name === 'workspace_name' || name === 'workspace') return workspaceName;
  if (name === 'org_id' || name === 'tenant_id') return tenant.organization.id;
  if (name === 'user_id') return victim.id;
  return String(sample(schema));
}

function queryValue(value: unknown): string {
  return typeof value === 'string' ? value : JSON.stringify(value);
}

/** A seed per operation that stays put when other routes are added. */
function seedOf(op: Operation): number {
  let hash = SEED;
  for (const ch of `${op.method} ${op.path}`) hash = (Math.imul(hash, 31) + ch.charCodeAt(0)) | 0;
  return hash;
}

function casesFor(op: Operation): Case[] {
  const pathParams = op.parameters.filter((p) => p.in === 'path');
  const queryParams = op.parameters.filter((p) => p.in === 'query');
  const basePath = Object.fromEntries(
    pathParams.map((p) => [p.name, basePathValue(p.name, p.schema, op.method)]),
  );
  const baseQuery = Object.fromEntries(
    queryParams.filter((p) => p.required).map((p) => [p.name, queryValue(sample(p.schema))]),
  );
  if (op.method === 'get' && queryParams.some((p) => p.name === 'workspace'))
    baseQuery.workspace = workspaceName;
  const baseBody = op.body ? sample(op.body) : undefined;
  const fields = fieldsOf(op.body);
  const base = (): Case => ({ kind: '', path: { ...basePath }, query: { ...baseQuery }, body: baseBody });
  const nasty = fc.oneof(
    fc.constantFrom(...NASTY),
    fc.string({ unit: 'binary', maxLength: 40 }),
    fc.string({ unit: 'grapheme', maxLength: 40 }),
  );

  const arbitraries: fc.Arbitrary<Case>[] = [
    // Anything at all as the body.
    fc.jsonValue({ maxDepth: 3 }).map((body) => ({ ...base(), kind: 'random body', body })),
    fc
      .constantFrom<unknown>(
        null,
        [],
        'text',
        0,
        true,
        JSON.parse('{"__proto__":{"x":1},"constructor":{"prototype":{"y":1}}}'),
      )
      .map((body) => ({
        ...base(),
        kind: 'non-object body',
        body,
      })),
    fc.constantFrom('{"a":', '{"a":1}}', '\u0000', 'nul\u0000l').map((rawBody) => ({
      ...base(),
      kind: 'malformed JSON',
      rawBody,
    })),
    fc
      .tuple(fc.string({ minLength: 1, maxLength: 20 }), fc.jsonValue({ maxDepth: 2 }))
      .map(([key, value]) => ({
        ...base(),
        kind: 'extra field',
        body: { ...(typeof baseBody === 'object' && baseBody ? baseBody : {}), [key]: value },
        query: { ...baseQuery, [key.slice(0, 50) || 'k']: queryValue(value) },
      })),
  ];
  if (fields.length) {
    const field = fc.constantFrom(...fields);
    arbitraries.push(
      field.chain((f) =>
        fc.constantFrom(...(WRONG_TYPED[typeOf(f.schema) ?? 'string'] ?? WRONG_TYPED.string)).map((v) => ({
          ...base(),
          kind: `wrong type ${f.path.join('.')}`,
          body: setIn(baseBody, f.path, v),
        })),
      ),
      field.map((f) => ({
        ...base(),
        kind: `missing ${f.path.join('.')}`,
        body: setIn(baseBody, f.path, 0, true),
      })),
      field.chain((f) =>
        fc.constantFrom(HUGE, '😀'.repeat(25_000), '\u0000'.repeat(1000)).map((v) => ({
          ...base(),
          kind: `huge ${f.path.join('.')}`,
          body: setIn(baseBody, f.path, v),
        })),
      ),
      field.chain((f) =>
        nasty.map((v) => ({
          ...base(),
          kind: `nasty ${f.path.join('.')}`,
          body: setIn(baseBody, f.path, v),
        })),
      ),
      field.chain((f) =>
        fc.constantFrom(...NUMBERS).map((v) => ({
          ...base(),
          kind: `number ${f.path.join('.')}`,
          body: setIn(baseBody, f.path, v),
        })),
      ),
    );
  }
  if (pathParams.length) {
    const param = fc.constantFrom(...pathParams.map((p) => p.name));
    arbitraries.push(
      fc.tuple(param, fc.oneof(nasty, fc.constant(LONG))).map(([name, v]) => ({
        ...base(),
        kind: `nasty path ${name}`,
        path: { ...basePath, [name]: v },
      })),
      fc.tuple(param, fc.constantFrom(...RAW_SEGMENTS)).map(([name, v]) => ({
        ...base(),
        kind: `raw path ${name}`,
        rawPath: { [name]: v },
      })),
    );
  }
  if (queryParams.length) {
    const param = fc.constantFrom(...queryParams.map((p) => p.name));
    arbitraries.push(
      fc
        .tuple(
          param,
          fc.oneof(nasty, fc.constant(LONG), fc.constantFrom(...NUMBERS.map(String), 'abc', 'true', '[]')),
        )
        .map(([name, v]) => ({ ...base(), kind: `query ${name}`, query: { ...baseQuery, [name]: v } })),
    );
    const required = queryParams.filter((p) => p.required);
    if (required.length)
      arbitraries.push(
        fc.constantFrom(...required.map((p) => p.name)).map((name) => {
          const query = { ...baseQuery };
          delete query[name];
          return { ...base(), kind: `missing query ${name}`, query };
        }),
      );
  }
  return fc.sample(fc.oneof(...arbitraries), { seed: seedOf(op), numRuns: CASES_PER_OPERATION });
}

function urlOf(op: Operation, c: Case): string {
  return op.path.replace(/\{([^}]+)\}/g, (_, name: string) =>
    c.rawPath?.[name] !== undefined
      ? c.rawPath[name]
      : // A lone surrogate cannot be percent-encoded; it becomes U+FFFD as a browser would send it.
        encodeURIComponent((c.path[name] ?? 'x').replace(/\p{Cs}/gu, '\uFFFD')),
  );
}

type Outcome = { status: number; body: unknown; contentType: string };

async function send(op: Operation, c: Case, token: string): Promise<Outcome> {
  const url = new URL(urlOf(op, c), server.url);
  for (const [k, v] of Object.entries(c.query)) url.searchParams.set(k, v);
  const headers: Record<string, string> = { authorization: `Bearer ${token}` };
  let body: string | undefined;
  const hasBody = op.method !== 'get' && op.method !== 'delete';
  if (hasBody && (c.rawBody !== undefined || c.body !== undefined)) {
    headers['content-type'] = 'application/json';
    body = c.rawBody ?? JSON.stringify(c.body);
  }
  const res = await fetch(url, {
    method: op.method.toUpperCase(),
    headers,
    body,
    signal: AbortSignal.timeout(30_000),
  });
  const text = await res.text();
  const contentType = res.headers.get('content-type') ?? '';
  let parsed: unknown = text;
  if (contentType.includes('json') && text) parsed = JSON.parse(text);
  return { status: res.status, body: parsed, contentType };
}

function problemOf(outcome: Outcome): string | null {
  if (outcome.status >= 500) return `status ${outcome.status}`;
  if (outcome.status < 400) return null;
  const body = outcome.body as { message?: unknown; code?: unknown; issues?: unknown } | string;
  if (typeof body !== 'object' || body === null) return `error body is not JSON (${outcome.contentType})`;
  if (typeof body.message !== 'string' || typeof body.code !== 'string')
    return 'error body lacks message/code';
  if (body.issues !== undefined && !Array.isArray(body.issues)) return 'issues is not an array';
  return null;
}

function show(value: unknown): string {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  return text && text.length > 300 ? `${text.slice(0, 300)}… (${text.length} chars)` : String(text);
}

beforeAll(async () => {
  // FUZZ_LOG_LEVEL=error shows the server's log, e.g. the cause behind a 500.
  server = await startTestServer(process.env.FUZZ_LOG_LEVEL ? { LOG_LEVEL: process.env.FUZZ_LOG_LEVEL } : {});
  tenant = await createTenant(server);
  victim = await tenant.addUser(['viewer']);
  superToken = await superAdminToken(server);
  logoutToken = await login(server, tenant.admin.username, tenant.organization.domain);
  workspaceName = await createWorkspace(server, tenant.admin.token, { name: unique('fuzz'), select: true });
  doc = (await call(server, 'GET', '/api/openapi.json')).body;
});
afterAll(async () => server?.close());

describe('fuzzing every operation', () => {
  it(
    'answers generated bad inputs below 500, with errors in the { message, code, issues? } shape',
    {
      timeout: 600_000,
    },
    async () => {
      const operations: Operation[] = [];
      for (const [path, item] of Object.entries<Record<string, any>>(doc.paths))
        for (const [method, raw] of Object.entries<any>(item)) {
          if (!METHODS.includes(method) || SKIPPED.has(`${method.toUpperCase()} ${path}`)) continue;
          operations.push({
            method,
            path,
            parameters: (raw.parameters ?? []).map((p: Schema) => resolveRef(p)),
            body: raw.requestBody
              ? resolveRef(raw.requestBody).content?.['application/json']?.schema
              : undefined,
          });
        }
      // Deletions last, so an unlucky hit cannot remove something a later operation needs.
      operations.sort((a, b) => Number(a.method === 'delete') - Number(b.method === 'delete'));

      const failures: string[] = [];
      const statuses = new Map<number, number>();
      let cases = 0;
      const started = Date.now();
      for (const op of operations) {
        const generated = casesFor(op);
        // Routes a tenant admin may not call are fuzzed as the super admin, so they reach validation.
        let token = op.path === '/api/auth/logout' ? logoutToken : tenant.admin.token;
        const probe = await send(op, { kind: 'probe', path: {}, query: {}, body: {} }, token);
        if (probe.status === 403) token = superToken;
        for (const c of generated) {
          cases++;
          let outcome: Outcome;
          try {
            outcome = await send(op, c, token);
          } catch (error) {
            failures.push(
              `${op.method.toUpperCase()} ${urlOf(op, c).slice(0, 200)} [${c.kind}]: ${String(error)}`,
            );
            continue;
          }
          statuses.set(outcome.status, (statuses.get(outcome.status) ?? 0) + 1);
          const problem = problemOf(outcome);
          if (problem)
            failures.push(
              `${op.method.toUpperCase()} ${op.path} [${c.kind}] ${problem}: path=${show(c.rawPath ?? c.path)} ` +
                `query=${show(c.query)} body=${show(c.rawBody ?? c.body)} → ${show(outcome.body)}`,
            );
        }
      }
      console.log(
        `fuzz: ${operations.length} operations (${SKIPPED.size} skipped), ${cases} cases, ` +
          `${failures.length} failures in ${((Date.now() - started) / 1000).toFixed(1)} s; statuses ` +
          JSON.stringify(Object.fromEntries([...statuses].sort(([a], [b]) => a - b))),
      );
      for (const failure of failures) console.log(`  ${failure}`);
      expect(failures).toEqual([]);
    },
  );
});
