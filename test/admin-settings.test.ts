import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EntityManager } from '@mikro-orm/postgresql';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, superAdminToken, type Tenant, type TestUser } from './helpers/api.ts';
import { namedCache } from '../src/cache.ts';
import { isFeatureEnabled } from '../src/features.ts';

let server: TestServer;
let a: Tenant;
let b: Tenant;
let viewer: TestUser;
let editor: TestUser;
let otherViewer: TestUser;

beforeAll(async () => {
  server = await startTestServer();
  [a, b] = [await createTenant(server), await createTenant(server)];
  viewer = await a.addUser(['viewer']);
  editor = await a.addUser(['editor']);
  otherViewer = await b.addUser(['viewer']);
});
afterAll(async () => server?.close());

const em = () => server.deps.orm.em.fork() as EntityManager;
const cacheOf = (body: any, name: string) => body.caches.find((c: any) => c.name === name);
const featureOf = (body: any, name: string) => body.features.find((f: any) => f.name === name);

describe('cache settings', () => {
  it('lists every cache with its defaults to any signed-in user', async () => {
    const res = await call(server, 'GET', '/api/admin/cache-settings', { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body.caches.map((c: any) => c.name)).toEqual(
      expect.arrayContaining(['requests', 'mappings', 'introspection', 'llm_responses']),
    );
    const mappings = cacheOf(res.body, 'mappings');
    expect(mappings).toMatchObject({ enabled: true, entries: 0 });
    expect(mappings.defaults).toEqual({
      enabled: mappings.enabled,
      ttl_seconds: mappings.ttl_seconds,
      max_entries: mappings.max_entries,
    });
    expect(res.body.updated_at).toBeNull();
  });

  it('refuses callers without credentials or without settings.manage', async () => {
    expect((await call(server, 'GET', '/api/admin/cache-settings')).status).toBe(401);
    const body = { caches: { mappings: { ttl_seconds: 10 } } };
    expect((await call(server, 'POST', '/api/admin/cache-settings', { body })).status).toBe(401);
    for (const user of [viewer, editor]) {
      const res = await call(server, 'POST', '/api/admin/cache-settings', { token: user.token, body });
      expect(res.status).toBe(403);
      expect(res.body.code).toBe('FORBIDDEN');
    }
  });

  it('answers 400 for unknown caches and bad values', async () => {
    for (const body of [
      { caches: { nope: { enabled: false } } },
      { caches: { mappings: { ttl_seconds: -1 } } },
      { caches: { mappings: { enabled: 'yes' } } },
      { caches: { mappings: { colour: 'red' } } },
      { clear: ['nope'] },
    ]) {
      const res = await call(server, 'POST', '/api/admin/cache-settings', { token: a.admin.token, body });
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(res.body.code).toBe('BAD_REQUEST');
      expect(res.body.issues.length).toBeGreaterThan(0);
    }
  });

  it('clears a cache switched off or on, keeps it for other changes, and never touches another tenant', async () => {
    const cache = namedCache<string>('mappings');
    const scopeA = { em: em(), organizationId: a.organization.id };
    const scopeB = { em: em(), organizationId: b.organization.id };
    await cache.set(scopeA, 'k1', 'v1');
    await cache.set(scopeB, 'k1', 'other tenant');
    let res = await call(server, 'GET', '/api/admin/cache-settings', { token: a.admin.token });
    expect(cacheOf(res.body, 'mappings').entries).toBe(1);

    res = await call(server, 'POST', '/api/admin/cache-settings', {
      token: a.admin.token,
      body: { caches: { mappings: { ttl_seconds: 120 } } },
    });
    expect(res.status).toBe(200);
    expect(res.body.cleared).toEqual([]);
    expect(cacheOf(res.body, 'mappings')).toMatchObject({ ttl_seconds: 120, enabled: true, entries: 1 });
    expect(await cache.get(scopeA, 'k1')).toBe('v1');

    res = await call(server, 'POST', '/api/admin/cache-settings', {
      token: a.admin.token,
      body: { caches: { mappings: { enabled: false } } },
    });
    expect(res.status).toBe(200);
    expect(res.body.cleared).toEqual(['mappings']);
    expect(cacheOf(res.body, 'mappings')).toMatchObject({ enabled: false, ttl_seconds: 120, entries: 0 });
    expect(new Date(res.body.updated_at).getTime()).toBeGreaterThan(Date.now() - 60_000);

    // Off means off: nothing is stored and every read goes to the loader.
    let loads = 0;
    const load = async () => `loaded ${++loads}`;
    expect(await cache.getOrLoad(scopeA, 'k2', load)).toBe('loaded 1');
    expect(await cache.getOrLoad(scopeA, 'k2', load)).toBe('loaded 2');
    expect(cache.size(a.organization.id)).toBe(0);

    // The other organization kept its entry and its own (default) settings.
    expect(await cache.get(scopeB, 'k1')).toBe('other tenant');
    const other = await call(server, 'GET', '/api/admin/cache-settings', { token: b.admin.token });
    expect(cacheOf(other.body, 'mappings')).toMatchObject({ enabled: true, entries: 1 });

    res = await call(server, 'POST', '/api/admin/cache-settings', {
      token: a.admin.token,
      body: { caches: { mappings: { enabled: true } } },
    });
    expect(res.body.cleared).toEqual(['mappings']);
    expect(await cache.getOrLoad(scopeA, 'k2', load)).toBe('loaded 3');
    expect(await cache.getOrLoad(scopeA, 'k2', load)).toBe('loaded 3');

    // The saved settings are what GET answers afterwards.
    res = await call(server, 'GET', '/api/admin/cache-settings', { token: viewer.token });
    expect(cacheOf(res.body, 'mappings')).toMatchObject({ enabled: true, ttl_seconds: 120, entries: 1 });
  });

  it('clears on request and applies size and time limits', async () => {
    const cache = namedCache<number>('introspection');
    const scope = { em: em(), organizationId: a.organization.id };
    let res = await call(server, 'POST', '/api/admin/cache-settings', {
      token: a.admin.token,
      body: { caches: { introspection: { max_entries: 2, ttl_seconds: 1 } } },
    });
    expect(res.status).toBe(200);
    await cache.set(scope, 'one', 1);
    await cache.set(scope, 'two', 2);
    await cache.get(scope, 'one'); // now the most recently used
    await cache.set(scope, 'three', 3);
    expect(await cache.get(scope, 'two')).toBeUndefined();
    expect(await cache.get(scope, 'one')).toBe(1);
    expect(await cache.get(scope, 'three')).toBe(3);

    res = await call(server, 'POST', '/api/admin/cache-settings', {
      token: a.admin.token,
      body: { clear: ['introspection'] },
    });
    expect(res.body.cleared).toEqual(['introspection']);
    expect(cacheOf(res.body, 'introspection')).toMatchObject({ entries: 0, max_entries: 2 });

    await cache.set(scope, 'short', 1);
    expect(await cache.get(scope, 'short')).toBe(1);
    await new Promise((r) => setTimeout(r, 1100));
    expect(await cache.get(scope, 'short')).toBeUndefined();
  });

  it('does not cache for callers outside an organization', async () => {
    const cache = namedCache<string>('requests');
    await cache.set({ em: em(), organizationId: null }, 'x', 'y');
    expect(await cache.get({ em: em(), organizationId: null }, 'x')).toBeUndefined();
  });
});

describe('feature settings', () => {
  it('lists the catalogue with defaults and effective values', async () => {
    const res = await call(server, 'GET', '/api/admin/feature-settings', { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body.features.map((f: any) => f.name)).toEqual(
      expect.arrayContaining(['llm_matching', 'identity_resolution', 'audience_exports', 'vcs_push']),
    );
    expect(featureOf(res.body, 'llm_matching')).toMatchObject({
      default: true,
      user_overridable: true,
      organization_value: null,
      enabled: true,
    });
    expect(featureOf(res.body, 'vcs_push').user_overridable).toBe(false);
    expect(res.body.allow_user_overrides).toBe(true);
  });

  it('saves organization values, and null returns a feature to its default', async () => {
    let res = await call(server, 'POST', '/api/admin/feature-settings', {
      token: a.admin.token,
      body: { features: { audience_exports: false, identity_resolution: false } },
    });
    expect(res.status).toBe(200);
    expect(featureOf(res.body, 'audience_exports')).toMatchObject({
      organization_value: false,
      enabled: false,
    });
    res = await call(server, 'POST', '/api/admin/feature-settings', {
      token: a.admin.token,
      body: { features: { identity_resolution: null } },
    });
    expect(featureOf(res.body, 'identity_resolution')).toMatchObject({
      organization_value: null,
      enabled: true,
    });
    expect(featureOf(res.body, 'audience_exports').enabled).toBe(false);
    const other = await call(server, 'GET', '/api/admin/feature-settings', { token: b.admin.token });
    expect(featureOf(other.body, 'audience_exports').enabled).toBe(true);
  });

  it('refuses callers and bad input', async () => {
    const body = { features: { llm_matching: false } };
    expect((await call(server, 'GET', '/api/admin/feature-settings')).status).toBe(401);
    expect((await call(server, 'POST', '/api/admin/feature-settings', { body })).status).toBe(401);
    expect(
      (await call(server, 'POST', '/api/admin/feature-settings', { token: viewer.token, body })).status,
    ).toBe(403);
    expect(
      (await call(server, 'POST', '/api/admin/feature-settings', { token: editor.token, body })).status,
    ).toBe(403);
    for (const bad of [
      { features: { teleport: true } },
      { features: { llm_matching: 'off' } },
      { features: 3 },
    ]) {
      const res = await call(server, 'POST', '/api/admin/feature-settings', {
        token: a.admin.token,
        body: bad,
      });
      expect(res.status, JSON.stringify(bad)).toBe(400);
    }
  });
});

describe('user feature overrides', () => {
  it('says who may override', async () => {
    let res = await call(server, 'GET', '/api/admin/user-feature-access', { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ has_access: true, reason: null, organization_id: a.organization.id });
    expect(res.body.overridable_features).toContain('llm_matching');
    expect(res.body.overridable_features).not.toContain('vcs_push');
    res = await call(server, 'GET', '/api/admin/user-feature-access', {
      token: await superAdminToken(server),
    });
    expect(res.body).toMatchObject({ has_access: false, organization_id: null });
    expect((await call(server, 'GET', '/api/admin/user-feature-access')).status).toBe(401);
  });

  it('applies default → organization → user, for the user only', async () => {
    await call(server, 'POST', '/api/admin/feature-settings', {
      token: a.admin.token,
      body: { features: { llm_matching: false } },
    });
    let res = await call(server, 'GET', '/api/admin/user-feature-overrides', { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ user_id: viewer.id, organization_id: a.organization.id, overrides: {} });
    expect(featureOf(res.body, 'llm_matching')).toMatchObject({
      organization_value: false,
      user_value: null,
      enabled: false,
    });

    res = await call(server, 'POST', '/api/admin/user-feature-overrides', {
      token: viewer.token,
      body: { overrides: { llm_matching: true } },
    });
    expect(res.status).toBe(200);
    expect(res.body.overrides).toEqual({ llm_matching: true });
    expect(featureOf(res.body, 'llm_matching')).toMatchObject({ user_value: true, enabled: true });

    // What other areas read through isFeatureEnabled follows the same order.
    const principalOf = async (token: string) =>
      (await server.deps.authenticator.authenticate({ em: em() }, token))!;
    expect(
      await isFeatureEnabled({ em: em(), principal: await principalOf(viewer.token) }, 'llm_matching'),
    ).toBe(true);
    expect(
      await isFeatureEnabled({ em: em(), principal: await principalOf(editor.token) }, 'llm_matching'),
    ).toBe(false);
    expect(
      await isFeatureEnabled({ em: em(), principal: await principalOf(otherViewer.token) }, 'llm_matching'),
    ).toBe(true);

    // The organization's view is unchanged.
    const org = await call(server, 'GET', '/api/admin/feature-settings', { token: viewer.token });
    expect(featureOf(org.body, 'llm_matching').enabled).toBe(false);

    res = await call(server, 'DELETE', '/api/admin/user-feature-overrides', { token: viewer.token });
    expect(res.status).toBe(200);
    expect(res.body.overrides).toEqual({});
    expect(featureOf(res.body, 'llm_matching').enabled).toBe(false);
  });

  it('refuses features that are not overridable, unknown features and bad bodies', async () => {
    let res = await call(server, 'POST', '/api/admin/user-feature-overrides', {
      token: viewer.token,
      body: { overrides: { vcs_push: false } },
    });
    expect(res.status).toBe(403);
    expect(res.body.message).toMatch(/vcs_push/);
    res = await call(server, 'POST', '/api/admin/user-feature-overrides', {
      token: viewer.token,
      body: { overrides: { teleport: true } },
    });
    expect(res.status).toBe(400);
    res = await call(server, 'POST', '/api/admin/user-feature-overrides', { token: viewer.token, body: {} });
    expect(res.status).toBe(400);
    for (const method of ['GET', 'POST', 'DELETE'])
      expect(
        (
          await call(server, method, '/api/admin/user-feature-overrides', {
            body: method === 'POST' ? { overrides: {} } : undefined,
          })
        ).status,
      ).toBe(401);
  });

  it('stays inside the caller organization', async () => {
    // Naming another organization is refused outright.
    let res = await call(server, 'POST', '/api/admin/user-feature-overrides', {
      token: a.admin.token,
      body: { organization_id: b.organization.id, overrides: { llm_matching: false } },
    });
    expect(res.status).toBe(403);
    res = await call(server, 'GET', '/api/admin/user-feature-overrides', {
      token: a.admin.token,
      query: { organization_id: b.organization.id },
    });
    expect(res.status).toBe(403);
    // Another organization's user is unknown here, even to an organization admin.
    for (const method of ['GET', 'POST', 'DELETE']) {
      res = await call(server, method, '/api/admin/user-feature-overrides', {
        token: a.admin.token,
        query: method === 'POST' ? undefined : { user_id: otherViewer.id },
        body: method === 'POST' ? { user_id: otherViewer.id, overrides: { llm_matching: false } } : undefined,
      });
      expect(res.status, method).toBe(404);
    }
    const untouched = await call(server, 'GET', '/api/admin/user-feature-overrides', {
      token: otherViewer.token,
    });
    expect(untouched.body.overrides).toEqual({});
    // A super admin acts inside no organization.
    res = await call(server, 'GET', '/api/admin/user-feature-overrides', {
      token: await superAdminToken(server),
    });
    expect(res.status).toBe(403);
  });

  it("lets an organization admin manage a member's overrides, and only an admin", async () => {
    let res = await call(server, 'POST', '/api/admin/user-feature-overrides', {
      token: viewer.token,
      body: { user_id: editor.id, overrides: { llm_hypotheses: false } },
    });
    expect(res.status).toBe(403);
    res = await call(server, 'POST', '/api/admin/user-feature-overrides', {
      token: a.admin.token,
      body: { user_id: editor.id, organization_id: a.organization.id, overrides: { llm_hypotheses: false } },
    });
    expect(res.status).toBe(200);
    expect(res.body.user_id).toBe(editor.id);
    res = await call(server, 'GET', '/api/admin/user-feature-overrides', { token: editor.token });
    expect(res.body.overrides).toEqual({ llm_hypotheses: false });
    expect(featureOf(res.body, 'llm_hypotheses').enabled).toBe(false);
  });

  it('stops applying overrides when the organization disallows them', async () => {
    await call(server, 'POST', '/api/admin/user-feature-overrides', {
      token: viewer.token,
      body: { overrides: { llm_matching: true } },
    });
    let res = await call(server, 'POST', '/api/admin/feature-settings', {
      token: a.admin.token,
      body: { allow_user_overrides: false },
    });
    expect(res.body.allow_user_overrides).toBe(false);
    res = await call(server, 'GET', '/api/admin/user-feature-access', { token: viewer.token });
    expect(res.body).toMatchObject({ has_access: false, reason: expect.stringMatching(/does not allow/) });
    res = await call(server, 'GET', '/api/admin/user-feature-overrides', { token: viewer.token });
    expect(featureOf(res.body, 'llm_matching')).toMatchObject({ user_value: true, enabled: false });
    res = await call(server, 'POST', '/api/admin/user-feature-overrides', {
      token: viewer.token,
      body: { overrides: { llm_matching: true } },
    });
    expect(res.status).toBe(403);
    await call(server, 'POST', '/api/admin/feature-settings', {
      token: a.admin.token,
      body: { allow_user_overrides: true },
    });
  });
});
