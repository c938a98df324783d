/**
 * The typed client of dimas (`import { createDimasClient } from 'dimas/client'`), for browsers and Node.
 * Only type imports reach the server's code: bundling this file pulls in @trpc/client and superjson, never
 * the server.
 */
import {
  createTRPCClient,
  httpBatchLink,
  httpSubscriptionLink,
  splitLink,
  type TRPCClient,
  TRPCClientError,
} from '@trpc/client';
import superjson from 'superjson';
import type { AppRouter } from '../trpc/router.ts';

/** @public The router's type, for a consumer's own typed tRPC client. */
export type { AppRouter };
export { TRPCClientError };

type Token = string | null | undefined;

export interface DimasClientOptions {
  /** The server's origin (`https://dimas.example.com`); `/trpc` is appended. */
  url: string;
  /**
   * A session token or service-account key, or a function read before each request (so a client made
   * before login picks up the token later).
   */
  token?: Token | (() => Token | Promise<Token>);
  /**
   * The EventSource class for subscriptions where the runtime has none (Node: the `eventsource` package).
   * Browsers use their own.
   */
  EventSource?: typeof globalThis.EventSource;
  /** The fetch used for queries and mutations (default: the global one). */
  fetch?: typeof globalThis.fetch;
}

export type DimasClient = TRPCClient<AppRouter>;

/**
 * Queries and mutations go batched over HTTP with the token in `Authorization`; subscriptions (discovery)
 * go over server-sent events with the token in `connectionParams`, the one channel a browser's
 * EventSource offers.
 */
export function createDimasClient(options: DimasClientOptions): DimasClient {
  const url = `${options.url.replace(/\/+$/, '')}/trpc`;
  const token = async (): Promise<Token> =>
    typeof options.token === 'function' ? await options.token() : options.token;
  return createTRPCClient<AppRouter>({
    links: [
      splitLink({
        condition: (op) => op.type === 'subscription',
        true: httpSubscriptionLink({
          url,
          transformer: superjson,
          ...(options.EventSource ? { EventSource: options.EventSource } : {}),
          connectionParams: async () => {
            const value = await token();
            return value ? { token: value } : null;
          },
        }),
        false: httpBatchLink({
          url,
          transformer: superjson,
          ...(options.fetch ? { fetch: options.fetch } : {}),
          headers: async () => {
            const value = await token();
            return value ? { authorization: `Bearer ${value}` } : {};
          },
        }),
      }),
    ],
  });
}
