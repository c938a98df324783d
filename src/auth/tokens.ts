import { hash, randomBytes } from 'node:crypto';
import { encodeBase32LowerCaseNoPadding } from '@oslojs/encoding';

/** 20 random bytes in base32: the session token of the Lucia guide. */
export function generateToken(bytes = 20): string {
  return encodeBase32LowerCaseNoPadding(randomBytes(bytes));
}

/**
 * What the database keeps instead of a token or key: hex sha256, as in the Lucia guide. Node's one-shot
 * native hash, because it runs on every authenticated request: the pure-JS one cost ten times more, and
 * a Hash object twice as much.
 */
export function hashToken(token: string): string {
  return hash('sha256', token, 'hex');
}
