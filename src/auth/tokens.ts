import { createHash, randomBytes } from 'node:crypto';
import { encodeBase32LowerCaseNoPadding } from '@oslojs/encoding';

/** 20 random bytes in base32: the session token of the Lucia guide. */
export function generateToken(bytes = 20): string {
  return encodeBase32LowerCaseNoPadding(randomBytes(bytes));
}

/**
 * What the database keeps instead of a token or key: hex sha256, as in the Lucia guide. Node's native
 * hash, because it runs on every authenticated request and the pure-JS one cost ten times more.
 */
export function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}
