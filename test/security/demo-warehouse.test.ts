import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect, type Socket } from 'node:net';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDemoWarehouse, type DemoWarehouse } from '../../src/warehouse/demo.ts';
import { createLogger } from '../../src/logger.ts';
import { until } from '../helpers/api.ts';

/*
 * The embedded mode's demo warehouse (a second PGlite) trusts every client of its socket server, so
 * that server listens only on a Unix socket in an owner-only directory, behind a front on 127.0.0.1
 * that asks for the password written to credentials.txt.
 */
let dataDir: string;
let demo: DemoWarehouse;

beforeAll(async () => {
  dataDir = mkdtempSync(join(tmpdir(), 'dimas-demo-'));
  demo = await startDemoWarehouse({ dataDir, logger: createLogger({ level: 'silent' }) });
}, 120_000);

afterAll(async () => {
  await demo?.close();
  rmSync(dataDir, { recursive: true, force: true });
});

const client = (password: string) =>
  new pg.Client({ host: demo.host, port: demo.port, user: 'postgres', database: 'postgres', password });

describe('demo warehouse door', () => {
  it('refuses a wrong password and an unknown user gets no further', async () => {
    const wrong = client('not-the-password');
    await expect(wrong.connect()).rejects.toMatchObject({ code: '28P01' });
    await wrong.end().catch(() => undefined);
  });

  it('lets the password from credentials.txt in', async () => {
    const credentials = readFileSync(join(dataDir, 'credentials.txt'), 'utf8');
    const password = /demo warehouse: user postgres, password (\S+)/.exec(credentials)![1];
    expect(password).toBe(demo.password);
    const right = client(password);
    await right.connect();
    const { rows } = await right.query('select count(*)::int as n from shop.customers');
    expect(rows[0].n).toBeGreaterThan(0);
    await right.end();
  });

  it('keeps the trusting socket server in a directory only the owner may enter', () => {
    expect(statSync(join(dataDir, 'warehouse-socket')).mode & 0o777).toBe(0o700);
    expect(statSync(join(dataDir, 'warehouse.password')).mode & 0o777).toBe(0o600);
    expect(demo.sourceConfig.password).toBe(demo.password);
  });
});

/** A raw protocol client: whatever bytes a broken or hostile client might send. */
function message(type: string, body: string | Buffer): Buffer {
  const payload = typeof body === 'string' ? Buffer.from(body) : body;
  const head = Buffer.alloc(5);
  head.write(type, 0);
  head.writeInt32BE(payload.length + 4, 1);
  return Buffer.concat([head, payload]);
}

async function rawSession(): Promise<{ socket: Socket; received: () => string; closed: Promise<void> }> {
  const socket = connect(demo.port, demo.host);
  let text = '';
  socket.on('data', (chunk) => (text += chunk.toString('latin1')));
  socket.on('error', () => undefined);
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  await new Promise((resolve) => socket.once('connect', resolve));
  const params = Buffer.from('user\0postgres\0database\0postgres\0\0');
  const startup = Buffer.alloc(8);
  startup.writeInt32BE(8 + params.length, 0);
  startup.writeInt32BE(196608, 4);
  socket.write(Buffer.concat([startup, params]));
  await untilReceived('the password request', () => text, 'R\0\0\0\x08\0\0\0\x03');
  socket.write(message('p', `${demo.password}\0`));
  await untilReceived('ready for a query', () => text, 'Z\0\0\0\x05I');
  text = '';
  return { socket, received: () => text, closed };
}

/** Waits for the raw protocol bytes `received` holds to include `expected`. */
const untilReceived = (what: string, received: () => string, expected: string) =>
  until(
    what,
    async () => received(),
    (text) => text.includes(expected),
    10_000,
    20,
  );

async function othersStillServed(): Promise<void> {
  const other = new pg.Client({
    host: demo.host,
    port: demo.port,
    user: 'postgres',
    database: 'postgres',
    password: demo.password,
    connectionTimeoutMillis: 5000,
    query_timeout: 5000,
  });
  other.on('error', () => undefined);
  await other.connect();
  const { rows } = await other.query('select count(*)::int as n from shop.customers');
  expect(rows[0].n).toBeGreaterThan(0);
  await other.end();
}

describe('a client that breaks the protocol loses only its own connection', () => {
  it('refuses COPY FROM STDIN with an error to that client, whose connection goes on', async () => {
    const { socket, received } = await rawSession();
    socket.write(message('Q', 'create temp table copied(x text); copy copied from stdin\0'));
    await untilReceived('ready for a query', received, 'Z\0\0\0\x05');
    expect(received()).toContain('C0A000');
    expect(received()).toContain('COPY FROM is not supported by the demo warehouse');
    // Whatever the client sends as COPY data afterwards is not COPY data to anyone.
    socket.write(message('d', 'a line\n'));
    socket.write(message('c', ''));
    socket.write(message('Q', 'select 42 as answer\0'));
    await untilReceived('the answer', received, 'SELECT 1');
    socket.destroy();
    await othersStillServed();
  });

  it('refuses COPY FROM through the extended protocol, answering after its Sync', async () => {
    const { socket, received } = await rawSession();
    socket.write(
      Buffer.concat([
        message('P', '\0copy shop.customers from stdin\0\0\0'),
        message('B', '\0\0\0\0\0\0\0'),
        message('E', '\0\0\0\0\0'),
        message('S', ''),
      ]),
    );
    await untilReceived('ready for a query', received, 'Z\0\0\0\x05');
    expect(received()).toContain('C0A000');
    socket.destroy();
    await othersStillServed();
  });

  it('drops a client whose message framing is broken, and serves the next one at once', async () => {
    const { socket, closed } = await rawSession();
    socket.write(Buffer.from([0x51, 0xff, 0xff, 0xff, 0xff, 0x41]));
    await closed;
    await othersStillServed();
  });

  it('serves the next client after one leaves in the middle of a message', async () => {
    const { socket } = await rawSession();
    const head = Buffer.alloc(5);
    head.write('Q', 0);
    head.writeInt32BE(1000, 1);
    socket.write(Buffer.concat([head, Buffer.from('select ')]));
    await new Promise((resolve) => setTimeout(resolve, 100));
    socket.destroy();
    await othersStillServed();
  });
});
