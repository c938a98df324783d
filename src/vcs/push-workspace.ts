import { AppError } from '../app-error.ts';
import type { CallerScope } from '../deps.ts';
import { organizationOf } from '../auth/tenancy.ts';
import { isFeatureEnabled } from '../features.ts';
import { outboundHttp } from '../outbound-http.ts';
import { VcsConfig, type VcsConfigEntity } from '../modules/admin/admin.entity.ts';
import { branchNameProblem } from './branch-name.ts';
import { normalizeRepoPath, pushFiles, type GitFile, type GitRemote } from './git-remote.ts';

export type PushResult =
  | { pushed: true; commit: string; branch: string; directory: string; files: number }
  | {
      pushed: false;
      reason: 'not_configured' | 'disabled' | 'feature_disabled' | 'no_changes' | 'failed' | 'timed_out';
      message: string;
      commit?: string | null;
    };

export function remoteOf(scope: CallerScope, config: VcsConfigEntity): GitRemote {
  return {
    url: config.url,
    username: config.username,
    token: config.tokenEncrypted ? scope.deps.secrets.decrypt(config.tokenEncrypted) : null,
    outbound: outboundHttp(scope.deps.env),
    timeoutMs: scope.deps.env.VCS_REMOTE_TIMEOUT_MS,
  };
}

/**
 * Pushes a workspace's file projection (schema.json, mappings/<table>.json, the transformation
 * project, prompts) as one commit to the organization's git remote, under its path prefix and, when
 * `workspace` is given, a directory of that name (so workspaces sharing a remote do not overwrite
 * each other). The files are the directory's whole content: a file missing from the list is removed.
 *
 * Never throws for remote failures: committing a transformation succeeds even when the remote is
 * down; the result (and the config's last_push_*) says what happened. Bad paths throw 400.
 * Talks to the network: call it after your transaction has committed, not inside it.
 */
export async function pushWorkspaceFiles(
  scope: CallerScope,
  files: GitFile[],
  message: string,
  options: { workspace?: string } = {},
): Promise<PushResult> {
  const organization = organizationOf(scope.principal);
  const config = await scope.em.findOne(VcsConfig, { organization });
  if (!config)
    return {
      pushed: false,
      reason: 'not_configured',
      message: 'No version-control integration is configured',
    };
  if (!config.enabled)
    return { pushed: false, reason: 'disabled', message: 'The version-control integration is disabled' };
  if (!(await isFeatureEnabled(scope, 'vcs_push')))
    return { pushed: false, reason: 'feature_disabled', message: 'The feature vcs_push is switched off' };

  const directory = [
    ...normalizeRepoPath(config.pathPrefix, 'Path prefix'),
    ...(options.workspace ? normalizeRepoPath(options.workspace, 'Workspace name') : []),
  ].join('/');
  const author = { name: config.authorName, email: config.authorEmail };
  // Saved before the branch was checked on save: git would create refs/heads/HEAD and the like.
  const branchProblem = branchNameProblem(config.branch);
  if (branchProblem) {
    config.lastPushError = `Push not attempted: the branch ${JSON.stringify(config.branch)} is not a valid git branch name (${branchProblem}); save the version-control settings with another branch`;
    await scope.em.flush();
    return { pushed: false, reason: 'failed', message: config.lastPushError };
  }
  try {
    const outcome = await pushFiles(
      remoteOf(scope, config),
      { branch: config.branch, directory, author, message },
      files,
    );
    if (!outcome.changed)
      return {
        pushed: false,
        reason: 'no_changes',
        message: 'The remote already holds these files',
        commit: outcome.commit,
      };
    config.lastPushAt = new Date();
    config.lastPushCommit = outcome.commit;
    config.lastPushError = null;
    await scope.em.flush();
    return { pushed: true, commit: outcome.commit!, branch: config.branch, directory, files: files.length };
  } catch (error) {
    if (!(error instanceof AppError) || error.code === 'BAD_REQUEST') throw error;
    const timedOut = error.details?.reason === 'VCS_TIMEOUT';
    // The whole projection goes with every push, so the next commit's push catches up either way.
    config.lastPushError = timedOut
      ? `${error.message}; the commit is saved in dimas, the remote may or may not have taken the push, and the next commit pushes the workspace again`
      : error.message;
    await scope.em.flush();
    return { pushed: false, reason: timedOut ? 'timed_out' : 'failed', message: config.lastPushError };
  }
}
