import type { EntityManager } from '@mikro-orm/postgresql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, superAdminToken, type Tenant, type TestUser } from './helpers/api.ts';
import { loadEnv } from '../src/env.ts';
import { llmManager } from '../src/llm/provider.ts';
import { loadLlmParameters } from '../src/modules/admin/llm-settings.service.ts';

/* The LLM rows of area admin: parameters (key write-only, encrypted), and the process-level mode. */

let server: TestServer;
let tenant: Tenant;
let viewer: TestUser;
let editor: TestUser;
let superAdmin: string;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
  viewer = await tenant.addUser(['viewer']);
  editor = await tenant.addUser(['editor']);
  superAdmin = await superAdminToken(server);
});
afterAll(async () => server?.close());

const PATH = '/api/admin/llm-parameters';

describe('llm-parameters', () => {
  it('shows the defaults before anything is saved, to any user of the organization', async () => {
    const res = await call(server, 'GET', PATH, { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      base_url: 'https://api.openai.com/v1',
      model: 'gpt-4o-mini',
      monthly_budget_usd: 20,
      api_key_set: false,
      api_key_hint: null,
      is_default: true,
      updated_at: null,
    });
  });

  it('saves, merges, keeps the key encrypted and never returns it', async () => {
    const key = 'sk-live-abcdefghijklmnop1234';
    const saved = await call(server, 'POST', PATH, {
      token: tenant.admin.token,
      body: { base_url: 'http://127.0.0.1:9/v1', model: 'llama3', temperature: 0.2, api_key: key },
    });
    expect(saved.status, JSON.stringify(saved.body)).toBe(200);
    expect(saved.body).toMatchObject({
      base_url: 'http://127.0.0.1:9/v1',
      model: 'llama3',
      temperature: 0.2,
      max_tokens: 4000,
      api_key_set: true,
      api_key_hint: '…1234',
      is_default: false,
    });
    expect(JSON.stringify(saved.body)).not.toContain('abcdefgh');
    expect(new Date(saved.body.updated_at).getTime()).toBeGreaterThan(0);

    const em = server.deps.orm.em.fork() as EntityManager;
    const [row] = await em
      .getConnection()
      .execute('select api_key_encrypted, parameters from llm_parameters where organization_id = ?', [
        tenant.organization.id,
      ]);
    expect(row.api_key_encrypted).not.toContain(key);
    const params = await loadLlmParameters(em, tenant.organization.id, server.deps.secrets);
    expect(params).toMatchObject({ model: 'llama3', api_key: key });

    // Keys left out keep their value, the key included.
    const merged = await call(server, 'POST', PATH, {
      token: tenant.admin.token,
      body: { monthly_budget_usd: 5 },
    });
    expect(merged.body).toMatchObject({ model: 'llama3', monthly_budget_usd: 5, api_key_set: true });
    const read = await call(server, 'GET', PATH, { token: viewer.token });
    expect(read.body).toMatchObject({ model: 'llama3', monthly_budget_usd: 5, api_key_hint: '…1234' });
    // null removes the key.
    const removed = await call(server, 'POST', PATH, { token: tenant.admin.token, body: { api_key: null } });
    expect(removed.body).toMatchObject({ api_key_set: false, api_key_hint: null, model: 'llama3' });
    const fresh = server.deps.orm.em.fork() as EntityManager;
    expect(
      (await loadLlmParameters(fresh, tenant.organization.id, server.deps.secrets)).api_key,
    ).toBeUndefined();

    // Another organization sees only its own parameters.
    const other = await createTenant(server);
    expect((await call(server, 'GET', PATH, { token: other.admin.token })).body).toMatchObject({
      model: 'gpt-4o-mini',
      is_default: true,
    });
  });

  it('refuses invalid parameters with 400 naming the field', async () => {
    for (const body of [
      { temperature: 5 },
      { base_url: 'ftp://example.com/v1' },
      { base_url: 'not a url' },
      { model: '' },
      { max_tokens: 1.5 },
      { monthly_budget_usd: -1 },
      { api_key: 42 },
    ]) {
      const res = await call(server, 'POST', PATH, { token: tenant.admin.token, body });
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(res.body.code).toBe('BAD_REQUEST');
      expect(JSON.stringify(res.body.issues)).toContain(Object.keys(body)[0]);
    }
    const malformed = await call(server, 'POST', PATH, { token: tenant.admin.token, body: '{"model":' });
    expect(malformed.status).toBe(400);
  });

  it('guards: 401 without a token, 403 without settings.manage or outside an organization', async () => {
    expect((await call(server, 'GET', PATH)).status).toBe(401);
    expect((await call(server, 'POST', PATH, { body: {} })).status).toBe(401);
    expect((await call(server, 'POST', PATH, { token: viewer.token, body: { model: 'x' } })).status).toBe(
      403,
    );
    expect((await call(server, 'POST', PATH, { token: editor.token, body: { model: 'x' } })).status).toBe(
      403,
    );
    expect((await call(server, 'GET', PATH, { token: superAdmin })).status).toBe(403);
  });
});

describe('LLM mode', () => {
  it('is readable by any user and set by the super admin, which resets the manager', async () => {
    const read = await call(server, 'GET', '/api/admin/get-llm-mode', { token: viewer.token });
    expect(read.status).toBe(200);
    expect(read.body).toMatchObject({ mode: 'offline', available_modes: ['offline', 'openai'] });

    const generation = llmManager.generation;
    const set = await call(server, 'POST', '/api/admin/set-llm-mode', {
      token: superAdmin,
      body: { mode: 'openai' },
    });
    expect(set.status).toBe(200);
    expect(set.body).toMatchObject({ mode: 'openai', previous_mode: 'offline' });
    expect(llmManager.generation).toBeGreaterThan(generation);
    expect((await call(server, 'GET', '/api/admin/get-llm-mode', { token: viewer.token })).body.mode).toBe(
      'openai',
    );
    const back = await call(server, 'POST', '/api/admin/set-llm-mode', {
      token: superAdmin,
      body: { mode: 'offline' },
    });
    expect(back.body).toMatchObject({ mode: 'offline', previous_mode: 'openai' });
  });

  it('guards: 401, 403 for an organization admin, 400 for an unknown mode', async () => {
    expect((await call(server, 'GET', '/api/admin/get-llm-mode')).status).toBe(401);
    expect((await call(server, 'POST', '/api/admin/set-llm-mode', { body: { mode: 'openai' } })).status).toBe(
      401,
    );
    const refused = await call(server, 'POST', '/api/admin/set-llm-mode', {
      token: tenant.admin.token,
      body: { mode: 'openai' },
    });
    expect(refused.status).toBe(403);
    const temporary = await tenant.addUser(['viewer'], { mustChangePassword: true });
    expect((await call(server, 'GET', '/api/admin/get-llm-mode', { token: temporary.token })).status).toBe(
      403,
    );
    const bad = await call(server, 'POST', '/api/admin/set-llm-mode', {
      token: superAdmin,
      body: { mode: 'gpt' },
    });
    expect(bad.status).toBe(400);
    expect(llmManager.mode).toBe('offline');
  });

  it('starts from LLM_MODE', async () => {
    expect(() => loadEnv({ LLM_MODE: 'gpt' })).toThrow(/LLM_MODE/);
    const other = await startTestServer({ LLM_MODE: 'openai' });
    try {
      expect(
        (await call(other, 'GET', '/api/admin/get-llm-mode', { token: await superAdminToken(other) })).body
          .mode,
      ).toBe('openai');
    } finally {
      await other.close();
      llmManager.setMode('offline');
    }
  });
});
