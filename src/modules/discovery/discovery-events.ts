import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError } from '../../app-error.ts';
import type { AppDeps, CallerScope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import type { DiscoveryEvent } from './discovery.schemas.ts';
import type { DiscoveryStatus } from './discovery.entity.ts';

/** Events written together: a burst of suggestions costs one insert, not one each. */
const FLUSH_EVERY = 25;
const FLUSH_AFTER_MS = 200;
/** How often a resumed stream looks for the events of a run still going in another connection. */
const FOLLOW_MS = 200;
/** How long cancel waits for the runs to stop, so that it can answer how they ended. */
const CANCEL_WAIT_MS = 10_000;

const TERMINAL = new Set(['completed', 'cancelled', 'error']);
const isTerminal = (event: DiscoveryEvent) =>
  TERMINAL.has(event.type) && !(event.type === 'error' && !event.fatal);

/**
 * The SSE `id:` of each event of one stream (also tRPC's tracked id): the run and the event's place in
 * it. Only some events name their run; the stream remembers it from `started` (or the resumed id).
 */
export function eventIds(resumedFrom?: string | null): (event: DiscoveryEvent) => string {
  let runId = resumedFrom?.split(':')[0] ?? '';
  return (event) => {
    if ('run_id' in event) runId = event.run_id;
    return `${runId}:${event.seq}`;
  };
}

function parseEventId(id: string): { runId: string; seq: number } {
  const match = /^([0-9a-f-]{36}):(\d{1,9})$/i.exec(id.trim());
  if (!match)
    throw new AppError(
      'BAD_REQUEST',
      'Last-Event-ID must be an event id of a discovery stream (<run_id>:<seq>)',
      {
        issues: [{ path: ['last_event_id'], message: 'expected <run_id>:<seq>' }],
      },
    );
  return { runId: match[1].toLowerCase(), seq: Number(match[2]) };
}

/**
 * The run's events, stored in batches on a unit of work of its own (the generator's is busy with the
 * mappings). Writes are chained, so they land in order; `close` waits for all of them.
 */
export class EventLog {
  #pending: DiscoveryEvent[] = [];
  #chain: Promise<void> = Promise.resolve();
  #lastFlush = Date.now();
  #last: DiscoveryEvent | undefined;

  private readonly deps: AppDeps;
  private readonly runId: string;
  private readonly organizationId: string;

  constructor(deps: AppDeps, runId: string, organizationId: string) {
    this.deps = deps;
    this.runId = runId;
    this.organizationId = organizationId;
  }

  add(event: DiscoveryEvent) {
    this.#pending.push(event);
    this.#last = event;
    if (
      isTerminal(event) ||
      this.#pending.length >= FLUSH_EVERY ||
      Date.now() - this.#lastFlush >= FLUSH_AFTER_MS
    )
      this.#flush();
  }

  #flush() {
    const batch = this.#pending;
    if (!batch.length) return;
    this.#pending = [];
    this.#lastFlush = Date.now();
    const em = this.deps.orm.em.fork() as EntityManager;
    this.#chain = this.#chain.then(() =>
      em
        .execute(
          `insert into discovery_run_events (run_id, seq, organization_id, event)
           select ?, (e->>'seq')::int, ?, e from jsonb_array_elements(?::jsonb) e on conflict do nothing`,
          [this.runId, this.organizationId, JSON.stringify(batch)],
        )
        .then(
          () => {},
          (error: unknown) =>
            this.deps.logger.warn({ err: error, runId: this.runId }, 'discovery events not stored'),
        ),
    );
  }

  /**
   * Stores what is left. A run that stopped without a last event (its client left) gets one here, so a
   * client resuming it learns how it ended.
   */
  async close(ending: () => DiscoveryEvent | null): Promise<void> {
    if (!this.#last || !isTerminal(this.#last)) {
      const last = ending();
      if (last) this.add(last);
    }
    this.#flush();
    await this.#chain;
  }
}

async function runOf(scope: CallerScope, runId: string) {
  const [run] = await scope.em.execute(
    `select id, status from discovery_runs where id = ? and organization_id = ? and started_by = ?`,
    [runId, organizationOf(scope.principal), scope.principal.id],
  );
  return run as { id: string; status: string } | undefined;
}

/**
 * The events of a run after `afterSeq`, from the store: a client reconnecting gets what it missed, then
 * the rest as the run (driven by another connection or process) stores it, until its last event.
 */
export async function* resumeDiscovery(
  scope: CallerScope,
  lastEventId: string,
  signal?: AbortSignal,
): AsyncGenerator<DiscoveryEvent, void, unknown> {
  const { runId, seq } = parseEventId(lastEventId);
  // Another caller's run (or another tenant's) answers like one that does not exist.
  if (!(await runOf(scope, runId))) throw new AppError('NOT_FOUND', `No discovery run ${runId} of yours`);
  let after = seq;
  for (;;) {
    const run = await runOf(scope, runId);
    const rows = (await scope.em.execute(
      `select event from discovery_run_events where run_id = ? and seq > ? order by seq`,
      [runId, after],
    )) as { event: DiscoveryEvent | string }[];
    for (const row of rows) {
      const event = (typeof row.event === 'string' ? JSON.parse(row.event) : row.event) as DiscoveryEvent;
      after = event.seq;
      yield event;
      if (isTerminal(event)) return;
    }
    // Finished and nothing more stored: the events were all sent already.
    if (!run || (run.status !== 'running' && rows.length === 0)) return;
    if (signal?.aborted) return;
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_MS));
  }
}

/** How each run ended once cancel was requested: waits (bounded) for them to reach a step boundary. */
export async function outcomesAfterCancel(deps: AppDeps, runIds: string[]) {
  const em = deps.orm.em.fork() as EntityManager;
  const deadline = Date.now() + CANCEL_WAIT_MS;
  for (;;) {
    const rows = runIds.length
      ? ((await em.execute(`select id, status, reason from discovery_runs where id = any(?::uuid[])`, [
          `{${runIds.join(',')}}`,
        ])) as {
          id: string;
          status: DiscoveryStatus;
          reason: string | null;
        }[])
      : [];
    if (rows.every((r) => r.status !== 'running') || Date.now() > deadline)
      return rows.map((r) => ({ run_id: r.id, status: r.status, reason: r.reason }));
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
