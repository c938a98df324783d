import { lookup } from 'node:dns/promises';
import { BlockList, SocketAddress, isIP } from 'node:net';
import { AppError } from '../app-error.ts';
import type { Env } from '../env.ts';

/**
 * Where a user-given warehouse host may lead, decided on addresses rather than on how the host was
 * written: the name is resolved once, every address it resolves to is checked against the operator's
 * blocked networks, and the caller connects to the checked address (no second lookup an attacker's
 * DNS could answer differently). Engine-neutral: any dialect that opens TCP connections uses it.
 *
 * Loopback is deliberately not refused here: warehouses legitimately run on the same machine. Whether
 * a connection reaches dimas's own database is decided by asking the server who it is (postgres.ts).
 */

/** Link-local networks and the cloud metadata endpoints (AWS, GCP, Azure, OCI, DigitalOcean; AWS IPv6; Alibaba). */
export const DEFAULT_BLOCKED_NETWORKS = [
  '169.254.0.0/16',
  'fe80::/10',
  '169.254.169.254/32',
  'fd00:ec2::254/128',
  '100.100.100.200/32',
];

export interface NetworkGuardSettings {
  /** Networks no warehouse connection may reach (from parseNetworkList). */
  blocked: BlockList;
  /** Unix socket paths reach whatever listens on this machine: refused unless the operator allows them. */
  allowSocketPaths: boolean;
}

export interface CheckedAddress {
  /** What to hand the driver: an IP address (IPv4-mapped IPv6 as plain IPv4), or an allowed socket directory. */
  address: string;
  kind: 'ip' | 'socket';
  /** The host name as written when it was a name: the TLS server name to verify the certificate against. */
  servername?: string;
  /** Every address the name resolved to (all of them were checked). */
  resolved: string[];
}

/**
 * A comma- or space-separated list of networks (`10.0.0.0/8`, `fd00::/8`, a single address) as a
 * BlockList. Throws an Error naming the bad entry (env validation turns it into a start-up message).
 */
export function parseNetworkList(text: string): BlockList {
  const list = new BlockList();
  for (const entry of text.split(/[\s,]+/).filter(Boolean)) {
    const [address, prefix, extra] = entry.split('/');
    const family = isIP(address);
    const bits = family === 6 ? 128 : 32;
    const length = prefix === undefined ? bits : Number(prefix);
    if (!family || extra !== undefined || !/^\d*$/.test(prefix ?? '') || length > bits || prefix === '')
      throw new Error(`"${entry}" is not a network (an IPv4 or IPv6 address with an optional /prefix)`);
    list.addSubnet(address, length, family === 6 ? 'ipv6' : 'ipv4');
  }
  return list;
}

/** The operator's settings as every engine applies them (WAREHOUSE_BLOCKED_NETWORKS, WAREHOUSE_ALLOW_SOCKET_PATHS). */
export function networkGuardSettings(
  env: Pick<Env, 'WAREHOUSE_BLOCKED_NETWORKS' | 'WAREHOUSE_ALLOW_SOCKET_PATHS'>,
): NetworkGuardSettings {
  return {
    blocked: parseNetworkList(env.WAREHOUSE_BLOCKED_NETWORKS),
    allowSocketPaths: env.WAREHOUSE_ALLOW_SOCKET_PATHS,
  };
}

/** The canonical form of an IP address; an IPv4-mapped IPv6 address (`::FFFF:7f00:1`) becomes its IPv4 address. */
function normalizeAddress(address: string): { address: string; family: 'ipv4' | 'ipv6' } {
  const family = isIP(address) === 6 ? 'ipv6' : 'ipv4';
  const canonical = new SocketAddress({ address, family }).address.toLowerCase();
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(canonical);
  return mapped ? { address: mapped[1], family: 'ipv4' } : { address: canonical, family };
}

const LOOKUP_REASONS: Record<string, string> = {
  ENOTFOUND: 'unknown host',
  EAI_AGAIN: 'the host name could not be resolved',
  ENODATA: 'the host name has no address',
};

/**
 * Resolves `host` once and checks every address it stands for. A socket path (`/var/run/postgresql`,
 * or an empty host, which drivers read as the default socket) is refused unless allowed. Refusals and
 * unresolvable names are AppErrors (422) with a `reason`.
 */
export async function resolveCheckedAddress(
  host: string,
  settings: NetworkGuardSettings,
): Promise<CheckedAddress> {
  const bare = host.trim().replace(/^\[(.*)\]$/, '$1');
  if (bare === '' || bare.startsWith('/') || bare.startsWith('@')) {
    if (!settings.allowSocketPaths)
      throw new AppError(
        'UNPROCESSABLE_CONTENT',
        `Host "${host}" is a Unix socket path; warehouse connections over local sockets are not allowed on this server (WAREHOUSE_ALLOW_SOCKET_PATHS)`,
        { reason: 'SOCKET_PATH_REFUSED' },
      );
    return { address: bare, kind: 'socket', resolved: [] };
  }
  let resolved: string[];
  if (isIP(bare)) resolved = [bare];
  else {
    try {
      resolved = (await lookup(bare, { all: true })).map((a) => a.address);
    } catch (error) {
      const code = (error as { code?: string }).code ?? 'ENOTFOUND';
      throw new AppError(
        'UNPROCESSABLE_CONTENT',
        `Cannot connect to ${bare}: ${LOOKUP_REASONS[code] ?? 'the host name could not be resolved'} (${(error as Error).message})`,
        { reason: code },
      );
    }
    if (!resolved.length)
      throw new AppError('UNPROCESSABLE_CONTENT', `Cannot connect to ${bare}: the host name has no address`, {
        reason: 'ENODATA',
      });
  }
  const addresses = resolved.map((a) => {
    try {
      return normalizeAddress(a);
    } catch {
      throw new AppError('UNPROCESSABLE_CONTENT', `Host "${host}" is not a usable address`, {
        reason: 'BAD_ADDRESS',
      });
    }
  });
  for (const { address, family } of addresses)
    if (settings.blocked.check(address, family))
      throw new AppError(
        'UNPROCESSABLE_CONTENT',
        `Host "${host}" resolves to ${address}, in a network warehouse connections may not reach (WAREHOUSE_BLOCKED_NETWORKS)`,
        { reason: 'BLOCKED_NETWORK' },
      );
  return {
    // A scoped IPv6 address keeps its zone (`fe80::1%eth0`): checked without it, connected with it.
    address: addresses[0].address + (/%[^%\]]+$/.exec(resolved[0])?.[0] ?? ''),
    kind: 'ip',
    servername: isIP(bare) ? undefined : bare,
    resolved: addresses.map((a) => a.address),
  };
}
