import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAdmin, postgresConfig, setUpMapping, signIn, type JsonApi } from '../../bench/harness.ts';
import { startChildServer, type ChildServer } from '../helpers/child-server.ts';
import { ADMIN_URL, postgresUnavailable, scratchDatabase, withClient } from '../helpers/scratch-db.ts';
import { TEST_PASSWORD } from '../helpers/constants.ts';
import { unique, until } from '../helpers/api.ts';

/*
 * A server process killed (SIGKILL) while it materializes a mapping: a new process on the same
 * database notices the run lost its worker (no heartbeat for JOB_HEARTBEAT_TIMEOUT_SECONDS), pg-boss
 * retries it, and it completes once: one run, one retry, exactly the source's rows in the target.
 */
const skip = await postgresUnavailable();

// About five seconds of INSERT … SELECT on the test machines: long enough to be killed mid-way.
const ROWS = 1_000_000;
const HEARTBEAT_TIMEOUT_SECONDS = 4;
/** Fast enough to catch the run in the middle of its load, before it ends on its own. */
const POLL_MS = 50;

describe.skipIf(skip)(`a server killed during a job${skip ? ` (${skip})` : ''}`, () => {
  const controlPlane = scratchDatabase('cp');
  const warehouseDb = scratchDatabase('wh');
  let server: ChildServer | undefined;
  const admin = { domain: `${unique('k')}.test`, username: 'admin', password: TEST_PASSWORD };
  const serverOptions = {
    JOB_HEARTBEAT_TIMEOUT_SECONDS: String(HEARTBEAT_TIMEOUT_SECONDS),
    WAREHOUSE_STATEMENT_TIMEOUT_MS: '300000',
  };

  beforeAll(async () => {
    await controlPlane.create();
    await warehouseDb.create();
    await withClient(warehouseDb.url, (c) =>
      c.query(`create schema src; create schema mart;
        create table src.events as
          select g::bigint as id, md5(g::text) as token, g % 1000 as bucket from generate_series(1, ${ROWS}) g;
        alter table src.events add primary key (id);
        analyze src.events;`),
    );
    server = await startChildServer(controlPlane.url, serverOptions);
    await createAdmin(controlPlane.url, admin);
    const { api } = await signIn(server.url, admin);
    const warehouse = postgresConfig(ADMIN_URL, warehouseDb.name, ['src']);
    await setUpMapping(api, {
      workspace: 'killed',
      sourceConfig: warehouse,
      targetConfig: { ...warehouse, schemas: ['mart'] },
      table: 'events_clean',
      primaryKey: ['id'],
      sourceTable: 'src.events',
      columns: [
        { name: 'id', type: 'bigint', nullable: false, sourceField: 'events.id' },
        { name: 'digest', type: 'text', expression: `md5(events.token || events.bucket::text)` },
        { name: 'token_upper', type: 'text', expression: 'upper(events.token)' },
        {
          name: 'bucket_band',
          type: 'text',
          expression: `CASE WHEN events.bucket >= 500 THEN 'high' ELSE 'low' END`,
        },
      ],
    });
  });

  afterAll(async () => {
    await server?.stop('SIGKILL');
    await controlPlane.drop();
    await warehouseDb.drop();
  });

  const runRow = async (runId: string) =>
    withClient(controlPlane.url, async (c) => {
      const { rows } = await c.query('select * from job_runs where id = $1', [runId]);
      return rows[0] as Record<string, any>;
    });

  it('retries the run on a new process and completes it once', async () => {
    const { api: first } = await signIn(server!.url, admin);
    const { run_id: runId } = await first('POST', '/api/mappings/events_clean/materialize', {});
    await until(
      'the run to load',
      async () => {
        const row = await runRow(runId);
        if (row.status === 'succeeded') throw new Error('the run finished before it could be killed');
        return row;
      },
      (row) => row.status === 'running' && row.progress?.phase === 'loading',
      30_000,
      POLL_MS,
    );
    // Mid-load: the INSERT … SELECT is under way in the warehouse.
    await new Promise((r) => setTimeout(r, 1000));
    const killed = await runRow(runId);
    expect(killed).toMatchObject({ status: 'running', retry_count: 0 });
    await server!.stop('SIGKILL');
    const killedAt = Date.now();

    server = await startChildServer(controlPlane.url, serverOptions);
    const startedAt = Date.now();
    const { api: second } = await signIn(server.url, admin);
    const done = await until(
      'the retried run to end',
      () => runRow(runId),
      (row) => ['succeeded', 'failed', 'cancelled'].includes(row.status),
      120_000,
      POLL_MS,
    );
    console.log(
      `killed mid-load; a new server started in ${((startedAt - killedAt) / 1000).toFixed(1)} s; ` +
        `the retried run succeeded ${((Date.now() - killedAt) / 1000).toFixed(1)} s after the kill`,
    );
    expect(done, JSON.stringify(done)).toMatchObject({ status: 'succeeded', retry_count: 1 });
    expect(done.result).toMatchObject({ rows_written: ROWS, mode: 'insert_select' });
    expect(done.started_at.getTime()).toBe(killed.started_at.getTime());

    // Nothing runs it a third time, and the queue agrees with the row.
    await new Promise((r) => setTimeout(r, HEARTBEAT_TIMEOUT_SECONDS * 1500));
    expect(await runRow(runId)).toMatchObject({ status: 'succeeded', retry_count: 1 });
    await withClient(controlPlane.url, async (c) => {
      const runs = await c.query(`select count(*)::int as n from job_runs where kind = $1`, [done.kind]);
      expect(runs.rows[0].n).toBe(1);
      const job = await c.query('select state, retry_count from pgboss.job where id = $1', [runId]);
      expect(job.rows).toEqual([{ state: 'completed', retry_count: 1 }]);
    });
    await expectTarget(second);
  });

  async function expectTarget(api: JsonApi) {
    const mapping = await api('GET', '/api/mappings/events_clean');
    expect(mapping.materialization.last_run).toMatchObject({ status: 'succeeded' });
    await withClient(warehouseDb.url, async (c) => {
      const { rows } = await c.query(
        `select count(*)::int as n, count(distinct id)::int as ids, min(id)::int as lo, max(id)::int as hi,
                count(*) filter (where digest = md5(e.token || e.bucket::text))::int as right_digests
           from mart.events_clean t join src.events e using (id)`,
      );
      expect(rows[0]).toEqual({ n: ROWS, ids: ROWS, lo: 1, hi: ROWS, right_digests: ROWS });
      // The killed attempt's staging table went with it.
      const tables = await c.query(`select tablename from pg_tables where schemaname = 'mart'`);
      expect(tables.rows.map((r) => r.tablename)).toEqual(['events_clean']);
    });
  }
});
