import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser } from 'playwright-core';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { createTenant, createWorkspace, unique, type Tenant } from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';
import { TEST_PASSWORD } from './helpers/constants.ts';
import { browserMissing, bundleForBrowser, launchChromium, nonLoopbackAddress } from './helpers/browser.ts';

/*
 * The client entry in a real browser: bundled by esbuild, loaded by headless Chromium from the
 * server's origin, it logs in and follows a discovery through httpSubscriptionLink, whose EventSource
 * can only authenticate through connectionParams.
 */
const source = scratchDatabase('brws');
let server: TestServer;
let tenant: Tenant;
let browser: Browser;

const title = browserMissing ? `in headless Chromium (skipped: ${browserMissing})` : 'in headless Chromium';

describe.skipIf(browserMissing)(title, () => {
  beforeAll(async () => {
    await source.create();
    await source.sql(`create schema crm;
      create table crm.customers (id integer primary key, email text, first_name text, country text);
      insert into crm.customers select g, 'user' || g || '@example.com', 'name' || g, 'FR'
        from generate_series(1, 20) g;`);
    server = await startTestServer();
    tenant = await createTenant(server);
    browser = await launchChromium();
  });
  afterAll(async () => {
    await browser?.close();
    await server?.close();
    await source.drop();
  });

  it('the bundled client logs in, runs discovery over SSE and shows the events', async () => {
    const name = unique('brws');
    await createWorkspace(server, tenant.admin.token, {
      name,
      source_config: pgConfig(source.name, { schemas: ['crm'] }),
      target_schema: {
        name: 'people',
        tables: [
          {
            name: 'customers',
            primary_key: ['customer_id'],
            columns: [
              { name: 'customer_id', type: 'text', nullable: false },
              { name: 'email', type: 'text' },
              { name: 'first_name', type: 'text' },
            ],
          },
        ],
      },
    });

    const script = await bundleForBrowser(
      fileURLToPath(new URL('./browser/discovery-page.ts', import.meta.url)),
    );
    // Neither the server nor the page may have leaked into the bundle: only the client and its libraries.
    expect(script).not.toMatch(/mikro-orm|pg-boss|express/i);
    const page = await browser.newPage();
    const pageErrors: string[] = [];
    page.on('pageerror', (error) => pageErrors.push(error.message));
    // Served from the API's origin, as a frontend deployed next to it would be.
    await page.route(`${server.url}/app/**`, (route) => {
      const path = new URL(route.request().url()).pathname;
      if (path === '/app/page.js') return route.fulfill({ contentType: 'text/javascript', body: script });
      return route.fulfill({
        contentType: 'text/html',
        body: `<!doctype html><html><body><p id="status">loading</p><ul id="events"></ul>
<script>window.DIMAS_TEST = ${JSON.stringify({
          username: tenant.admin.username,
          domain: tenant.organization.domain,
          password: TEST_PASSWORD,
        })};</script>
<script type="module" src="/app/page.js"></script></body></html>`,
      });
    });
    await page.goto(`${server.url}/app/index.html`);
    await page.waitForFunction(
      () => /^(done|failed)/.test(document.getElementById('status')?.textContent ?? ''),
      undefined,
      { timeout: 30_000 },
    );
    expect(await page.textContent('#status')).toBe('done');
    const types = await page.$$eval('#events li', (items) => items.map((i) => i.getAttribute('data-type')));
    expect(types[0]).toBe('started');
    expect(types).toContain('table_profiled');
    expect(types.at(-1)).toBe('completed');
    const suggestions = await page.$$eval('#events li[data-type="suggestion"]', (items) =>
      items.map((i) => i.textContent),
    );
    expect(suggestions).toContain('email ← crm.customers.email');
    expect(pageErrors).toEqual([]);
    await page.close();
  });
});

/*
 * /api/docs reached the way a colleague on the network reaches it: plain HTTP on the machine's LAN
 * address. Its CSP must not upgrade the page's own asset requests to https.
 */
const lanAddress = nonLoopbackAddress();
const docsSkip = browserMissing ?? (lanAddress ? null : 'this machine has no non-loopback IPv4 address');

describe.skipIf(docsSkip)(docsSkip ? `the API reference (skipped: ${docsSkip})` : 'the API reference', () => {
  let lan: TestServer;
  let docsBrowser: Browser;
  beforeAll(async () => {
    lan = await startTestServer({ HOST: '0.0.0.0', TRUST_PROXY: 'loopback' });
    docsBrowser = await launchChromium();
  });
  afterAll(async () => {
    await docsBrowser?.close();
    await lan?.close();
  });

  it('renders the operations over plain HTTP on a non-loopback address', async () => {
    const origin = `http://${lanAddress}:${new URL(lan.url).port}`;
    const page = await docsBrowser.newPage();
    const requested: string[] = [];
    const failed: string[] = [];
    page.on('request', (request) => requested.push(request.url()));
    page.on('requestfailed', (request) => failed.push(request.url()));
    const response = await page.goto(`${origin}/api/docs`);
    expect(response!.status()).toBe(200);
    expect(response!.headers()['content-security-policy']).not.toMatch(/upgrade-insecure-requests/);
    await page.waitForSelector('.opblock-summary-path', { timeout: 60_000 });
    const paths = await page.$$eval('.opblock-summary-path', (items) =>
      items.map((i) => i.getAttribute('data-path')),
    );
    expect(paths).toContain('/api/auth/login');
    expect(await page.textContent('.info .title')).toMatch(/dimas API/);
    expect(requested.every((url) => url.startsWith(`${origin}/`))).toBe(true);
    expect(failed).toEqual([]);
    await page.close();
  }, 90_000);

  it('keeps upgrade-insecure-requests when the page is served over HTTPS (behind a TLS proxy)', async () => {
    const plain = await fetch(`${lan.url}/api/docs`);
    const secure = await fetch(`${lan.url}/api/docs`, { headers: { 'x-forwarded-proto': 'https' } });
    expect(plain.headers.get('content-security-policy')).not.toMatch(/upgrade-insecure-requests/);
    expect(secure.headers.get('content-security-policy')).toMatch(/upgrade-insecure-requests/);
  });
});
