import { connect, createServer, type AddressInfo, type Socket } from 'node:net';

export interface TcpProxy {
  /** The target URL with its host and port replaced by the proxy's. */
  url: string;
  /** The database vanishes: open connections are destroyed and new ones reset at once. */
  cut(): void;
  /** Connections pass again (on the same port, so clients reconnect to the same URL). */
  restore(): void;
  close(): Promise<void>;
  /** Everything clients sent through the proxy so far (latin1), when started with `record`. */
  sent(): string;
  /** The database's answers wait in the proxy (connections stay open) until `release`. */
  hold(): void;
  release(): void;
}

/**
 * A TCP relay in front of a PostgreSQL server, so a test can make the database vanish for one
 * dimas server and come back (the shared PostgreSQL server must stay up for every other test), or
 * see what a dimas server sent to it.
 */
export async function startTcpProxy(target: URL, options: { record?: boolean } = {}): Promise<TcpProxy> {
  const sockets = new Set<Socket>();
  const recorded: Buffer[] = [];
  let open = true;
  let holding = false;
  const held: (() => void)[] = [];
  const relay = createServer((client) => {
    client.on('error', () => {});
    if (!open) {
      client.resetAndDestroy();
      return;
    }
    const upstream = connect(Number(target.port || 5432), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', () => {});
      s.on('close', () => {
        sockets.delete(s);
        // Either side gone: the other follows, as a real network failure would show it.
        client.destroy();
        upstream.destroy();
      });
    }
    if (options.record) client.on('data', (chunk: Buffer) => recorded.push(chunk));
    client.pipe(upstream);
    upstream.on('data', (chunk: Buffer) => {
      if (!holding) {
        client.write(chunk);
        return;
      }
      upstream.pause();
      held.push(() => {
        client.write(chunk);
        upstream.resume();
      });
    });
  });
  await new Promise<void>((resolve) => relay.listen(0, '127.0.0.1', resolve));
  const url = new URL(target);
  url.hostname = '127.0.0.1';
  url.port = String((relay.address() as AddressInfo).port);
  const destroyAll = () => {
    for (const s of sockets) s.destroy();
  };
  return {
    url: url.toString(),
    cut() {
      open = false;
      destroyAll();
    },
    restore() {
      open = true;
    },
    close() {
      open = false;
      destroyAll();
      return new Promise((resolve) => relay.close(() => resolve()));
    },
    hold() {
      holding = true;
    },
    release() {
      holding = false;
      for (const pass of held.splice(0)) pass();
    },
    sent() {
      if (!options.record) throw new Error('this proxy was started without record');
      return Buffer.concat(recorded).toString('latin1');
    },
  };
}
