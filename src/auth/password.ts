import { createRequire } from 'node:module';
import { hash, verify } from '@node-rs/argon2';
import type { dictionary as CommonLists } from '@zxcvbn-ts/language-common';
import { AppError, type AppErrorIssue } from '../app-error.ts';
import { generateToken } from './tokens.ts';

// argon2id (the library's default algorithm) with OWASP's recommended memory and time costs.
const ARGON2_OPTIONS = { memoryCost: 19456, timeCost: 2, parallelism: 1 } as const;

/**
 * The form a password is hashed and judged in: NFKC (NIST SP 800-63B §5.1.1.2), so one password typed
 * on two keyboards or input methods (a precomposed `é` or `e` + combining accent, full-width letters,
 * a ligature) is one password.
 */
const normalized = (password: string) => password.normalize('NFKC');

export function hashPassword(password: string): Promise<string> {
  return hash(normalized(password), ARGON2_OPTIONS);
}

/**
 * Whether `password` is the one `passwordHash` was made from: `'match'`, `'mismatch'`, or
 * `'match-unnormalized'` for a hash made before passwords were normalized from characters that
 * normalization changes (the caller re-hashes it, so the other spellings match from then on).
 */
export async function checkPassword(
  passwordHash: string,
  password: string,
): Promise<'match' | 'match-unnormalized' | 'mismatch'> {
  const attempt = async (candidate: string) => {
    try {
      return await verify(passwordHash, candidate);
    } catch {
      return false;
    }
  };
  const form = normalized(password);
  if (await attempt(form)) return 'match';
  // A second hash only for the few passwords that normalization changes.
  if (form !== password && (await attempt(password))) return 'match-unnormalized';
  return 'mismatch';
}

// ---- the password policy ----
//
// The one policy for every password that is set: user creation (admin, super admin, organization and
// environment setup), change-password, an administrator's reset, the seeded accounts and
// SUPERADMIN_PASSWORD at start. In the spirit of NIST SP 800-63B (§3.1.1.2): length rather than
// composition rules, nothing trimmed, every character allowed, judged (and hashed) in NFKC form;
// refused are the passwords an attacker tries first:
//   1. fewer than 12 characters (Unicode code points);
//   2. repetitive: one character or a short pattern repeated ('            ', 'aaaaaaaaaaaa', 'abcabcabcabc');
//   3. sequential: characters stepping evenly or by a repeated pattern ('123456789012', 'abcdefghijkl',
//      'zyxwvutsrqpo', '135791357913', 'a1b2c3d4e5f6'); digits and letters wrap around (…7890…, …xyza…);
//   4. containing a word of the account (ignoring case): the username, the organization's domain or a
//      label of it before the top-level one ('acme' of acme.com). Words shorter than 4 characters are
//      not looked for: inside a 12-character password they match by chance, not by choice;
//   5. common: a password of zxcvbn-ts's list of leaked passwords (49,233 of them), whole or with only
//      digits, spaces and symbols before or after it ('password1234', 'iloveyou2024!', 'qwertyuiop!!'):
//      with 12 characters required, only 308 of the list are long enough to be refused as they are,
//      and padding a common word up to the length is what people do. What is left once the padding
//      is taken off must have 4 characters or more to count ('1a2345678901' is not 'a'). Look-alike
//      characters read as the letters they stand for ('P@ssw0rd2024' is 'password'; '1' and '!' as 'i'
//      or 'l'), so a digit or symbol inside the word is a substitution and around it padding.
// Cases 2, 3 and 5 ignore letter case. The messages name the rule, never the password.

const MIN_PASSWORD_LENGTH = 12;
const MIN_CONTEXT_WORD_LENGTH = 4;
const MIN_COMMON_CORE_LENGTH = 4;

let commonPasswords: Set<string> | null = null;
let longestCommon = 0;

/** Characters written for letters: the letters they may stand for. */
const LOOK_ALIKES: Record<string, string> = {
  '@': 'a',
  '4': 'a',
  '8': 'b',
  '(': 'c',
  '3': 'e',
  '6': 'g',
  '9': 'g',
  '1': 'il',
  '!': 'il',
  '|': 'il',
  '0': 'o',
  $: 's',
  '5': 's',
  '7': 't',
  '+': 't',
  '2': 'z',
};
const PADDING = /^[\p{N}\p{P}\p{S}\p{Z}]$/u;
const LETTER_UNIT = /^\p{L}$/u;
/** How far into a run of padding a word may start or end: past it, the rest is padding anyway. */
const MAX_PADDING_TRIED = 16;
/** Readings of a core tried at most (each ambiguous look-alike doubles them). */
const MAX_READINGS = 64;

/**
 * The leaked-password list, read the first time a password is set rather than at start: the package
 * decompresses its lists when loaded (~30 ms), and a server may never set a password.
 */
function commonList(): Set<string> {
  if (!commonPasswords) {
    const require = createRequire(import.meta.url);
    const { dictionary } = require('@zxcvbn-ts/language-common') as { dictionary: typeof CommonLists };
    commonPasswords = new Set(dictionary['passwords-common']);
    for (const word of commonPasswords) longestCommon = Math.max(longestCommon, [...word].length);
  }
  return commonPasswords;
}

/** The words `core` may be read as, its look-alikes taken for letters (bounded). */
function readings(core: string[]): string[] {
  let words = [''];
  for (const unit of core) {
    const letters = LOOK_ALIKES[unit] ?? unit;
    if (words.length * letters.length > MAX_READINGS) return [];
    words = words.flatMap((word) => [...letters].map((letter) => word + letter));
  }
  return words;
}

/**
 * Whether a lowercased password is a common one: whole, or what is left (4 characters or more) once
 * the padding around it is taken off, or a middle of at least half letters with only padding around
 * it, read with its look-alikes as letters. Every split of the padding runs is tried for that, as a
 * look-alike at the edge of the word (the '0' of 'hell0') is also padding.
 */
function isCommonPassword(lowered: string): boolean {
  const list = commonList();
  if (list.has(lowered)) return true;
  const units = [...lowered];
  let lead = 0;
  while (lead < units.length && PADDING.test(units[lead])) lead++;
  let trail = units.length;
  while (trail > lead && PADDING.test(units[trail - 1])) trail--;
  if (trail === lead) return false;
  for (let start = Math.max(0, lead - MAX_PADDING_TRIED); start <= lead; start++)
    for (let end = Math.min(units.length, trail + MAX_PADDING_TRIED); end >= trail; end--) {
      const core = units.slice(start, end);
      if (core.length < MIN_COMMON_CORE_LENGTH || core.length > longestCommon) continue;
      if (start === lead && end === trail && list.has(core.join(''))) return true;
      // Mostly letters: read as letters, a run of digits spells some listed keyboard walk ('a23456').
      const letters = core.filter((unit) => LETTER_UNIT.test(unit)).length;
      if (letters * 2 >= core.length && readings(core).some((word) => list.has(word))) return true;
    }
  return false;
}

/** Whom a password is for: the words of the account it must not contain. */
interface PasswordAccount {
  username: string;
  /** The organization's domain; none for the super admin. */
  domain?: string | null;
}

/** Whether `units` is its first p units over and over (the last copy may be cut short), for a p ≤ n/2. */
function repeatsPattern<T>(units: readonly T[]): boolean {
  for (let period = 1; period <= units.length / 2; period++) {
    let repeats = true;
    for (let i = period; i < units.length && repeats; i++) repeats = units[i] === units[i - period];
    if (repeats) return true;
  }
  return false;
}

const DIGIT = /^[0-9]$/;
const LETTER = /^[a-z]$/;

/** The step from one character to the next; digits and letters step around their alphabet. */
function step(from: string, to: string): string {
  if (DIGIT.test(from) && DIGIT.test(to)) return `d${(Number(to) - Number(from) + 10) % 10}`;
  if (LETTER.test(from) && LETTER.test(to)) return `l${(to.charCodeAt(0) - from.charCodeAt(0) + 26) % 26}`;
  return `c${to.codePointAt(0)! - from.codePointAt(0)!}`;
}

/** The account's words a password must not contain, lowercased. */
function contextWords(account: PasswordAccount): { word: string; what: string }[] {
  const words = [{ word: account.username.toLowerCase(), what: 'the username' }];
  const domain = account.domain?.toLowerCase();
  if (domain) {
    words.push({ word: domain, what: "the organization's domain name" });
    for (const label of domain.split('.').slice(0, -1))
      words.push({ word: label, what: "the organization's domain name" });
  }
  return words.filter((w) => w.word.length >= MIN_CONTEXT_WORD_LENGTH);
}

/** Every way a new password breaks the policy, so a client can show them all at once. */
export function passwordPolicyIssues(
  account: PasswordAccount,
  password: string,
  field = 'password',
): AppErrorIssue[] {
  const issues: AppErrorIssue[] = [];
  const issue = (message: string) => issues.push({ path: [field], message });
  password = normalized(password);
  const units = [...password.toLowerCase()];
  if ([...password].length < MIN_PASSWORD_LENGTH)
    issue(`must have at least ${MIN_PASSWORD_LENGTH} characters`);
  if (repeatsPattern(units)) issue('must not be one character or a short pattern repeated');
  else if (units.length > 2 && repeatsPattern(units.slice(1).map((unit, i) => step(units[i], unit))))
    issue('must not be a sequence such as 123456… or abcdef…');
  const lowered = password.toLowerCase();
  const found = new Set(
    contextWords(account)
      .filter((w) => lowered.includes(w.word))
      .map((w) => w.what),
  );
  for (const what of found) issue(`must not contain ${what}`);
  if (isCommonPassword(lowered))
    issue('must not be a common password, alone or with only digits or symbols around it');
  return issues;
}

/** The 400 of a refused password: its message names every rule that failed. */
export function passwordPolicyError(issues: AppErrorIssue[], what = 'The password'): AppError {
  const rules = issues.map((i) => i.message).join('; ');
  return new AppError('BAD_REQUEST', `${what} does not meet the policy: it ${rules}`, { issues });
}

export function assertPasswordPolicy(account: PasswordAccount, password: string): void {
  const issues = passwordPolicyIssues(account, password);
  if (issues.length) throw passwordPolicyError(issues);
}

/**
 * A random password for the account (temporary passwords, first-start credentials). Base32 can still
 * spell a word of the account by chance, so one that does is drawn again.
 */
export function generatePassword(account: PasswordAccount, bytes = 15): string {
  for (;;) {
    const password = generateToken(bytes);
    if (!passwordPolicyIssues(account, password).length) return password;
  }
}
