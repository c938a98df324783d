import { initTRPC } from '@trpc/server';
import superjson from 'superjson';
import type { OpenApiMeta } from 'trpc-to-openapi';
import type { Context } from './context.ts';
import { errorAnswer } from './errors.ts';

export interface Meta extends OpenApiMeta {
  /** Callable while the user still has to replace a temporary password. */
  allowPendingPasswordChange?: boolean;
}

export const t = initTRPC
  .context<Context>()
  .meta<Meta>()
  .create({
    transformer: superjson,
    isDev: false,
    // Subscriptions (discovery) send a ping on idle streams, like the REST stream's heartbeat comment.
    sse: { ping: { enabled: true, intervalMs: 15_000 } },
    errorFormatter({ shape, error, ctx, path }) {
      const { body, internal, cause } = errorAnswer(error);
      if (internal) ctx?.deps.logger.error({ err: cause, path, requestId: ctx?.requestId }, 'internal error');
      const { message, code: _code, ...extras } = body;
      return {
        ...shape,
        message,
        data: { code: shape.data.code, httpStatus: shape.data.httpStatus, path, ...extras },
      };
    },
  });
