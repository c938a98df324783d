import { z } from 'zod';
import { authedProcedure, permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import { llmBudgetStatus } from '../admin/llm-settings.service.ts';
import * as s from './discovery.schemas.ts';
import * as discovery from './discovery.service.ts';

const write = permissionProcedure('workspace.write');

export const SSE_DESCRIPTION =
  'The response is a `text/event-stream`: one message per event, `id: <seq>` then `data: <event JSON>` ' +
  '(the schema below), and a `: heartbeat` comment every 15 s. The stream ends after `completed`, ' +
  '`cancelled` or a fatal `error`. Closing the connection stops the discovery at its next step. ' +
  'Failures before the first event (no workspace selected, no source or target schema, a discovery ' +
  'already running for the workspace) answer with a JSON error and their status instead.';

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

  /** The same generator as a tRPC subscription (SSE through httpSubscriptionLink). */
  discover: write
    .input(s.discoverInput)
    .subscription(({ ctx, input, signal }) => discovery.discover(ctx, input, signal)),

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
