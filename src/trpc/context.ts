import { randomUUID } from 'node:crypto';
import type { Request } from 'express';
import type { EntityManager } from '@mikro-orm/postgresql';
import type { AppDeps } from '../deps.ts';
import type { Principal } from '../auth/principal.ts';
import { tenantSession } from '../auth/tenancy.ts';

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
  /** Puts the rest of the request under the organization's row-level security (src/auth/tenancy.ts). */
  setTenant(organizationId: string): void;
}

/** The context after the authentication middleware: the caller is known. */
export interface AuthedContext extends Context {
  principal: Principal;
}

function bearerOf(header: string | undefined): string | null {
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header ?? '');
  return match ? match[1] : null;
}

/**
 * A browser's EventSource cannot send headers, so httpSubscriptionLink carries the token in its
 * `connectionParams` (`{ token }`, serialized into the query string). The header wins when both are sent.
 */
function connectionToken(
  info: { connectionParams?: Record<string, string | undefined> | null } | undefined,
): string | null {
  const token = info?.connectionParams?.token;
  return typeof token === 'string' && /^\S+$/.test(token) ? token : null;
}

export function createContextFactory(deps: AppDeps, transport: Context['transport']) {
  return ({
    req,
    info,
  }: {
    req: Request;
    info?: { connectionParams?: Record<string, string | undefined> | null };
  }): Context => {
    let em: EntityManager | undefined;
    let tenant: string | undefined;
    return {
      deps,
      // Forked on first use: a request answered from caches (a session lookup) never pays for it.
      get em() {
        if (!em) {
          em = deps.orm.em.fork() as EntityManager;
          if (tenant) em.setSessionContext(tenantSession(tenant));
        }
        return em;
      },
      setTenant(organizationId: string) {
        tenant = organizationId;
        em?.setSessionContext(tenantSession(organizationId));
      },
      transport,
      requestId: String((req as { id?: unknown }).id ?? randomUUID()),
      // Resolved on use: only logins and session creation read it, and trusted-proxy parsing is not free.
      get ipAddress() {
        return req.ip ?? req.socket.remoteAddress ?? 'unknown';
      },
      userAgent: req.headers['user-agent'] ?? null,
      bearer: bearerOf(req.headers.authorization) ?? connectionToken(info),
    };
  };
}
