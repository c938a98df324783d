import type { EntityManager } from '@mikro-orm/postgresql';
import type { Principal } from './auth/principal.ts';

/**
 * Feature flags. Each names a code path that reads it with `isFeatureEnabled` before running;
 * the effective value is the catalogue default, replaced by the organization's setting, replaced by
 * the user's override (overridable features only, and only while the organization allows overrides).
 */
export const FEATURES = {
  llm_matching: {
    description:
      'Discovery may ask the configured LLM to match source columns to target fields (openai mode); off = the offline matcher only',
    default: true,
    user_overridable: true,
  },
  llm_hypotheses: {
    description: 'Hypothesis generation may call the LLM; off = the offline rules only',
    default: true,
    user_overridable: true,
  },
  identity_resolution: {
    description: 'Identity graph building (identifiers, edges, clusters) in monitoring',
    default: true,
    user_overridable: false,
  },
  audience_exports: {
    description: 'Audiences may be exported to ad platforms',
    default: true,
    user_overridable: false,
  },
  vcs_push: {
    description:
      'Committing a transformation pushes the workspace files to the configured git remote (when the VCS integration is enabled)',
    default: true,
    user_overridable: false,
  },
} as const satisfies Record<string, { description: string; default: boolean; user_overridable: boolean }>;

export type FeatureName = keyof typeof FEATURES;
export const FEATURE_NAMES = Object.keys(FEATURES) as FeatureName[];

export function isFeatureName(name: string): name is FeatureName {
  return Object.hasOwn(FEATURES, name);
}

export interface FeatureState {
  /** The organization's explicit settings (name → value); absent = default. */
  organization: Partial<Record<FeatureName, boolean>>;
  allowUserOverrides: boolean;
  /** The user's overrides as stored (they apply only where allowed). */
  user: Partial<Record<FeatureName, boolean>>;
}

const flags = (value: unknown): Partial<Record<FeatureName, boolean>> => {
  const parsed = typeof value === 'string' ? JSON.parse(value) : value;
  const out: Partial<Record<FeatureName, boolean>> = {};
  if (parsed && typeof parsed === 'object')
    for (const [k, v] of Object.entries(parsed)) if (isFeatureName(k) && typeof v === 'boolean') out[k] = v;
  return out;
};

/** One query: the organization's settings and, when a user is named, that user's overrides. */
export async function loadFeatureState(
  em: EntityManager,
  organizationId: string,
  userId: string | null,
): Promise<FeatureState> {
  const [row] = await em.execute(
    `select fs.features, fs.allow_user_overrides,
            (select o.overrides from user_feature_overrides o where o.user_id = ? and o.organization_id = ?) as overrides
     from (select 1) one left join feature_settings fs on fs.organization_id = ?`,
    [userId, organizationId, organizationId],
  );
  return {
    organization: flags(row?.features),
    allowUserOverrides: row?.allow_user_overrides ?? true,
    user: flags(row?.overrides),
  };
}

/** default → organization → user, for every feature. */
export function effectiveFeatures(state: FeatureState): Record<FeatureName, boolean> {
  const out = {} as Record<FeatureName, boolean>;
  for (const name of FEATURE_NAMES) {
    let value: boolean = FEATURES[name].default;
    if (state.organization[name] !== undefined) value = state.organization[name];
    if (state.allowUserOverrides && FEATURES[name].user_overridable && state.user[name] !== undefined)
      value = state.user[name];
    out[name] = value;
  }
  return out;
}

/** For code running without a principal (jobs): the organization's value, or a user's when named. */
export async function isFeatureEnabledFor(
  em: EntityManager,
  organizationId: string,
  name: FeatureName,
  userId: string | null = null,
): Promise<boolean> {
  return effectiveFeatures(await loadFeatureState(em, organizationId, userId))[name];
}

/**
 * Whether the feature is on for the caller. User overrides apply to signed-in users only (a service
 * account follows its organization); a caller outside any organization gets the default.
 */
export async function isFeatureEnabled(
  scope: { em: EntityManager; principal: Principal },
  name: FeatureName,
): Promise<boolean> {
  const { principal } = scope;
  if (!principal.organizationId) return FEATURES[name].default;
  const userId = principal.kind === 'user' ? principal.id : null;
  return isFeatureEnabledFor(scope.em, principal.organizationId, name, userId);
}
