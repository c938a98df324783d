import { UniqueConstraintViolationException } from '@mikro-orm/core';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { hasPermission } from '../../auth/permissions.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { assertReadOnlySql } from '../../warehouse/sql-guard.ts';
import { UUID } from '../workspaces/workspaces.service.ts';
import { SavedQuery, type QueryVisibility, type SavedQueryEntity } from './queries.entity.ts';

const isAdmin = (scope: CallerScope) => hasPermission(scope.principal.permissions, 'org.admin');

type QueryFields = Pick<
  SavedQueryEntity,
  | 'id'
  | 'name'
  | 'description'
  | 'sql'
  | 'schemaIdentifier'
  | 'visibility'
  | 'ownerId'
  | 'ownerName'
  | 'createdAt'
  | 'updatedAt'
>;

function queryView(scope: CallerScope, query: QueryFields) {
  const isOwner = query.ownerId === scope.principal.id;
  return {
    id: query.id,
    name: query.name,
    description: query.description,
    sql: query.sql,
    schema_identifier: query.schemaIdentifier ?? null,
    visibility: query.visibility,
    owner: { id: query.ownerId, name: query.ownerName },
    is_owner: isOwner,
    can_edit: isOwner || isAdmin(scope),
    created_at: query.createdAt,
    updated_at: query.updatedAt,
  };
}

/** What the caller may see: its own queries and those shared with the organization. */
function visibleTo(scope: CallerScope) {
  return {
    organization: organizationOf(scope.principal),
    $or: [{ ownerId: scope.principal.id }, { visibility: 'shared' as const }],
  };
}

const COLUMNS =
  'id, name, description, sql, schema_identifier, visibility, owner_id, owner_name, created_at, updated_at';

/** A query the caller may see; another owner's private query and another tenant's answer 404 alike. */
async function findVisible(scope: CallerScope, id: string): Promise<SavedQueryEntity> {
  if (!UUID.test(id)) throw notFound('Saved query');
  const query = await scope.em.findOne(SavedQuery, { id, ...visibleTo(scope) });
  if (!query) throw notFound('Saved query');
  return query;
}

async function findEditable(scope: CallerScope, id: string): Promise<SavedQueryEntity> {
  const query = await findVisible(scope, id);
  assertEditable(scope, query);
  return query;
}

function assertEditable(scope: CallerScope, query: Pick<QueryFields, 'ownerId'>) {
  if (query.ownerId !== scope.principal.id && !isAdmin(scope))
    throw new AppError(
      'FORBIDDEN',
      'Only the owner of a saved query (or an organization admin) may change it',
    );
}

/** The row of a query the caller may see, read as a row: it only passes through to the answer. */
async function visibleRow(scope: CallerScope, id: string): Promise<QueryRow> {
  if (!UUID.test(id)) throw notFound('Saved query');
  const [row]: QueryRow[] = await scope.em.execute(
    `select ${COLUMNS} from saved_queries
      where id = ? and organization_id = ? and (owner_id = ? or visibility = 'shared')`,
    [id, organizationOf(scope.principal), scope.principal.id],
  );
  if (!row) throw notFound('Saved query');
  return row;
}

const fieldsOf = (q: QueryRow): QueryFields => ({
  id: q.id,
  name: q.name,
  description: q.description,
  sql: q.sql,
  schemaIdentifier: q.schema_identifier,
  visibility: q.visibility,
  ownerId: q.owner_id,
  ownerName: q.owner_name,
  createdAt: new Date(q.created_at),
  updatedAt: new Date(q.updated_at),
});

async function flushNamed<T>(scope: CallerScope, name: string, result: () => T): Promise<T> {
  try {
    await scope.em.flush();
  } catch (error) {
    if (error instanceof UniqueConstraintViolationException)
      throw new AppError('CONFLICT', `You already have a saved query named ${name}`);
    throw error;
  }
  return result();
}

/** Read as rows (they only pass through to the answer), the page and the total in one statement. */
export async function listQueries(
  scope: CallerScope,
  input: { schema_identifier?: string; limit: number; offset: number },
) {
  const organization = organizationOf(scope.principal);
  const bySchema = input.schema_identifier !== undefined;
  const where = `organization_id = ? and (owner_id = ? or visibility = 'shared')${bySchema ? ' and schema_identifier = ?' : ''}`;
  const params = [organization, scope.principal.id, ...(bySchema ? [input.schema_identifier] : [])];
  const rows: QueryRow[] = await scope.em.execute(
    `select id, name, description, sql, schema_identifier, visibility, owner_id, owner_name, created_at, updated_at,
        count(*) over () as total
      from saved_queries where ${where} order by name asc, id asc limit ? offset ?`,
    [...params, input.limit, input.offset],
  );
  const total = rows.length
    ? Number(rows[0].total)
    : Number((await scope.em.execute(`select count(*) as n from saved_queries where ${where}`, params))[0].n);
  return {
    queries: rows.map((q) => queryView(scope, fieldsOf(q))),
    total,
    limit: input.limit,
    offset: input.offset,
  };
}

interface QueryRow {
  id: string;
  name: string;
  description: string;
  sql: string;
  schema_identifier: string | null;
  visibility: QueryVisibility;
  owner_id: string;
  owner_name: string;
  /** Timestamps arrive as PostgreSQL's text (MikroORM's type parsers). */
  created_at: string;
  updated_at: string;
  total?: string;
}

export async function getQuery(scope: CallerScope, id: string) {
  return queryView(scope, fieldsOf(await visibleRow(scope, id)));
}

export async function createQuery(
  scope: CallerScope,
  input: {
    name: string;
    description: string;
    sql: string;
    schema_identifier?: string | null;
    visibility: QueryVisibility;
  },
) {
  await assertReadOnlySql(input.sql);
  const query = scope.em.create(SavedQuery, {
    organization: organizationOf(scope.principal),
    name: input.name,
    description: input.description,
    sql: input.sql,
    schemaIdentifier: input.schema_identifier ?? null,
    ownerId: scope.principal.id,
    ownerName: scope.principal.username,
    visibility: input.visibility,
  });
  return flushNamed(scope, input.name, () => queryView(scope, query));
}

export async function updateQuery(
  scope: CallerScope,
  input: {
    query_id: string;
    name?: string;
    description?: string;
    sql?: string;
    schema_identifier?: string | null;
    visibility?: QueryVisibility;
  },
) {
  if (input.sql !== undefined) await assertReadOnlySql(input.sql);
  const changes: [string, unknown][] = [
    ['name', input.name],
    ['description', input.description],
    ['sql', input.sql],
    ['schema_identifier', input.schema_identifier],
    ['visibility', input.visibility],
  ].filter(([, value]) => value !== undefined) as [string, unknown][];
  if (!changes.length) {
    const row = await visibleRow(scope, input.query_id);
    assertEditable(scope, { ownerId: row.owner_id });
    return queryView(scope, fieldsOf(row));
  }
  if (!UUID.test(input.query_id)) throw notFound('Saved query');
  // One statement: the update is limited to what the caller may edit (its own queries; an admin also
  // the shared ones). Only when it finds nothing does a second look tell 404 from 403.
  let rows: QueryRow[];
  try {
    rows = await scope.em.execute(
      `update saved_queries set ${changes.map(([column]) => `${column} = ?`).join(', ')}, updated_at = ?
        where id = ? and organization_id = ? and (owner_id = ? or (visibility = 'shared' and ?))
        returning ${COLUMNS}`,
      [
        ...changes.map(([, value]) => value),
        new Date(),
        input.query_id,
        organizationOf(scope.principal),
        scope.principal.id,
        isAdmin(scope),
      ],
    );
  } catch (error) {
    if (error instanceof UniqueConstraintViolationException)
      throw new AppError('CONFLICT', `You already have a saved query named ${input.name}`);
    throw error;
  }
  if (!rows.length) {
    assertEditable(scope, { ownerId: (await visibleRow(scope, input.query_id)).owner_id });
    throw notFound('Saved query');
  }
  return queryView(scope, fieldsOf(rows[0]));
}

export async function deleteQuery(scope: CallerScope, id: string) {
  const query = await findEditable(scope, id);
  await scope.em.remove(query).flush();
  return { success: true as const, message: `Saved query ${query.name} deleted` };
}
