import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { gunzipSync, inflateRawSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { loadEnv } from '../src/env.ts';
import { openDatabase } from '../src/db/orm.ts';
import { createLogger } from '../src/logger.ts';
import { startServer } from '../src/server.ts';
import type { TestServer } from './helpers/server.ts';
import { SUPERADMIN_PASSWORD, SUPERADMIN_USERNAME, TEST_SECRET_KEY } from './helpers/constants.ts';
import {
  call,
  createTenant,
  superAdminToken,
  unique,
  until,
  type Tenant,
  type TestUser,
} from './helpers/api.ts';
import { pgConfig, scratchDatabase } from './helpers/scratch-db.ts';

/**
 * Recognizable secrets are seeded through the real routes; then every GET route of the OpenAPI
 * document, the write routes used, the downloads and the log files are scanned for them.
 */
const mark = (what: string) => `${what}-${randomBytes(12).toString('hex')}`;
const SECRETS = {
  source_password: mark('SRCPW'),
  target_password: mark('TGTPW'),
  vcs_token: mark('VCSTOKEN'),
  llm_key: mark('sk-LLMKEY'),
  retl_password: mark('RETLPW'),
  retl_copy_password: mark('RETLCOPYPW'),
};

/** The target warehouse: a scratch database on 127.0.0.1:5432 (trust auth accepts the seeded password). */
const warehouse = scratchDatabase('sec');

let server: TestServer;
let logDir: string;
let tenant: Tenant;
let viewer: TestUser;
let superToken: string;
let workspace: string;
const secrets = new Map<string, string>(Object.entries(SECRETS));
/** Route label → the text of its answer. */
const scanned: { route: string; text: string }[] = [];
const ids: Record<string, string> = {};

/** Like startTestServer, but with the control-plane log written to the data directory. */
async function startLoggingServer(): Promise<TestServer> {
  const databaseUrl = inject('databaseUrl');
  const dataDir = mkdtempSync(join(inject('scratchDir'), 'server-'));
  const env = loadEnv({
    PORT: '0',
    DIMAS_DATA_DIR: dataDir,
    DIMAS_SECRET_KEY: TEST_SECRET_KEY,
    SUPERADMIN_USERNAME,
    SUPERADMIN_PASSWORD,
    SEED_DEMO: 'false',
    LOG_LEVEL: 'info',
    AUTH_CACHE_TTL_MS: '0',
    LOGIN_MAX_FAILURES_PER_ADDRESS: '100000',
    ...(databaseUrl ? { DATABASE_URL: databaseUrl } : {}),
  });
  logDir = join(dataDir, 'logs');
  const db = databaseUrl
    ? await openDatabase({ databaseUrl })
    : await openDatabase({ loadDataDir: new Blob([readFileSync(inject('embeddedTemplate'))]) });
  return startServer(env, {
    db,
    seed: false,
    logger: createLogger({ level: env.LOG_LEVEL, logDir }),
  });
}

async function scan(method: string, path: string, token: string | undefined, body?: unknown) {
  const res = await call(server, method, path, { token, body });
  scanned.push({
    route: `${method} ${path} → ${res.status}`,
    text: typeof res.body === 'string' ? res.body : JSON.stringify(res.body),
  });
  return res;
}

/** Bytes of a download, as raw text and with every zip entry inflated. */
async function download(path: string, token: string): Promise<{ status: number; bytes: Buffer }> {
  const res = await fetch(new URL(path, server.url), { headers: { authorization: `Bearer ${token}` } });
  return { status: res.status, bytes: Buffer.from(await res.arrayBuffer()) };
}

function unzipAll(zip: Buffer): string {
  const end = zip.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  if (end < 0) return zip.toString('latin1');
  let at = zip.readUInt32LE(end + 16);
  let text = '';
  for (let i = 0; i < zip.readUInt16LE(end + 10); i++) {
    const method = zip.readUInt16LE(at + 10);
    const size = zip.readUInt32LE(at + 20);
    const nameLength = zip.readUInt16LE(at + 28);
    const skip = nameLength + zip.readUInt16LE(at + 30) + zip.readUInt16LE(at + 32);
    const local = zip.readUInt32LE(at + 42);
    const start = local + 30 + zip.readUInt16LE(local + 26) + zip.readUInt16LE(local + 28);
    const data = zip.subarray(start, start + size);
    text += `\n${zip.toString('utf8', at + 46, at + 46 + nameLength)}\n`;
    text += (method === 8 ? inflateRawSync(data) : data).toString('utf8');
    at += 46 + skip;
  }
  return text;
}

function leaksIn(text: string): string[] {
  return [...secrets].filter(([, value]) => text.includes(value)).map(([name]) => name);
}

beforeAll(async () => {
  server = await startLoggingServer();
  tenant = await createTenant(server);
  viewer = await tenant.addUser(['viewer']);
  superToken = await superAdminToken(server);
  const admin = tenant.admin.token;
  workspace = unique('sec');

  await warehouse.create();
  await warehouse.sql(`create schema crm;
     create table crm.customers (customer_id integer primary key, email text, country text, plan text, spend numeric);
     insert into crm.customers select i, 'user' || i || '@example.com', case when i % 2 = 0 then 'US' else 'DE' end,
       case when i % 3 = 0 then 'pro' else 'basic' end, case when i % 3 = 0 then 1000 + i else i end
       from generate_series(1, 100) i`);
  const source = (password: string) => ({
    type: 'postgres',
    host: 'db.example.internal',
    port: 5432,
    database: 'shop',
    user: 'reader',
    password,
    schemas: ['public'],
  });
  const seeded = [
    await scan('POST', '/api/workspaces/create', admin, { name: workspace, select: true }),
    await scan('POST', '/api/workspaces/source-config', admin, {
      source_config: source(SECRETS.source_password),
    }),
    await scan('POST', `/api/workspaces/${workspace}/config`, admin, {
      target_config: pgConfig(warehouse.name, { password: SECRETS.target_password, schemas: ['crm'] }),
      target_schema: {
        name: 'crm',
        version: '1.0.0',
        tables: [
          {
            name: 'customers',
            primary_key: ['customer_id'],
            columns: [
              { name: 'customer_id', type: 'integer', nullable: false },
              { name: 'email', type: 'text' },
              { name: 'country', type: 'text' },
              { name: 'plan', type: 'text' },
              { name: 'spend', type: 'numeric' },
            ],
          },
        ],
      },
    }),
    await scan('POST', '/api/admin/vcs-config', admin, {
      url: 'https://git.example.com/project.git',
      branch: 'main',
      author_name: 'Dimas Bot',
      author_email: 'bot@example.com',
      path_prefix: 'dimas',
      token: SECRETS.vcs_token,
    }),
    await scan('POST', '/api/admin/llm-parameters', admin, {
      base_url: 'http://127.0.0.1:9/v1',
      model: 'llama3',
      api_key: SECRETS.llm_key,
    }),
    await scan('PUT', '/api/workspaces/admin-settings', admin, {
      workspace_name: workspace,
      reverse_etl_connections: [
        {
          name: 'crm-db',
          ...pgConfig(warehouse.name, { password: SECRETS.retl_password }),
          schema: 'crm',
        },
        {
          name: 'copy-db',
          ...pgConfig(warehouse.name, { password: SECRETS.retl_copy_password }),
          schema: 'copy',
        },
      ],
    }),
    await scan('POST', '/api/admin/roles', admin, { name: unique('role'), permissions: ['workspace.read'] }),
    await scan('POST', '/api/queries', admin, { name: 'q', sql: 'select 1', schema_identifier: 'public' }),
    await scan('POST', '/api/workspaces/select', viewer.token, { workspace_name: workspace }),
  ];
  for (const res of seeded) expect(res.status, JSON.stringify(res.body)).toBe(200);
  ids.role_id = String(seeded[6].body.id ?? seeded[6].body.role?.id);
  ids.query_id = String(seeded[7].body.id ?? seeded[7].body.query?.id);

  // Warehouse-backed objects, so that their routes answer with real data read through the secret.
  const audience = await scan('POST', '/api/api/audiences', admin, {
    name: unique('aud'),
    target_table: 'customers',
    definition: { type: 'rules', rules: { all: [{ field: 'country', op: '=', value: 'US' }] } },
    attribute_columns: ['email'],
  });
  expect(audience.status, JSON.stringify(audience.body)).toBe(200);
  ids.audience_id = audience.body.id;
  const run = await scan('POST', `/api/api/audiences/${ids.audience_id}/materialize`, admin);
  expect(run.status, JSON.stringify(run.body)).toBe(200);
  const materialized = await until(
    'materialization',
    async () =>
      (await call(server, 'GET', `/api/api/audiences/${ids.audience_id}`, { token: admin })).body
        .materialization,
    (m) => m.run_id === run.body.run_id && ['succeeded', 'failed'].includes(m.status),
  );
  expect(materialized.status).toBe('succeeded');
  const exported = await scan('POST', '/api/api/audiences/exports', admin, {
    audience_id: ids.audience_id,
    name: unique('export'),
    destination: { type: 'csv' },
    field_mapping: [{ source: 'customer_id', destination: 'id' }],
  });
  expect(exported.status, JSON.stringify(exported.body)).toBe(200);
  ids.export_id = exported.body.export.id;
  const hypothesis = await scan('POST', '/api/analytics/hypotheses', admin, {
    statement: 'Pro customers spend more than basic ones',
    table: 'customers',
    metric: { expression: 'spend' },
    segment: { column: 'plan', groups: ['pro', 'basic'] },
    test: 'welch_t',
  });
  expect(hypothesis.status, JSON.stringify(hypothesis.body)).toBe(200);
  ids.hypothesis_id = hypothesis.body.id;
  const tested = await scan('POST', '/api/analytics/hypotheses/test', admin, {
    hypothesis_id: ids.hypothesis_id,
  });
  expect(tested.status, JSON.stringify(tested.body)).toBe(200);
  await until(
    'hypothesis test',
    async () =>
      (await call(server, 'GET', `/api/analytics/status/${ids.hypothesis_id}`, { token: admin })).body,
    (status) => status.run?.id === tested.body.run_id && ['succeeded', 'failed'].includes(status.run.status),
  );
  await scan('POST', '/api/analytics/execute', admin, { sql: 'select * from crm.customers limit 3' });

  // The API key is shown once, at creation and at rotation: those two answers are not scanned.
  const created = await call(server, 'POST', '/api/api/service-accounts', {
    token: admin,
    body: { name: unique('sa'), roles: ['viewer'] },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(200);
  ids.account_id = created.body.service_account.id;
  secrets.set('service_account_key', created.body.api_key);
  const rotated = await call(server, 'POST', `/api/api/service-accounts/${ids.account_id}/rotate-key`, {
    token: admin,
    body: {},
  });
  expect(rotated.status, JSON.stringify(rotated.body)).toBe(200);
  secrets.set('rotated_service_account_key', rotated.body.api_key);
  expect(rotated.body.api_key).not.toBe(created.body.api_key);
  // The key in use: a request made with it must not echo it anywhere either.
  await scan('GET', '/api/auth/session', rotated.body.api_key);

  const rows = await server.deps.orm.em
    .fork()
    .getConnection()
    .execute('select id, password_hash from users where organization_id = ? or is_super_admin = true', [
      tenant.organization.id,
    ]);
  expect(rows.length).toBeGreaterThanOrEqual(2);
  for (const row of rows) secrets.set(`password_hash of ${row.id}`, row.password_hash);
  for (const [name, token] of [
    ['admin session', admin],
    ['viewer session', viewer.token],
    ['super admin session', superToken],
  ]) {
    secrets.set(`${name} token`, token);
    secrets.set(`${name} token sha256`, createHash('sha256').update(token).digest('hex'));
  }
  ids.user_id = tenant.admin.id;
}, 60_000);

let closed = false;
afterAll(async () => {
  if (!closed) await server?.close();
  await warehouse.drop().catch(() => undefined);
});

/** A real value for every path parameter of this tenant, or a placeholder. */
function fill(path: string, names: Record<string, string>): string {
  return path.replace(/\{([^}]+)\}/g, (_, param: string) =>
    encodeURIComponent(names[param] ?? 'placeholder'),
  );
}

describe('secrets never leave the server', () => {
  it('are absent from every GET route, the write routes, the downloads and the logs', async () => {
    const spec = (await call(server, 'GET', '/api/openapi.json')).body;
    const names: Record<string, string> = {
      ...ids,
      workspace_name: workspace,
      workspace,
      org_id: tenant.organization.id,
      tenant_id: tenant.organization.id,
      table_name: 'customers',
      column_name: 'email',
      template_name: 'placeholder',
      library_schema_name: 'placeholder',
      config_name: 'crm-db',
      target_field: 'email',
      source_table: 'customers',
    };
    const templates = await call(server, 'GET', '/api/schemas/templates', { token: tenant.admin.token });
    const firstTemplate = templates.body?.templates?.[0];
    if (firstTemplate) names.template_name = firstTemplate.name ?? firstTemplate.id ?? 'placeholder';

    const gets = Object.entries(spec.paths as Record<string, Record<string, unknown>>)
      .filter(([, ops]) => 'get' in ops)
      .map(([path]) => path)
      .filter((path) => !path.endsWith('/download'));
    expect(gets.length).toBeGreaterThan(50);
    for (const path of gets) {
      const filled = fill(path, names);
      const query = path === '/api/api/alerts/active' ? `?workspace=${workspace}` : '';
      // As the organization's admin, a viewer, and the super admin (who alone passes super_admin guards).
      await scan('GET', filled + query, tenant.admin.token);
      await scan('GET', filled + query, viewer.token);
      if (path.includes('/admin/')) await scan('GET', filled + query, superToken);
    }
    await scan('GET', '/api/workspaces/source-config', tenant.admin.token);
    await scan('POST', `/api/workspaces/${workspace}/database/test`, tenant.admin.token);
    await scan('POST', '/api/workspaces/test-stored-password', tenant.admin.token);
    await scan('POST', '/api/admin/vcs-test', tenant.admin.token, {
      url: 'https://127.0.0.1:9/project.git',
      branch: 'main',
      author_name: 'Dimas Bot',
      author_email: 'bot@example.com',
      path_prefix: 'dimas',
      token: SECRETS.vcs_token,
    });
    await scan('POST', '/api/auth/logout', viewer.token);

    const zip = await download(`/api/workspaces/${workspace}/download`, tenant.admin.token);
    expect(zip.status).toBe(200);
    scanned.push({
      route: `GET /api/workspaces/${workspace}/download (zip, inflated)`,
      text: unzipAll(zip.bytes),
    });
    scanned.push({
      route: `GET /api/workspaces/${workspace}/download (raw)`,
      text: zip.bytes.toString('latin1'),
    });

    // No pause: the download writes out the lines still gathered for the log file before archiving it.
    const logs = await download('/api/auth/admin/logs/download', superToken);
    expect(logs.status).toBe(200);
    const tar = gunzipSync(logs.bytes).toString('utf8');
    // The scan is only worth something if the requests made above were logged.
    expect(tar).toContain('/api/workspaces/source-config');
    scanned.push({ route: 'GET /api/auth/admin/logs/download (tar, gunzipped)', text: tar });

    closed = true;
    await server.close();
    const files = existsSync(logDir) ? readdirSync(logDir) : [];
    expect(files.length).toBeGreaterThan(0);
    for (const file of files)
      scanned.push({ route: `log file ${file}`, text: readFileSync(join(logDir, file), 'utf8') });

    const leaks = scanned.flatMap(({ route, text }) =>
      leaksIn(text).map((secret) => `${secret} in ${route}`),
    );
    console.log(`scanned ${scanned.length} answers and files:\n${scanned.map((s) => s.route).join('\n')}`);
    expect(leaks).toEqual([]);
    // The scan is only a proof if the secrets were really in use: the masks say so.
    const config = scanned.find((s) => s.route.startsWith('GET /api/workspaces/source-config'))!;
    expect(config.text).toContain('"password_set":true');
  }, 120_000);
});
