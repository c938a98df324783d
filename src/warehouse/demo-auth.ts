import { timingSafeEqual, createHash } from 'node:crypto';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { loadModule, parseSync } from 'libpg-query';

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

/** The largest message the front passes on (PostgreSQL's own limit for a CopyData row is 1 GB). */
const MAX_MESSAGE = 1 << 30;

function message(type: string, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.write(type, 0);
  head.writeInt32BE(body.length + 4, 1);
  return Buffer.concat([head, body]);
}

const COPY_FROM_REFUSED = message(
  'E',
  Buffer.from(
    'SERROR\0VERROR\0C0A000\0MCOPY FROM is not supported by the demo warehouse (PGlite cannot take COPY data over its socket)\0\0',
  ),
);

/** Does this SQL text hold a COPY … FROM statement? Decided on the parse tree; text that does not parse is PostgreSQL's to refuse. */
function copiesFrom(sql: string): boolean {
  if (!/copy/i.test(sql)) return false;
  try {
    return (parseSync(sql) as { stmts?: { stmt?: { CopyStmt?: { is_from?: boolean } } }[] }).stmts!.some(
      (s) => s.stmt?.CopyStmt?.is_from === true,
    );
  } catch {
    return false;
  }
}

/** The SQL of a Query ('Q': text) or Parse ('P': name, text, …) message. */
function sqlOf(type: number, body: Buffer): string | null {
  if (type === 0x51) return body.toString('utf8', 0, body.indexOf(0));
  if (type !== 0x50) return null;
  const textStart = body.indexOf(0) + 1;
  return body.toString('utf8', textStart, body.indexOf(0, textStart));
}

/**
 * Joins an authenticated client to its own connection of the socket server, message by message.
 * PGlite is one backend shared by every connection, and it cannot take COPY data over its socket: a
 * COPY … FROM STDIN ends in "unexpected EOF" and a FATAL that takes the backend down for everyone.
 * So the front refuses COPY FROM itself (an error to that client, nothing sent on), and passes on
 * only whole messages, so a client that breaks the framing loses its own connection only.
 */
function relay(client: Socket, backend: Socket, startup: Buffer, pending: Buffer) {
  let fromClient: Buffer = Buffer.alloc(0);
  /** The transaction status of the backend's last ReadyForQuery, for answers the front gives itself. */
  let status = 'I';
  let skipUntilSync = false;
  const forwardClient = (chunk: Buffer) => {
    fromClient = fromClient.length ? Buffer.concat([fromClient, chunk]) : chunk;
    let start = 0;
    let end = 0;
    const flush = () => {
      if (end > start) backend.write(fromClient.subarray(start, end));
    };
    while (fromClient.length - end >= 5) {
      const type = fromClient[end];
      const length = fromClient.readInt32BE(end + 1);
      if (length < 4 || length > MAX_MESSAGE) {
        flush();
        return void client.destroy();
      }
      if (fromClient.length - end < length + 1) break;
      const body = fromClient.subarray(end + 5, end + 1 + length);
      const sql = skipUntilSync ? null : sqlOf(type, body);
      if (skipUntilSync || (sql !== null && copiesFrom(sql))) {
        flush();
        if (skipUntilSync && type === 0x53 /* Sync */) {
          skipUntilSync = false;
          client.write(message('Z', Buffer.from(status)));
        } else if (!skipUntilSync) {
          client.write(COPY_FROM_REFUSED);
          // A simple query is answered at once; an extended one after its Sync, as PostgreSQL does.
          if (type === 0x51) client.write(message('Z', Buffer.from(status)));
          else skipUntilSync = true;
        }
        end += length + 1;
        start = end;
        continue;
      }
      end += length + 1;
    }
    flush();
    fromClient = fromClient.subarray(end);
  };
  let fromBackend: Buffer = Buffer.alloc(0);
  const watchBackend = (chunk: Buffer) => {
    client.write(chunk);
    fromBackend = fromBackend.length ? Buffer.concat([fromBackend, chunk]) : chunk;
    let offset = 0;
    while (fromBackend.length - offset >= 5) {
      const length = fromBackend.readInt32BE(offset + 1);
      if (fromBackend.length - offset < length + 1) break;
      if (fromBackend[offset] === 0x5a /* ReadyForQuery */)
        status = String.fromCharCode(fromBackend[offset + 5]);
      offset += length + 1;
    }
    fromBackend = fromBackend.subarray(offset);
  };
  backend.on('error', () => client.destroy());
  backend.on('close', () => client.destroy());
  client.on('close', () => backend.destroy());
  client.on('error', () => backend.destroy());
  backend.on('data', watchBackend);
  backend.write(startup);
  client.on('data', forwardClient);
  if (pending.length) forwardClient(pending);
}

export async function startAuthenticatingFront(options: {
  host: string;
  port: number;
  password: string;
  /** The Unix socket of the PGlite socket server behind the front. */
  backendPath: string;
}): Promise<Server> {
  const expected = digest(options.password);
  await loadModule();
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
