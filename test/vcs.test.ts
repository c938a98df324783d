import { spawnSync } from 'node:child_process';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EntityManager } from '@mikro-orm/postgresql';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, call, createTenant, unique, type Tenant, type TestUser } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { readZip } from './helpers/zip.ts';
import { startGitHttpServer, type GitHttpServer } from './helpers/git-http-server.ts';
import { pushWorkspaceFiles } from '../src/vcs/push-workspace.ts';
import { branchNameProblem } from '../src/vcs/branch-name.ts';
import type { CallerScope } from '../src/deps.ts';

const WRITE_TOKEN = 'write-token-0123456789';
const READ_TOKEN = 'read-token-0123456789';

let server: TestServer;
let gitServer: GitHttpServer;
let a: Tenant;
let b: Tenant;
let viewer: TestUser;
let repoUrl: string;

beforeAll(async () => {
  server = await startTestServer();
  gitServer = await startGitHttpServer({ tokens: { [WRITE_TOKEN]: 'write', [READ_TOKEN]: 'read' } });
  gitServer.createRepo('project', { seed: { 'README.md': 'kept by every push\n' } });
  repoUrl = `${gitServer.url}/project.git`;
  [a, b] = [await createTenant(server), await createTenant(server)];
  viewer = await a.addUser(['viewer']);
});
afterAll(async () => {
  await server?.close();
  await gitServer?.close();
});

/** A port nothing listens on: taken from the system, then released. */
async function closedPort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const { port } = probe.address() as AddressInfo;
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

const config = (extra: Record<string, unknown> = {}) => ({
  url: repoUrl,
  branch: 'main',
  author_name: 'Dimas Bot',
  author_email: 'bot@example.com',
  path_prefix: 'dimas',
  token: WRITE_TOKEN,
  ...extra,
});

async function scopeOf(token: string): Promise<CallerScope> {
  const em = server.deps.orm.em.fork() as EntityManager;
  const principal = await server.deps.authenticator.authenticate({ em }, token);
  return { em, deps: server.deps, principal: principal! };
}

describe('vcs-config', () => {
  it('answers an unconfigured organization', async () => {
    const res = await call(server, 'GET', '/api/admin/vcs-config', { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ configured: false, url: null, token_set: false });
  });

  it('refuses callers without credentials or without settings.manage', async () => {
    expect((await call(server, 'GET', '/api/admin/vcs-config')).status).toBe(401);
    expect((await call(server, 'POST', '/api/admin/vcs-config', { body: config() })).status).toBe(401);
    const res = await call(server, 'POST', '/api/admin/vcs-config', { token: viewer.token, body: config() });
    expect(res.status).toBe(403);
  });

  it('answers 400 for bad settings', async () => {
    for (const extra of [
      { url: 'ftp://example.com/repo.git' },
      { url: 'http://example.com/repo.git' },
      { url: `http://user:secret@127.0.0.1/x.git` },
      { url: 'not a url' },
      { branch: 'bad..branch' },
      { branch: 'has space' },
      { path_prefix: '../outside' },
      { author_email: 'not-an-email' },
      { url: undefined },
    ]) {
      const res = await call(server, 'POST', '/api/admin/vcs-config', {
        token: a.admin.token,
        body: config(extra),
      });
      expect(res.status, JSON.stringify(extra)).toBe(400);
      expect(res.body.code).toBe('BAD_REQUEST');
    }
  });

  it('saves the configuration, seals the token and never returns it', async () => {
    const res = await call(server, 'POST', '/api/admin/vcs-config', { token: a.admin.token, body: config() });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      configured: true,
      enabled: true,
      url: repoUrl,
      branch: 'main',
      path_prefix: 'dimas',
      username: 'x-access-token',
      token_set: true,
    });
    expect(JSON.stringify(res.body)).not.toContain(WRITE_TOKEN);
    const read = await call(server, 'GET', '/api/admin/vcs-config', { token: viewer.token });
    expect(read.body).toMatchObject({ configured: true, token_set: true });
    expect(JSON.stringify(read.body)).not.toContain(WRITE_TOKEN);
    const [row] = await server.deps.orm.em
      .fork()
      .getConnection()
      .execute('select token_encrypted from vcs_configs where organization_id = ?', [a.organization.id]);
    expect(row.token_encrypted).toMatch(/^v1:/);
    expect(row.token_encrypted).not.toContain(WRITE_TOKEN);
    expect(server.deps.secrets.decrypt(row.token_encrypted)).toBe(WRITE_TOKEN);
  });

  it('keeps the token when omitted, refuses to carry it to another host, removes it with null', async () => {
    let res = await call(server, 'POST', '/api/admin/vcs-config', {
      token: a.admin.token,
      body: config({ token: undefined, branch: 'main' }),
    });
    expect(res.body.token_set).toBe(true);
    res = await call(server, 'POST', '/api/admin/vcs-config', {
      token: a.admin.token,
      body: config({ token: undefined, url: 'https://git.example.com/other.git' }),
    });
    expect(res.status).toBe(400);
    res = await call(server, 'POST', '/api/admin/vcs-config', {
      token: b.admin.token,
      body: config({ token: null }),
    });
    expect(res.body.token_set).toBe(false);
    // b's save did not touch a's configuration.
    res = await call(server, 'GET', '/api/admin/vcs-config', { token: a.admin.token });
    expect(res.body.token_set).toBe(true);
  });
});

describe('vcs-test', () => {
  it('lists the remote refs and checks push access with the stored token', async () => {
    const before = gitServer.requests.length;
    const res = await call(server, 'POST', '/api/admin/vcs-test', {
      token: a.admin.token,
      body: config({ token: undefined }),
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      success: true,
      branch_exists: true,
      default_branch: 'main',
      refs: 1,
      push_access: true,
      token_used: 'stored',
    });
    // It really talked to the server, authenticated, on both services.
    const seen = gitServer.requests.slice(before);
    expect(seen.some((r) => r.path.includes('service=git-upload-pack'))).toBe(true);
    expect(seen.some((r) => r.path.includes('service=git-receive-pack'))).toBe(true);
    expect(seen.every((r) => r.user === 'x-access-token')).toBe(true);
  });

  it('reports a branch the first push will create', async () => {
    const res = await call(server, 'POST', '/api/admin/vcs-test', {
      token: a.admin.token,
      body: config({ branch: 'dimas/new' }),
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ branch_exists: false, token_used: 'given' });
    expect(res.body.message).toMatch(/will be created/);
  });

  it('fails with 422 and a clear message for a wrong token, a read-only token or no server', async () => {
    let res = await call(server, 'POST', '/api/admin/vcs-test', {
      token: a.admin.token,
      body: config({ token: 'wrong-token' }),
    });
    expect(res.status).toBe(422);
    expect(res.body.message).toMatch(/refused the credentials \(HTTP 401\)/);
    res = await call(server, 'POST', '/api/admin/vcs-test', {
      token: a.admin.token,
      body: config({ token: READ_TOKEN }),
    });
    expect(res.status).toBe(422);
    expect(res.body.message).toMatch(/do not grant this access \(HTTP 403\)/);
    res = await call(server, 'POST', '/api/admin/vcs-test', {
      token: a.admin.token,
      body: config({ url: `${gitServer.url}/missing.git` }),
    });
    expect(res.status).toBe(422);
    expect(res.body.message).toMatch(/404/);
    res = await call(server, 'POST', '/api/admin/vcs-test', {
      token: a.admin.token,
      body: config({ url: `http://127.0.0.1:${await closedPort()}/repo.git` }),
    });
    expect(res.status).toBe(422);
    expect(res.body.message).toMatch(/cannot reach/);
    // A port the fetch standard blocks is refused before connecting, and said so.
    res = await call(server, 'POST', '/api/admin/vcs-test', {
      token: a.admin.token,
      body: config({ url: 'http://127.0.0.1:1/repo.git' }),
    });
    expect(res.status).toBe(422);
    expect(res.body.message).toMatch(/port that HTTP clients refuse/);
  });

  it('does not lend the stored token to another organization', async () => {
    const res = await call(server, 'POST', '/api/admin/vcs-test', {
      token: b.admin.token,
      body: config({ token: undefined }),
    });
    expect(res.status).toBe(422);
    expect(res.body.message).toMatch(/401/);
  });

  it('refuses callers and bad input', async () => {
    expect((await call(server, 'POST', '/api/admin/vcs-test', { body: config() })).status).toBe(401);
    expect(
      (await call(server, 'POST', '/api/admin/vcs-test', { token: viewer.token, body: config() })).status,
    ).toBe(403);
    const res = await call(server, 'POST', '/api/admin/vcs-test', {
      token: a.admin.token,
      body: config({ url: 'file:///etc' }),
    });
    expect(res.status).toBe(400);
  });
});

describe('pushWorkspaceFiles', () => {
  const files = [
    { path: 'schema.json', content: '{"name":"crm","version":1}\n' },
    { path: 'mappings/customers.json', content: '{"table_name":"customers"}\n' },
    { path: 'transformation/models/customers.sql', content: 'select 1 as id\n' },
  ];

  it('commits the file projection under the prefix and pushes it', async () => {
    const scope = await scopeOf(a.admin.token);
    const result = await pushWorkspaceFiles(scope, files, 'Commit transformation v1', { workspace: 'crm' });
    expect(result).toMatchObject({ pushed: true, branch: 'main', directory: 'dimas/crm', files: 3 });
    const tree = gitServer.git('project', ['ls-tree', '-r', '--name-only', 'main']).split('\n');
    expect(tree).toEqual([
      'README.md',
      'dimas/crm/mappings/customers.json',
      'dimas/crm/schema.json',
      'dimas/crm/transformation/models/customers.sql',
    ]);
    expect(gitServer.git('project', ['show', 'main:dimas/crm/schema.json'])).toBe(
      '{"name":"crm","version":1}',
    );
    expect(gitServer.git('project', ['log', '-1', '--format=%H|%an|%ae|%s', 'main'])).toBe(
      `${(result as { commit: string }).commit}|Dimas Bot|bot@example.com|Commit transformation v1`,
    );
    const cfg = await call(server, 'GET', '/api/admin/vcs-config', { token: viewer.token });
    expect(cfg.body).toMatchObject({
      last_push_commit: (result as { commit: string }).commit,
      last_push_error: null,
    });
  });

  it('replaces the directory: removed files disappear, other directories stay; no change, no commit', async () => {
    const scope = await scopeOf(a.admin.token);
    await pushWorkspaceFiles(scope, [{ path: 'schema.json', content: '{}' }], 'other workspace', {
      workspace: 'sales',
    });
    const next = [files[0], { ...files[1], content: '{"table_name":"customers","version":2}\n' }];
    const result = await pushWorkspaceFiles(scope, next, 'Commit transformation v2', { workspace: 'crm' });
    expect(result.pushed).toBe(true);
    const tree = gitServer.git('project', ['ls-tree', '-r', '--name-only', 'main']).split('\n');
    expect(tree).toEqual([
      'README.md',
      'dimas/crm/mappings/customers.json',
      'dimas/crm/schema.json',
      'dimas/sales/schema.json',
    ]);
    const head = gitServer.git('project', ['rev-parse', 'main']);
    const again = await pushWorkspaceFiles(scope, next, 'same again', { workspace: 'crm' });
    expect(again).toMatchObject({ pushed: false, reason: 'no_changes', commit: head });
    expect(gitServer.git('project', ['rev-parse', 'main'])).toBe(head);
    expect(gitServer.git('project', ['fsck', '--strict'])).toBe('');
  });

  it('skips the push when the feature vcs_push is switched off', async () => {
    const head = gitServer.git('project', ['rev-parse', 'main']);
    let res = await call(server, 'POST', '/api/admin/feature-settings', {
      token: a.admin.token,
      body: { features: { vcs_push: false } },
    });
    expect(res.status).toBe(200);
    const skipped = await pushWorkspaceFiles(await scopeOf(a.admin.token), files, 'not pushed', {
      workspace: 'crm',
    });
    expect(skipped).toMatchObject({ pushed: false, reason: 'feature_disabled' });
    expect(gitServer.git('project', ['rev-parse', 'main'])).toBe(head);

    res = await call(server, 'POST', '/api/admin/feature-settings', {
      token: a.admin.token,
      body: { features: { vcs_push: null } },
    });
    const pushed = await pushWorkspaceFiles(await scopeOf(a.admin.token), files, 'pushed again', {
      workspace: 'crm',
    });
    expect(pushed.pushed).toBe(true);
    expect(gitServer.git('project', ['rev-parse', 'main'])).not.toBe(head);
  });

  it('skips when the integration is disabled or not configured', async () => {
    await call(server, 'POST', '/api/admin/vcs-config', {
      token: a.admin.token,
      body: config({ token: undefined, enabled: false }),
    });
    expect(await pushWorkspaceFiles(await scopeOf(a.admin.token), files, 'x')).toMatchObject({
      pushed: false,
      reason: 'disabled',
    });
    await call(server, 'POST', '/api/admin/vcs-config', {
      token: a.admin.token,
      body: config({ token: undefined, enabled: true }),
    });
    const other = await createTenant(server);
    expect(await pushWorkspaceFiles(await scopeOf(other.admin.token), files, 'x')).toMatchObject({
      pushed: false,
      reason: 'not_configured',
    });
  });

  it('reports a refused push without throwing, and refuses paths outside the repository', async () => {
    // b's configuration points at the same repository with no token.
    const result = await pushWorkspaceFiles(await scopeOf(b.admin.token), files, 'x');
    expect(result).toMatchObject({ pushed: false, reason: 'failed', message: expect.stringMatching(/401/) });
    const cfg = await call(server, 'GET', '/api/admin/vcs-config', { token: b.admin.token });
    expect(cfg.body.last_push_error).toMatch(/401/);

    await expect(
      pushWorkspaceFiles(await scopeOf(a.admin.token), [{ path: '../escape.txt', content: 'x' }], 'x'),
    ).rejects.toMatchObject({ code: 'BAD_REQUEST' });
    await expect(
      pushWorkspaceFiles(await scopeOf(a.admin.token), [{ path: '.git/config', content: 'x' }], 'x'),
    ).rejects.toMatchObject({ code: 'BAD_REQUEST' });
  });
});

describe('branch names', () => {
  /** What git itself says of a branch name (exit 0: valid). */
  const gitAccepts = (name: string) =>
    spawnSync('git', ['check-ref-format', '--branch', name], { cwd: tmpdir() }).status === 0;
  // git accepts these as branch names, but they would not name the branch dimas means.
  const refusedBeyondGit = new Set(['HEAD', '@', 'refs/heads/x']);
  const names = [
    'main',
    'feature/x',
    'dimas/ws-1',
    'release-1.0',
    'x@y',
    'ünïcode',
    'a.b/c_d',
    'bad..branch',
    'has space',
    'a/.hidden',
    '.hidden',
    'x.lock',
    'a.lock/b',
    'x/',
    '/x',
    'a//b',
    'x.',
    'a@{b',
    'a~1',
    'a^',
    'a:b',
    'a?',
    'a*',
    'a[b',
    'a\\b',
    'tab\there',
    'del\x7f',
    '-x',
    ...refusedBeyondGit,
  ];

  it("accepts exactly the names git accepts (but HEAD, '@' and refs/…), and says which rule failed", async () => {
    const tenant = await createTenant(server);
    for (const name of names) {
      const problem = branchNameProblem(name);
      const valid = !refusedBeyondGit.has(name) && gitAccepts(name);
      expect(problem === null, `${JSON.stringify(name)}: ${problem}`).toBe(valid);
      const res = await call(server, 'POST', '/api/admin/vcs-config', {
        token: tenant.admin.token,
        body: config({ branch: name }),
      });
      expect(res.status, `${JSON.stringify(name)}: ${JSON.stringify(res.body)}`).toBe(valid ? 200 : 400);
      if (!valid)
        expect(res.body.issues).toContainEqual(
          expect.objectContaining({ path: ['branch'], message: `not a valid git branch name: ${problem}` }),
        );
    }
    expect(branchNameProblem('a/.hidden')).toMatch(/start with '\.'/);
    expect(branchNameProblem('refs/heads/x')).toMatch(/refs\//);
    expect(branchNameProblem('HEAD')).toMatch(/HEAD/);
  });

  it('does not push to a branch saved before names were checked', async () => {
    const tenant = await createTenant(server);
    const saved = await call(server, 'POST', '/api/admin/vcs-config', {
      token: tenant.admin.token,
      body: config(),
    });
    expect(saved.status).toBe(200);
    await server.deps.orm.em
      .fork()
      .getConnection()
      .execute(`update vcs_configs set branch = 'HEAD' where organization_id = ?`, [tenant.organization.id]);
    const result = await pushWorkspaceFiles(
      await scopeOf(tenant.admin.token),
      [{ path: 'a', content: 'x' }],
      'x',
    );
    expect(result).toMatchObject({ pushed: false, reason: 'failed', message: expect.stringMatching(/HEAD/) });
    expect(gitServer.git('project', ['for-each-ref', 'refs/heads/HEAD'])).toBe('');
  });
});

describe('push history when the remote settings change', () => {
  it('clears last_push_error for new credentials, and the whole history for another repository', async () => {
    gitServer.createRepo('history', { seed: { 'README.md': 'x\n' } });
    gitServer.createRepo('history-moved', { seed: { 'README.md': 'x\n' } });
    const tenant = await createTenant(server);
    const url = `${gitServer.url}/history.git`;
    const save = async (extra: Record<string, unknown>) => {
      const res = await call(server, 'POST', '/api/admin/vcs-config', {
        token: tenant.admin.token,
        body: config({ url, ...extra }),
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      return res.body;
    };
    const push = async (content: string) =>
      pushWorkspaceFiles(await scopeOf(tenant.admin.token), [{ path: 'a.txt', content }], content);

    await save({ token: READ_TOKEN });
    expect(await push('one')).toMatchObject({ pushed: false, reason: 'failed' });
    // Settings that do not touch the remote keep the error: it still applies.
    let view = await save({ token: undefined, author_name: 'Someone Else' });
    expect(view.last_push_error).toMatch(/403/);
    view = await save({ token: READ_TOKEN });
    expect(view.last_push_error).toMatch(/403/);

    view = await save({ token: WRITE_TOKEN });
    expect(view.last_push_error).toBeNull();
    const pushed = await push('two');
    expect(pushed.pushed).toBe(true);
    const commit = (pushed as { commit: string }).commit;

    await save({ token: READ_TOKEN });
    expect(await push('three')).toMatchObject({ pushed: false, reason: 'failed' });
    view = await save({ token: undefined, username: 'oauth2' });
    // Same repository and branch: the last successful push is still there.
    expect(view).toMatchObject({ last_push_error: null, last_push_commit: commit });
    expect(view.last_push_at).not.toBeNull();

    await save({ token: READ_TOKEN });
    expect(await push('four')).toMatchObject({ pushed: false, reason: 'failed' });
    view = await save({ token: undefined, url: `${gitServer.url}/history-moved.git` });
    expect(view).toMatchObject({ last_push_error: null, last_push_commit: null, last_push_at: null });

    await save({ token: WRITE_TOKEN, url: `${gitServer.url}/history-moved.git` });
    expect((await push('five')).pushed).toBe(true);
    view = await save({ token: undefined, url: `${gitServer.url}/history-moved.git`, branch: 'other' });
    expect(view).toMatchObject({ last_push_error: null, last_push_commit: null, last_push_at: null });
  });
});

describe('a remote whose HEAD names a missing branch', () => {
  it('takes every push of the configured branch, not only the first', async () => {
    // `git init --bare` on a self-hosted server: HEAD → refs/heads/master, which never exists here.
    gitServer.createRepo('elsewhere', { branch: 'master' });
    const tenant = await createTenant(server);
    const saved = await call(server, 'POST', '/api/admin/vcs-config', {
      token: tenant.admin.token,
      body: config({ url: `${gitServer.url}/elsewhere.git`, branch: 'main' }),
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    const commits: string[] = [];
    for (const version of [1, 2, 3]) {
      const result = await pushWorkspaceFiles(
        await scopeOf(tenant.admin.token),
        [{ path: 'schema.json', content: `{"version":${version}}\n` }],
        `version ${version}`,
      );
      expect(result, `push ${version}`).toMatchObject({ pushed: true, branch: 'main' });
      commits.push((result as { commit: string }).commit);
    }
    expect(gitServer.git('elsewhere', ['symbolic-ref', 'HEAD'])).toBe('refs/heads/master');
    expect(gitServer.git('elsewhere', ['log', '--format=%H %s', 'refs/heads/main']).split('\n')).toEqual(
      commits.map((c, i) => `${c} version ${i + 1}`).reverse(),
    );
    expect(gitServer.git('elsewhere', ['show', 'refs/heads/main:dimas/schema.json'])).toBe('{"version":3}');
    expect(gitServer.git('elsewhere', ['fsck', '--strict'])).toBe('');
    const cfg = await call(server, 'GET', '/api/admin/vcs-config', { token: tenant.admin.token });
    expect(cfg.body).toMatchObject({ last_push_commit: commits[2], last_push_error: null });
  });
});

/*
 * The workspace as the remote holds it: every push (here, the ones commit-transformation makes) is
 * one commit whose directory is exactly the workspace zip that `download` gives, file for file and
 * byte for byte, whatever was committed before.
 */
describe('pushing the workspace', () => {
  const warehouse = scratchDatabase('vcs');
  const workspace = unique('vcsws');
  const directory = `dimas/${workspace}`;
  const api = bindCall(
    () => server,
    () => a.admin.token,
  );
  const connection = (schemas: string[]) => pgConfig(warehouse.name, { schemas });

  async function downloaded(): Promise<Map<string, Buffer>> {
    const res = await fetch(new URL(`/api/workspaces/${workspace}/download`, server.url), {
      headers: { authorization: `Bearer ${a.admin.token}` },
    });
    expect(res.status).toBe(200);
    return readZip(Buffer.from(await res.arrayBuffer()));
  }

  async function commitTable(table: string, message: string) {
    const res = await api('POST', `/api/mappings/${table}/commit-transformation`, { body: { message } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return res.body;
  }

  /** The pushed directory equals the zip: the same paths and the same bytes in each. */
  async function expectRemoteEqualsDownload() {
    const zip = await downloaded();
    const remote = gitServer.tree('project', 'main', directory);
    expect([...remote.keys()].sort()).toEqual([...zip.keys()].sort());
    for (const [path, content] of zip)
      expect(remote.get(path)?.toString('utf8'), path).toBe(content.toString('utf8'));
    return zip;
  }

  beforeAll(async () => {
    await warehouse.create();
    await warehouse.sql(`create schema app; create schema mart;
      create table app.users (id integer primary key, email text, plan text);
      insert into app.users values (1, 'a@x.io', 'gold'), (2, 'b@x.io', 'tin');
      create table app.groups (id integer primary key, title text);
      insert into app.groups values (1, 'first'), (2, 'second');`);
    const saved = await api('POST', '/api/admin/vcs-config', {
      body: config({ enabled: true, username: 'dimas-bot' }),
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    expect(
      (await api('POST', '/api/workspaces/create', { body: { name: workspace, select: true } })).status,
    ).toBe(200);
    const res = await api('POST', `/api/workspaces/${workspace}/config`, {
      body: {
        source_config: connection(['app']),
        target_config: connection(['mart']),
        system_prompt: 'Map the shop into the CRM.\n',
        success_criteria_prompt: 'Every contact has an e-mail.\n',
        target_schema: {
          name: 'crm',
          tables: [
            {
              name: 'contacts',
              primary_key: ['id'],
              columns: [
                { name: 'id', type: 'integer', nullable: false },
                { name: 'email', type: 'text', pii: true },
                { name: 'tier', type: 'text' },
              ],
            },
            {
              name: 'segments',
              primary_key: ['id'],
              columns: [
                { name: 'id', type: 'integer', nullable: false },
                { name: 'label', type: 'text' },
              ],
            },
          ],
        },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const steps: [string, string, unknown][] = [
      ['contacts', 'tables', { source_table: 'users', relationship: 'primary' }],
      ['contacts', 'connection', { connection: { source_field: 'users.id', target_field: 'id' } }],
      ['contacts', 'connection', { connection: { source_field: 'users.email', target_field: 'email' } }],
      [
        'contacts',
        'transformation',
        { transformation: { target_field: 'tier', expression: 'upper(users.plan)' } },
      ],
      ['segments', 'tables', { source_table: 'groups', relationship: 'primary' }],
      ['segments', 'connection', { connection: { source_field: 'groups.id', target_field: 'id' } }],
      ['segments', 'connection', { connection: { source_field: 'groups.title', target_field: 'label' } }],
    ];
    for (const [table, route, body] of steps) {
      const step = await api('POST', `/api/mappings/${table}/${route}`, { body });
      expect(step.status, `${table} ${route}: ${JSON.stringify(step.body)}`).toBe(200);
    }
  });
  afterAll(async () => {
    await warehouse.drop();
  });

  it('pushes the whole projection with the first committed table, not that table alone', async () => {
    const seen = gitServer.requests.length;
    const committed = await commitTable('contacts', 'contacts from users');
    expect(committed.vcs).toMatchObject({ pushed: true, reason: null });
    // Every request of the push authenticated as the configured user name with the token.
    const push = gitServer.requests.slice(seen);
    expect(push.some((r) => r.path.endsWith('/git-receive-pack'))).toBe(true);
    expect(new Set(push.map((r) => r.user))).toEqual(new Set(['dimas-bot']));
    expect(gitServer.git('project', ['rev-parse', 'main'])).toBe(committed.vcs.commit);
    const zip = await expectRemoteEqualsDownload();
    // Both mappings (one still uncommitted), the schema, the prompts and the workspace description.
    expect([...zip.keys()].sort()).toEqual([
      'mappings/contacts.json',
      'mappings/contacts.sql',
      'mappings/segments.json',
      'prompts/success_criteria.md',
      'prompts/system_prompt.md',
      'schema.json',
      'workspace.json',
    ]);
    expect(gitServer.git('project', ['log', '-1', '--format=%s', 'main'])).toMatch(
      /^contacts v\d+: contacts from users$/,
    );
    expect(gitServer.git('project', ['ls-tree', '--name-only', 'main'])).toContain('README.md');
    const diff = await api('GET', `/api/workspaces/${workspace}/git-diff`);
    expect(diff.body).toMatchObject({ has_changes: false, files: [] });
  });

  it('a later push carries the transformation project and keeps every earlier file', async () => {
    const before = gitServer.git('project', ['rev-parse', 'main']);
    const project = await api('POST', '/api/pipelines/generate-project', { body: {} });
    expect(project.status, JSON.stringify(project.body)).toBe(200);
    let diff = await api('GET', `/api/workspaces/${workspace}/git-diff`);
    const added = diff.body.files.map((f: { path: string }) => f.path);
    expect(added).toContain('transformation/dbt_project.yml');
    expect(added.every((p: string) => p.startsWith('transformation/'))).toBe(true);

    // A message from a client that ends lines with a bare carriage return.
    const committed = await commitTable('segments', 'segments from groups\rdrop table mart.segments;');
    expect(committed.vcs).toMatchObject({ pushed: true });
    expect(gitServer.git('project', ['rev-parse', 'main'])).toBe(committed.vcs.commit);
    const zip = await expectRemoteEqualsDownload();
    // Only the message's first line is in the SQL file's comment: the rest would have run as SQL.
    const sqlFile = zip.get('mappings/segments.sql')!.toString('utf8');
    expect(sqlFile).not.toContain('drop table');
    expect(sqlFile.split('\n')[0]).toMatch(/^-- segments, committed version \d+: segments from groups$/);
    expect([...zip.keys()]).toEqual(
      expect.arrayContaining([
        'mappings/contacts.json',
        'mappings/contacts.sql',
        'mappings/segments.json',
        'mappings/segments.sql',
        'prompts/system_prompt.md',
        'schema.json',
        'transformation/dbt_project.yml',
        'transformation/models/contacts.sql',
      ]),
    );
    // One commit on top of the previous push.
    expect(gitServer.git('project', ['rev-parse', 'main^'])).toBe(before);
    diff = await api('GET', `/api/workspaces/${workspace}/git-diff`);
    expect(diff.body.has_changes).toBe(false);
  });

  it('git-diff compares the same projection: an edited prompt is the only change, and the next push carries it', async () => {
    let res = await api('POST', `/api/workspaces/${workspace}/config`, {
      body: {
        system_prompt: 'Map the shop, carefully.\n',
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const diff = await api('GET', `/api/workspaces/${workspace}/git-diff`);
    expect(diff.body.files).toEqual([
      expect.objectContaining({ path: 'prompts/system_prompt.md', status: 'modified' }),
    ]);
    res = await api('POST', '/api/mappings/contacts/transformation', {
      body: {
        transformation: { target_field: 'tier', expression: 'lower(users.plan)' },
      },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    await commitTable('contacts', 'lower-case tiers');
    const zip = await expectRemoteEqualsDownload();
    expect(zip.get('prompts/system_prompt.md')?.toString()).toBe('Map the shop, carefully.\n');
    expect(gitServer.git('project', ['fsck', '--strict'])).toBe('');
  });
});
