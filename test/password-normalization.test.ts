import { hash } from '@node-rs/argon2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, unique, type Tenant } from './helpers/api.ts';
import { User } from '../src/modules/users/users.entity.ts';

/*
 * One password, whatever Unicode form the keyboard or input method produced: passwords are hashed
 * and judged in NFKC form, and accounts hashed before that keep working.
 */
let server: TestServer;
let tenant: Tenant;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
});
afterAll(async () => server?.close());

const DECOMPOSED = 'Cre\u0300me bru\u0302le\u0301e a\u0300 la carte'; // e + combining grave, …
const COMPOSED = DECOMPOSED.normalize('NFC');

const loginAs = (username: string, password: string) =>
  call(server, 'POST', '/api/auth/login', {
    body: { username, domain: tenant.organization.domain, password },
  });

async function createUser(password: string) {
  const username = unique('nfkc');
  const res = await call(server, 'POST', '/api/admin/users', {
    token: tenant.admin.token,
    body: { username, password },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return { username, id: res.body.id ?? res.body.user?.id };
}

describe('passwords in any Unicode form', () => {
  it('logs in with the composed, decomposed or full-width spelling of the password that was set', async () => {
    expect(COMPOSED).not.toBe(DECOMPOSED);
    const { username } = await createUser(DECOMPOSED);
    expect((await loginAs(username, COMPOSED)).status).toBe(200);
    expect((await loginAs(username, DECOMPOSED)).status).toBe(200);
    expect((await loginAs(username, COMPOSED.replace('Cr', 'Gr'))).status).toBe(401);

    // Full-width letters (an East Asian input method) are the ASCII ones.
    const wide = await createUser('ｗｉｄｅ ｐａｓｓｐｈｒａｓｅ ９');
    expect((await loginAs(wide.username, 'wide passphrase 9')).status).toBe(200);
  });

  it('judges the password in its normalized form: decomposed Hangul counts its syllables', async () => {
    const syllables = '한국어비밀번호'; // 7 syllables, 18 code points once decomposed
    const decomposed = syllables.normalize('NFD');
    expect([...decomposed].length).toBeGreaterThanOrEqual(12);
    const res = await call(server, 'POST', '/api/admin/users', {
      token: tenant.admin.token,
      body: { username: unique('nfkc'), password: decomposed },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect(res.body.message).toMatch(/at least 12 characters/);
  });

  it('keeps accounts hashed before normalization: their spelling logs in and the hash is made again', async () => {
    const { username } = await createUser('placeholder password 1');
    const em = server.deps.orm.em.fork();
    // What the server stored before: the hash of the password exactly as typed.
    const legacy = await hash(DECOMPOSED);
    await em.nativeUpdate(User, { username }, { passwordHash: legacy });
    expect((await loginAs(username, COMPOSED)).status).toBe(401);
    expect((await loginAs(username, DECOMPOSED)).status).toBe(200);
    const [after] = await em.fork().find(User, { username });
    expect(after.passwordHash).not.toBe(legacy);
    expect((await loginAs(username, COMPOSED)).status).toBe(200);
  });

  it('refuses a new password that is the current one in another form', async () => {
    const { username } = await createUser(DECOMPOSED);
    const login = await loginAs(username, DECOMPOSED);
    const res = await call(server, 'POST', '/api/auth/change-password', {
      token: login.body.token,
      body: { current_password: DECOMPOSED, new_password: COMPOSED },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(400);
    expect(res.body.message).toMatch(/must differ from the current password/);
    const changed = await call(server, 'POST', '/api/auth/change-password', {
      token: login.body.token,
      body: { current_password: COMPOSED, new_password: `${COMPOSED} encore` },
    });
    expect(changed.status, JSON.stringify(changed.body)).toBe(200);
    expect((await loginAs(username, `${DECOMPOSED} encore`)).status).toBe(200);
  });
});
