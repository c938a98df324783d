import type { EntityManager } from '@mikro-orm/postgresql';
import type { Principal } from './auth/principal.ts';

/**
 * Named in-process caches whose behaviour each organization sets (POST /api/admin/cache-settings):
 * on/off, time to live and size. Entries are kept per organization, so clearing one tenant's cache
 * never touches another's.
 *
 * Settings live in the database (table cache_settings); each process re-reads an organization's
 * settings at most every SETTINGS_REFRESH_MS, so a change made through another API process reaches
 * this one within that delay, and a cache switched on or off there is cleared here too.
 */

export interface CacheConfig {
  enabled: boolean;
  ttl_seconds: number;
  max_entries: number;
}

/** Every cache of the system; an area adds its cache here, then uses `namedCache(name)`. */
export const CACHE_CATALOGUE = {
  requests: {
    description:
      "Per caller: the selected workspace, which routes without a workspace in their path act on (another API process's change is seen within the TTL)",
    defaults: { enabled: true, ttl_seconds: 60, max_entries: 5000 },
  },
  mappings: {
    description:
      'Per workspace: the source catalog that mapping writes and wildcards read, and generated SQL; emptied by every mapping write and source config or schema save',
    defaults: { enabled: true, ttl_seconds: 300, max_entries: 2000 },
  },
  introspection: {
    description: 'Source database introspection results (tables, columns, keys, estimated rows)',
    defaults: { enabled: true, ttl_seconds: 600, max_entries: 200 },
  },
  llm_responses: {
    description: 'LLM answers to identical prompts (discovery matching, hypothesis generation)',
    defaults: { enabled: true, ttl_seconds: 3600, max_entries: 1000 },
  },
} as const satisfies Record<string, { description: string; defaults: CacheConfig }>;

export type CacheName = keyof typeof CACHE_CATALOGUE;
export type CacheSettingsMap = Record<CacheName, CacheConfig>;

export const CACHE_NAMES = Object.keys(CACHE_CATALOGUE) as CacheName[];
export const MAX_TTL_SECONDS = 7 * 24 * 3600;
export const MAX_CACHE_ENTRIES = 100_000;

export function isCacheName(name: string): name is CacheName {
  return Object.hasOwn(CACHE_CATALOGUE, name);
}

/** Stored (partial, possibly stale) settings → a complete map; unknown names and bad values fall back. */
export function resolveCacheSettings(stored: unknown): CacheSettingsMap {
  const source = (stored && typeof stored === 'object' ? stored : {}) as Record<string, unknown>;
  const resolved = {} as CacheSettingsMap;
  for (const name of CACHE_NAMES) {
    const defaults = CACHE_CATALOGUE[name].defaults;
    const given = (source[name] && typeof source[name] === 'object' ? source[name] : {}) as Record<
      string,
      unknown
    >;
    const int = (v: unknown, fallback: number, max: number) =>
      Number.isInteger(v) && (v as number) >= 0 && (v as number) <= max ? (v as number) : fallback;
    resolved[name] = {
      enabled: typeof given.enabled === 'boolean' ? given.enabled : defaults.enabled,
      ttl_seconds: int(given.ttl_seconds, defaults.ttl_seconds, MAX_TTL_SECONDS),
      max_entries: int(given.max_entries, defaults.max_entries, MAX_CACHE_ENTRIES),
    };
  }
  return resolved;
}

/** Where a cache is used: the request's EntityManager (to read settings) and the tenant. */
export type CacheScope =
  { em: EntityManager; organizationId: string | null } | { em: EntityManager; principal: Principal };

const organizationOfScope = (scope: CacheScope) =>
  'principal' in scope ? scope.principal.organizationId : scope.organizationId;

const SETTINGS_REFRESH_MS = 5000;
const known = new Map<string, { settings: CacheSettingsMap; loadedAt: number }>();

/**
 * Records an organization's settings in this process and clears every cache whose `enabled` changed
 * since the settings this process knew. Returns the names cleared.
 */
export function applyCacheSettings(organizationId: string, settings: CacheSettingsMap): CacheName[] {
  const previous = known.get(organizationId)?.settings;
  known.set(organizationId, { settings, loadedAt: Date.now() });
  const toggled = previous ? CACHE_NAMES.filter((n) => previous[n].enabled !== settings[n].enabled) : [];
  for (const name of toggled) clearCache(name, organizationId);
  return toggled;
}

/** The organization's settings, from this process's copy when it is fresh enough. */
async function cacheSettingsOf(em: EntityManager, organizationId: string): Promise<CacheSettingsMap> {
  const entry = known.get(organizationId);
  if (entry && Date.now() - entry.loadedAt < SETTINGS_REFRESH_MS) return entry.settings;
  const [row] = await em.execute('select caches from cache_settings where organization_id = ?', [
    organizationId,
  ]);
  const stored = typeof row?.caches === 'string' ? JSON.parse(row.caches) : row?.caches;
  const settings = resolveCacheSettings(stored);
  applyCacheSettings(organizationId, settings);
  return settings;
}

interface Entry<V> {
  value: V;
  storedAt: number;
}

/**
 * One named cache: a bounded map per organization, least recently used entries evicted first,
 * expiry checked on read against the organization's current TTL (so a shorter TTL applies at once).
 * A caller without an organization (a super admin) is never cached.
 */
export class NamedCache<V = unknown> {
  readonly #buckets = new Map<string, Map<string, Entry<V>>>();

  readonly name: CacheName;

  constructor(name: CacheName) {
    this.name = name;
  }

  async get(scope: CacheScope, key: string): Promise<V | undefined> {
    const organizationId = organizationOfScope(scope);
    if (!organizationId) return undefined;
    const config = (await cacheSettingsOf(scope.em, organizationId))[this.name];
    if (!config.enabled) return undefined;
    const bucket = this.#buckets.get(organizationId);
    if (!bucket) return undefined;
    // A lowered max_entries applies to what is already held, least recently used first.
    for (const oldest of bucket.keys()) {
      if (bucket.size <= config.max_entries) break;
      bucket.delete(oldest);
    }
    const entry = bucket.get(key);
    if (!entry) return undefined;
    if (Date.now() - entry.storedAt >= config.ttl_seconds * 1000) {
      bucket.delete(key);
      return undefined;
    }
    // Re-inserting moves the key to the end of the Map's order: the order is the LRU order.
    bucket.delete(key);
    bucket.set(key, entry);
    return entry.value;
  }

  async set(scope: CacheScope, key: string, value: V): Promise<void> {
    const organizationId = organizationOfScope(scope);
    if (!organizationId) return;
    const config = (await cacheSettingsOf(scope.em, organizationId))[this.name];
    if (!config.enabled || config.max_entries === 0 || config.ttl_seconds === 0) return;
    let bucket = this.#buckets.get(organizationId);
    if (!bucket) this.#buckets.set(organizationId, (bucket = new Map()));
    bucket.delete(key);
    bucket.set(key, { value, storedAt: Date.now() });
    for (const oldest of bucket.keys()) {
      if (bucket.size <= config.max_entries) break;
      bucket.delete(oldest);
    }
  }

  /** The cached value, or `load()`'s result, stored when the cache is on. */
  async getOrLoad(scope: CacheScope, key: string, load: () => Promise<V>): Promise<V> {
    const hit = await this.get(scope, key);
    if (hit !== undefined) return hit;
    const value = await load();
    await this.set(scope, key, value);
    return value;
  }

  /** Drops one key (after a write that makes it stale). */
  delete(organizationId: string, key: string): void {
    this.#buckets.get(organizationId)?.delete(key);
  }

  /** Drops every key of the organization starting with `prefix` (e.g. all keys of one workspace). */
  deletePrefix(organizationId: string, prefix: string): void {
    const bucket = this.#buckets.get(organizationId);
    if (!bucket) return;
    for (const key of [...bucket.keys()]) if (key.startsWith(prefix)) bucket.delete(key);
  }

  /** Empties the organization's entries, or every organization's when none is given; returns how many. */
  clear(organizationId?: string): number {
    if (organizationId === undefined) {
      const count = [...this.#buckets.values()].reduce((n, bucket) => n + bucket.size, 0);
      this.#buckets.clear();
      return count;
    }
    const count = this.size(organizationId);
    this.#buckets.delete(organizationId);
    return count;
  }

  /** Entries this process holds for the organization (expired ones included until read). */
  size(organizationId: string): number {
    return this.#buckets.get(organizationId)?.size ?? 0;
  }
}

const registry = new Map<CacheName, NamedCache<unknown>>();

/** The process-wide cache of that name (one instance per name). */
export function namedCache<V>(name: CacheName): NamedCache<V> {
  let cache = registry.get(name);
  if (!cache) registry.set(name, (cache = new NamedCache(name)));
  return cache as NamedCache<V>;
}

export function clearCache(name: CacheName, organizationId?: string): number {
  return registry.get(name)?.clear(organizationId) ?? 0;
}
