import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope, Scope } from '../../deps.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { OrganizationSettings } from '../workspaces/workspaces.entity.ts';
import { currentWorkspace, targetSchemaOf, type WorkspaceEntity } from '../workspaces/workspaces.service.ts';
import { SchemaConfig } from './schemas.entity.ts';
import type { ReverseEtlDestination } from './reverse-etl.schemas.ts';
import { isMaskedSecret } from '../../auth/secret-box.ts';

/*
 * Reverse-ETL connections are defined in the admin settings (`reverse_etl_connections`, at the
 * workspace level or inherited from the global level); which table of a connection holds a target
 * table's copy is a SchemaConfig row of kind reverse_etl_connection.
 */

const SETTINGS_KEY = 'reverse_etl_connections';

type Stored = Record<string, unknown>;
type Destination = Record<string, unknown> & { name: string; type: string };

/** The secret field of a destination type, and what must match for a stored secret to be kept. */
const SECRET_OF: Record<string, { field: string; identity: string[] } | undefined> = {
  postgres: { field: 'password', identity: ['host', 'port', 'database', 'user'] },
};

function sealOne(scope: Scope, next: Destination, previous: Destination[]): Destination {
  const secret = SECRET_OF[next.type];
  if (!secret) return next;
  const setFlag = `${secret.field}_set`;
  const { [secret.field]: given, [setFlag]: flag, ...rest } = next;
  if (typeof given === 'string' && given !== '' && !isMaskedSecret(given))
    return { ...rest, [secret.field]: scope.deps.secrets.encrypt(given) } as Destination;
  // A masked destination sent back keeps its secret, but only for the same server or URL.
  const before = previous.find(
    (p) => p.name === next.name && p.type === next.type && secret.identity.every((k) => p[k] === next[k]),
  );
  if (flag !== false && typeof before?.[secret.field] === 'string')
    return { ...rest, [secret.field]: before[secret.field] } as Destination;
  return rest as Destination;
}

/**
 * Seals the destination secrets of a settings patch before it is stored; `stored` is what the same
 * level holds now (its secrets are already sealed). Other keys pass through untouched.
 */
export function sealSettingsSecrets(scope: Scope, values: Stored, stored: Stored | null | undefined): Stored {
  const list = values[SETTINGS_KEY];
  if (!Array.isArray(list)) return values;
  const previous = (Array.isArray(stored?.[SETTINGS_KEY]) ? stored[SETTINGS_KEY] : []) as Destination[];
  return { ...values, [SETTINGS_KEY]: (list as Destination[]).map((d) => sealOne(scope, d, previous)) };
}

function maskDestination(d: Destination): Destination {
  const secret = SECRET_OF[d.type];
  if (!secret) return d;
  const { [secret.field]: sealed, ...rest } = d;
  return { ...rest, [`${secret.field}_set`]: typeof sealed === 'string' && sealed !== '' } as Destination;
}

/** Settings as shown to a client: destination secrets become `password_set` / `secret_set`. */
export function maskSettingsSecrets<T extends Stored>(settings: T): T {
  const list = settings[SETTINGS_KEY];
  if (!Array.isArray(list)) return settings;
  return { ...settings, [SETTINGS_KEY]: (list as Destination[]).map(maskDestination) };
}

/**
 * The connections a workspace can use, with their passwords still sealed (to connect:
 * `scope.deps.secrets.decrypt(d.password)`); never return them unmasked.
 */
export async function workspaceDestinations(
  scope: CallerScope,
  workspace: WorkspaceEntity,
): Promise<{ defined_in: 'workspace' | 'global'; destinations: ReverseEtlDestination[] }> {
  const own = workspace.settings?.[SETTINGS_KEY];
  if (Array.isArray(own)) return { defined_in: 'workspace', destinations: own as ReverseEtlDestination[] };
  const org = await scope.em.findOne(OrganizationSettings, { organization: organizationOf(scope.principal) });
  const global = org?.adminSettings?.[SETTINGS_KEY];
  return {
    defined_in: 'global',
    destinations: (Array.isArray(global) ? global : []) as ReverseEtlDestination[],
  };
}

interface TableAssignment {
  connection_name: string;
  destination_table: string;
}

async function assignments(scope: CallerScope, workspace: WorkspaceEntity) {
  return scope.em.find(
    SchemaConfig,
    {
      organization: organizationOf(scope.principal),
      workspace: workspace.id,
      kind: 'reverse_etl_connection',
    },
    { orderBy: { tableName: 'asc' } },
  );
}

/** Every table → connection assignment of a workspace (monitoring measures the assigned tables). */
export async function tableAssignments(scope: CallerScope, workspace: WorkspaceEntity) {
  return (await assignments(scope, workspace)).map((row) => {
    const config = row.config as unknown as TableAssignment;
    return {
      table_name: row.tableName,
      connection_name: config.connection_name,
      destination_table: config.destination_table,
      updated_at: row.updatedAt,
    };
  });
}

export async function listConnections(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const { defined_in: definedIn, destinations } = await workspaceDestinations(scope, workspace);
  const tables = new Set(targetSchemaOf(workspace)?.tables.map((t) => t.name) ?? []);
  const assigned = await tableAssignments(scope, workspace);
  const names = new Set(destinations.map((d) => d.name));
  return {
    workspace_name: workspace.name,
    defined_in: definedIn,
    connections: destinations.map((d) => ({
      ...(maskDestination(d as unknown as Destination) as unknown as ReverseEtlDestination),
      assigned_tables: assigned.filter((a) => a.connection_name === d.name).map((a) => a.table_name),
    })),
    assignments: assigned.map((a) => ({
      ...a,
      table_missing: !tables.has(a.table_name),
      connection_missing: !names.has(a.connection_name),
    })),
  };
}

export async function assignConnection(
  scope: CallerScope,
  input: {
    table_name: string;
    connection_name: string | null;
    destination_table?: string;
  },
) {
  const workspace = await currentWorkspace(scope);
  const schema = targetSchemaOf(workspace);
  if (!schema)
    throw new AppError('NOT_FOUND', `Workspace ${workspace.name} has no schema.json; assign a schema first`);
  const table = schema.tables.find((t) => t.name === input.table_name);
  if (!table) throw notFound(`Table ${input.table_name} of the target schema`);
  const organization = organizationOf(scope.principal);
  const where = {
    organization,
    workspace: workspace.id,
    schemaType: 'target' as const,
    tableName: table.name,
    columnName: '',
    kind: 'reverse_etl_connection' as const,
  };
  let row = await scope.em.findOne(SchemaConfig, where);
  if (input.connection_name === null) {
    if (row) await scope.em.remove(row).flush();
    return {
      workspace_name: workspace.name,
      table_name: table.name,
      assigned: false,
      connection: null,
      destination_table: null,
      updated_at: null,
    };
  }
  const { destinations } = await workspaceDestinations(scope, workspace);
  const destination = destinations.find((d) => d.name === input.connection_name);
  if (!destination)
    throw notFound(
      `Reverse-ETL connection ${input.connection_name} (define it in the admin settings, key ${SETTINGS_KEY})`,
    );
  const config: TableAssignment = {
    connection_name: destination.name,
    destination_table: input.destination_table ?? table.name,
  };
  const updatedBy = scope.principal.username;
  if (row) Object.assign(row, { config, updatedBy });
  else row = scope.em.create(SchemaConfig, { ...where, config: { ...config }, updatedBy });
  await scope.em.flush();
  return {
    workspace_name: workspace.name,
    table_name: table.name,
    assigned: true,
    connection: maskDestination(destination as unknown as Destination) as unknown as ReverseEtlDestination,
    destination_table: config.destination_table,
    updated_at: row.updatedAt,
  };
}
