import SwaggerParser from '@apidevtools/swagger-parser';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call } from './helpers/api.ts';

let server: TestServer;

beforeAll(async () => {
  server = await startTestServer();
});
afterAll(async () => server?.close());

const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'options', 'head', 'trace'];

describe('OpenAPI document', () => {
  it('is a valid OpenAPI 3.1 document', async () => {
    const res = await call(server, 'GET', '/api/openapi.json');
    expect(res.status).toBe(200);
    expect(res.body.openapi).toMatch(/^3\.1\./);
    await expect(SwaggerParser.validate(structuredClone(res.body))).resolves.toBeTruthy();
  });

  it('gives every operation a summary and tags, and guarded ones a security requirement', async () => {
    const doc = (await call(server, 'GET', '/api/openapi.json')).body;
    const problems: string[] = [];
    let count = 0;
    for (const [path, item] of Object.entries<Record<string, any>>(doc.paths))
      for (const [method, op] of Object.entries<any>(item)) {
        if (!METHODS.includes(method)) continue;
        count++;
        if (!op.summary) problems.push(`${method} ${path}: no summary`);
        if (!op.tags?.length) problems.push(`${method} ${path}: no tags`);
      }
    expect(problems).toEqual([]);
    expect(count).toBeGreaterThanOrEqual(40);
    expect(doc.paths['/api/auth/session'].get.security?.length).toBeGreaterThan(0);
    expect(doc.paths['/api/auth/login'].post.security ?? []).toEqual([]);
  });

  it('names the real media type of the streamed answers', async () => {
    const doc = (await call(server, 'GET', '/api/openapi.json')).body;
    const typesOf = (path: string, method: string) =>
      Object.keys(doc.paths[path][method].responses['200'].content);
    expect(typesOf('/api/workspaces/discover', 'post')).toEqual(['text/event-stream']);
    expect(typesOf('/api/auth/admin/logs/download', 'get')).toEqual(['application/gzip']);
    expect(typesOf('/api/workspaces/{workspace_name}/download', 'get')).toEqual(['application/zip']);
    expect(typesOf('/api/auth/session', 'get')).toEqual(['application/json']);
  });
});

describe('API reference page', () => {
  it('serves HTML whose scripts and styles all come from this server', async () => {
    const res = await fetch(new URL('/api/docs', server.url));
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/text\/html/);
    const html = await res.text();
    expect(html).not.toMatch(/https?:\/\//);
    const assets = [...html.matchAll(/<(?:script|link)\b[^>]*\b(?:src|href)="([^"]+)"/g)].map((m) => m[1]);
    expect(assets.some((a) => a.endsWith('.js'))).toBe(true);
    expect(assets.some((a) => a.endsWith('.css'))).toBe(true);
    for (const asset of assets) {
      const url = new URL(asset, res.url);
      expect(url.origin, asset).toBe(new URL(server.url).origin);
      const got = await fetch(url);
      expect(got.status, asset).toBe(200);
      expect((await got.arrayBuffer()).byteLength, asset).toBeGreaterThan(0);
    }
  });

  it('points the UI at this server’s OpenAPI document', async () => {
    const html = await (await fetch(new URL('/api/docs', server.url))).text();
    const scripts = [...html.matchAll(/<script\b[^>]*\bsrc="([^"]+)"/g)].map((m) => m[1]);
    const bodies = await Promise.all(scripts.map(async (s) => (await fetch(new URL(s, server.url))).text()));
    expect(bodies.some((b) => b.includes("'/api/openapi.json'") || b.includes('"/api/openapi.json"'))).toBe(
      true,
    );
    // The page's own policy forbids scripts from anywhere else.
    const csp = (await fetch(new URL('/api/docs', server.url))).headers.get('content-security-policy');
    expect(csp).toMatch(/script-src 'self'/);
  });
});
