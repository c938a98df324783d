import { randomUUID } from 'node:crypto';
import type { Request } from 'express';
import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../deps.ts';
import type { Principal } from '../auth/principal.ts';

export interface Context {
  deps: AppDeps;
  /** A fresh unit of work per request; never shared between requests. */
  em: EntityManager;
  transport: 'rest' | 'trpc' | 'internal';
  requestId: string;
  ipAddress: string;
  userAgent: string | null;
  bearer: string | null;
  signal?: AbortSignal;
}

/** The context after the authentication middleware: the caller is known. */
export interface AuthedContext extends Context {
  principal: Principal;
}

function bearerOf(header: string | undefined): string | null {
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header ?? '');
  return match ? match[1] : null;
}

export function createContextFactory(deps: AppDeps, transport: Context['transport']) {
  return ({ req }: { req: Request }): Context => ({
    deps,
    em: deps.orm.em.fork() as EntityManager,
    transport,
    requestId: String((req as { id?: unknown }).id ?? randomUUID()),
    ipAddress: req.ip ?? req.socket.remoteAddress ?? 'unknown',
    userAgent: req.get('user-agent') ?? null,
    bearer: bearerOf(req.get('authorization')),
  });
}
