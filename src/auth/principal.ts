import { timingSafeEqual } from 'node:crypto';
import type { EntityManager } from '@mikro-orm/postgresql';
import { apiKeyPrefix, isApiKey } from './api-key.ts';
import { hashToken } from './tokens.ts';

/** Who is calling: a signed-in user or a service account, with its effective permissions. */
export interface Principal {
  kind: 'user' | 'service_account';
  id: string;
  organizationId: string | null;
  username: string;
  isSuperAdmin: boolean;
  mustChangePassword: boolean;
  permissions: ReadonlySet<string>;
  /** sha256 of the session token (user sessions only). */
  sessionId?: string;
  expiresAt: Date | null;
}

const PERMISSIONS_OF = (pivot: string, owner: string, id: string) => `coalesce((
    select array_agg(distinct perm) from ${pivot} x
    join roles r on r.id = x.role_id, unnest(r.permissions) perm
    where x.${owner} = ${id}), '{}')`;

const SESSION_QUERY = `
  select s.id as session_id, s.expires_at, u.id, u.organization_id, u.username, u.is_super_admin,
         u.must_change_password, u.is_active, ${PERMISSIONS_OF('user_roles', 'user_id', 'u.id')} as permissions
  from sessions s join users u on u.id = s.user_id
  where s.id = ?`;

const SERVICE_ACCOUNT_QUERY = `
  select sa.id, sa.organization_id, sa.name, sa.is_active, sa.key_hash, sa.key_expires_at,
         sa.previous_key_hash, sa.previous_key_expires_at, sa.last_used_at,
         ${PERMISSIONS_OF('service_account_roles', 'service_account_id', 'sa.id')} as permissions
  from service_accounts sa
  where sa.key_prefix = ? or sa.previous_key_prefix = ?`;

function sameHash(a: string | null, b: string): boolean {
  return !!a && a.length === b.length && timingSafeEqual(Buffer.from(a), Buffer.from(b));
}

const asDate = (v: unknown) => (v == null ? null : new Date(v as string));
const asArray = (v: unknown): string[] =>
  Array.isArray(v)
    ? v
    : typeof v === 'string'
      ? v
          .replace(/^\{|\}$/g, '')
          .split(',')
          .filter(Boolean)
      : [];

/**
 * Resolves bearer credentials in one query, with a short-lived in-process cache so that an
 * authenticated request costs no database round trip most of the time. Writes that change who may
 * do what call `forget()`; other API processes see them within `cacheTtlMs`.
 */
export class Authenticator {
  readonly #cache = new Map<string, { principal: Principal | null; until: number }>();

  private readonly options: { cacheTtlMs: number; sessionTtlMs: number };

  constructor(options: { cacheTtlMs: number; sessionTtlMs: number }) {
    this.options = options;
  }

  /** `scope.em` is read only on a cache miss (a request's entity manager is forked on first use). */
  async authenticate(scope: { em: EntityManager }, bearer: string): Promise<Principal | null> {
    const hash = hashToken(bearer);
    const now = Date.now();
    const cached = this.#cache.get(hash);
    if (
      cached &&
      cached.until > now &&
      (!cached.principal?.expiresAt || cached.principal.expiresAt.getTime() > now)
    )
      return cached.principal;
    const principal = isApiKey(bearer)
      ? await this.#serviceAccount(scope.em, bearer, hash)
      : await this.#session(scope.em, hash);
    if (this.options.cacheTtlMs > 0) {
      if (this.#cache.size > 10_000) this.#cache.clear();
      this.#cache.set(hash, { principal, until: now + this.options.cacheTtlMs });
    }
    return principal;
  }

  /** Drops every cached principal (after logout, role or user changes). */
  forget(): void {
    this.#cache.clear();
  }

  async #session(em: EntityManager, hash: string): Promise<Principal | null> {
    const [row] = await em.execute(SESSION_QUERY, [hash]);
    if (!row || !row.is_active) return null;
    const now = Date.now();
    let expiresAt = asDate(row.expires_at)!;
    if (expiresAt.getTime() <= now) {
      await em.execute('delete from sessions where id = ?', [hash]);
      return null;
    }
    // Sliding expiry: renew once half the lifetime is used, so active users stay signed in.
    if (expiresAt.getTime() - now < this.options.sessionTtlMs / 2) {
      expiresAt = new Date(now + this.options.sessionTtlMs);
      await em.execute('update sessions set expires_at = ? where id = ?', [expiresAt, hash]);
    }
    return {
      kind: 'user',
      id: row.id,
      organizationId: row.organization_id,
      username: row.username,
      isSuperAdmin: row.is_super_admin,
      mustChangePassword: row.must_change_password,
      permissions: new Set(asArray(row.permissions)),
      sessionId: hash,
      expiresAt,
    };
  }

  async #serviceAccount(em: EntityManager, key: string, hash: string): Promise<Principal | null> {
    const prefix = apiKeyPrefix(key);
    if (!prefix) return null;
    const rows = await em.execute(SERVICE_ACCOUNT_QUERY, [prefix, prefix]);
    const now = Date.now();
    for (const row of rows) {
      if (!row.is_active) continue;
      const current =
        sameHash(row.key_hash, hash) && (!row.key_expires_at || asDate(row.key_expires_at)!.getTime() > now);
      const previous =
        sameHash(row.previous_key_hash, hash) && asDate(row.previous_key_expires_at)!.getTime() > now;
      if (!current && !previous) continue;
      const lastUsed = asDate(row.last_used_at)?.getTime() ?? 0;
      if (now - lastUsed > 60_000)
        await em
          .getConnection()
          .execute('update service_accounts set last_used_at = ? where id = ?', [new Date(now), row.id]);
      return {
        kind: 'service_account',
        id: row.id,
        organizationId: row.organization_id,
        username: row.name,
        isSuperAdmin: false,
        mustChangePassword: false,
        permissions: new Set(asArray(row.permissions)),
        expiresAt: current ? asDate(row.key_expires_at) : asDate(row.previous_key_expires_at),
      };
    }
    return null;
  }
}
