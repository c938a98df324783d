import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { call, createTenant, login, superAdminToken, unique, type Tenant } from './helpers/api.ts';
import { SUPERADMIN_PASSWORD, SUPERADMIN_USERNAME, TEST_PASSWORD } from './helpers/constants.ts';
import { loadEnv } from '../src/env.ts';

let server: TestServer;
let tenant: Tenant;
let superAdmin: string;

beforeAll(async () => {
  server = await startTestServer();
  tenant = await createTenant(server);
  superAdmin = await superAdminToken(server);
});
afterAll(async () => server?.close());

const REPEATED = /one character or a short pattern repeated/;
const SEQUENCE = /sequence/;
const USERNAME = /must not contain the username/;
const DOMAIN = /must not contain the organization's domain name/;
const COMMON = /must not be a common password/;

/** A 400 whose message and issues name the rule, and that never shows the password it refused. */
function expectRefused(
  res: { status: number; body: any },
  rule: RegExp,
  password: string,
  field = 'password',
) {
  expect(res.status, JSON.stringify(res.body)).toBe(400);
  expect(res.body.code).toBe('BAD_REQUEST');
  expect(res.body.message).toMatch(rule);
  expect(res.body.issues).toContainEqual({ path: [field], message: expect.stringMatching(rule) });
  expect(JSON.stringify(res.body)).not.toContain(JSON.stringify(password).slice(1, -1));
}

describe('the password policy, wherever a password is set', () => {
  it('refuses repetitive and sequential passwords at user creation (org admin)', async () => {
    const cases: [string, RegExp][] = [
      [' '.repeat(12), REPEATED],
      ['aaaaaaaaaaaa', REPEATED],
      ['abcabcabcabc', REPEATED],
      ['AbcAbcABCabc', REPEATED],
      ['passwordpassword', REPEATED],
      ['123456789012', SEQUENCE],
      ['abcdefghijkl', SEQUENCE],
      ['ZYXWVUTSRQPO', SEQUENCE],
      ['a1b2c3d4e5f6', SEQUENCE],
    ];
    for (const [password, rule] of cases) {
      const res = await call(server, 'POST', '/api/admin/users', {
        token: tenant.admin.token,
        body: { username: unique('u'), password },
      });
      expectRefused(res, rule, password);
    }
  });

  it('refuses a password containing the username or the domain, in any case', async () => {
    const username = unique('name');
    const { domain } = tenant.organization;
    const label = domain.split('.')[0];
    const cases: [string, RegExp][] = [
      [`my-${username.toUpperCase()}-horse`, USERNAME],
      [`${domain}-horse-battery`, DOMAIN],
      [`${label.toUpperCase()}-horse-battery`, DOMAIN],
    ];
    for (const [password, rule] of cases) {
      const res = await call(server, 'POST', '/api/admin/users', {
        token: tenant.admin.token,
        body: { username, password },
      });
      expectRefused(res, rule, password);
    }
    // Not a character class rule: spaces, punctuation and other scripts are all fine.
    for (const password of ['correct horse battery staple', '  leading and trailing  ', 'пароль-для-входа']) {
      const res = await call(server, 'POST', '/api/admin/users', {
        token: tenant.admin.token,
        body: { username: unique('u'), password, must_change_password: false },
      });
      expect(res.status, password).toBe(200);
      // Kept as given: nothing was trimmed.
      await login(server, res.body.user.username, domain, password);
    }
  });

  it('refuses common passwords, alone or padded with digits and symbols, in any case or with look-alikes', async () => {
    // 'baseball1234' is not a sequence, not repeated, and long enough: only the list refuses it.
    for (const password of [
      '1qaz2wsx3edc',
      'baseball1234',
      'Iloveyou2024!',
      '!!Sunshine!!2025',
      '  monkey 2024  ',
      // Look-alikes read as the letters they stand for; a digit at the word's edge can be either.
      'P@ssw0rd2024',
      'M0nk3y!!2024',
      '1loveyou!2025',
      'hell0w0rld123',
    ]) {
      const res = await call(server, 'POST', '/api/admin/users', {
        token: tenant.admin.token,
        body: { username: unique('u'), password },
      });
      expectRefused(res, COMMON, password);
    }
    // A common word inside a longer phrase, or with letters after it, is a different password.
    // Digits read as letters spell some listed keyboard walk ('a23456'): only a middle of mostly letters is read so.
    for (const password of [
      'baseball-in-the-rain',
      'sunshinearcade7',
      '1a2345678901',
      'p@ssage-in-the-rain',
    ]) {
      const res = await call(server, 'POST', '/api/admin/users', {
        token: tenant.admin.token,
        body: { username: unique('u'), password, must_change_password: false },
      });
      expect(res.status, `${password}: ${JSON.stringify(res.body)}`).toBe(200);
    }
    const user = await tenant.addUser(['viewer']);
    const changed = await call(server, 'POST', '/api/auth/change-password', {
      token: user.token,
      body: { current_password: TEST_PASSWORD, new_password: 'Football2024' },
    });
    expectRefused(changed, COMMON, 'Football2024', 'new_password');
  });

  it('refuses them at change-password, naming the rule', async () => {
    const user = await tenant.addUser(['viewer']);
    for (const [password, rule] of [
      [' '.repeat(12), REPEATED],
      ['098765432109', SEQUENCE],
      [`${user.username}-horse`, USERNAME],
      [`${tenant.organization.domain}!`, DOMAIN],
    ] as const) {
      const res = await call(server, 'POST', '/api/auth/change-password', {
        token: user.token,
        body: { current_password: TEST_PASSWORD, new_password: password },
      });
      expectRefused(res, rule, password, 'new_password');
      expect(res.body.message).toMatch(/^The new password does not meet the policy: it /);
    }
  });

  it("refuses them when the super admin sets a password, creates a user or an organization's admin", async () => {
    const user = await tenant.addUser(['viewer']);
    const reset = await call(server, 'PUT', `/api/admin/users/${user.id}/password`, {
      token: superAdmin,
      body: { password: ' '.repeat(16) },
    });
    expectRefused(reset, REPEATED, ' '.repeat(16));
    const created = await call(server, 'POST', '/api/auth/admin/users', {
      token: superAdmin,
      body: {
        organization_id: tenant.organization.id,
        username: unique('u'),
        password: 'qrstuvwxyzab',
        must_change_password: false,
      },
    });
    expectRefused(created, SEQUENCE, 'qrstuvwxyzab');
    const domain = `${unique('acme')}.example`;
    const organization = await call(server, 'POST', '/api/auth/admin/organizations', {
      token: superAdmin,
      body: { name: domain, domain, admin: { username: 'owner', password: `${domain.split('.')[0]}-2024` } },
    });
    expectRefused(organization, DOMAIN, `${domain.split('.')[0]}-2024`);
  });

  it('gives generated temporary passwords that meet it', async () => {
    for (let i = 0; i < 5; i++) {
      const res = await call(server, 'POST', '/api/admin/users', {
        token: tenant.admin.token,
        body: { username: unique('temp') },
      });
      expect(res.status).toBe(200);
      await login(server, res.body.user.username, tenant.organization.domain, res.body.temporary_password);
    }
  });
});

describe('SUPERADMIN_PASSWORD at start', () => {
  const start =
    (password: string, username = SUPERADMIN_USERNAME) =>
    () =>
      loadEnv({ SUPERADMIN_USERNAME: username, SUPERADMIN_PASSWORD: password });

  it('stops the start with the rule it breaks, never the password', () => {
    expect(start(' '.repeat(12))).toThrow(
      /SUPERADMIN_PASSWORD: must not be one character or a short pattern repeated/,
    );
    expect(start('short')).toThrow(/SUPERADMIN_PASSWORD: must have at least 12 characters/);
    expect(start('12345678901234')).toThrow(/SUPERADMIN_PASSWORD: must not be a sequence/);
    expect(start('administrator2024')).toThrow(/SUPERADMIN_PASSWORD: must not be a common password/);
    expect(start('the-root-of-it-all', 'root-of-it')).toThrow(
      /SUPERADMIN_PASSWORD: must not contain the username/,
    );
    expect(start('the-root-of-it-all', 'root-of-it')).not.toThrow(/the-root-of-it-all/);
  });

  it("accepts the tests' own and an unset one (generated at first start)", () => {
    expect(start(SUPERADMIN_PASSWORD)).not.toThrow();
    expect(() => loadEnv({})).not.toThrow();
  });
});
