import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { createTenant, unique, until, type Tenant } from './helpers/api.ts';
import type { JobQueue } from '../src/jobs/queue.ts';

/*
 * Runs of one kind side by side: one tenant's long run must not hold every other tenant's run of that
 * kind behind it. JOB_CONCURRENCY sets how many a process works on at once (unset: 4 on PostgreSQL,
 * 1 on the embedded database, which serves one transaction at a time); a kind may set its own.
 */
let server: TestServer;
let defaults: TestServer;
const tenants: Tenant[] = [];
let defaultsTenant: Tenant;

beforeAll(async () => {
  server = await startTestServer({ JOB_CONCURRENCY: '3' });
  defaults = await startTestServer();
  for (let i = 0; i < 3; i++) tenants.push(await createTenant(server));
  defaultsTenant = await createTenant(defaults);
});
afterAll(async () => {
  await server?.close();
  await defaults?.close();
});

function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

/** A kind whose runs say when they start and wait for `release` before they end. */
async function gatedKind(jobs: JobQueue, options: { concurrency?: number } = {}) {
  const kind = unique('gated-');
  const release = gate();
  const events: string[] = [];
  await jobs.register<{ name: string }>(
    kind,
    async ({ name }) => {
      events.push(`start ${name}`);
      await release.opened;
      events.push(`end ${name}`);
      return { name };
    },
    { retryLimit: 0, ...options },
  );
  return { kind, release, events };
}

const statuses = (jobs: JobQueue, runs: { id: string; organizationId: string }[]) =>
  Promise.all(runs.map(async (r) => (await jobs.getRun(r.id, r.organizationId))?.status));

async function enqueueFor(jobs: JobQueue, kind: string, orgs: string[]) {
  const runs = [];
  for (const [i, organizationId] of orgs.entries()) {
    const { run } = await jobs.enqueue(kind, { name: `run ${i}` }, { organizationId });
    runs.push({ id: run.id, organizationId });
  }
  return runs;
}

describe('runs of one kind side by side', () => {
  it('works on JOB_CONCURRENCY runs of a kind at once, each tenant its own', async () => {
    const jobs = server.deps.jobs;
    const { kind, release, events } = await gatedKind(jobs);
    const runs = await enqueueFor(
      jobs,
      kind,
      tenants.map((t) => t.organization.id),
    );
    // All three started while none has ended: with one worker the second would wait for the first.
    await until(
      'three runs at once',
      () => statuses(jobs, runs),
      (s) => s.every((x) => x === 'running'),
    );
    expect(events.filter((e) => e.startsWith('start'))).toHaveLength(3);
    expect(events.some((e) => e.startsWith('end'))).toBe(false);
    release.open();
    await until(
      'all done',
      () => statuses(jobs, runs),
      (s) => s.every((x) => x === 'succeeded'),
    );
  });

  it("keeps a kind's own limit: its second run starts after the first ends", async () => {
    const jobs = server.deps.jobs;
    const { kind, release, events } = await gatedKind(jobs, { concurrency: 1 });
    const runs = await enqueueFor(jobs, kind, [tenants[0].organization.id, tenants[1].organization.id]);
    await until(
      'one run started',
      () => statuses(jobs, runs),
      (s) => s.includes('running'),
    );
    // Local enqueues wake idle workers at once: a free worker would have taken the second run by now.
    await new Promise((resolve) => setTimeout(resolve, 2000));
    expect(await statuses(jobs, runs)).toEqual(['running', 'queued']);
    release.open();
    await until(
      'both done',
      () => statuses(jobs, runs),
      (s) => s.every((x) => x === 'succeeded'),
    );
    expect(events).toEqual(['start run 0', 'end run 0', 'start run 1', 'end run 1']);
  });

  it("takes tenants in turn: one tenant's many waiting runs do not hold another's behind them all", async () => {
    const jobs = server.deps.jobs;
    const { kind, release, events } = await gatedKind(jobs, { concurrency: 1 });
    const [busy, many, one] = tenants.map((t) => t.organization.id);
    // The one worker is busy while the rest wait: tenant `many` queues three runs, then `one` queues one.
    const runs = await enqueueFor(jobs, kind, [busy]);
    await until(
      'the first run started',
      () => statuses(jobs, runs),
      (s) => s[0] === 'running',
    );
    runs.push(...(await enqueueFor(jobs, kind, [many, many, many, one])));
    release.open();
    await until(
      'all done',
      () => statuses(jobs, runs),
      (s) => s.every((x) => x === 'succeeded'),
    );
    // enqueueFor names runs by their position in its own list: `many`'s are runs 0–2, `one`'s is run 3.
    const started = events.filter((e) => e.startsWith('start')).slice(1);
    expect(started).toEqual(['start run 0', 'start run 3', 'start run 1', 'start run 2']);
  });

  it('defaults to four at once on PostgreSQL and one on the embedded database', async () => {
    const jobs = defaults.deps.jobs;
    const expected = defaults.deps.dbKind === 'embedded' ? 1 : 4;
    const { kind, release } = await gatedKind(jobs);
    const org = defaultsTenant.organization.id;
    const runs = await enqueueFor(jobs, kind, Array(expected + 1).fill(org));
    await until(
      `${expected} running`,
      () => statuses(jobs, runs),
      (s) => s.filter((x) => x === 'running').length === expected,
    );
    await new Promise((resolve) => setTimeout(resolve, 2000));
    const now = await statuses(jobs, runs);
    expect(now.filter((x) => x === 'running')).toHaveLength(expected);
    expect(now.filter((x) => x === 'queued')).toHaveLength(1);
    release.open();
    await until(
      'all done',
      () => statuses(jobs, runs),
      (s) => s.every((x) => x === 'succeeded'),
    );
  });
});
