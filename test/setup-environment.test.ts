import type { EntityManager } from '@mikro-orm/postgresql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, superAdminToken, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

/*
 * POST /api/admin/setup-environment over a real PostgreSQL source: a scratch database on the test
 * server with a small customers table, created here and dropped at the end (both test modes).
 */
const sourceDb = scratchDatabase('setup');
const SOURCE_PASSWORD = 'source-secret-that-must-not-leak';
const PATH = '/api/admin/setup-environment';

let server: TestServer;
let superAdmin: string;
let tenant: Tenant;

beforeAll(async () => {
  await sourceDb.create();
  await sourceDb.sql(
    `create table customers (
       id integer primary key,
       email text not null,
       first_name text,
       last_name text,
       phone text,
       city text,
       created_at timestamptz not null default now())`,
  );
  await sourceDb.sql(
    `insert into customers (id, email, first_name, last_name, phone, city)
     select g, 'user' || g || '@example.com', 'First' || g, 'Last' || g, '+1 555 010 ' || lpad(g::text, 4, '0'),
            (array['Berlin', 'Paris', 'Lisbon'])[1 + g % 3]
       from generate_series(1, 40) g`,
  );
  server = await startTestServer();
  [superAdmin, tenant] = await Promise.all([superAdminToken(server), createTenant(server)]);
});

afterAll(async () => {
  await server?.close();
  await sourceDb.drop();
});

const source = (overrides: Record<string, unknown> = {}) =>
  pgConfig(sourceDb.name, { password: SOURCE_PASSWORD, schemas: ['public'], ...overrides });

function request(overrides: Record<string, unknown> = {}) {
  const domain = `${unique('setup')}.test`;
  return {
    organization: { name: `Setup ${domain}`, domain },
    admin: { username: unique('admin'), email: 'owner@example.com' },
    workspace: { name: unique('ws'), description: 'Created by setup-environment' },
    source: source(),
    template: 'customer-360',
    ...overrides,
  };
}

const setup = (body: unknown, token = superAdmin) => call(server, 'POST', PATH, { token, body });

/** What the control plane holds for a request's names: all zero after a refused or failed setup. */
async function traces(body: ReturnType<typeof request>) {
  const em = server.deps.orm.em.fork() as EntityManager;
  const [row] = await em.getConnection().execute(
    `select (select count(*) from organizations where domain = ?)::int as organizations,
            (select count(*) from users where username = ?)::int as users,
            (select count(*) from workspaces where name = ?)::int as workspaces,
            (select count(*) from mappings m join workspaces w on w.id = m.workspace_id where w.name = ?)::int as mappings,
            (select count(*) from discovery_runs r join workspaces w on w.id = r.workspace_id where w.name = ?)::int as runs`,
    [
      body.organization.domain,
      body.admin.username,
      body.workspace.name,
      body.workspace.name,
      body.workspace.name,
    ],
  );
  return row as { organizations: number; users: number; workspaces: number; mappings: number; runs: number };
}

const NOTHING = { organizations: 0, users: 0, workspaces: 0, mappings: 0, runs: 0 };

describe('setup-environment', () => {
  it('creates organization, admin, workspace, source, schema and suggested mappings in one call', async () => {
    const body = request();
    const res = await setup(body);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const out = res.body;

    expect(out.organization).toMatchObject({
      name: body.organization.name,
      domain: body.organization.domain,
    });
    expect(out.admin.user).toMatchObject({
      username: body.admin.username,
      email: 'owner@example.com',
      organization_id: out.organization.id,
      is_super_admin: false,
      must_change_password: true,
      roles: ['admin'],
    });
    expect(out.admin.temporary_password).toEqual(expect.any(String));
    expect(out.workspace).toMatchObject({
      name: body.workspace.name,
      description: 'Created by setup-environment',
      source_configured: true,
      schema_assigned: true,
      schema_template: 'customer-360',
      is_current: true,
    });
    expect(out.workspace.source_config).toMatchObject({ database: sourceDb.name, password_set: true });
    expect(out.workspace.source_config).not.toHaveProperty('password');
    expect(out.schema).toMatchObject({ template_name: 'customer-360', name: 'customer-360' });
    expect(out.schema.tables).toContain('customers');
    // The only secret in the answer is the admin's temporary password.
    expect(JSON.stringify(out)).not.toContain(SOURCE_PASSWORD);

    expect(out.discovery).toMatchObject({ ran: true, mode: 'offline', source_tables: 1, source_columns: 7 });
    expect(out.discovery.run_id).toEqual(expect.any(String));
    expect(out.discovery.unprofiled_tables).toEqual([]);
    const customers = out.discovery.mappings.find(
      (m: { table_name: string }) => m.table_name === 'customers',
    );
    expect(customers.tables).toEqual({ 'public.customers': { relationship: 'primary' } });
    const byTarget = Object.fromEntries(
      customers.connections.map((c: { target_field: string; source_field: string }) => [c.target_field, c]),
    );
    expect(byTarget.email).toMatchObject({ source_field: 'public.customers.email', status: 'suggested' });
    expect(byTarget.first_name).toMatchObject({ source_field: 'public.customers.first_name' });
    expect(byTarget.city).toMatchObject({ source_field: 'public.customers.city' });
    expect(out.discovery.fields_suggested).toBeGreaterThanOrEqual(customers.connections.length);
    expect(await traces(body)).toMatchObject({ organizations: 1, users: 1, workspaces: 1, runs: 1 });

    // The source password is stored sealed, and opens to what was sent.
    const em = server.deps.orm.em.fork() as EntityManager;
    const [stored] = await em
      .getConnection()
      .execute(`select source_config->>'password' as password from workspaces where id = ?`, [
        out.workspace.id,
      ]);
    expect(stored.password).not.toContain(SOURCE_PASSWORD);
    expect(server.deps.secrets.decrypt(stored.password)).toBe(SOURCE_PASSWORD);

    // The new admin signs in with the temporary password and must change it first.
    const login = await call(server, 'POST', '/api/auth/login', {
      body: {
        username: body.admin.username,
        domain: body.organization.domain,
        password: out.admin.temporary_password,
      },
    });
    expect(login.status, JSON.stringify(login.body)).toBe(200);
    expect(login.body.user.must_change_password).toBe(true);
    const token = login.body.token;
    const blocked = await call(server, 'GET', '/api/workspaces/current', { token });
    expect(blocked.status).toBe(403);
    expect(blocked.body.reason).toBe('PASSWORD_CHANGE_REQUIRED');
    const changed = await call(server, 'POST', '/api/auth/change-password', {
      token,
      body: { current_password: out.admin.temporary_password, new_password: 'a-brand-new-passphrase' },
    });
    expect(changed.status, JSON.stringify(changed.body)).toBe(200);

    // Their workspace is selected, with the source (password hidden), the schema and the mappings.
    const current = await call(server, 'GET', '/api/workspaces/current', { token });
    expect(current.status, JSON.stringify(current.body)).toBe(200);
    expect(current.body).toMatchObject({ name: body.workspace.name, schema_template: 'customer-360' });
    const sourceConfig = await call(server, 'GET', '/api/workspaces/source-config', { token });
    expect(sourceConfig.status).toBe(200);
    expect(sourceConfig.body.source_config).toMatchObject({
      host: source().host,
      database: sourceDb.name,
      password_set: true,
    });
    expect(JSON.stringify(sourceConfig.body)).not.toContain(SOURCE_PASSWORD);
    const schema = await call(server, 'GET', '/api/workspaces/target-schema/content', { token });
    expect(schema.status).toBe(200);
    expect(schema.body.schema.tables.map((t: { name: string }) => t.name)).toContain('customers');
    const mapping = await call(server, 'GET', '/api/mappings/customers', { token });
    expect(mapping.status, JSON.stringify(mapping.body)).toBe(200);
    expect(mapping.body.connections).toEqual(customers.connections);
    // The stored config (password decrypted on use) really connects: the sources area queries it.
    const query = await call(server, 'POST', '/api/sources/execute-query', {
      token,
      body: { sql: 'select count(*)::int as n from customers' },
    });
    expect(query.status, JSON.stringify(query.body)).toBe(200);
    expect(query.body.rows).toEqual([{ n: 40 }]);
  });

  it('answers 409 when repeated with the same names, and changes nothing', async () => {
    const body = request();
    expect((await setup(body)).status).toBe(200);
    const again = await setup(body);
    expect(again.status).toBe(409);
    expect(again.body.code).toBe('CONFLICT');
    expect(again.body.message).toContain(body.organization.domain);
    expect(await traces(body)).toMatchObject({ organizations: 1, users: 1, workspaces: 1 });
  });

  it('leaves no trace when the last step (writing the mappings) fails inside the transaction', async () => {
    const body = request();
    const em = server.deps.orm.em.fork() as EntityManager;
    const conn = em.getConnection();
    const fn = unique('fail_mappings_').toLowerCase();
    // A real failure of the database at the final insert, only for this request's organization.
    await conn.execute(
      `create function ${fn}() returns trigger language plpgsql as $body$
       begin
         if exists (select 1 from organizations o where o.id = new.organization_id and o.domain = '${body.organization.domain}') then
           raise exception 'injected failure while writing mappings';
         end if;
         return new;
       end $body$`,
    );
    await conn.execute(
      `create trigger ${fn} before insert on mappings for each row execute function ${fn}()`,
    );
    try {
      const res = await setup(body);
      expect(res.status).toBe(500);
      expect(res.body).toEqual({ code: 'INTERNAL_SERVER_ERROR', message: 'Internal server error' });
      expect(await traces(body)).toEqual(NOTHING);
    } finally {
      await conn.execute(`drop trigger if exists ${fn} on mappings`);
      await conn.execute(`drop function if exists ${fn}()`);
    }
    // Nothing was left to collide with: the same request now succeeds.
    const retry = await setup(body);
    expect(retry.status, JSON.stringify(retry.body)).toBe(200);
    expect(await traces(body)).toMatchObject({ organizations: 1, users: 1, workspaces: 1, runs: 1 });
  });

  it('refuses a reserved workspace name with 400 before writing anything', async () => {
    const body = request({ workspace: { name: 'Current' } });
    const res = await setup(body);
    expect(res.status).toBe(400);
    expect(res.body.issues).toEqual([
      expect.objectContaining({ path: ['workspace', 'name'], message: expect.stringContaining('reserved') }),
    ]);
    expect(await traces(body)).toEqual(NOTHING);
  });

  it('refuses an unreachable source with 422 before writing anything', async () => {
    const body = request({ source: source({ port: 1 }) });
    const res = await setup(body);
    expect(res.status, JSON.stringify(res.body)).toBe(422);
    expect(await traces(body)).toEqual(NOTHING);
  });

  it('refuses an unknown library template with 400', async () => {
    const body = request({ template: 'no-such-template' });
    const res = await setup(body);
    expect(res.status).toBe(400);
    expect(res.body.issues).toEqual([
      { path: ['template'], message: expect.stringContaining('customer-360') },
    ]);
    expect(await traces(body)).toEqual(NOTHING);
  });

  it('without discovery creates the environment with no mappings', async () => {
    const body = { ...request({ template: 'ecommerce-orders' }), discover: false };
    const res = await setup(body);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.discovery).toMatchObject({ ran: false, run_id: null, mappings: [], fields_suggested: 0 });
    expect(res.body.workspace).toMatchObject({
      schema_template: 'ecommerce-orders',
      source_configured: true,
    });
    expect(await traces(body)).toMatchObject({
      organizations: 1,
      users: 1,
      workspaces: 1,
      mappings: 0,
      runs: 0,
    });
  });

  it('answers 401 without a token and 403 to an organization admin', async () => {
    const body = request();
    expect((await call(server, 'POST', PATH, { body })).status).toBe(401);
    const refused = await setup(body, tenant.admin.token);
    expect(refused.status).toBe(403);
    expect(refused.body.code).toBe('FORBIDDEN');
    expect(await traces(body)).toEqual(NOTHING);
  });

  it('answers 400 for bad bodies', async () => {
    const good = request();
    const bad: [string, unknown][] = [
      ['empty body', {}],
      ['no organization', { ...good, organization: undefined }],
      ['bad domain', { ...good, organization: { name: 'X', domain: 'not a domain' } }],
      ['bad username', { ...good, admin: { username: '!' } }],
      ['bad workspace name', { ...good, workspace: { name: '1 bad name' } }],
      ['unsupported source type', { ...good, source: { ...source(), type: 'oracle' } }],
      ['source without host', { ...good, source: { ...source(), host: undefined } }],
      // Only the MySQL extract–load reads these: a postgres source would store them unread.
      ['raw_schema on a postgres source', { ...good, source: { ...source(), raw_schema: 'raw_x' } }],
      ['cursor_columns on a postgres source', { ...good, source: { ...source(), cursor_columns: {} } }],
      ['no template', { ...good, template: undefined }],
      ['discover not a boolean', { ...good, discover: 'yes' }],
    ];
    for (const [what, body] of bad) {
      const res = await setup(body);
      expect(res.status, what).toBe(400);
      expect(res.body.code, what).toBe('BAD_REQUEST');
    }
    const malformed = await call(server, 'POST', PATH, {
      token: superAdmin,
      body: '{"organization":',
      headers: { 'content-type': 'application/json' },
    });
    expect(malformed.status).toBe(400);
    expect(await traces(good)).toEqual(NOTHING);
  });
});
