import { execFileSync, spawn } from 'node:child_process';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A real git smart-HTTP server for tests: `git http-backend` (the CGI program that ships with git)
 * behind a small node HTTP server, over bare repositories in a temporary directory.
 * With `tokens`, every request needs Basic auth whose password is a known token; a `read` token is
 * refused (403) on the receive-pack service, as hosting services refuse read-only tokens a push.
 */
export interface GitHttpServer {
  /** Base URL; a repository named r is at `${url}/r.git`. */
  url: string;
  /** Creates a bare repository (with one commit on `branch` when `seed` is given). */
  createRepo(name: string, options?: { branch?: string; seed?: Record<string, string> }): string;
  /** Runs git against a repository and returns its output. */
  git(repo: string, args: string[]): string;
  /** The files of `directory` at `rev`, path (relative to the directory) → exact bytes. */
  tree(repo: string, rev: string, directory: string): Map<string, Buffer>;
  /** Requests seen, for asserting what was sent. */
  requests: { method: string; path: string; user: string | null }[];
  close(): Promise<void>;
}

const GIT_ENV = {
  GIT_AUTHOR_NAME: 'seed',
  GIT_AUTHOR_EMAIL: 'seed@example.invalid',
  GIT_COMMITTER_NAME: 'seed',
  GIT_COMMITTER_EMAIL: 'seed@example.invalid',
  GIT_CONFIG_NOSYSTEM: '1',
  HOME: tmpdir(),
};

export async function startGitHttpServer(
  options: { tokens?: Record<string, 'read' | 'write'> } = {},
): Promise<GitHttpServer> {
  const root = mkdtempSync(join(tmpdir(), 'dimas-git-'));
  const backend = join(execFileSync('git', ['--exec-path']).toString().trim(), 'git-http-backend');
  const requests: GitHttpServer['requests'] = [];
  const run = (gitDir: string, args: string[], input?: string) =>
    execFileSync('git', [`--git-dir=${gitDir}`, ...args], {
      input,
      env: { ...process.env, ...GIT_ENV },
    })
      .toString()
      .trim();

  function authorize(req: IncomingMessage, res: ServerResponse, forPush: boolean): string | null | false {
    if (!options.tokens) return null;
    const header = req.headers.authorization ?? '';
    const [user, token] = header.startsWith('Basic ')
      ? Buffer.from(header.slice(6), 'base64').toString().split(/:(.*)/s)
      : [];
    const right = token ? options.tokens[token] : undefined;
    if (!right) {
      res.writeHead(401, { 'WWW-Authenticate': 'Basic realm="git"' }).end('Unauthorized');
      return false;
    }
    if (forPush && right !== 'write') {
      res.writeHead(403).end('Forbidden: read-only token');
      return false;
    }
    return user || 'token';
  }

  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://localhost');
    const forPush =
      url.searchParams.get('service') === 'git-receive-pack' || url.pathname.endsWith('/git-receive-pack');
    const user = authorize(req, res, forPush);
    if (user === false) return;
    requests.push({ method: req.method ?? 'GET', path: url.pathname + url.search, user });
    const child = spawn(backend, [], {
      env: {
        ...GIT_ENV,
        PATH: process.env.PATH,
        GIT_PROJECT_ROOT: root,
        GIT_HTTP_EXPORT_ALL: '1',
        PATH_INFO: decodeURIComponent(url.pathname),
        QUERY_STRING: url.search.slice(1),
        REQUEST_METHOD: req.method ?? 'GET',
        CONTENT_TYPE: req.headers['content-type'] ?? '',
        ...(req.headers['content-length'] ? { CONTENT_LENGTH: req.headers['content-length'] } : {}),
        ...(req.headers['content-encoding']
          ? { HTTP_CONTENT_ENCODING: req.headers['content-encoding'] }
          : {}),
        ...(req.headers['git-protocol'] ? { GIT_PROTOCOL: String(req.headers['git-protocol']) } : {}),
        // An authenticated user may push (http-backend enables receive-pack for REMOTE_USER).
        ...(user ? { REMOTE_USER: user } : {}),
        REMOTE_ADDR: req.socket.remoteAddress ?? '127.0.0.1',
      },
    });
    req.pipe(child.stdin);
    // CGI output: headers (with an optional Status line), a blank line, then the body.
    let head = Buffer.alloc(0);
    let headersDone = false;
    child.stdout.on('data', (chunk: Buffer) => {
      if (headersDone) return void res.write(chunk);
      head = Buffer.concat([head, chunk]);
      const crlf = head.indexOf('\r\n\r\n');
      const lf = head.indexOf('\n\n');
      const end = crlf >= 0 && (lf < 0 || crlf < lf) ? crlf : lf;
      if (end < 0) return;
      const sep = end === crlf ? 4 : 2;
      let status = 200;
      const headers: Record<string, string> = {};
      for (const line of head.subarray(0, end).toString().split(/\r?\n/)) {
        const i = line.indexOf(':');
        if (i < 0) continue;
        const name = line.slice(0, i).trim();
        const value = line.slice(i + 1).trim();
        if (name.toLowerCase() === 'status') status = parseInt(value, 10);
        else headers[name] = value;
      }
      res.writeHead(status, headers);
      headersDone = true;
      const rest = head.subarray(end + sep);
      if (rest.length) res.write(rest);
    });
    child.stdout.on('end', () => {
      if (!headersDone) res.writeHead(502);
      res.end();
    });
    child.on('error', () => {
      if (!res.headersSent) res.writeHead(500);
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;

  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    createRepo(name, { branch = 'main', seed } = {}) {
      const dir = join(root, `${name}.git`);
      execFileSync('git', ['init', '--bare', '--quiet', `--initial-branch=${branch}`, dir], {
        env: { ...process.env, ...GIT_ENV },
      });
      // Without tokens there is no REMOTE_USER: allow anonymous pushes explicitly.
      if (!options.tokens) run(dir, ['config', 'http.receivepack', 'true']);
      if (seed) {
        const lines = Object.entries(seed).map(([path, content]) => {
          if (path.includes('/')) throw new Error('seed files are top-level only');
          return `100644 blob ${run(dir, ['hash-object', '-w', '--stdin'], content)}\t${path}`;
        });
        const tree = run(dir, ['mktree'], lines.join('\n') + '\n');
        const commit = run(dir, ['commit-tree', tree, '-m', 'seed']);
        run(dir, ['update-ref', `refs/heads/${branch}`, commit]);
      }
      return dir;
    },
    git: (repo, args) => run(join(root, `${repo}.git`), args),
    tree(repo, rev, directory) {
      const gitDir = join(root, `${repo}.git`);
      const prefix = directory.replace(/\/*$/, '/');
      const paths = run(gitDir, ['ls-tree', '-r', '--name-only', rev, '--', prefix])
        .split('\n')
        .filter(Boolean);
      return new Map(
        paths.map((path) => [
          path.slice(prefix.length),
          execFileSync('git', [`--git-dir=${gitDir}`, 'cat-file', 'blob', `${rev}:${path}`], {
            env: { ...process.env, ...GIT_ENV },
          }),
        ]),
      );
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      rmSync(root, { recursive: true, force: true });
    },
  };
}
