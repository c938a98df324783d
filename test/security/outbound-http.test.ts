import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../src/app-error.ts';
import { OutboundHttp, outboundFailure } from '../../src/outbound-http.ts';
import { DEFAULT_BLOCKED_NETWORKS, parseNetworkList } from '../../src/warehouse/network-guard.ts';
import { call, createTenant, type Tenant } from '../helpers/api.ts';
import { startTestServer, type TestServer } from '../helpers/server.ts';

/*
 * HTTP requests to tenant-chosen addresses (webhooks, git remotes, the LLM endpoint) reach only the
 * networks the operator allows: decided on the address each connection really goes to, so neither an
 * unusual spelling, a host name nor a redirect leads into a blocked network.
 */

/** The cloud metadata address (169.254.169.254) as a URL host, written every way a URL parser accepts. */
const METADATA_SPELLINGS = [
  '169.254.169.254',
  '2852039166',
  '0xa9fea9fe',
  '0251.0376.0251.0376',
  '169.254.43518',
  '[::ffff:169.254.169.254]',
  '[::ffff:a9fe:a9fe]',
  '[0:0:0:0:0:ffff:a9fe:a9fe]',
  '[fd00:ec2::254]',
  '100.100.100.200',
  '169.254.0.1',
  '[fe80::1]',
];

async function listen(handler: (req: IncomingMessage, res: ServerResponse) => void) {
  const server: Server = createServer(handler);
  server.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  return { server, port: (server.address() as AddressInfo).port };
}

async function refusalOf(promise: Promise<unknown>) {
  const error = await promise.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error, 'expected the request to be refused').not.toBeNull();
  return outboundFailure(error);
}

describe('outbound requests go only to allowed networks', () => {
  const defaults = new OutboundHttp(parseNetworkList(DEFAULT_BLOCKED_NETWORKS.join(',')));
  // Loopback blocked: lets a test see a refusal of a name and of a redirect on this machine.
  const noLoopback = new OutboundHttp(parseNetworkList('127.0.0.0/8, ::1/128'));

  it.each(METADATA_SPELLINGS)('refuses %s before connecting, however it is written', async (host) => {
    const failure = await refusalOf(defaults.fetch(`http://${host}/latest/meta-data/`));
    expect(failure).toMatchObject({ blocked: true });
    expect(failure.message).toContain('OUTBOUND_BLOCKED_NETWORKS');
    const saved = await defaults.checkDestination(`https://${host}/hook`, 'The webhook URL').catch((e) => e);
    expect(saved).toBeInstanceOf(AppError);
    expect(saved.details.reason).toBe('BLOCKED_NETWORK');
  });

  it('checks the address a host name resolves to, at connection time', async () => {
    const { server, port } = await listen((_req, res) => res.end('ok'));
    try {
      // The same listener through an allowed guard answers: only the guard differs.
      expect(await (await defaults.fetch(`http://localhost:${port}/`)).text()).toBe('ok');
      const failure = await refusalOf(noLoopback.fetch(`http://localhost:${port}/`));
      expect(failure.blocked).toBe(true);
      expect(failure.message).toMatch(/localhost \((127\.0\.0\.1|::1)\)/);
      await expect(noLoopback.checkDestination(`http://localhost:${port}/`, 'The URL')).rejects.toThrow(
        /OUTBOUND_BLOCKED_NETWORKS/,
      );
    } finally {
      server.close();
    }
  });

  it('refuses a redirect into a blocked network; the target never sees the request', async () => {
    let reachedTarget = 0;
    const target = await listen((_req, res) => {
      reachedTarget++;
      res.end('secret');
    });
    // The redirecting host is allowed (127.0.0.1); the address it sends the client to is not.
    const guard = new OutboundHttp(parseNetworkList('127.0.0.2/32'));
    const redirector = await listen((_req, res) =>
      res.writeHead(302, { location: `http://127.0.0.2:${target.port}/` }).end(),
    );
    try {
      const failure = await refusalOf(guard.fetch(`http://127.0.0.1:${redirector.port}/`));
      expect(failure).toMatchObject({ blocked: true });
      expect(reachedTarget).toBe(0);
    } finally {
      target.server.close();
      redirector.server.close();
    }
  });

  it('refuses URLs that are not http(s) when they are saved', async () => {
    for (const url of ['file:///etc/passwd', 'gopher://127.0.0.1:70/', 'not a url'])
      await expect(defaults.checkDestination(url, 'The webhook URL')).rejects.toMatchObject({
        code: 'BAD_REQUEST',
      });
  });
});

describe('settings that point at a blocked network are refused when saved', () => {
  let server: TestServer;
  let tenant: Tenant;

  beforeAll(async () => {
    server = await startTestServer();
    tenant = await createTenant(server);
  });
  afterAll(async () => {
    await server?.close();
  });

  it.each(['169.254.169.254', '[::ffff:a9fe:a9fe]', '2852039166'])(
    'version-control remote and its connection test at %s answer 422 BLOCKED_NETWORK',
    async (host) => {
      const body = {
        url: `https://${host}/org/repo.git`,
        branch: 'main',
        author_name: 'Dimas Bot',
        author_email: 'bot@example.com',
        path_prefix: 'dimas',
        token: 'a-token',
      };
      for (const path of ['/api/admin/vcs-config', '/api/admin/vcs-test']) {
        const res = await call(server, 'POST', path, { token: tenant.admin.token, body });
        expect(res.status, `${path} ${JSON.stringify(res.body)}`).toBe(422);
        expect(res.body.reason).toBe('BLOCKED_NETWORK');
      }
      const read = await call(server, 'GET', '/api/admin/vcs-config', { token: tenant.admin.token });
      expect(read.body.configured).toBe(false);
    },
  );

  it('an LLM base_url in a blocked network answers 422 and leaves the parameters as they were', async () => {
    const res = await call(server, 'POST', '/api/admin/llm-parameters', {
      token: tenant.admin.token,
      body: { base_url: 'http://[fd00:ec2::254]/v1' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(422);
    expect(res.body.reason).toBe('BLOCKED_NETWORK');
    const read = await call(server, 'GET', '/api/admin/llm-parameters', { token: tenant.admin.token });
    expect(read.body.base_url).not.toContain('fd00');
  });
});
