import { generateToken, hashToken } from './tokens.ts';

const KEY_PATTERN = /^dms_([a-z0-9]{12})_([a-z0-9]{32,})$/;

export interface NewApiKey {
  key: string;
  prefix: string;
  hash: string;
}

/** `dms_<prefix>_<secret>`: the prefix finds the account, sha256 of the whole key proves it. */
export function generateApiKey(): NewApiKey {
  const prefix = generateToken(8).slice(0, 12);
  const key = `dms_${prefix}_${generateToken(25)}`;
  return { key, prefix, hash: hashToken(key) };
}

export function apiKeyPrefix(key: string): string | null {
  return KEY_PATTERN.exec(key)?.[1] ?? null;
}

export function isApiKey(bearer: string): boolean {
  return bearer.startsWith('dms_');
}
