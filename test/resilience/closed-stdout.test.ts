import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startChildServer, type ChildServer } from '../helpers/child-server.ts';
import { postgresUnavailable, scratchDatabase } from '../helpers/scratch-db.ts';

/*
 * Whoever reads the server's stdout (a log shipper, a terminal) may go away; the server logs every
 * request there and must keep answering with the pipe closed rather than die of EPIPE.
 */
const skip = await postgresUnavailable();

describe.skipIf(skip)(`a closed stdout${skip ? ` (${skip})` : ''}`, () => {
  const controlPlane = scratchDatabase('stdout');
  let server: ChildServer;

  beforeAll(async () => {
    await controlPlane.create();
    server = await startChildServer(controlPlane.url, { LOG_LEVEL: 'info' });
  });

  afterAll(async () => {
    await server?.stop();
    await controlPlane.drop();
  });

  it('keeps the server answering after the reader of its stdout is gone', async () => {
    server.child.stdout!.destroy();
    for (let i = 0; i < 50; i++) {
      const res = await fetch(new URL('/api/health', server.url));
      expect(res.status).toBe(200);
      await res.arrayBuffer();
    }
    await new Promise((r) => setTimeout(r, 200));
    expect(server.child.exitCode).toBeNull();
    expect(server.child.signalCode).toBeNull();
  });
});
