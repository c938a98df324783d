import { createServer as createHttpServer, request, type IncomingMessage, type Server } from 'node:http';
import { createServer as createNetServer, type AddressInfo, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EntityManager } from '@mikro-orm/postgresql';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, call, createTenant, createWorkspace, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { startGitHttpServer, type GitHttpServer } from './helpers/git-http-server.ts';
import { pushWorkspaceFiles } from '../src/vcs/push-workspace.ts';
import type { CallerScope } from '../src/deps.ts';

/*
 * Remotes that behave unlike `git http-backend` behind a plain server: ones that redirect, never
 * answer, do not name their HEAD's branch, or speak without side-band. Each is the real git server
 * behind a small proxy that changes one thing.
 */

const TOKEN = 'write-token-remotes-0123456789';
// Short enough for the remotes that never answer, long enough for a real push on a loaded machine
// (2 s failed one under an embedded suite, .ci/run and a benchmark at once).
const TIMEOUT_MS = 5000;

let server: TestServer;
let gitServer: GitHttpServer;
let tenant: Tenant;
const closers: (() => Promise<void>)[] = [];

beforeAll(async () => {
  server = await startTestServer({ VCS_REMOTE_TIMEOUT_MS: String(TIMEOUT_MS) });
  gitServer = await startGitHttpServer({ tokens: { [TOKEN]: 'write' } });
  gitServer.createRepo('project', { seed: { 'README.md': 'seed\n' } });
  tenant = await createTenant(server);
});
afterAll(async () => {
  for (const close of closers) await close();
  await server?.close();
  await gitServer?.close();
});

async function listen(srv: Server | ReturnType<typeof createNetServer>, onClose?: () => void) {
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  closers.push(async () => {
    onClose?.();
    if ('closeAllConnections' in srv) srv.closeAllConnections();
    await new Promise((resolve) => srv.close(resolve));
  });
  return `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
}

function pktLines(body: Buffer): (Buffer | null)[] {
  const lines: (Buffer | null)[] = [];
  for (let pos = 0; pos < body.length;) {
    const length = parseInt(body.subarray(pos, pos + 4).toString('ascii'), 16);
    lines.push(length === 0 ? null : body.subarray(pos + 4, pos + length));
    pos += length === 0 ? 4 : length;
  }
  return lines;
}

function encodePktLines(lines: (Buffer | null)[]): Buffer {
  return Buffer.concat(
    lines.map((l) =>
      l === null
        ? Buffer.from('0000')
        : Buffer.concat([Buffer.from((l.length + 4).toString(16).padStart(4, '0')), l]),
    ),
  );
}

interface ProxyOptions {
  /** Protocol v1 only: the Git-Protocol header is not passed on. */
  v1?: boolean;
  /** Capabilities left out of the v1 advertisements. */
  strip?: RegExp;
  /** A Location to answer 301 with instead of passing the request on. */
  redirect?: (path: string) => string | null;
}

interface Proxy {
  url: string;
  seen: { method: string; path: string; authorized: boolean; body: Buffer }[];
}

/** The git server behind a proxy that changes what `options` says. */
async function startProxy(options: ProxyOptions): Promise<Proxy> {
  const upstream = new URL(gitServer.url);
  const seen: Proxy['seen'] = [];
  const srv = createHttpServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    seen.push({ method: req.method!, path: req.url!, authorized: !!req.headers.authorization, body });
    const location = options.redirect?.(req.url!);
    if (location) return void res.writeHead(301, { location }).end();
    const headers = { ...req.headers };
    delete headers.host;
    if (options.v1) delete headers['git-protocol'];
    const answer = await new Promise<IncomingMessage>((resolve, reject) => {
      const out = request(
        { host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers },
        resolve,
      );
      out.on('error', reject);
      out.end(body);
    });
    const parts: Buffer[] = [];
    for await (const chunk of answer) parts.push(chunk as Buffer);
    let data: Buffer = Buffer.concat(parts);
    if (options.strip && /-advertisement$/.test(String(answer.headers['content-type']))) {
      const strip = options.strip;
      data = encodePktLines(
        pktLines(data).map((line) => {
          const nul = line?.indexOf(0) ?? -1;
          if (!line || nul < 0) return line;
          const caps = line
            .subarray(nul + 1)
            .toString('utf8')
            .trim()
            .split(' ');
          const kept = caps.filter((c) => !strip.test(c)).join(' ');
          return Buffer.concat([line.subarray(0, nul + 1), Buffer.from(`${kept}\n`)]);
        }),
      );
    }
    const outHeaders = { ...answer.headers };
    delete outHeaders['content-length'];
    delete outHeaders['transfer-encoding'];
    res.writeHead(answer.statusCode!, outHeaders).end(data);
  });
  return { url: await listen(srv), seen };
}

const settings = (url: string, extra: Record<string, unknown> = {}) => ({
  url,
  branch: 'main',
  author_name: 'Dimas Bot',
  author_email: 'bot@example.com',
  path_prefix: 'dimas',
  token: TOKEN,
  ...extra,
});

async function configure(url: string, t: Tenant = tenant) {
  const res = await call(server, 'POST', '/api/admin/vcs-config', {
    token: t.admin.token,
    body: settings(url),
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
}

async function scopeOf(t: Tenant = tenant): Promise<CallerScope> {
  const em = server.deps.orm.em.fork() as EntityManager;
  const principal = await server.deps.authenticator.authenticate({ em }, t.admin.token);
  return { em, deps: server.deps, principal: principal! };
}

const vcsTest = (url: string, extra: Record<string, unknown> = {}) =>
  call(server, 'POST', '/api/admin/vcs-test', { token: tenant.admin.token, body: settings(url, extra) });

describe('a remote that redirects', () => {
  it('follows a redirect within the origin with the token, and pushes to where it points', async () => {
    // A renamed repository: every request to the old name answers 301 with the new name.
    const proxy = await startProxy({
      redirect: (path) => (path.startsWith('/old.git/') ? path.replace('/old.git/', '/project.git/') : null),
    });
    const test = await vcsTest(`${proxy.url}/old.git`);
    expect(test.status, JSON.stringify(test.body)).toBe(200);
    expect(test.body).toMatchObject({ success: true, branch_exists: true, default_branch: 'main' });

    await configure(`${proxy.url}/old.git`);
    const before = proxy.seen.length;
    const result = await pushWorkspaceFiles(
      await scopeOf(),
      [{ path: 'a.txt', content: 'moved\n' }],
      'via redirect',
    );
    expect(result, JSON.stringify(result)).toMatchObject({ pushed: true });
    expect(gitServer.git('project', ['show', 'main:dimas/a.txt'])).toBe('moved');
    const push = proxy.seen.slice(before);
    // Only the discovery requests were redirected; the POSTs went to the new address directly.
    expect(push.filter((r) => r.path.startsWith('/old.git/')).every((r) => r.method === 'GET')).toBe(true);
    expect(push.some((r) => r.method === 'POST' && r.path === '/project.git/git-receive-pack')).toBe(true);
    expect(push.every((r) => r.authorized)).toBe(true);
  });

  it('refuses a redirect to another host, naming it, and sends the token nowhere else', async () => {
    const target = await startProxy({});
    const proxy = await startProxy({
      redirect: (path) => `${target.url}${path.replace('/repo.git/', '/project.git/')}`,
    });
    const res = await vcsTest(`${proxy.url}/repo.git`);
    expect(res.status).toBe(422);
    expect(res.body.message).toContain('redirects to another host');
    expect(res.body.message).toContain(`set the URL to ${target.url}/project.git`);
    // The old answer: "refused the credentials (401)" (a port such as 40101 holds "401" too).
    expect(res.body.message).not.toMatch(/credentials|\(401\)/);
    expect(target.seen).toEqual([]);

    await configure(`${proxy.url}/repo.git`);
    const result = await pushWorkspaceFiles(await scopeOf(), [{ path: 'a.txt', content: 'x' }], 'x');
    expect(result).toMatchObject({ pushed: false, reason: 'failed' });
    expect((result as { message: string }).message).toContain(`set the URL to ${target.url}/project.git`);
    expect(target.seen).toEqual([]);
  });
});

describe('a remote that accepts the connection and never answers', () => {
  const warehouse = scratchDatabase('vcsremotes');
  let silentUrl: string;
  let owner: Tenant;

  beforeAll(async () => {
    const sockets = new Set<Socket>();
    const silent = createNetServer((socket) => {
      sockets.add(socket);
      socket.on('error', () => undefined);
    });
    silentUrl = `${await listen(silent, () => sockets.forEach((s) => s.destroy()))}/repo.git`;
    owner = await createTenant(server);
    await warehouse.create();
    await warehouse.sql(`create schema app; create schema mart;
      create table app.users (id integer primary key, email text);
      insert into app.users values (1, 'a@x.io');`);
  });
  afterAll(async () => {
    await warehouse.drop();
  });

  it('answers the commit within the push timeout: the commit saved, the push reported timed out', async () => {
    const api = bindCall(
      () => server,
      () => owner.admin.token,
    );
    const workspace = await createWorkspace(server, owner.admin.token, {
      source_config: pgConfig(warehouse.name, { schemas: ['app'] }),
      target_config: pgConfig(warehouse.name, { schemas: ['mart'] }),
      target_schema: {
        name: 'crm',
        tables: [
          {
            name: 'contacts',
            primary_key: ['id'],
            columns: [
              { name: 'id', type: 'integer', nullable: false },
              { name: 'email', type: 'text' },
            ],
          },
        ],
      },
    });
    for (const [route, body] of [
      ['tables', { source_table: 'users', relationship: 'primary' }],
      ['connection', { connection: { source_field: 'users.id', target_field: 'id' } }],
      ['connection', { connection: { source_field: 'users.email', target_field: 'email' } }],
    ] as const) {
      const step = await api('POST', `/api/mappings/contacts/${route}`, { body });
      expect(step.status, `${route}: ${JSON.stringify(step.body)}`).toBe(200);
    }
    await configure(silentUrl, owner);

    const started = Date.now();
    const res = await api('POST', '/api/mappings/contacts/commit-transformation', {
      body: { message: 'first' },
    });
    const elapsed = Date.now() - started;
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(elapsed).toBeLessThan(TIMEOUT_MS + 3000);
    expect(res.body.commit_id).toEqual(expect.any(String));
    expect(res.body.vcs).toMatchObject({ pushed: false, reason: 'timed_out', commit: null });
    expect(res.body.vcs.message).toMatch(new RegExp(`did not answer within ${TIMEOUT_MS / 1000} s`));
    expect(res.body.vcs.message).toMatch(/commit is saved/);
    // The commit is saved (nothing left to commit), and the push's outcome kept with the configuration.
    const diff = await api('GET', `/api/workspaces/${workspace}/git-diff`);
    expect(diff.body).toMatchObject({ has_changes: false });
    const cfg = await api('GET', '/api/admin/vcs-config');
    expect(cfg.body.last_push_error).toMatch(new RegExp(`did not answer within ${TIMEOUT_MS / 1000} s`));
  }, 60_000);

  it('ends the connection test within the timeout with a 422 that says so', async () => {
    const started = Date.now();
    const res = await vcsTest(silentUrl);
    expect(Date.now() - started).toBeLessThan(TIMEOUT_MS + 3000);
    expect(res.status).toBe(422);
    expect(res.body.message).toMatch(new RegExp(`did not answer within ${TIMEOUT_MS / 1000} s`));
  }, 60_000);
});

describe('a remote that does not name the branch its HEAD points to', () => {
  it('finds the default branch from the commit HEAD points at, or says why it cannot', async () => {
    // Protocol v1 without the symref=HEAD: capability, as some servers advertise.
    const proxy = await startProxy({ v1: true, strip: /^symref=/ });
    let res = await vcsTest(`${proxy.url}/project.git`);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ default_branch: 'main', branch_exists: true });
    expect(res.body.default_branch_note).toMatch(/only branch at HEAD's commit/);

    gitServer.createRepo('twins', { seed: { 'README.md': 'x\n' } });
    gitServer.git('twins', ['branch', 'other', 'main']);
    res = await vcsTest(`${proxy.url}/twins.git`);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.default_branch).toBeNull();
    expect(res.body.default_branch_note).toMatch(/unknown: .*tip of 2 branches \(main, other\)/);

    // A server that names it: no note.
    res = await vcsTest(`${gitServer.url}/project.git`);
    expect(res.body).toMatchObject({ default_branch: 'main', default_branch_note: null });
  });
});

describe('a remote without side-band', () => {
  it('fetches the branch tip and pushes over plain packs and reports', async () => {
    gitServer.createRepo('plain', { seed: { 'README.md': 'kept\n' } });
    const proxy = await startProxy({ v1: true, strip: /^side-band/ });
    const other = await createTenant(server);
    await configure(`${proxy.url}/plain.git`, other);
    for (const version of [1, 2]) {
      const result = await pushWorkspaceFiles(
        await scopeOf(other),
        [{ path: 'schema.json', content: `{"version":${version}}\n` }],
        `version ${version}`,
      );
      expect(result, `push ${version}: ${JSON.stringify(result)}`).toMatchObject({ pushed: true });
      expect(gitServer.git('plain', ['rev-parse', 'main'])).toBe((result as { commit: string }).commit);
    }
    expect(gitServer.git('plain', ['ls-tree', '-r', '--name-only', 'main']).split('\n')).toEqual([
      'README.md',
      'dimas/schema.json',
    ]);
    expect(gitServer.git('plain', ['show', 'main:dimas/schema.json'])).toBe('{"version":2}');
    expect(gitServer.git('plain', ['log', '--format=%s', 'main']).split('\n')).toEqual([
      'version 2',
      'version 1',
      'seed',
    ]);
    // Neither service was asked for side-band: the exchanges really were plain.
    const posts = proxy.seen.filter((r) => r.method === 'POST');
    expect(posts.some((r) => r.path.endsWith('/git-upload-pack'))).toBe(true);
    expect(posts.some((r) => r.path.endsWith('/git-receive-pack'))).toBe(true);
    for (const post of posts)
      expect(post.body.subarray(0, 200).toString('latin1')).not.toContain('side-band');
  });
});
