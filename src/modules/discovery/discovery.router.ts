import { tracked } from '@trpc/server';
import { z } from 'zod';
import { authedProcedure, permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import { llmBudgetStatus } from '../admin/llm-settings.service.ts';
import * as s from './discovery.schemas.ts';
import * as discovery from './discovery.service.ts';
import { eventIds } from './discovery-events.ts';
import { toTRPCError } from '../../trpc/errors.ts';
import { AppError } from '../../app-error.ts';

const write = permissionProcedure('workspace.write');

/**
 * Discovery streams open per caller in this process, over REST (app.ts iterates the subscription
 * below) and tRPC alike: each holds a connection and a running discovery, so one caller cannot hold
 * them all.
 */
const openStreams = new Map<string, number>();

function takeStreamSlot(owner: string, limit: number): () => void {
  const open = openStreams.get(owner) ?? 0;
  if (open >= limit)
    throw new AppError(
      'TOO_MANY_REQUESTS',
      `At most ${limit} discovery streams may be open per user; wait for one to end`,
      { retryAfter: 5 },
    );
  openStreams.set(owner, open + 1);
  return () => {
    const left = (openStreams.get(owner) ?? 1) - 1;
    if (left > 0) openStreams.set(owner, left);
    else openStreams.delete(owner);
  };
}

const SSE_DESCRIPTION =
  'The response is a `text/event-stream`: one message per event, `event: <type>` (started, progress, ' +
  'table_profiled, suggestion, ambiguity, completed, cancelled, error), `id: <run_id>:<seq>` and ' +
  '`data: <event JSON>` (the schema below), and a `: heartbeat` comment every 15 s so that idle proxies keep ' +
  'the connection. The stream ends after `completed`, `cancelled` or a fatal `error`. Closing the connection ' +
  'stops the discovery at its next step. A client that lost the stream sends the same request with ' +
  '`Last-Event-ID: <id of the last event received>` (what EventSource does) and gets the events it missed ' +
  'from the stored run, up to its last one; no new run starts. Failures before the first event (no workspace ' +
  'selected, no source or target schema, a discovery already running for the workspace, an unknown ' +
  'Last-Event-ID) answer with a JSON error and their status instead.';

export const discoveryRouter = router({
  /**
   * The REST face (documentation): POST /api/workspaces/discover is served as an event stream by the
   * express route in app.ts, which iterates `discover` below. Called over tRPC it runs to the end and
   * returns the last event (for scripts; interactive clients use the subscription).
   */
  run: write
    .meta(
      rest(
        'POST',
        '/api/workspaces/discover',
        'Run the discovery agent; answers a server-sent event stream',
        'workspaces',
        {
          openapi: {
            method: 'POST',
            path: '/api/workspaces/discover',
            description: SSE_DESCRIPTION,
            successDescription: 'text/event-stream of discovery events (each `data:` line is one of these)',
          },
        },
      ),
    )
    .input(s.discoverInput)
    .output(s.discoveryEvent)
    .mutation(async ({ ctx, input, signal }) => {
      let last: s.DiscoveryEvent | undefined;
      for await (const event of discovery.discover(ctx, input, signal)) last = event;
      return last!;
    }),

  /**
   * The same generator as a tRPC subscription (SSE through httpSubscriptionLink). Events are tracked:
   * on reconnect the link sends the last id as `lastEventId` and the stored run is replayed from there.
   */
  discover: write
    .input(s.discoverInput.extend({ lastEventId: z.string().max(100).nullish() }))
    .subscription(async function* ({ ctx, input, signal }) {
      const { lastEventId, ...rest } = input;
      const resumeFrom = lastEventId ?? rest.last_event_id;
      const idOf = eventIds(resumeFrom);
      let release: (() => void) | undefined;
      try {
        release = takeStreamSlot(ctx.principal.id, ctx.deps.env.SSE_MAX_STREAMS_PER_USER);
        for await (const event of discovery.discover(ctx, { ...rest, last_event_id: resumeFrom }, signal))
          yield tracked(idOf(event), event);
      } catch (error) {
        // Thrown while iterating, past the procedure's error mapping: without it a 409 would reach the
        // client as a 500, which httpSubscriptionLink retries for ever.
        throw toTRPCError(error);
      } finally {
        release?.();
      }
    }),

  cancel: authedProcedure
    .meta(
      rest(
        'POST',
        '/api/workspaces/discover/cancel',
        "Mark the caller's running discovery cancelled; it stops at its next step",
        'workspaces',
      ),
    )
    .input(z.object({}))
    .output(s.cancelOutput)
    .mutation(({ ctx }) => discovery.cancelDiscovery(ctx)),

  budgetStatus: permissionProcedure('workspace.read')
    .meta(
      rest(
        'GET',
        '/api/analytics/budget/status',
        "This month's LLM spend of the organization against its budget",
        'analytics',
      ),
    )
    .input(z.object({}))
    .output(s.budgetStatusOutput)
    .query(({ ctx }) => llmBudgetStatus(ctx)),
});
