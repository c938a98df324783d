import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Encryption at rest for stored secrets (database passwords, VCS tokens, LLM keys): AES-256-GCM,
 * one random IV per value, stored as `v1:<iv>:<tag>:<ciphertext>` in base64.
 */
/** How a stored secret is shown; a form that sends it back means "keep the stored value". */
export const SECRET_MASK = '••••••';

/** Whether a value sent back is a mask (ours, or asterisks) rather than a new secret. */
export const isMaskedSecret = (value: string) => /^[*•]+$/.test(value);

export class SecretBox {
  readonly #key: Buffer;

  constructor(keyHex: string) {
    this.#key = Buffer.from(keyHex, 'hex');
    if (this.#key.length !== 32) throw new Error('The secret key must be 32 bytes (64 hex characters)');
  }

  encrypt(plain: string): string {
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.#key, iv);
    const data = Buffer.concat([cipher.update(plain, 'utf8'), cipher.final()]);
    return [
      'v1',
      iv.toString('base64'),
      cipher.getAuthTag().toString('base64'),
      data.toString('base64'),
    ].join(':');
  }

  decrypt(sealed: string): string {
    const [version, iv, tag, data] = sealed.split(':');
    if (version !== 'v1' || !iv || !tag || data === undefined) throw new Error('Not an encrypted secret');
    const decipher = createDecipheriv('aes-256-gcm', this.#key, Buffer.from(iv, 'base64'));
    decipher.setAuthTag(Buffer.from(tag, 'base64'));
    return Buffer.concat([decipher.update(Buffer.from(data, 'base64')), decipher.final()]).toString('utf8');
  }
}

/** DIMAS_SECRET_KEY when set; otherwise a key generated once into the data directory. */
export function loadSecretKey(configured: string | undefined, dataDir: string): string {
  if (configured) return configured;
  const file = join(dataDir, 'secret.key');
  if (existsSync(file)) return readFileSync(file, 'utf8').trim();
  mkdirSync(dataDir, { recursive: true });
  const key = randomBytes(32).toString('hex');
  writeFileSync(file, key + '\n', { mode: 0o600 });
  return key;
}
