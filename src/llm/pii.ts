import { detectPatterns, type PatternShare } from './value-patterns.ts';

/*
 * Which columns hold personal data. One rule for everything that shows values outside the process
 * (LLM prompts) or to a user (sample values, previews), so the two can never disagree: a column is
 * personal when its name says so, when profiling finds personal values in it, or when the target
 * schema marks the field it feeds as `pii`.
 */

/** Names of personal columns: names, contact data, address, birth date, personal identifiers. */
const PERSONAL_NAME =
  /(^|_)(first|last|middle|given|family|full|maiden|nick|display|user)_?names?$|^(name|surname|forename|fullname|firstname|lastname|username)$|e_?mail|phone|mobile|^tel(ephone)?$|_tel$|^fax|address|street|^city$|postal|zip|post_?code|birth|^dob$|^age$|gender|^sex$|ssn|social_security|passport|national_id|tax_id|iban|account_number|card_number|^ip(_address)?$|(^|_)(ip|device|cookie|anonymous|anon|visitor|loyalty|external|crm|customer|cust|user|member|person|contact|patient|subscriber|guest|lead|session)_?(id|key|uuid|number|no)$/i;

/** Value patterns that are personal whatever the column is called. */
const PERSONAL_PATTERNS = new Set(['email', 'phone', 'gender']);

export interface ColumnFacts {
  name: string;
  patterns?: readonly PatternShare[];
}

export function isPersonalColumn(column: ColumnFacts, markedPii = false): boolean {
  if (markedPii) return true;
  if (PERSONAL_NAME.test(column.name)) return true;
  return (column.patterns ?? []).some((p) => PERSONAL_PATTERNS.has(p.pattern) && p.share >= 0.3);
}

/**
 * What a masked value looks like: its shape (capitals → A, every other letter of any script and the
 * marks that join letters → a, digits → 9) with the length kept. Scripts without case (Han, Arabic,
 * Devanagari …) are letters too: only Latin-like cased letters were masked before.
 */
function maskValue(value: string): string {
  return value.replace(/(\p{Lu}|\p{Lt})|(\p{L}|\p{M})|\p{N}/gu, (_, capital, letter) =>
    capital ? 'A' : letter ? 'a' : '9',
  );
}

/**
 * The masking a workspace applies to values it shows or sends: with `mask` off nothing is masked.
 * `piiFields` are the target-schema fields marked `pii`; a column of that name is personal too.
 */
export function piiMasker(mask: boolean, piiFields: Iterable<string> = []) {
  const marked = new Set([...piiFields].map((f) => f.toLowerCase()));
  const personal = (column: ColumnFacts) => {
    const last = column.name.slice(column.name.lastIndexOf('.') + 1);
    return isPersonalColumn({ ...column, name: last }, marked.has(last.toLowerCase()));
  };
  return {
    mask,
    personal,
    /** Rows with every personal column's values replaced by their shape; and which columns that was. */
    rows<R extends Record<string, unknown>>(columns: readonly string[], rows: readonly R[]) {
      if (!mask) return { rows: [...rows], masked: [] as string[] };
      const masked = columns.filter((name) =>
        personal({ name, patterns: detectPatterns(rows.map((r) => r[name])) }),
      );
      if (!masked.length) return { rows: [...rows], masked };
      return {
        masked,
        rows: rows.map((r) => {
          const copy: Record<string, unknown> = { ...r };
          for (const name of masked)
            if (copy[name] !== null && copy[name] !== undefined) copy[name] = maskValue(String(copy[name]));
          return copy as R;
        }),
      };
    },
  };
}
