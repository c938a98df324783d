import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { createTenant, unique, type Tenant } from './helpers/api.ts';
import { TEST_PASSWORD } from './helpers/constants.ts';

/*
 * `dimas/client` from another TypeScript project (examples/client, which depends on dimas by path):
 * it type-checks against the emitted declarations alone, in seconds, and its code runs against a server.
 */
const run = promisify(execFile);
const root = fileURLToPath(new URL('..', import.meta.url));
const exampleDir = join(root, 'examples/client');
const declarations = join(root, 'dist/types/src/client/index.d.ts');

function newestUnder(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true }))
    if (entry.isFile()) newest = Math.max(newest, statSync(join(entry.parentPath, entry.name)).mtimeMs);
  return newest;
}

let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  // `npm test` builds first (pretest); a single file run rebuilds only when the source is newer.
  if (!existsSync(declarations) || statSync(declarations).mtimeMs < newestUnder(join(root, 'src')))
    await run('npm', ['run', 'build:client'], { cwd: root });
  // What `npm install` does for a `file:` dependency: a link to the project.
  const link = join(exampleDir, 'node_modules/dimas');
  if (!existsSync(link)) {
    mkdirSync(join(exampleDir, 'node_modules'), { recursive: true });
    symlinkSync('../../..', link);
  }
  server = await startTestServer();
  tenant = await createTenant(server);
}, 180_000);
afterAll(async () => server?.close());

describe('examples/client', () => {
  it('type-checks against the declarations only, in seconds', async () => {
    const started = Date.now();
    const { stdout } = await run(
      join(root, 'node_modules/.bin/tsc'),
      ['-p', 'tsconfig.json', '--listFiles'],
      {
        cwd: exampleDir,
        maxBuffer: 16 * 1024 * 1024,
      },
    );
    const seconds = (Date.now() - started) / 1000;
    const files = stdout.split('\n').filter(Boolean);
    expect(files).toContain(declarations);
    // Not one file of the server's source: its .d.ts shims (jstat, pg-cursor) are not needed either.
    expect(files.filter((f) => f.startsWith(join(root, 'src/')))).toEqual([]);
    // What makes it fast is the line above (no server source to compile); the time is reported, not
    // asserted: on a machine shared with other test files it varies tenfold.
    console.log(`examples/client type-checked in ${seconds.toFixed(1)} s (${files.length} files)`);
  }, 180_000);

  it('the declarations carry the router: a wrong call does not compile', () => {
    const config = ts.getParsedCommandLineOfConfigFile(
      join(exampleDir, 'tsconfig.json'),
      {},
      {
        ...ts.sys,
        onUnRecoverableConfigFileDiagnostic: () => {},
      },
    )!;
    const dir = join(exampleDir, 'node_modules/.check');
    mkdirSync(dir, { recursive: true });
    const wrong = join(dir, 'wrong.ts');
    writeFileSync(
      wrong,
      `import { createDimasClient } from 'dimas/client';
const dimas = createDimasClient({ url: 'http://localhost' });
export const a = dimas.auth.noSuchProcedure.query();
export const b = dimas.workspaces.create.mutate({ name: 42 });
export const c: number = (await dimas.auth.session.query()).user.username;\n`,
    );
    const diagnostics = ts
      .getPreEmitDiagnostics(ts.createProgram([wrong], config.options))
      .map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
    expect(diagnostics.some((m) => m.includes("'noSuchProcedure' does not exist"))).toBe(true);
    expect(diagnostics.some((m) => m.includes("'number' is not assignable to type 'string'"))).toBe(true);
    expect(diagnostics.some((m) => m.includes("'string' is not assignable to type 'number'"))).toBe(true);
  }, 60_000);

  it('runs against a server: login, session, a workspace, roles, a refused call', async () => {
    const { tour } = (await import(join(exampleDir, 'index.ts'))) as {
      tour: (url: string, credentials: object, workspace: string) => Promise<Record<string, any>>;
    };
    const name = unique('cli');
    const result = await tour(
      server.url,
      { username: tenant.admin.username, domain: tenant.organization.domain, password: TEST_PASSWORD },
      name,
    );
    expect(result).toMatchObject({
      username: tenant.admin.username,
      workspace: name,
      roles: ['admin', 'editor', 'viewer'],
      refused: { code: 'UNAUTHORIZED', httpStatus: 401 },
    });
    expect(result.expiresInMs).toBeGreaterThan(0);
  });
});
