import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { isIP, type BlockList, type LookupFunction } from 'node:net';
import { Agent, buildConnector, fetch as undiciFetch, type RequestInit, type Response } from 'undici';
import { AppError } from './app-error.ts';
import type { Env } from './env.ts';
import { normalizeAddress, parseNetworkList } from './warehouse/network-guard.ts';

/**
 * HTTP requests to addresses a tenant chose (audience webhooks, version-control remotes, the
 * organization's LLM endpoint) go only to networks the operator allows (OUTBOUND_BLOCKED_NETWORKS:
 * by default link-local and the cloud metadata endpoints, whose credentials a tenant must never read
 * through dimas). The check sits in the connection's own DNS lookup, so the address checked is the
 * address connected to: a name that resolves differently between a check and the request (DNS
 * rebinding) cannot slip through, nor can a redirect.
 */
export class OutboundHttp {
  readonly #blocked: BlockList;
  readonly #dispatcher: Agent;

  constructor(blocked: BlockList) {
    this.#blocked = blocked;
    const connect = buildConnector({ lookup: this.#lookup });
    // Every connection passes here, redirects included: an IP literal (which skips DNS) is checked
    // as written, a name by the lookup the socket itself uses.
    this.#dispatcher = new Agent({
      connect: (options, callback) => {
        const host = options.hostname.replace(/^\[(.*)\]$/, '$1');
        const blocked = isIP(host) ? this.#blockedAddress([host]) : undefined;
        if (blocked) callback(blockedNetworkError(host, blocked), null);
        else connect(options, callback);
      },
    });
  }

  /** The first blocked address among `addresses`, if any. */
  #blockedAddress(addresses: readonly string[]): string | undefined {
    for (const raw of addresses) {
      const { address, family } = normalizeAddress(raw);
      if (this.#blocked.check(address, family)) return address;
    }
    return undefined;
  }

  /** `dns.lookup` that refuses, as BLOCKED_NETWORK, a name resolving to any blocked address. */
  readonly #lookup: LookupFunction = (hostname, options, callback) => {
    dnsLookup(hostname, { ...options, all: true }, (error, addresses: LookupAddress[]) => {
      if (error) return callback(error, '', 0);
      const blocked = this.#blockedAddress(addresses.map((a) => a.address));
      if (blocked) return callback(blockedNetworkError(hostname, blocked), '', 0);
      if (options.all) (callback as (e: null, a: LookupAddress[]) => void)(null, addresses);
      else callback(null, addresses[0].address, addresses[0].family);
    });
  };

  /**
   * Refuses, when a setting is saved rather than at its first use, a URL that is not http(s) or whose
   * host is, or resolves to, an address in a blocked network. A name that does not resolve (yet) is
   * accepted: its use will say so. Every request is checked again when it connects.
   */
  async checkDestination(url: string, what: string): Promise<URL> {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new AppError('BAD_REQUEST', `${what} ${url} is not a URL`);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:')
      throw new AppError('BAD_REQUEST', `${what} must be an http or https URL, not ${parsed.protocol}`);
    const host = parsed.hostname.replace(/^\[(.*)\]$/, '$1');
    const addresses = isIP(host)
      ? [host]
      : await new Promise<string[]>((resolve) =>
          dnsLookup(host, { all: true }, (error, found) => resolve(error ? [] : found.map((a) => a.address))),
        );
    const blocked = this.#blockedAddress(addresses);
    if (blocked) throw blockedNetworkError(host, blocked, what);
    return parsed;
  }

  /** `fetch` whose every connection is checked (see the constructor). */
  readonly fetch = (url: string | URL, init: RequestInit = {}): Promise<Response> =>
    undiciFetch(url, { ...init, dispatcher: this.#dispatcher });
}

function blockedNetworkError(host: string, address: string, what = 'The address'): AppError {
  const at = host === address ? address : `${host} (${address})`;
  return new AppError(
    'UNPROCESSABLE_CONTENT',
    `${what} ${at} is in a network this server does not send requests to (OUTBOUND_BLOCKED_NETWORKS)`,
    { reason: 'BLOCKED_NETWORK' },
  );
}

/**
 * Whether a secret saved with `saved` may be sent to `next`: only to the same scheme, host and port.
 * One rule for every setting that keeps a secret when its form comes back masked or without it
 * (version control, audience webhooks): whoever may edit the address must not be able to point it at
 * a host of their own and have the stored secret delivered there.
 */
export function sameOrigin(saved: string | URL, next: string | URL): boolean {
  try {
    return new URL(saved).origin === new URL(next).origin;
  } catch {
    return false;
  }
}

/**
 * Whether a URL carries credentials (`user:password@`). They are refused when saved: fetch refuses
 * such URLs anyway, and a URL is shown back and printed in errors, which a secret must never be.
 */
export function hasUrlCredentials(url: string | URL): boolean {
  try {
    const parsed = new URL(url);
    return parsed.username !== '' || parsed.password !== '';
  } catch {
    return false;
  }
}

/** `text` with the credentials of every http(s) URL in it masked (a URL saved before they were refused). */
export function maskUrlCredentials(text: string): string {
  return text.replace(/\b(https?:\/\/)[^\s/@]*@/gi, '$1••••••@');
}

const guards = new Map<string, OutboundHttp>();

/** The guard for the operator's OUTBOUND_BLOCKED_NETWORKS; one per distinct setting, so agents are shared. */
export function outboundHttp(env: Pick<Env, 'OUTBOUND_BLOCKED_NETWORKS'>): OutboundHttp {
  let guard = guards.get(env.OUTBOUND_BLOCKED_NETWORKS);
  if (!guard) {
    guard = new OutboundHttp(parseNetworkList(env.OUTBOUND_BLOCKED_NETWORKS));
    guards.set(env.OUTBOUND_BLOCKED_NETWORKS, guard);
  }
  return guard;
}

/** The reason a failed outbound request gives, looking through fetch's `cause` to the guard's refusal. */
export function outboundFailure(error: unknown): { message: string; blocked: boolean } {
  const cause = (error as { cause?: unknown }).cause;
  for (const e of [error, cause])
    if (e instanceof AppError && e.details?.reason === 'BLOCKED_NETWORK')
      return { message: e.message, blocked: true };
  const message = (error as Error).message;
  const detail = cause instanceof Error && cause.message !== message ? `: ${cause.message}` : '';
  return { message: message + detail, blocked: false };
}
