import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDemoWarehouse, type DemoWarehouse } from '../../src/warehouse/demo.ts';
import { createLogger } from '../../src/logger.ts';

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
