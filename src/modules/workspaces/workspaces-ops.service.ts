import { mkdtemp, open, readFile, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { flushLibraryCache } from '../schemas/schema-library.ts';
import { flushOrganizationMappingCache, selectionCache } from './workspaces-cache.ts';

export function flushRequestCache(scope: CallerScope) {
  const cleared = selectionCache.forget(scope);
  // The authenticator caches principals (user, permissions) by token hash, not by user, so the only
  // way to make this caller's next request reload them is to drop that whole cache.
  scope.deps.authenticator.forget();
  return {
    success: true as const,
    message: 'Request cache flushed; the next request reloads your context',
    cleared,
  };
}

export function flushMappingCache(scope: CallerScope) {
  const cleared = flushOrganizationMappingCache(organizationOf(scope.principal)) + flushLibraryCache();
  return {
    success: true as const,
    message: 'Mapping cache of the organization and file-access caches flushed',
    cleared,
  };
}

interface Timing {
  operations: number;
  total_ms: number;
  avg_ms: number;
  ops_per_sec: number;
}

/** Repeats op until `count` runs or `budgetMs` passes, whichever is first. */
async function measure(
  count: number,
  budgetMs: number,
  op: (i: number) => Promise<unknown>,
): Promise<Timing> {
  const start = performance.now();
  let done = 0;
  while (done < count && performance.now() - start < budgetMs) await op(done++);
  const total = performance.now() - start;
  const round = (n: number) => Math.round(n * 1000) / 1000;
  return {
    operations: done,
    total_ms: round(total),
    avg_ms: done ? round(total / done) : 0,
    ops_per_sec: total > 0 ? round((done * 1000) / total) : 0,
  };
}

/** Real timings, each phase bounded, the whole run a few seconds at most. */
export async function runBenchmark(scope: CallerScope) {
  const started = performance.now();
  const dir = await mkdtemp(join(tmpdir(), 'dimas-bench-'));
  const payload = Buffer.alloc(16 * 1024, 'dimas benchmark\n');
  const files = 200;
  const budget = 500;
  try {
    const write = await measure(files, budget, (i) => writeFile(join(dir, `f${i}.txt`), payload));
    const written = write.operations;
    const read = await measure(written, budget, (i) => readFile(join(dir, `f${i}.txt`)));
    const statT = await measure(written * 5, budget, (i) => stat(join(dir, `f${i % written}.txt`)));
    const openReadClose = await measure(written * 2, budget, async (i) => {
      const handle = await open(join(dir, `f${i % written}.txt`), 'r');
      try {
        await handle.read(Buffer.alloc(4096), 0, 4096, 0);
      } finally {
        await handle.close();
      }
    });
    const del = await measure(written, budget, (i) => unlink(join(dir, `f${i}.txt`)));
    // eslint-disable-next-line no-restricted-properties -- times the bare round trip: `select 1` reads no table, and the tenant's transaction would make it four
    const conn = scope.em.getConnection();
    const roundTrip = await measure(500, budget, () => conn.execute('select 1'));
    const organization = organizationOf(scope.principal);
    const workspaceQuery = await measure(200, budget, () =>
      scope.em.execute('select id, name from workspaces where organization_id = ? order by name limit 50', [
        organization,
      ]),
    );
    return {
      filesystem: { write, read, delete: del },
      file_access: { stat: statT, open_read_close: openReadClose },
      database: { round_trip: roundTrip, workspace_query: workspaceQuery },
      total_ms: Math.round((performance.now() - started) * 1000) / 1000,
      database_kind: scope.deps.dbKind,
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
