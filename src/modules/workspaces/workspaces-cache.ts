import { clearCache, namedCache } from '../../cache.ts';
import type { CallerScope } from '../../deps.ts';

/*
 * The workspace caches live in the named caches of src/cache.ts, so each organization's cache
 * settings (POST /api/admin/cache-settings: on/off, TTL, size) govern them. The database stays the
 * truth: writes here invalidate at once, other API processes see changes within the TTL.
 */

/** `requests`: per caller, keys start with the principal id (flush-cache drops them all). */
const requests = namedCache<string | null>('requests');
const selectionKey = (scope: CallerScope) => `${scope.principal.id}:current_workspace`;

export const selectionCache = {
  /** The selected workspace id, null for none, undefined when not cached. */
  get: (scope: CallerScope) => requests.get(scope, selectionKey(scope)),
  set: (scope: CallerScope, workspaceId: string | null) =>
    requests.set(scope, selectionKey(scope), workspaceId),
  /** Drops every cached entry of the caller; returns how many there were. */
  forget(scope: CallerScope): number {
    const organizationId = scope.principal.organizationId;
    if (!organizationId) return 0;
    const before = requests.size(organizationId);
    requests.deletePrefix(organizationId, `${scope.principal.id}:`);
    return before - requests.size(organizationId);
  },
};

/**
 * `mappings`: values derived from a workspace's mappings. Keys start with `<workspace id>:`, so that
 * every write to a workspace can drop its entries:
 *   mappingCache.getOrLoad(scope, `${workspace.id}:sql:${table}`, () => …)
 */
export const mappingCache = namedCache<unknown>('mappings');

/**
 * `introspection` (the source tables discovery reads) and `llm_responses` (model answers keyed by the
 * prompt), keys starting with `<workspace id>:`. Dropped when the source config or the target schema
 * changes; not on mapping writes, which discovery itself makes.
 */
export const introspectionCache = namedCache<unknown>('introspection');
export const llmAnswerCache = namedCache<unknown>('llm_responses');

export function invalidateSourceCaches(organizationId: string, workspaceId: string): void {
  introspectionCache.deletePrefix(organizationId, `${workspaceId}:`);
  llmAnswerCache.deletePrefix(organizationId, `${workspaceId}:`);
}

export function invalidateWorkspaceCaches(organizationId: string, workspaceId: string): void {
  mappingCache.deletePrefix(organizationId, `${workspaceId}:`);
}

export function flushOrganizationMappingCache(organizationId: string): number {
  return clearCache('mappings', organizationId);
}
