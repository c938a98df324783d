import { hash, verify } from '@node-rs/argon2';
import type { AppErrorIssue } from '../app-error.ts';

// argon2id (the library's default algorithm) with OWASP's recommended memory and time costs.
const ARGON2_OPTIONS = { memoryCost: 19456, timeCost: 2, parallelism: 1 } as const;

const MIN_PASSWORD_LENGTH = 12;

export function hashPassword(password: string): Promise<string> {
  return hash(password, ARGON2_OPTIONS);
}

export async function verifyPassword(passwordHash: string, password: string): Promise<boolean> {
  try {
    return await verify(passwordHash, password);
  } catch {
    return false;
  }
}

/** Every way a new password breaks the policy, so a client can show them all at once. */
export function passwordPolicyIssues(
  username: string,
  password: string,
  field = 'password',
): AppErrorIssue[] {
  const issues: AppErrorIssue[] = [];
  if (password.length < MIN_PASSWORD_LENGTH)
    issues.push({ path: [field], message: `must have at least ${MIN_PASSWORD_LENGTH} characters` });
  if (password.toLowerCase() === username.toLowerCase())
    issues.push({ path: [field], message: 'must not be the same as the username' });
  return issues;
}
