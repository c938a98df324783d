import type { EntityManager } from '@mikro-orm/postgresql';
import { Session } from '../modules/auth/auth.entity.ts';
import { generateToken, hashToken } from './tokens.ts';

export interface NewSession {
  token: string;
  expiresAt: Date;
}

/** A new session: the token goes to the client once; only its hash is stored. */
export async function createSession(
  em: EntityManager,
  userId: string,
  ttlMs: number,
  client: { ipAddress: string; userAgent: string | null },
): Promise<NewSession> {
  const token = generateToken();
  const expiresAt = new Date(Date.now() + ttlMs);
  em.create(Session, {
    id: hashToken(token),
    user: userId,
    expiresAt,
    ipAddress: client.ipAddress,
    userAgent: client.userAgent?.slice(0, 500) ?? null,
  });
  await em.flush();
  return { token, expiresAt };
}

export async function deleteSession(em: EntityManager, sessionId: string): Promise<void> {
  await em.nativeDelete(Session, { id: sessionId });
}

/** Ends every session of a user, optionally keeping one (the caller's own, after a password change). */
export async function deleteUserSessions(em: EntityManager, userId: string, keep?: string): Promise<void> {
  await em.nativeDelete(Session, keep ? { user: userId, id: { $ne: keep } } : { user: userId });
}
