import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { serverEnv, startServer, stopServer } from '../../bench/harness.ts';

export interface ChildServer {
  child: ChildProcess;
  url: string;
  stop(signal?: NodeJS.Signals): Promise<void>;
}

/**
 * A dimas server as its own process (`node src/main.ts`), so that a test can kill it
 * the way a crash would; it migrates `databaseUrl` on start. Each server has its own data directory.
 */
export async function startChildServer(
  databaseUrl: string,
  overrides: Record<string, string> = {},
): Promise<ChildServer> {
  const dataDir = mkdtempSync(join(tmpdir(), 'dimas-child-'));
  const removeDataDir = () => rmSync(dataDir, { recursive: true, force: true });
  const { child, url } = await startServer({
    ...serverEnv(databaseUrl, dataDir),
    LOG_LEVEL: 'error',
    ...overrides,
  }).catch((error: unknown) => {
    removeDataDir();
    throw error;
  });
  child.once('exit', removeDataDir);
  return { child, url, stop: (signal) => stopServer(child, signal) };
}
