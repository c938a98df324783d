import fs from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import git from 'isomorphic-git';
import type { HttpClient, ServerRef } from 'isomorphic-git';
import { GitRemoteHTTP } from 'isomorphic-git/managers';
import { AppError } from '../app-error.ts';
import { maskUrl, sameOrigin, type OutboundHttp } from '../outbound-http.ts';

/** A remote repository over HTTP(S) and the credentials to use with it. */
export interface GitRemote {
  url: string;
  /** Basic-auth user name sent with the token (GitHub: any, e.g. x-access-token; GitLab: oauth2). */
  username: string;
  token: string | null;
  outbound: OutboundHttp;
  /** How long one whole operation (a connection test, a push with its retries) may take. */
  timeoutMs: number;
}

export interface GitAuthor {
  name: string;
  email: string;
}

export interface GitFile {
  path: string;
  content: string | Uint8Array;
}

const MAX_REDIRECTS = 5;
const REDIRECT_STATUSES = new Set([301, 302, 303, 307, 308]);

/** A redirect dimas does not follow: the message says what to set instead. */
class RedirectRefused extends Error {
  readonly code = 'RedirectRefused';
}

/** The repository address a redirect of `/info/refs?service=…` points at, when it keeps that suffix. */
function repositoryOf(location: string, requested: string): string | null {
  const at = requested.lastIndexOf('/info/refs?');
  if (at < 0) return null;
  const suffix = requested.slice(at);
  return location.endsWith(suffix) ? location.slice(0, -suffix.length) : null;
}

/**
 * isomorphic-git's push reads the receive-pack report from side-band 1 only, even when side-band-64k
 * was not agreed on: a server without side-band sends the report as plain pkt-lines, which it
 * dropped, failing every push with a parse error. A plain report is handed on wrapped in band 1, as a
 * side-band server would have sent it.
 */
function bandedReport(report: Buffer): Buffer {
  if (report.subarray(4, 11).toString('latin1') !== 'unpack ') return report;
  const packets: Buffer[] = [];
  for (let pos = 0; pos < report.length; pos += 65515) {
    const chunk = report.subarray(pos, pos + 65515);
    const length = Buffer.from((chunk.length + 5).toString(16).padStart(4, '0'));
    packets.push(length, Buffer.from([1]), chunk);
  }
  return Buffer.concat([...packets, Buffer.from('0000')]);
}

/**
 * isomorphic-git's HTTP client over the outbound guard (every connection goes only where
 * OUTBOUND_BLOCKED_NETWORKS allows), for one operation: every request shares one deadline, so a
 * silent remote costs the operation `timeoutMs` at most, not a timeout per request.
 *
 * Redirects are followed here, not by fetch: only within the remote's origin (scheme, host and
 * port, `sameOrigin`), where the token may go; a redirect elsewhere is refused with its Location
 * rather than followed without the token (which the remote then answered 401, blaming the token).
 * As git does (http.followRedirects=initial), a redirected discovery request moves the repository:
 * the later requests (the POSTs, which a 301/302 would turn into bodiless GETs) go to the new address.
 */
function httpClient(remote: GitRemote): HttpClient {
  const deadline = AbortSignal.timeout(remote.timeoutMs);
  let moved: string | null = null;
  const rebase = (url: string) =>
    moved !== null && url.startsWith(remote.url) ? moved + url.slice(remote.url.length) : url;
  return {
    request: async ({ url, method = 'GET', headers = {}, body }) => {
      const chunks: Uint8Array[] = [];
      if (body) for await (const chunk of body) chunks.push(chunk);
      const payload = chunks.length ? Buffer.concat(chunks) : undefined;
      let target = rebase(url);
      for (let hops = 0; ; hops++) {
        const res = await remote.outbound.fetch(target, {
          method,
          headers,
          body: payload,
          redirect: 'manual',
          signal: deadline,
        });
        if (!REDIRECT_STATUSES.has(res.status)) {
          const report =
            method === 'POST' && target.endsWith('/git-receive-pack') && res.ok
              ? bandedReport(Buffer.from(await res.arrayBuffer()))
              : null;
          const responseBody = report
            ? (async function* () {
                yield report;
              })()
            : (res.body?.[Symbol.asyncIterator]() as AsyncIterableIterator<Uint8Array> | undefined);
          return {
            url: target,
            method,
            statusCode: res.status,
            statusMessage: res.statusText,
            headers: Object.fromEntries(res.headers),
            body: responseBody,
          };
        }
        await res.arrayBuffer().catch(() => undefined);
        const location = res.headers.get('location');
        const answered = `the remote answered HTTP ${res.status}`;
        if (!location) throw new RedirectRefused(`${answered} without a Location`);
        let next: string;
        try {
          next = new URL(location, target).toString();
        } catch {
          throw new RedirectRefused(`${answered} with an invalid Location ${maskUrl(location)}`);
        }
        const repository = repositoryOf(next, target);
        const setUrl = repository
          ? `: set the URL to ${maskUrl(repository)}`
          : ': set the URL to where it points';
        if (!sameOrigin(target, next))
          throw new RedirectRefused(
            `the remote redirects to another host (HTTP ${res.status} to ${maskUrl(next)}); the token is only sent to ${new URL(remote.url).origin}${setUrl}`,
          );
        if (method !== 'GET' && res.status !== 307 && res.status !== 308)
          throw new RedirectRefused(
            `the remote redirects ${method} ${new URL(target).pathname} (HTTP ${res.status} to ${maskUrl(next)})${setUrl}`,
          );
        if (hops >= MAX_REDIRECTS)
          throw new RedirectRefused(
            `the remote redirected more than ${MAX_REDIRECTS} times (last to ${maskUrl(next)})`,
          );
        if (repository !== null) moved = repository;
        target = next;
      }
    },
  };
}

/**
 * The token goes in every request up front: hosts that allow anonymous reads would never ask for it.
 * A new object each call: isomorphic-git adds its protocol header to the object it is given.
 */
function authHeaders(remote: GitRemote): Record<string, string> {
  if (!remote.token) return {};
  const basic = Buffer.from(`${remote.username}:${remote.token}`).toString('base64');
  return { Authorization: `Basic ${basic}` };
}

/** Everything that can go wrong talking to a remote becomes a 422 that says what to fix. */
function remoteError(error: unknown, remote: GitRemote, action: string): AppError {
  // fetch reports a failed connection as "fetch failed" with the reason as its cause.
  const cause = (error as { cause?: unknown }).cause;
  if (error instanceof TypeError && cause instanceof Error) error = cause;
  if (error instanceof AppError) return error;
  const e = error as { code?: string; name?: string; message?: string; data?: Record<string, unknown> };
  const host = (() => {
    try {
      return new URL(remote.url).host;
    } catch {
      return remote.url;
    }
  })();
  const fail = (message: string, reason: string) =>
    new AppError('UNPROCESSABLE_CONTENT', `${action} failed: ${message}`, { reason });
  if (e.code === 'HttpError') {
    const status = Number(e.data?.statusCode);
    if (status === 401)
      return fail(
        `the remote refused the credentials (HTTP 401); check the token and user name`,
        'VCS_AUTH_FAILED',
      );
    if (status === 403)
      return fail(`the credentials do not grant this access (HTTP 403)`, 'VCS_ACCESS_DENIED');
    if (status === 404) return fail(`no repository at ${remote.url} (HTTP 404)`, 'VCS_NOT_FOUND');
    return fail(
      `the remote answered HTTP ${status} ${String(e.data?.statusMessage ?? '')}`,
      'VCS_HTTP_ERROR',
    );
  }
  if (e.code === 'RedirectRefused') return fail(e.message ?? 'redirect refused', 'VCS_REDIRECT');
  if (e.code === 'SmartHttpError')
    return fail(`${remote.url} does not speak the git smart HTTP protocol`, 'VCS_NOT_GIT');
  if (e.code === 'PushRejectedError' || e.code === 'GitPushError')
    return fail(`the remote rejected the push: ${e.message}`, 'VCS_PUSH_REJECTED');
  if (e.name === 'TimeoutError' || e.name === 'AbortError' || e.code === 'ABORT_ERR')
    return fail(
      `${host} did not answer within ${remote.timeoutMs / 1000} s (VCS_REMOTE_TIMEOUT_MS)`,
      'VCS_TIMEOUT',
    );
  if (
    e.code &&
    /^(ECONNREFUSED|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|ECONNRESET|EHOSTUNREACH|ENETUNREACH)$/.test(e.code)
  )
    return fail(`cannot reach ${host} (${e.code})`, 'VCS_UNREACHABLE');
  // fetch refuses the ports its standard blocks (1, 7, 9, 6000, 6665–6669, …) before connecting.
  if (e.message === 'bad port')
    return fail(`${host} uses a port that HTTP clients refuse to connect to`, 'VCS_UNREACHABLE');
  if (e.code && /^(CERT_|DEPTH_ZERO|SELF_SIGNED|UNABLE_TO_VERIFY|ERR_TLS)/.test(e.code))
    return fail(`the TLS certificate of ${host} is not trusted (${e.code})`, 'VCS_TLS');
  return fail(e.message ?? 'unknown error', 'VCS_ERROR');
}

export interface RemoteCheck {
  refs: number;
  default_branch: string | null;
  /** How the default branch was found when the remote does not name it, or why it is unknown. */
  default_branch_note: string | null;
  branch_exists: boolean;
  push_access: boolean;
}

/**
 * The remote's default branch: the branch its HEAD names (protocol v2 ls-refs with symrefs, or the
 * v1 `symref=HEAD:` capability). Servers that name neither still advertise the commit HEAD points
 * at: the one branch at that commit is the default branch, as `git clone` guesses it.
 */
function defaultBranchOf(refs: ServerRef[]): { branch: string | null; note: string | null } {
  const head = refs.find((r) => r.ref === 'HEAD');
  if (head?.target) return { branch: head.target.replace(/^refs\/heads\//, ''), note: null };
  if (!head)
    return {
      branch: null,
      note: 'unknown: the remote advertises no HEAD (an empty repository, or HEAD names a branch that does not exist)',
    };
  const atHead = refs
    .filter((r) => r.ref.startsWith('refs/heads/') && r.oid === head.oid)
    .map((r) => r.ref.slice('refs/heads/'.length));
  if (atHead.length === 1)
    return {
      branch: atHead[0],
      note: `the remote does not name the branch HEAD points to; ${atHead[0]} is the only branch at HEAD's commit`,
    };
  return {
    branch: null,
    note: atHead.length
      ? `unknown: the remote does not name the branch HEAD points to, and HEAD's commit is the tip of ${atHead.length} branches (${atHead.join(', ')})`
      : "unknown: the remote does not name the branch HEAD points to, and no branch is at HEAD's commit",
  };
}

/**
 * Proves the remote is reachable, readable and writable without changing it:
 * 1. lists its refs (the upload-pack advertisement, as `git ls-remote` does);
 * 2. asks for the receive-pack advertisement, the first step of `git push` and all of
 *    `git push --dry-run`: hosts authorize write access at this step (401/403 when the token may
 *    only read). Nothing is written, so a test leaves no scratch refs or objects behind; a branch
 *    protection rule that only applies to the final ref update shows at the first real push.
 */
export async function checkRemote(remote: GitRemote, branch: string): Promise<RemoteCheck> {
  const http = httpClient(remote);
  try {
    const refs = await git.listServerRefs({
      http,
      url: remote.url,
      headers: authHeaders(remote),
      symrefs: true,
    });
    // Protocol v2 has no push: ask in v1, as git itself does.
    await git.getRemoteInfo2({
      http,
      url: remote.url,
      headers: authHeaders(remote),
      forPush: true,
      protocolVersion: 1,
    });
    const defaultBranch = defaultBranchOf(refs);
    return {
      refs: refs.filter((r) => r.ref !== 'HEAD').length,
      default_branch: defaultBranch.branch,
      default_branch_note: defaultBranch.note,
      branch_exists: refs.some((r) => r.ref === `refs/heads/${branch}`),
      push_access: true,
    };
  } catch (error) {
    throw remoteError(error, remote, 'Connection test');
  }
}

/** A relative path without empty, `.` or `..` segments, as git stores it. */
export function normalizeRepoPath(path: string, what: string): string[] {
  const segments = path.replace(/\\/g, '/').split('/');
  const clean = segments.filter((s) => s !== '');
  if (
    path.startsWith('/') ||
    clean.some((s) => s === '.' || s === '..' || s === '.git' || /[\0]/.test(s)) ||
    (path !== '' && clean.length === 0)
  )
    throw new AppError(
      'BAD_REQUEST',
      `${what} ${JSON.stringify(path)} is not a relative path inside the repository`,
    );
  return clean;
}

type TreeNode = Map<string, TreeNode | Uint8Array>;

async function writeNode(gitdir: string, node: TreeNode): Promise<string> {
  const tree = [];
  for (const [name, child] of node) {
    if (child instanceof Map)
      tree.push({ mode: '040000', path: name, type: 'tree' as const, oid: await writeNode(gitdir, child) });
    else
      tree.push({
        mode: '100644',
        path: name,
        type: 'blob' as const,
        oid: await git.writeBlob({ fs, gitdir, blob: child }),
      });
  }
  return git.writeTree({ fs, gitdir, tree });
}

function buildTree(files: GitFile[]): TreeNode {
  const root: TreeNode = new Map();
  for (const file of files) {
    const segments = normalizeRepoPath(file.path, 'File path');
    if (segments.length === 0) throw new AppError('BAD_REQUEST', 'A file path is empty');
    let node = root;
    for (const dir of segments.slice(0, -1)) {
      let next = node.get(dir);
      if (next === undefined) node.set(dir, (next = new Map()));
      if (!(next instanceof Map))
        throw new AppError('BAD_REQUEST', `File path ${file.path} goes through a file`);
      node = next;
    }
    const name = segments.at(-1)!;
    if (node.has(name))
      throw new AppError('BAD_REQUEST', `File path ${file.path} appears twice or is a directory`);
    node.set(name, typeof file.content === 'string' ? Buffer.from(file.content, 'utf8') : file.content);
  }
  return root;
}

/** The tree `base` with the entry at `segments` replaced by `replacement` (removed when null). */
async function replaceSubtree(
  gitdir: string,
  base: string | null,
  segments: string[],
  replacement: string | null,
): Promise<string | null> {
  if (segments.length === 0) return replacement;
  const entries = base ? (await git.readTree({ fs, gitdir, oid: base })).tree : [];
  const [name, ...rest] = segments;
  const current = entries.find((e) => e.path === name);
  const child = await replaceSubtree(
    gitdir,
    current?.type === 'tree' ? current.oid : null,
    rest,
    replacement,
  );
  const others = entries.filter((e) => e.path !== name);
  const tree = child
    ? [...others, { mode: '040000', path: name, type: 'tree' as const, oid: child }]
    : others;
  // git has no empty directories: a directory left empty disappears from its parent.
  if (tree.length === 0) return null;
  return git.writeTree({ fs, gitdir, tree });
}

interface UploadPackAdvertisement {
  refs: Map<string, string>;
  capabilities: Set<string>;
}

/** The refs and capabilities of the remote's upload-pack service (protocol v1, as `git fetch` sees them). */
async function discoverUploadPack(remote: GitRemote, http: HttpClient): Promise<UploadPackAdvertisement> {
  const advertised = (await GitRemoteHTTP.discover({
    http,
    service: 'git-upload-pack',
    url: remote.url,
    headers: authHeaders(remote),
    protocolVersion: 1,
  })) as UploadPackAdvertisement;
  return { refs: advertised.refs, capabilities: advertised.capabilities };
}

function pktLine(line: string): Buffer {
  const payload = Buffer.from(line, 'utf8');
  return Buffer.concat([Buffer.from((payload.length + 4).toString(16).padStart(4, '0')), payload]);
}

/**
 * Fetches the commit `oid` alone (depth 1) into `gitdir`. Not git.fetch: isomorphic-git's fetch
 * resolves the remote's HEAD after every fetch, and a remote whose HEAD names a branch that does not
 * exist (an empty repository created with another default branch, which the first push does not
 * change) advertises no HEAD, so every push after the first failed with "Could not find HEAD". This
 * asks for the configured branch's tip and nothing else.
 */
async function fetchCommit(
  remote: GitRemote,
  http: HttpClient,
  gitdir: string,
  capabilities: Set<string>,
  oid: string,
): Promise<void> {
  const sideBand = ['side-band-64k', 'side-band'].find((c) => capabilities.has(c));
  const wanted = [sideBand, capabilities.has('ofs-delta') && 'ofs-delta', 'agent=dimas'].filter(
    (c): c is string => !!c,
  );
  const shallow = capabilities.has('shallow');
  const request = [
    pktLine(`want ${oid} ${wanted.join(' ')}\n`),
    ...(shallow ? [pktLine('deepen 1\n')] : []),
    Buffer.from('0000'),
    pktLine('done\n'),
  ];
  const res = await GitRemoteHTTP.connect({
    http,
    service: 'git-upload-pack',
    url: remote.url,
    headers: authHeaders(remote),
    body: [Buffer.concat(request)],
    auth: {},
  });
  const chunks: Uint8Array[] = [];
  if (res.body) for await (const chunk of res.body) chunks.push(chunk);
  const response = Buffer.concat(chunks);

  // The answer: shallow lines and a flush (when deepening), NAK, then the pack (multiplexed on
  // band 1 when side-band was asked for; band 2 is progress, band 3 a fatal error).
  const pack: Buffer[] = [];
  let pos = 0;
  let negotiating = true;
  while (pos < response.length) {
    if (!negotiating && !sideBand) {
      pack.push(response.subarray(pos));
      break;
    }
    const length = parseInt(response.subarray(pos, pos + 4).toString('ascii'), 16);
    if (!Number.isInteger(length) || (length > 0 && length < 4) || pos + length > response.length)
      throw new Error('the remote sent a malformed upload-pack response');
    if (length === 0) {
      pos += 4;
      if (!negotiating) break;
      continue;
    }
    const payload = response.subarray(pos + 4, pos + length);
    pos += length;
    if (negotiating) {
      const line = payload.toString('utf8').trimEnd();
      if (line.startsWith('ERR ')) throw new Error(`the remote refused the fetch: ${line.slice(4)}`);
      if (line === 'NAK' || line.startsWith('ACK ')) negotiating = false;
      continue;
    }
    if (payload[0] === 1) pack.push(payload.subarray(1));
    else if (payload[0] === 3)
      throw new Error(`the remote failed the fetch: ${payload.subarray(1).toString('utf8').trim()}`);
  }
  const packfile = Buffer.concat(pack);
  if (packfile.subarray(0, 4).toString('ascii') !== 'PACK')
    throw new Error('the remote sent no pack for the branch tip');
  const name = `objects/pack/pack-${packfile.subarray(-20).toString('hex')}.pack`;
  await fs.promises.mkdir(join(gitdir, 'objects/pack'), { recursive: true });
  await fs.promises.writeFile(join(gitdir, name), packfile);
  await git.indexPack({ fs, dir: gitdir, gitdir, filepath: name });
  // The tip's parents are not here: say so, as git does for a shallow clone.
  if (shallow) await fs.promises.writeFile(join(gitdir, 'shallow'), `${oid}\n`);
}

export interface PushOutcome {
  /** The new commit, or the branch tip when nothing changed. */
  commit: string | null;
  changed: boolean;
}

/**
 * Commits `files` as the whole content of directory `directory` on `branch` (files that are no
 * longer in the list disappear; the rest of the repository is untouched) and pushes it. Works in a
 * throw-away bare repository holding only the branch tip (a depth-1 fetch); when someone pushed
 * in between, the fast-forward check refuses and the whole step is retried on the new tip.
 */
export async function pushFiles(
  remote: GitRemote,
  options: { branch: string; directory: string; author: GitAuthor; message: string },
  files: GitFile[],
): Promise<PushOutcome> {
  const directory = normalizeRepoPath(options.directory, 'Path prefix');
  const content = buildTree(files);
  const ref = `refs/heads/${options.branch}`;
  const gitdir = await mkdtemp(join(tmpdir(), 'dimas-vcs-'));
  const http = httpClient(remote);
  try {
    await git.init({ fs, gitdir, bare: true, defaultBranch: options.branch });
    for (let attempt = 1; ; attempt++) {
      try {
        const advertised = await discoverUploadPack(remote, http);
        const tip = advertised.refs.get(ref) ?? null;
        let baseTree: string | null = null;
        if (tip) {
          await fetchCommit(remote, http, gitdir, advertised.capabilities, tip);
          baseTree = (await git.readCommit({ fs, gitdir, oid: tip })).commit.tree;
        }
        const subtree = content.size ? await writeNode(gitdir, content) : null;
        const tree =
          (await replaceSubtree(gitdir, baseTree, directory, subtree)) ??
          (await git.writeTree({ fs, gitdir, tree: [] }));
        if (tree === baseTree) return { commit: tip, changed: false };
        const now = Math.floor(Date.now() / 1000);
        const person = { ...options.author, timestamp: now, timezoneOffset: 0 };
        const commit = await git.writeCommit({
          fs,
          gitdir,
          commit: {
            message: options.message.endsWith('\n') ? options.message : options.message + '\n',
            tree,
            parent: tip ? [tip] : [],
            author: person,
            committer: person,
          },
        });
        await git.writeRef({ fs, gitdir, ref, value: commit, force: true });
        await git.push({
          fs,
          http,
          gitdir,
          url: remote.url,
          headers: authHeaders(remote),
          ref,
          remoteRef: ref,
        });
        return { commit, changed: true };
      } catch (error) {
        const code = (error as { code?: string }).code;
        const raced = code === 'PushRejectedError' || code === 'GitPushError' || code === 'NotFoundError';
        if (!raced || attempt >= 3) throw remoteError(error, remote, 'Push');
      }
    }
  } finally {
    await rm(gitdir, { recursive: true, force: true });
  }
}
