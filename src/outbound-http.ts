import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { isIP, type BlockList, type LookupFunction } from 'node:net';
import { Agent, buildConnector, fetch as undiciFetch, type RequestInit, type Response } from 'undici';
import { AppError } from './app-error.ts';
import { SECRET_MASK as MASK, isMaskedSecret } from './auth/secret-box.ts';
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
      throw new AppError('BAD_REQUEST', `${what} ${maskUrl(url)} is not a URL`);
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

/** A URL cut at its query and fragment, each kept as written. */
function urlParts(url: string) {
  const hash = url.indexOf('#');
  const beforeFragment = hash < 0 ? url : url.slice(0, hash);
  const q = beforeFragment.indexOf('?');
  const query = q < 0 ? null : beforeFragment.slice(q + 1);
  return {
    head: q < 0 ? beforeFragment : beforeFragment.slice(0, q),
    /** `name=value` pairs as written; a part without `=` is a value without a name. */
    params:
      query === null
        ? null
        : query.split('&').map((part) => {
            const eq = part.indexOf('=');
            return eq < 0
              ? { name: null, value: part }
              : { name: part.slice(0, eq), value: part.slice(eq + 1) };
          }),
    fragment: hash < 0 ? '' : url.slice(hash),
  };
}

function joinUrl(head: string, params: { name: string | null; value: string }[], fragment: string) {
  return `${head}?${params.map((p) => (p.name === null ? p.value : `${p.name}=${p.value}`)).join('&')}${fragment}`;
}

/**
 * `url` as it may be shown: its credentials (`user:password@`, a URL saved before they were refused)
 * and the value of every query parameter masked, names kept. A query value is where many receivers
 * take their key (`?token=…`, `?sig=…`), and nothing tells a key from a harmless value, so every one
 * counts as a secret. The fragment, never sent, stays.
 */
export function maskUrl(url: string): string {
  const { head, params, fragment } = urlParts(url);
  const shown = head.replace(/^(https?:\/\/)[^/]*@/i, `$1${MASK}@`);
  if (params === null) return shown + fragment;
  return joinUrl(
    shown,
    params.map((p) => ({ name: p.name, value: p.value && MASK })),
    fragment,
  );
}

/**
 * `text` with every http(s) URL in it shown as `maskUrl` shows it: errors quote URLs (a Location, a
 * receiver repeating the address it was called on). Punctuation ending a sentence stays outside.
 */
export function maskUrlSecrets(text: string): string {
  return text.replace(/\bhttps?:\/\/[^\s"'<>`]*/gi, (match) => {
    const url = match.replace(/[.,:;!?)\]]+$/, '');
    return maskUrl(url) + match.slice(url.length);
  });
}

/**
 * The value of every query parameter of `url`, decoded: the secrets a text quoting them without the
 * URL around them (a receiver's "unknown token abc…") must not show either.
 */
export function urlQueryValues(url: string): string[] {
  try {
    return [...new URL(url).searchParams.values()].filter(Boolean);
  } catch {
    return [];
  }
}

const isMasked = (value: string) => {
  try {
    return isMaskedSecret(decodeURIComponent(value));
  } catch {
    return false;
  }
};

/**
 * `next`, a URL sent back by a form that showed `saved` masked (`maskUrl`), with each masked query
 * value replaced by the stored value of the parameter of the same name (its same occurrence), the
 * rest kept as written. `restored` names the parameters whose stored value it took, `missing` those
 * sent masked that `saved` has no value for. Whether the stored values may go where `next` points
 * is the caller's rule (`sameOrigin`).
 */
export function restoreMaskedQuery(
  next: string,
  saved: string | null,
): { url: string; restored: string[]; missing: string[] } {
  const target = urlParts(next);
  const restored: string[] = [];
  const missing: string[] = [];
  if (target.params === null || !target.params.some((p) => isMasked(p.value)))
    return { url: next, restored, missing };
  const stored = new Map<string | null, string[]>();
  for (const { name, value } of (saved === null ? null : urlParts(saved).params) ?? [])
    stored.set(name, [...(stored.get(name) ?? []), value]);
  const seen = new Map<string | null, number>();
  const params = target.params.map(({ name, value }) => {
    const occurrence = seen.get(name) ?? 0;
    seen.set(name, occurrence + 1);
    if (!isMasked(value)) return { name, value };
    const kept = stored.get(name)?.[occurrence];
    // A stored value that is itself masked is no value (saved as shown by an earlier version).
    if (kept === undefined || isMasked(kept)) {
      missing.push(name ?? '(without a name)');
      return { name, value };
    }
    restored.push(name ?? '(without a name)');
    return { name, value: kept };
  });
  return { url: joinUrl(target.head, params, target.fragment), restored, missing };
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

/**
 * How long a `Retry-After` header asks to wait, in milliseconds: RFC 9110 allows seconds or an HTTP
 * date (a receiver behind a proxy often sends the date). 0 when absent or unreadable.
 */
export function retryAfterMs(header: string | null, now = Date.now()): number {
  const value = header?.trim();
  if (!value) return 0;
  if (/^\d+$/.test(value)) return Number(value) * 1000;
  const at = Date.parse(value);
  return Number.isFinite(at) ? Math.max(0, at - now) : 0;
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
