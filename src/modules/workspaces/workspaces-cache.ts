/**
 * In-process caches that save database round trips on hot paths. The database stays the truth: entries
 * expire after a short time (other API processes write too), writes here invalidate at once, and the
 * flush routes clear them.
 */

const SELECTION_TTL_MS = 5_000;

interface Selection {
  workspaceId: string | null;
  until: number;
}

/** Per caller: which workspace is selected (user preference or service-account column). */
const selections = new Map<string, Selection>();

export const selectionCache = {
  get(principalId: string): string | null | undefined {
    const hit = selections.get(principalId);
    if (!hit) return undefined;
    if (hit.until <= Date.now()) {
      selections.delete(principalId);
      return undefined;
    }
    return hit.workspaceId;
  },
  set(principalId: string, workspaceId: string | null): void {
    if (selections.size > 10_000) selections.clear();
    selections.set(principalId, { workspaceId, until: Date.now() + SELECTION_TTL_MS });
  },
  forget(principalId: string): boolean {
    return selections.delete(principalId);
  },
  /** After a workspace is deleted or renamed, nobody's cached selection may point at it. */
  forgetWorkspace(workspaceId: string): void {
    for (const [key, value] of selections) if (value.workspaceId === workspaceId) selections.delete(key);
  },
};

/**
 * Mapping-derived values (generated SQL, mapping documents…) keyed per organization and workspace.
 * Areas that compute them use get/set and call invalidateWorkspace on every write.
 */
const mappings = new Map<string, { value: unknown; until: number }>();
const MAPPING_TTL_MS = 60_000;

const mappingKey = (organizationId: string, workspaceId: string, key: string) =>
  `${organizationId}\u0000${workspaceId}\u0000${key}`;

export const mappingCache = {
  get<T>(organizationId: string, workspaceId: string, key: string): T | undefined {
    const k = mappingKey(organizationId, workspaceId, key);
    const hit = mappings.get(k);
    if (!hit) return undefined;
    if (hit.until <= Date.now()) {
      mappings.delete(k);
      return undefined;
    }
    return hit.value as T;
  },
  set(organizationId: string, workspaceId: string, key: string, value: unknown): void {
    if (mappings.size > 50_000) mappings.clear();
    mappings.set(mappingKey(organizationId, workspaceId, key), { value, until: Date.now() + MAPPING_TTL_MS });
  },
  invalidateWorkspace(organizationId: string, workspaceId: string): void {
    const prefix = `${organizationId}\u0000${workspaceId}\u0000`;
    for (const key of mappings.keys()) if (key.startsWith(prefix)) mappings.delete(key);
  },
  /** Drops every entry of one organization; returns how many. */
  flushOrganization(organizationId: string): number {
    const prefix = `${organizationId}\u0000`;
    let count = 0;
    for (const key of mappings.keys())
      if (key.startsWith(prefix)) {
        mappings.delete(key);
        count++;
      }
    return count;
  },
};
