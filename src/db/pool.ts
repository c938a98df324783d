import type pg from 'pg';

/**
 * How long a request waits for a control-plane connection (a free slot, or a new connection) before
 * it answers 503 rather than hanging: the database may be unreachable without refusing connections.
 */
export const CONNECTION_WAIT_MS = 15_000;

/**
 * Gives a checked-out client back to the pool when its connection dies.
 *
 * Kysely (under MikroORM) releases a connection only when its `begin` or `rollback` succeeds, and both
 * fail on a dead connection. Each transaction cut off by a database outage would then keep a pool
 * slot forever; with every slot lost, all requests wait for a connection and the server never answers
 * again, even after the database is back. Releasing with an error makes the pool drop the client and
 * free the slot; the release the holder may still make later becomes a no-op instead of an error.
 */
export function releaseClientsWhoseConnectionDied(pool: pg.Pool): void {
  const checkedOut = new WeakSet<pg.PoolClient>();
  pool.on('acquire', (client) => checkedOut.add(client));
  pool.on('release', (_error, client) => checkedOut.delete(client as pg.PoolClient));
  pool.on('connect', (client) => {
    (client as pg.PoolClient).once('end', () => {
      const held = client as pg.PoolClient;
      if (!checkedOut.has(held)) return;
      const release = held.release;
      held.release = () => {};
      release(new Error('Connection terminated unexpectedly'));
    });
  });
}
