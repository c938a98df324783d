import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { bindCall, call, createTenant, createWorkspace, unique, type Tenant } from './helpers/api.ts';

/*
 * The body rule across areas: each route takes its documented body; a body wrapped in a parameter
 * name the route does not document is a 400 that names the field and what was expected, and changes
 * nothing. A route whose documented body is a wrapper (resolve-ambiguity) takes exactly that.
 */
let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
});
afterAll(async () => server?.close());

const api = bindCall(
  () => server,
  () => tenant.admin.token,
);

describe('wrapped bodies', () => {
  it('admin llm-parameters: {"input_data": {...}} is a 400 saying what was expected, and saves nothing', async () => {
    const res = await api('POST', '/api/admin/llm-parameters', {
      body: {
        input_data: { model: 'llama3', monthly_budget_usd: 1000 },
      },
    });
    expect(res.status).toBe(400);
    expect(res.body.code).toBe('BAD_REQUEST');
    expect(res.body.issues).toEqual([
      {
        code: 'unrecognized_keys',
        path: ['input_data'],
        keys: ['input_data'],
        message: expect.stringMatching(
          /"input_data" is not a field of POST \/api\/admin\/llm-parameters; send .*model.*monthly_budget_usd.* at the top level of the body, not wrapped/,
        ),
      },
    ]);
    const after = await api('GET', '/api/admin/llm-parameters');
    expect(after.body).toMatchObject({ is_default: true, model: 'gpt-4o-mini', monthly_budget_usd: 20 });

    // The documented, flat shape is taken.
    const flat = await api('POST', '/api/admin/llm-parameters', {
      body: {
        model: 'llama3',
        monthly_budget_usd: 1000,
      },
    });
    expect(flat.status, JSON.stringify(flat.body)).toBe(200);
    expect(flat.body).toMatchObject({ model: 'llama3', monthly_budget_usd: 1000 });
  });

  it('the same rule in other areas: cache and feature settings, workspace admin settings', async () => {
    const cache = await api('POST', '/api/admin/cache-settings', {
      body: { cache_settings: { enabled: false } },
    });
    expect(cache.status).toBe(400);
    expect(cache.body.issues[0].message).toMatch(
      /"cache_settings" is not a field of POST \/api\/admin\/cache-settings; send caches/,
    );
    const features = await api('POST', '/api/admin/feature-settings', {
      body: { input_data: { features: {} } },
    });
    expect(features.status).toBe(400);
    const name = await createWorkspace(server, tenant.admin.token, { name: unique('body') });
    const settings = await api('PUT', '/api/workspaces/admin-settings', {
      body: {
        settings: { workspace_name: name, sample_size: 50 },
      },
    });
    expect(settings.status).toBe(400);
    // admin-settings answers with a `settings` field: being a field of the answer does not make it one
    // of the body.
    expect(settings.body.issues).toEqual([
      expect.objectContaining({ code: 'unrecognized_keys', path: ['settings'], keys: ['settings'] }),
    ]);
  });

  it('resolve-ambiguity documents its resolve_input wrapper: flat fields are the unknown ones there', async () => {
    const flat = await api('POST', '/api/mappings/resolve-ambiguity', {
      body: {
        table_name: 'people',
        target_field: 'name',
        source_field: null,
      },
    });
    expect(flat.status).toBe(400);
    // table_name is also a field of its answer: a client that sends it still learns it was not taken.
    // The wrapper the body lacks is named after them.
    expect(flat.body.issues.map((i: { path: string[] }) => i.path[0])).toEqual([
      'table_name',
      'target_field',
      'source_field',
      'resolve_input',
    ]);
    expect(flat.body.issues[0].message).toMatch(/send resolve_input at the top level/);
  });

  it('a caller without credentials still gets 401 first', async () => {
    const res = await call(server, 'POST', '/api/admin/llm-parameters', { body: { input_data: {} } });
    expect(res.status).toBe(401);
  });
});
