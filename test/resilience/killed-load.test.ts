import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAdmin, postgresConfig, signIn } from '../../bench/harness.ts';
import { startChildServer, type ChildServer } from '../helpers/child-server.ts';
import { ADMIN_URL, postgresUnavailable, scratchDatabase, withClient } from '../helpers/scratch-db.ts';
import { mariadbUnavailable, MARIADB, scratchMysql } from '../helpers/mariadb.ts';
import { TEST_PASSWORD } from '../helpers/constants.ts';
import { unique, until } from '../helpers/api.ts';

/*
 * A server process killed (SIGKILL) while it extract-loads a MariaDB table into the raw schema: the
 * target transaction of the table dies with it, a new process retries the run, and the raw table ends
 * with exactly the source's rows, once.
 */
const skip = (await postgresUnavailable()) ?? (await mariadbUnavailable());

// A few seconds of loading on the test machines: long enough to be killed mid-way.
const ROWS = 1_000_000;
const HEARTBEAT_TIMEOUT_SECONDS = 4;
/** Fast enough to catch the load while its rows stream, before it ends on its own. */
const POLL_MS = 25;

describe.skipIf(skip)(`a server killed during a MySQL load${skip ? ` (${skip})` : ''}`, () => {
  const controlPlane = scratchDatabase('cp');
  const warehouseDb = scratchDatabase('wh');
  const source = scratchMysql('kill');
  let server: ChildServer | undefined;
  const admin = { domain: `${unique('kl')}.test`, username: 'admin', password: TEST_PASSWORD };
  const serverOptions = { JOB_HEARTBEAT_TIMEOUT_SECONDS: String(HEARTBEAT_TIMEOUT_SECONDS) };

  beforeAll(async () => {
    await controlPlane.create();
    await warehouseDb.create();
    await source.create();
    await source.sql(`create table big (id int not null primary key, token char(32), note varchar(100))`);
    await source.sql(
      `set statement max_recursive_iterations = 100000000 for insert into big with recursive g(n) as (select 1 union all select n + 1 from g where n < ${ROWS})
       select n, md5(n), concat('row ', n, repeat(' pad', 20)) from g`,
    );
    server = await startChildServer(controlPlane.url, serverOptions);
    await createAdmin(controlPlane.url, admin);
    const { api } = await signIn(server.url, admin);
    await api('POST', '/api/workspaces/create', {
      name: 'killed',
      select: true,
      source_config: { type: 'mysql', ...MARIADB, database: source.name },
      target_config: postgresConfig(ADMIN_URL, warehouseDb.name, ['mart']),
    });
    await api('POST', '/api/schemas/workspace', {
      schema: {
        name: 's',
        version: '1',
        tables: [
          { name: 't', primary_key: ['id'], columns: [{ name: 'id', type: 'bigint', nullable: false }] },
        ],
      },
    });
  }, 120_000);

  afterAll(async () => {
    await server?.stop('SIGKILL');
    await controlPlane.drop();
    await warehouseDb.drop();
    await source.drop();
  });

  const runRow = async (runId: string) =>
    withClient(controlPlane.url, async (c) => {
      const { rows } = await c.query('select * from job_runs where id = $1', [runId]);
      return rows[0] as Record<string, any>;
    });

  it('retries the load on a new process and ends with every row once', async () => {
    const { api } = await signIn(server!.url, admin);
    const { source_load } = await api('POST', '/api/schemas/workspace/sync', {
      load_source: { mode: 'full' },
    });
    const runId = source_load.run_id as string;
    await until(
      'rows to stream',
      async () => {
        const row = await runRow(runId);
        if (row.status === 'succeeded') throw new Error('the load finished before it could be killed');
        return row;
      },
      (row) => Number(row.progress?.rows_loaded ?? 0) > 0,
      60_000,
      POLL_MS,
    );
    await server!.stop('SIGKILL');
    // The killed attempt's transaction rolled back: no raw table (it was created in that transaction).
    const raw = `raw_${source.name}`;
    const left = await withClient(warehouseDb.url, (c) =>
      c.query(`select to_regclass($1) as t`, [`"${raw}".big`]),
    );
    expect(left.rows[0].t).toBeNull();

    server = await startChildServer(controlPlane.url, serverOptions);
    const done = await until(
      'the retried load to end',
      () => runRow(runId),
      (row) => ['succeeded', 'failed', 'cancelled'].includes(row.status),
      120_000,
      POLL_MS,
    );
    expect(done, JSON.stringify(done)).toMatchObject({ status: 'succeeded', retry_count: 1 });
    expect(done.result).toMatchObject({ rows: ROWS });
    await withClient(warehouseDb.url, async (c) => {
      const { rows } = await c.query(
        `select count(*)::int as n, count(distinct id)::int as ids, min(id)::int as lo, max(id)::int as hi,
                count(*) filter (where token = md5(id::text))::int as right_tokens from "${raw}".big`,
      );
      expect(rows[0]).toEqual({ n: ROWS, ids: ROWS, lo: 1, hi: ROWS, right_tokens: ROWS });
    });
  });
});
