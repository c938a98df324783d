import { timingSafeEqual, createHash } from 'node:crypto';
import { connect, createServer, type Server, type Socket } from 'node:net';

/*
 * The demo warehouse's door. PGlite's socket server answers every startup as a trusted superuser, so
 * it listens only on a Unix socket in a directory of the data dir that only the owner may enter; this
 * TCP front on 127.0.0.1 asks each client for the password (PostgreSQL's cleartext password
 * exchange, fine on loopback), and only then joins it to that socket with the client's own startup
 * message. Each client gets a connection of its own behind the front.
 */

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;
const CANCEL_REQUEST = 80877102;
const MAX_STARTUP = 10_000;

function errorResponse(code: string, message: string): Buffer {
  const fields = Buffer.concat([Buffer.from(`SFATAL\0VFATAL\0C${code}\0M${message}\0`), Buffer.from([0])]);
  const head = Buffer.alloc(5);
  head.write('E', 0);
  head.writeInt32BE(fields.length + 4, 1);
  return Buffer.concat([head, fields]);
}

/** AuthenticationCleartextPassword. */
const PASSWORD_REQUEST = Buffer.from([0x52, 0, 0, 0, 8, 0, 0, 0, 3]);

const digest = (value: string) => createHash('sha256').update(value).digest();

/** Joins an authenticated client to its own connection of the socket server. */
function relay(client: Socket, backend: Socket, startup: Buffer, pending: Buffer) {
  backend.on('error', () => client.destroy());
  client.on('close', () => backend.destroy());
  backend.on('close', () => client.destroy());
  backend.write(startup);
  if (pending.length) backend.write(pending);
  client.pipe(backend);
  backend.pipe(client);
}

export function startAuthenticatingFront(options: {
  host: string;
  port: number;
  password: string;
  /** The Unix socket of the PGlite socket server behind the front. */
  backendPath: string;
}): Promise<Server> {
  const expected = digest(options.password);
  const server = createServer((client) => handle(client));
  function handle(client: Socket) {
    let buffer = Buffer.alloc(0);
    let startup: Buffer | null = null;
    client.on('error', () => client.destroy());
    const fail = (code: string, message: string) => {
      client.end(errorResponse(code, message));
    };
    const onData = (chunk: Buffer) => {
      buffer = Buffer.concat([buffer, chunk]);
      for (;;) {
        if (!startup) {
          if (buffer.length < 8) return;
          const length = buffer.readInt32BE(0);
          if (length < 8 || length > MAX_STARTUP) return fail('08P01', 'invalid startup packet');
          if (buffer.length < length) return;
          const code = buffer.readInt32BE(4);
          const packet = buffer.subarray(0, length);
          buffer = buffer.subarray(length);
          if (code === SSL_REQUEST || code === GSSENC_REQUEST) {
            client.write('N');
            continue;
          }
          if (code === CANCEL_REQUEST) return void client.destroy();
          startup = Buffer.from(packet);
          client.write(PASSWORD_REQUEST);
          continue;
        }
        if (buffer.length < 5) return;
        const length = buffer.readInt32BE(1);
        if (buffer[0] !== 0x70 || length < 5 || length > MAX_STARTUP)
          return fail('08P01', 'expected a password message');
        if (buffer.length < length + 1) return;
        const given = buffer
          .subarray(5, length + 1)
          .toString('utf8')
          .replace(/\0$/, '');
        const rest = buffer.subarray(length + 1);
        client.off('data', onData);
        if (!timingSafeEqual(digest(given), expected))
          return fail('28P01', 'password authentication failed for the demo warehouse');
        const backend = connect(options.backendPath);
        relay(client, backend, startup, rest);
        return;
      }
    };
    client.on('data', onData);
  }
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host, () => {
      server.off('error', reject);
      resolve(server);
    });
  });
}
