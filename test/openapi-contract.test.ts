import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, type Tenant } from './helpers/api.ts';

/*
 * The OpenAPI document as a contract: every status the API answers is documented with the one error
 * schema, public operations say so, and Redocly's recommended rules find nothing.
 */
const run = promisify(execFile);
const METHODS = ['get', 'put', 'post', 'delete', 'patch'];

let server: TestServer;
let tenant: Tenant;
let doc: any;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
  doc = (await call(server, 'GET', '/api/openapi.json')).body;
});
afterAll(async () => server?.close());

function operations() {
  const ops: { path: string; method: string; op: any }[] = [];
  for (const [path, item] of Object.entries<Record<string, any>>(doc.paths))
    for (const [method, op] of Object.entries<any>(item))
      if (METHODS.includes(method)) ops.push({ path, method, op });
  return ops;
}

const documented = (op: any) => Object.keys(op.responses).map(Number);

describe('error statuses in the OpenAPI document', () => {
  it('every operation documents 400, 413, 422, 429, 500 and 503 with the error schema', () => {
    const missing: string[] = [];
    for (const { path, method, op } of operations())
      for (const status of [400, 413, 422, 429, 500, 503])
        if (!op.responses[status]?.$ref) missing.push(`${method} ${path} ${status}`);
    expect(missing).toEqual([]);
    for (const [name, response] of Object.entries<any>(doc.components.responses))
      expect(response.content['application/json'].schema, name).toEqual({
        $ref: '#/components/schemas/Error',
      });
    expect(doc.components.schemas.Error.required).toEqual(['message', 'code']);
    expect(doc.components.schemas.Error.properties.code.enum).toContain('CONFLICT');
    expect(doc.components.responses.TooManyRequests.headers['Retry-After']).toBeDefined();
  });

  it('guarded operations document 401 and 403; public ones say security: []', () => {
    const problems: string[] = [];
    for (const { path, method, op } of operations()) {
      if (!Array.isArray(op.security)) problems.push(`${method} ${path}: no security`);
      else if (op.security.length && !(op.responses[401] && op.responses[403]))
        problems.push(`${method} ${path}: guarded without 401/403`);
    }
    expect(problems).toEqual([]);
    expect(doc.paths['/api/auth/login'].post.security).toEqual([]);
    expect(doc.paths['/api/auth/organizations'].get.security).toEqual([]);
    expect(doc.paths['/api/auth/session'].get.security).toEqual([{ Authorization: [] }]);
  });

  it('documents 409 wherever a caller without a workspace gets one, and no read of /api/admin says 409', async () => {
    // A fresh member of the organization has no current workspace: the reads that act on it answer 409.
    const user = await tenant.addUser(['admin']);
    const reads = operations().filter(
      ({ method, path, op }) =>
        method === 'get' &&
        !path.includes('{') &&
        !path.endsWith('/download') &&
        !(op.parameters ?? []).some((p: any) => p.required),
    );
    const undocumented: string[] = [];
    let conflicts = 0;
    for (const { path, op } of reads) {
      const res = await call(server, 'GET', path, { token: user.token });
      if (res.status === 409) conflicts++;
      if (!documented(op).includes(res.status) && res.status !== 200)
        undocumented.push(`GET ${path} answered ${res.status}: ${JSON.stringify(res.body)}`);
    }
    expect(undocumented).toEqual([]);
    expect(conflicts).toBeGreaterThan(5);
    expect(documented(doc.paths['/api/admin/users'].get)).not.toContain(409);
    expect(documented(doc.paths['/api/workspaces/create'].post)).toContain(409);
  });

  it('answers every error with a status the operation documents, in the documented shape', async () => {
    const tooBig = 'x'.repeat(2 * 1024 * 1024);
    const cases = [
      await call(server, 'POST', '/api/workspaces/create', { token: tenant.admin.token, body: { name: 1 } }),
      await call(server, 'POST', '/api/workspaces/create', {
        token: tenant.admin.token,
        body: { name: tooBig },
      }),
      await call(server, 'GET', '/api/auth/session'),
    ];
    const ops = [
      doc.paths['/api/workspaces/create'].post,
      doc.paths['/api/workspaces/create'].post,
      doc.paths['/api/auth/session'].get,
    ];
    expect(cases.map((c) => c.status)).toEqual([400, 413, 401]);
    cases.forEach((res, i) => {
      expect(documented(ops[i])).toContain(res.status);
      expect(Object.keys(res.body).every((k) => k in doc.components.schemas.Error.properties)).toBe(true);
      expect(doc.components.schemas.Error.properties.code.enum).toContain(res.body.code);
    });
  });
});

describe('document metadata', () => {
  it('has a license, and the discovery operation is an event stream with its event schema', () => {
    expect(doc.info.license.name).toBeTruthy();
    const discover = doc.paths['/api/workspaces/discover'].post;
    const stream = discover.responses['200'].content['text/event-stream'];
    expect(stream.schema.oneOf ?? stream.schema.anyOf).toBeDefined();
    expect(discover.description).toMatch(/`event: <type>`/);
    expect(discover.description).toMatch(/Last-Event-ID/);
  });
});

describe('redocly lint', () => {
  it('reports no error and no warning with the recommended rules', async () => {
    const dir = mkdtempSync(join(inject('scratchDir'), 'redocly-'));
    const file = join(dir, 'openapi.json');
    writeFileSync(file, JSON.stringify(doc));
    const result = await run(
      'npx',
      ['redocly', 'lint', file, '--config', 'redocly.yaml', '--format', 'json'],
      { maxBuffer: 64 * 1024 * 1024 },
    ).catch((error: { stdout: string; stderr: string }) => error);
    const report = JSON.parse(result.stdout);
    expect(report.totals, JSON.stringify(report.problems?.slice(0, 5))).toMatchObject({
      errors: 0,
      warnings: 0,
    });
  }, 120_000);
});
