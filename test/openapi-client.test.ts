import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import openapiTS, { astToString } from 'openapi-typescript';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, unique, type Tenant } from './helpers/api.ts';
import { TEST_PASSWORD } from './helpers/constants.ts';

/*
 * A client generated from the served document as an external team would make one: openapi-typescript
 * writes the types, examples/openapi-fetch/calls.ts must compile against them under strict settings,
 * and its ten operations then run against the server.
 */
const example = (file: string) =>
  fileURLToPath(new URL(`../examples/openapi-fetch/${file}`, import.meta.url));

let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
});
afterAll(async () => server?.close());

describe('a client generated with openapi-typescript and openapi-fetch', () => {
  it('compiles against the generated types', async () => {
    const doc = (await call(server, 'GET', '/api/openapi.json')).body;
    writeFileSync(example('schema.d.ts'), astToString(await openapiTS(doc)));
    const program = ts.createProgram([example('calls.ts')], {
      strict: true,
      noEmit: true,
      target: ts.ScriptTarget.ES2023,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      allowImportingTsExtensions: true,
      skipLibCheck: true,
      lib: ['lib.es2023.d.ts', 'lib.dom.d.ts'],
      types: [],
    });
    const errors = ts
      .getPreEmitDiagnostics(program)
      .map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
    expect(errors).toEqual([]);
  }, 120_000);

  it('runs ten operations against the server, errors included', async () => {
    // Typed loosely here: the example's types exist only once the test above has generated them.
    const { tour } = (await import(example('calls.ts'))) as {
      tour: (url: string, credentials: object, workspace: string) => Promise<Record<string, any>>;
    };
    const user = await tenant.addUser(['admin']);
    const name = unique('oaf');
    const result = await tour(
      server.url,
      { username: user.username, domain: tenant.organization.domain, password: TEST_PASSWORD },
      name,
    );
    expect(result).toMatchObject({
      username: user.username,
      noWorkspace: { status: 409, code: 'CONFLICT' },
      createdName: name,
      selected: true,
      currentName: name,
      byNameIsCurrent: true,
      workflowWorkspace: name,
      roleNames: ['admin', 'editor', 'viewer'],
      invalid: { status: 400, code: 'BAD_REQUEST', paths: ['name'] },
    });
    expect(result.userCount).toBeGreaterThanOrEqual(2);
    expect(result.permissionCount).toBeGreaterThanOrEqual(8);
  });
});
