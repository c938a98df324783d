import { PGlite } from '@electric-sql/pglite';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEmbeddedPool } from '../src/db/embedded.ts';

/**
 * The embedded database runs in the server's process: a long chain of its statements (a job's) must
 * not hold the process's timers and sockets, or every other request waits for the chain to end.
 */
describe('embedded database and the event loop', () => {
  let pg: PGlite;
  beforeAll(async () => {
    pg = await PGlite.create();
  }, 60_000);
  afterAll(async () => pg?.close());

  it('lets timers run while a chain of statements goes on', async () => {
    const pool = createEmbeddedPool(pg);
    const client = await pool.connect();
    let firedAfterStatements = -1;
    let statements = 0;
    const timer = setTimeout(() => (firedAfterStatements = statements), 5);
    try {
      for (; statements < 3000 && firedAfterStatements < 0; statements++)
        await client.query('select $1::int + 1 as next', [statements]);
    } finally {
      clearTimeout(timer);
      client.release();
    }
    // Without a turn of the event loop the timer fires only after the whole chain (or never here).
    expect(firedAfterStatements).toBeGreaterThanOrEqual(0);
    expect(firedAfterStatements).toBeLessThan(3000);
  });
});
