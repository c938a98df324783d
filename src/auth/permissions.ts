/** The permission catalogue of DESIGN §4. `org.admin` implies every other permission of its organization. */
export const PERMISSIONS = {
  'workspace.read': 'Read workspaces, schemas, mappings, audiences, analytics results and monitoring',
  'workspace.write': 'Create and change workspaces, schemas, mappings and configurations',
  'settings.manage': 'Change organization and workspace settings, LLM, cache, feature and VCS settings',
  'pipeline.run': 'Sync schemas to the warehouse, generate and test the transformation project, materialize',
  'sql.execute': 'Run read-only SQL against source and target warehouses',
  'audience.write': 'Create, materialize and export audiences; record ad performance and conversions',
  'analytics.run': 'Create, generate and test hypotheses; record insights',
  'org.admin': 'Administer the organization: users, roles, service accounts, sessions (implies all others)',
} as const;

export type Permission = keyof typeof PERMISSIONS;

export const ALL_PERMISSIONS = Object.keys(PERMISSIONS) as Permission[];

export function isPermission(value: string): value is Permission {
  return value in PERMISSIONS;
}

export const BUILTIN_ROLES: { name: string; description: string; permissions: Permission[] }[] = [
  { name: 'admin', description: 'Everything in the organization', permissions: ALL_PERMISSIONS },
  {
    name: 'editor',
    description: 'Everything but administration and settings',
    permissions: ALL_PERMISSIONS.filter((p) => p !== 'org.admin' && p !== 'settings.manage'),
  },
  { name: 'viewer', description: 'Read-only access', permissions: ['workspace.read'] },
];

export function hasPermission(granted: ReadonlySet<string>, required: Permission): boolean {
  return granted.has(required) || granted.has('org.admin');
}

/** The effective list a client sees: org.admin expands to the whole catalogue. */
export function effectivePermissions(granted: Iterable<string>): Permission[] {
  const set = new Set(granted);
  if (set.has('org.admin')) return [...ALL_PERMISSIONS];
  return ALL_PERMISSIONS.filter((p) => set.has(p));
}
