import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, createTenant, type Tenant, type TestUser } from './helpers/api.ts';

/*
 * Saved queries: visibility between users of one organization (own + shared) and across
 * organizations (never), edit rights (owner or org.admin), SQL checked on save.
 */
let server: TestServer;
let tenant: Tenant;
let other: Tenant;
let owner: TestUser;
let colleague: TestUser;
let viewer: TestUser;

// No default caller: every call below names its own token, or none.
const api = bindCall(
  () => server,
  () => undefined,
  '/api/queries',
);

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
  other = await createTenant(server);
  owner = await tenant.addUser(['editor']);
  colleague = await tenant.addUser(['editor']);
  viewer = await tenant.addUser(['viewer']);
});

afterAll(async () => {
  await server?.close();
});

describe('saved queries', () => {
  let privateId: string;
  let sharedId: string;

  it('creates queries with the SQL checked, owned by the caller', async () => {
    const priv = await api('POST', '', {
      token: owner.token,
      body: {
        name: 'Top customers',
        description: 'by lifetime value',
        sql: 'select customer_id from crm.customers order by lifetime_value desc limit 10',
        schema_identifier: 'crm',
      },
    });
    expect(priv.status, JSON.stringify(priv.body)).toBe(200);
    expect(priv.body).toMatchObject({
      name: 'Top customers',
      visibility: 'private',
      schema_identifier: 'crm',
      owner: { id: owner.id, name: owner.username },
      is_owner: true,
      can_edit: true,
    });
    expect(typeof priv.body.created_at).toBe('string');
    privateId = priv.body.id;

    const shared = await api('POST', '', {
      token: owner.token,
      body: {
        name: 'Countries',
        sql: 'select country, count(*) from crm.customers group by country',
        schema_identifier: 'crm',
        visibility: 'shared',
      },
    });
    expect(shared.status).toBe(200);
    sharedId = shared.body.id;

    const elsewhere = await api('POST', '', {
      token: owner.token,
      body: {
        name: 'Orders',
        sql: 'select 1',
        schema_identifier: 'shop',
        visibility: 'shared',
      },
    });
    expect(elsewhere.status).toBe(200);
  });

  it('refuses SQL that is not one read-only statement, and bad bodies', async () => {
    for (const sql of [
      'delete from crm.customers',
      'select 1; select 2',
      'with d as (delete from crm.customers returning *) select * from d',
      'selec 1',
    ]) {
      const res = await api('POST', '', { token: owner.token, body: { name: `bad ${sql.length}`, sql } });
      expect(res.status, sql).toBe(400);
      expect(res.body.message).toBeTruthy();
    }
    expect((await api('POST', '', { token: owner.token, body: { sql: 'select 1' } })).status).toBe(400);
    expect(
      (
        await api('POST', '', {
          token: owner.token,
          body: { name: 'x', sql: 'select 1', visibility: 'public' },
        })
      ).status,
    ).toBe(400);
    const update = await api('PUT', `/${privateId}`, {
      token: owner.token,
      body: { sql: 'drop table crm.customers' },
    });
    expect(update.status).toBe(400);
    expect((await api('GET', `/${privateId}`, { token: owner.token })).body.sql).toContain(
      'order by lifetime_value',
    );
  });

  it('refuses a second query of the same name by the same owner (409)', async () => {
    const res = await api('POST', '', {
      token: owner.token,
      body: { name: 'Top customers', sql: 'select 2' },
    });
    expect(res.status).toBe(409);
    // Renaming another of the owner's queries to it is refused the same way, and changes nothing.
    const second = await api('POST', '', { token: owner.token, body: { name: 'Second', sql: 'select 3' } });
    const rename = await api('PUT', `/${second.body.id}`, {
      token: owner.token,
      body: { name: 'Top customers' },
    });
    expect(rename.status).toBe(409);
    expect(rename.body.message).toMatch(/already have a saved query named Top customers/);
    expect((await api('GET', `/${second.body.id}`, { token: owner.token })).body.name).toBe('Second');
    expect((await api('DELETE', `/${second.body.id}`, { token: owner.token })).status).toBe(200);
    // Another user may use the name.
    const mine = await api('POST', '', {
      token: colleague.token,
      body: { name: 'Top customers', sql: 'select 2' },
    });
    expect(mine.status).toBe(200);
    expect((await api('DELETE', `/${mine.body.id}`, { token: colleague.token })).status).toBe(200);
  });

  it('lists own and shared queries of the organization, filtered by schema_identifier', async () => {
    const mine = await api('GET', '', { token: owner.token });
    expect(mine.status).toBe(200);
    expect(mine.body.queries.map((q: any) => q.name).sort()).toEqual([
      'Countries',
      'Orders',
      'Top customers',
    ]);

    const theirs = await api('GET', '', { token: colleague.token });
    expect(theirs.body.queries.map((q: any) => q.name).sort()).toEqual(['Countries', 'Orders']);
    expect(theirs.body.queries.every((q: any) => !q.is_owner && !q.can_edit)).toBe(true);

    const filtered = await api('GET', '', { token: colleague.token, query: { schema_identifier: 'crm' } });
    expect(filtered.body.queries.map((q: any) => q.name)).toEqual(['Countries']);
    expect(filtered.body.total).toBe(1);

    const viewerList = await api('GET', '', { token: viewer.token, query: { schema_identifier: 'crm' } });
    expect(viewerList.status).toBe(200);
    expect(viewerList.body.queries.map((q: any) => q.id)).toEqual([sharedId]);

    const foreign = await api('GET', '', { token: other.admin.token });
    expect(foreign.status).toBe(200);
    expect(foreign.body.queries).toEqual([]);

    const page = await api('GET', '', { token: owner.token, query: { limit: 1, offset: 1 } });
    expect(page.body.queries).toHaveLength(1);
    expect(page.body.total).toBe(3);
    expect((await api('GET', '', { token: owner.token, query: { limit: 0 } })).status).toBe(400);
  });

  it("gets a visible query; another owner's private query and another tenant answer 404", async () => {
    expect((await api('GET', `/${privateId}`, { token: owner.token })).status).toBe(200);
    expect((await api('GET', `/${sharedId}`, { token: colleague.token })).status).toBe(200);
    expect((await api('GET', `/${privateId}`, { token: colleague.token })).status).toBe(404);
    expect((await api('GET', `/${sharedId}`, { token: other.admin.token })).status).toBe(404);
    expect((await api('GET', '/not-a-uuid', { token: owner.token })).status).toBe(404);
    expect((await api('GET', '/00000000-0000-4000-8000-000000000000', { token: owner.token })).status).toBe(
      404,
    );
  });

  it('lets only the owner or an org.admin update or delete', async () => {
    const refused = await api('PUT', `/${sharedId}`, { token: colleague.token, body: { name: 'Mine now' } });
    expect(refused.status).toBe(403);
    expect((await api('DELETE', `/${sharedId}`, { token: colleague.token })).status).toBe(403);
    expect((await api('PUT', `/${privateId}`, { token: colleague.token, body: { name: 'x' } })).status).toBe(
      404,
    );

    const byOwner = await api('PUT', `/${privateId}`, {
      token: owner.token,
      body: {
        visibility: 'shared',
        description: 'now for everyone',
        sql: 'select customer_id from crm.customers limit 5',
      },
    });
    expect(byOwner.status).toBe(200);
    expect(byOwner.body).toMatchObject({ visibility: 'shared', description: 'now for everyone' });
    expect((await api('GET', `/${privateId}`, { token: colleague.token })).status).toBe(200);

    const byAdmin = await api('PUT', `/${sharedId}`, {
      token: tenant.admin.token,
      body: { name: 'Countries (reviewed)' },
    });
    expect(byAdmin.status).toBe(200);
    expect(byAdmin.body).toMatchObject({ name: 'Countries (reviewed)', is_owner: false, can_edit: true });
    expect(byAdmin.body.owner.id).toBe(owner.id);

    expect((await api('PUT', `/${sharedId}`, { token: other.admin.token, body: { name: 'y' } })).status).toBe(
      404,
    );
    expect((await api('DELETE', `/${sharedId}`, { token: other.admin.token })).status).toBe(404);
    expect(
      (await api('PUT', `/${sharedId}`, { token: owner.token, body: { visibility: 'everyone' } })).status,
    ).toBe(400);

    const deleted = await api('DELETE', `/${sharedId}`, { token: tenant.admin.token });
    expect(deleted.status).toBe(200);
    expect((await api('GET', `/${sharedId}`, { token: owner.token })).status).toBe(404);
    expect((await api('DELETE', `/${privateId}`, { token: owner.token })).status).toBe(200);
  });

  it('answers 401 without credentials and 403 to a viewer that writes', async () => {
    expect((await api('GET', '', {})).status).toBe(401);
    expect((await api('POST', '', { body: { name: 'x', sql: 'select 1' } })).status).toBe(401);
    expect((await api('GET', `/${privateId}`, {})).status).toBe(401);
    expect((await api('PUT', `/${privateId}`, { body: { name: 'x' } })).status).toBe(401);
    expect((await api('DELETE', `/${privateId}`, {})).status).toBe(401);
    expect(
      (await api('POST', '', { token: viewer.token, body: { name: 'x', sql: 'select 1' } })).status,
    ).toBe(403);
    expect((await api('PUT', `/${privateId}`, { token: viewer.token, body: { name: 'x' } })).status).toBe(
      403,
    );
    expect((await api('DELETE', `/${privateId}`, { token: viewer.token })).status).toBe(403);
  });
});
