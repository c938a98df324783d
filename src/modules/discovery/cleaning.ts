import { parseTableKey, splitSourceField } from '../../transform/mapping.ts';
import { sourceTableSql } from '../../transform/sql.ts';
import { quoteIdent } from '../../warehouse/postgres.ts';
import { isStructuredType, type ColumnValues } from '../../llm/matcher-values.ts';
import type { QueryRunner } from '../../llm/profile.ts';
import type { PatternShare } from '../../llm/value-patterns.ts';
import type { CleaningKind, ProposedBy } from './cleaning-kinds.ts';
import { alpha3Of, countryCodeOf, dialingFacts } from './cleaning-countries.ts';

/*
 * Discovery's cleaning proposals: for a suggested source column and its target field, a SQL
 * expression that turns the source's values into what the target field means (a country name into
 * its ISO 3166-1 alpha-2 code, a phone number into E.164, epoch seconds into a timestamptz, …). Each
 * proposal is an ordinary mapping transformation, written only from constructs that preview,
 * materialize and the generated Python script all evaluate alike, and carries the share of the
 * sampled source values it converts, measured by running it on the profile's sample rows.
 */

export interface CleaningProposal extends ProposedBy {
  target_field: string;
  expression: string;
  description: string;
}

interface CleaningColumn {
  name: string;
  type: string;
  /** The type of the values (a domain's base type; see ColumnValues); absent, `type`. */
  baseType?: string;
  patterns?: PatternShare[];
  samples?: string[];
}

export interface CleaningInput {
  target: { name: string; columns: { name: string; type: string; description?: string | null }[] };
  /** The mapping's connections after discovery (suggested and confirmed), one per target field. */
  connections: { source_field: string; target_field: string }[];
  /** Profiled source tables by key (`schema.table`). */
  sources: ReadonlyMap<string, { columns: CleaningColumn[] }>;
  /** Runs SQL on the source (PostgreSQL): measures shares and reads a column's distinct spellings. */
  run: QueryRunner;
  /** Rows of the sample (the profile's row limit); null for the whole table. */
  rowLimit: number | null;
}

/** Most spellings a country lookup lists; past it the generated Python nests too deep. */
const MAX_COUNTRY_KEYS = 120;
/** Most countries a phone proposal knows the calling code of (the same nesting limit). */
const MAX_PHONE_COUNTRIES = 40;

const literal = (s: string) => `'${s.replace(/'/g, "''")}'`;

/** `customerId`, `opted_out`, `DO-NOT-CONTACT` → their lower-case words. */
const words = (name: string) =>
  name
    .replace(/([a-z0-9])([A-Z])/g, '$1_$2')
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter(Boolean);

const TEXT_TYPES =
  /^(text|varchar|character varying|char|character|bpchar|citext|string|nvarchar|longtext|mediumtext|tinytext)\b/i;
const INTEGER_TYPES = /^(int|integer|int2|int4|int8|smallint|bigint|serial|bigserial|tinyint|mediumint)\b/i;
const NUMERIC_TYPES = /^(numeric|decimal|real|double|float|float4|float8)\b/i;
// `text[]` starts like `text` but holds arrays, which no cleaning function takes.
const isOf = (types: RegExp) => (type: string) => !isStructuredType(type) && types.test(type.trim());
const isText = isOf(TEXT_TYPES);
const isInteger = isOf(INTEGER_TYPES);
const isDecimal = isOf(NUMERIC_TYPES);
const isNumber = (type: string) => isInteger(type) || isDecimal(type);
const isBoolean = isOf(/^bool(ean)?\b/i);
/** What a column's values are: a domain over text is text to every cleaning function. */
const valuesType = (column: CleaningColumn) => column.baseType ?? column.type;

const TRUE_TOKENS = ['1', 'on', 't', 'true', 'y', 'yes'];
const FALSE_TOKENS = ['0', 'f', 'false', 'n', 'no', 'off'];

/**
 * A flag whose name says the opposite of consent or activity: `opted_out`, `unsubscribed`,
 * `do_not_contact`, `is_inactive`. Its values are the negation of a positively named field's.
 */
function isNegated(name: string): boolean {
  const w = words(name);
  const joined = w.join('_');
  if (/^(do_not|dont|dnc|no|not|non)(_|$)/.test(joined)) return true;
  if (/(^|_)(is_)?(do_not|dont)_/.test(joined)) return true;
  return w.some((x) =>
    [
      'out',
      'optout',
      'optedout',
      'unsubscribed',
      'unsubscribe',
      'inactive',
      'disabled',
      'blocked',
      'suppressed',
      'blacklisted',
      'blocklisted',
      'declined',
      'revoked',
    ].includes(x),
  );
}

const MONEY_WORDS = new Set([
  'amount',
  'price',
  'total',
  'value',
  'revenue',
  'spend',
  'spent',
  'cost',
  'balance',
  'subtotal',
  'fee',
  'tax',
  'discount',
  'paid',
  'refund',
  'ltv',
]);
const CENTS_WORDS = new Set(['cents', 'cent', 'pennies', 'penny', 'minor', 'cts']);

const patternShare = (column: CleaningColumn, pattern: string) =>
  column.patterns?.find((p) => p.pattern === pattern)?.share ?? 0;

interface Draft {
  kind: CleaningKind;
  expression: string;
  description: string;
  /** SQL over `v` (the expression's value) saying it converted: not null unless stricter. */
  converted?: (v: string) => string;
}

/** The proposals for a table's connections; a connection that needs no cleaning gets none. */
export async function proposeCleaning(input: CleaningInput): Promise<CleaningProposal[]> {
  const targetByName = new Map(input.target.columns.map((c) => [c.name, c]));
  const proposals: CleaningProposal[] = [];
  const countryCases = new Map<string, Promise<CountryCase | null>>();
  const countryCaseOf = (table: string, column: string) => {
    const key = `${table}.${column}`;
    if (!countryCases.has(key)) countryCases.set(key, countryCase(input, table, column));
    return countryCases.get(key)!;
  };

  for (const connection of input.connections) {
    const target = targetByName.get(connection.target_field);
    const split = splitSourceField(connection.source_field);
    const table = split && input.sources.get(split.table);
    const column = split && table?.columns.find((c) => c.name === split.column);
    if (!target || !split || !table || !column) continue;
    const ref = columnRef(split.table, split.column);
    const targetWords = words(target.name);
    const type = target.type.toLowerCase();
    let draft: Draft | null = null;

    if (type === 'boolean') draft = booleanDraft(ref, column, target.name);
    else if (type === 'timestamptz') draft = epochDraft(ref, column);
    else if (type === 'text' && targetWords.includes('country')) {
      if (isText(valuesType(column))) {
        const found = await countryCaseOf(split.table, split.column);
        if (found && !found.alreadyCodes)
          draft = {
            kind: 'country_alpha2',
            expression: found.expression,
            description: `ISO 3166-1 alpha-2 code of ${split.column}: ${found.spellings} spellings of ${found.codes.length} countries found in the sample (names in every locale of i18n-iso-countries, alpha-2 and alpha-3 codes); a spelling the package does not know becomes NULL`,
          };
      }
    } else if (
      type === 'text' &&
      targetWords.some((w) => ['phone', 'mobile', 'telephone', 'tel', 'fax', 'msisdn'].includes(w))
    ) {
      if (
        isText(valuesType(column)) &&
        (patternShare(column, 'phone') >= 0.5 || /phone|mobile|tel/i.test(column.name))
      )
        draft = await phoneDraft(input, ref, split.table, column, countryCaseOf);
    } else if (type === 'text' && targetWords.some((w) => w === 'email' || w === 'mail')) {
      if (isText(valuesType(column)) && (patternShare(column, 'email') >= 0.5 || /mail/i.test(column.name)))
        draft = {
          kind: 'email_normalised',
          expression: `lower(trim(${ref}))`,
          description: `${split.column} trimmed and lower-cased, so one address is spelled one way`,
          converted: (v) => `coalesce(${v} ~ '^[^@[:space:]]+@[^@[:space:]]+[.][^@[:space:]]+$', false)`,
        };
    } else if (type === 'numeric') draft = centsDraft(ref, column, target.name, table.columns);

    if (!draft) continue;
    const { share, sampled } = await measure(input, split.table, ref, draft);
    proposals.push({
      target_field: connection.target_field,
      source_field: connection.source_field,
      kind: draft.kind,
      expression: draft.expression,
      description: `${draft.description} (proposed by discovery; converts ${Math.round(share * 1000) / 10}% of ${sampled} sampled values)`,
      share,
      sampled,
    });
  }
  return proposals;
}

/**
 * Whether a proposal of this module turns the column into a value of the field's type by an
 * expression of its own (epoch numbers into a timestamptz, 0/1 integers into a boolean), decided on
 * the same samples as `proposeCleaning`. Discovery gives it to the matcher as `converts`: a pair
 * PostgreSQL has no cast for is still a suggestion when this proposal comes with it, because the
 * generated SQL then casts the proposal's result, not the column.
 */
export function cleaningConverts(column: ColumnValues, targetType: string): boolean {
  const named = { name: '', ...column };
  const type = targetType.toLowerCase();
  if (type === 'timestamptz') return epochDraft('', named) !== null;
  if (type === 'boolean') return booleanDraft('', named, '') !== null;
  return false;
}

// Names are always quoted: a bare lower-case name may be a keyword (`select`, `order`), which
// PostgreSQL does not read as an identifier; the mapping routes and the Python export take both.
const fromClause = (tableKey: string) => sourceTableSql(parseTableKey(tableKey));
const columnRef = (tableKey: string, column: string) => `${fromClause(tableKey)}.${quoteIdent(column)}`;

/** The share of the sample's non-blank values the draft converts, measured on the source itself. */
async function measure(
  input: CleaningInput,
  tableKey: string,
  ref: string,
  draft: Draft,
): Promise<{ share: number; sampled: number }> {
  const converted = (draft.converted ?? ((v: string) => `${v} is not null`))(`(${draft.expression})`);
  const params: unknown[] = [];
  let limit = '';
  if (input.rowLimit !== null) {
    params.push(Math.max(1, Math.floor(input.rowLimit)));
    limit = ` limit $1`;
  }
  const rows = await input.run(
    `select count(*) filter (where present) as present, count(*) filter (where present and ok) as ok
       from (select (${ref} is not null and btrim(${ref}::text) <> '') as present, (${converted}) as ok
               from ${fromClause(tableKey)}${limit}) as sampled`,
    params,
  );
  const present = Number(rows[0]?.present ?? 0);
  const ok = Number(rows[0]?.ok ?? 0);
  return { sampled: present, share: present === 0 ? 0 : Math.round((ok / present) * 10_000) / 10_000 };
}

// ---- booleans, inverted flags ----

function booleanDraft(ref: string, column: CleaningColumn, targetName: string): Draft | null {
  const inverted = isNegated(column.name) !== isNegated(targetName);
  const [yes, no] = inverted ? ['false', 'true'] : ['true', 'false'];
  const why = inverted
    ? `${column.name} says the opposite of ${targetName}, so its values are negated`
    : `${column.name}'s yes/no values as a boolean`;
  if (isBoolean(valuesType(column)))
    return inverted ? { kind: 'inverted_flag', expression: `NOT ${ref}`, description: why } : null;
  const samples = (column.samples ?? []).map((s) => s.trim().toLowerCase()).filter(Boolean);
  const tokens = new Set([...TRUE_TOKENS, ...FALSE_TOKENS]);
  if (samples.length === 0 || !samples.every((s) => tokens.has(s))) return null;
  const kind: CleaningKind = inverted ? 'inverted_flag' : 'boolean_text';
  if (isInteger(valuesType(column)))
    return {
      kind,
      expression: `CASE ${ref} WHEN 1 THEN ${yes} WHEN 0 THEN ${no} END`,
      description: `${why}; 1 and 0 are read, other values become NULL`,
    };
  if (!isText(valuesType(column))) return null;
  const arms = [
    ...TRUE_TOKENS.map((t) => `WHEN ${literal(t)} THEN ${yes}`),
    ...FALSE_TOKENS.map((t) => `WHEN ${literal(t)} THEN ${no}`),
  ];
  return {
    kind,
    expression: `CASE lower(trim(${ref})) ${arms.join(' ')} END`,
    description: `${why}; yes/no, y/n, true/false, t/f, on/off and 1/0 in any case are read, other values become NULL`,
  };
}

// ---- epoch timestamps ----

const SECONDS = [1e8, 1e10] as const; // 1973 … 2286
const MILLISECONDS = [1e11, 1e13] as const; // 1973 … 2286

function epochDraft(ref: string, column: CleaningColumn): Draft | null {
  const numeric = isNumber(valuesType(column));
  if (!numeric && !isText(valuesType(column))) return null;
  const values = (column.samples ?? []).map((s) => s.trim()).filter(Boolean);
  if (values.length === 0 || !values.every((s) => /^[0-9]+(\.[0-9]+)?$/.test(s))) return null;
  const numbers = values.map(Number);
  const within = ([low, high]: readonly [number, number]) => numbers.every((n) => n >= low && n < high);
  const value = numeric ? ref : `${ref}::numeric`;
  if (within(SECONDS))
    return {
      kind: 'epoch_seconds',
      expression: `to_timestamp(${value})`,
      description: `${column.name} holds seconds since 1970-01-01 UTC (every sampled value lies between 1973 and 2286 as seconds)`,
    };
  if (within(MILLISECONDS))
    return {
      kind: 'epoch_milliseconds',
      expression: `to_timestamp(${value} / 1000.0)`,
      description: `${column.name} holds milliseconds since 1970-01-01 UTC (every sampled value lies between 1973 and 2286 as milliseconds)`,
    };
  return null;
}

// ---- amounts in cents ----

function centsDraft(
  ref: string,
  column: CleaningColumn,
  targetName: string,
  siblings: CleaningColumn[],
): Draft | null {
  const integerText =
    isText(valuesType(column)) &&
    (column.samples ?? []).length > 0 &&
    (column.samples ?? []).every((s) => /^\s*-?[0-9]+\s*$/.test(s));
  if (!isInteger(valuesType(column)) && !integerText) return null;
  const sourceWords = words(column.name);
  const nameSays = sourceWords.some((w) => CENTS_WORDS.has(w)) || /cents$/i.test(column.name);
  // Payment systems export integer amounts in the currency's minor unit next to its code (Stripe's
  // `amount` + `currency`): an integer amount beside a currency-code column is read as cents.
  const valuesSay =
    words(targetName).some((w) => MONEY_WORDS.has(w)) &&
    sourceWords.some((w) => MONEY_WORDS.has(w)) &&
    siblings.some((c) => c !== column && patternShare(c, 'currency_code') >= 0.8);
  if (!nameSays && !valuesSay) return null;
  const value = isInteger(valuesType(column)) ? ref : `trim(${ref})`;
  return {
    kind: 'cents_to_units',
    expression: `round(${value}::numeric / 100, 2)`,
    description: nameSays
      ? `${column.name} is in cents (its name says so): divided by 100`
      : `${column.name} holds integer amounts next to a currency code, as payment systems export minor units: divided by 100`,
  };
}

// ---- countries ----

interface CountryCase {
  expression: string;
  codes: string[];
  spellings: number;
  /** Every sampled value is already an upper-case alpha-2 code: nothing to clean. */
  alreadyCodes: boolean;
}

/** `upper()` as PostgreSQL's C ctype does it (ASCII only) and as a Unicode one does: both keys are listed. */
const upperKeys = (s: string) => [
  ...new Set([s.replace(/[a-z]+/g, (m) => m.toUpperCase()), s.toUpperCase()]),
];

/**
 * A CASE over the distinct spellings of the sampled column (read from the source, not only the
 * profile's few samples), each mapped to its alpha-2 code by i18n-iso-countries, widened with the
 * alpha-2 and alpha-3 codes of every country found. Null when fewer than half the spellings name a
 * country.
 */
async function countryCase(
  input: CleaningInput,
  tableKey: string,
  column: string,
): Promise<CountryCase | null> {
  const ref = columnRef(tableKey, column);
  const params: unknown[] = [];
  let limit = '';
  if (input.rowLimit !== null) {
    params.push(Math.max(1, Math.floor(input.rowLimit)));
    limit = ` limit $1`;
  }
  const rows = await input.run(
    `select distinct v from (select ${ref}::text as v from ${fromClause(tableKey)}${limit}) as sampled
      where v is not null and btrim(v) <> '' order by v limit 1000`,
    params,
  );
  const spellings = rows.map((r) => String(r.v));
  if (spellings.length === 0) return null;
  const keys = new Map<string, string>();
  let resolved = 0;
  for (const spelling of spellings) {
    const code = countryCodeOf(spelling);
    if (!code) continue;
    resolved++;
    for (const key of upperKeys(spelling.replace(/^ +| +$/g, ''))) if (!keys.has(key)) keys.set(key, code);
  }
  if (resolved / spellings.length < 0.5) return null;
  const codes = [...new Set(keys.values())].sort();
  for (const code of codes) {
    if (!keys.has(code)) keys.set(code, code);
    const alpha3 = alpha3Of(code);
    if (alpha3 && !keys.has(alpha3)) keys.set(alpha3, code);
  }
  const arms = [...keys]
    .sort((a, b) => a[1].localeCompare(b[1]) || a[0].localeCompare(b[0]))
    .slice(0, MAX_COUNTRY_KEYS)
    .map(([key, code]) => `WHEN ${literal(key)} THEN ${literal(code)}`);
  return {
    expression: `CASE upper(trim(${ref})) ${arms.join(' ')} END`,
    codes,
    spellings: resolved,
    alreadyCodes: spellings.every((s) => /^[A-Z]{2}$/.test(s) && codes.includes(s)),
  };
}

// ---- phones ----

/**
 * E.164 from the number as typed: `+` or `00` numbers keep their own country code; a national number
 * gets the calling code of the row's country (from a country column of the same table, read through
 * the country lookup) with the country's national prefix removed. Digits only: the length is not
 * validated, extensions are not recognised, and a national number without a known country is NULL.
 */
async function phoneDraft(
  input: CleaningInput,
  ref: string,
  tableKey: string,
  column: CleaningColumn,
  countryCaseOf: (table: string, column: string) => Promise<CountryCase | null>,
): Promise<Draft> {
  const table = input.sources.get(tableKey)!;
  // The country column of the same table: the one a country field is mapped from, else any whose
  // values are mostly countries.
  const mapped = input.connections
    .filter((c) => words(c.target_field).includes('country'))
    .map((c) => splitSourceField(c.source_field))
    .filter((s) => s?.table === tableKey)
    .map((s) => s!.column);
  const others = table.columns
    .filter(
      (c) =>
        c !== column &&
        isText(valuesType(c)) &&
        (words(c.name).includes('country') || patternShare(c, 'country_code') >= 0.5),
    )
    .map((c) => c.name);
  let country: { column: string; found: CountryCase } | null = null;
  for (const name of [...new Set([...mapped, ...others])]) {
    const found = await countryCaseOf(tableKey, name);
    if (found) {
      country = { column: name, found };
      break;
    }
  }
  const digits = `regexp_replace(regexp_replace(${ref}, '[(]0[)]', '', 'g'), '[^0-9]', '', 'g')`;
  const arms: string[] = [];
  for (const code of (country?.found.codes ?? []).slice(0, MAX_PHONE_COUNTRIES)) {
    const facts = dialingFacts(code);
    if (!facts) continue;
    const national = facts.nationalPrefix
      ? `regexp_replace(${digits}, '^${facts.nationalPrefix}', '')`
      : digits;
    arms.push(`WHEN ${literal(code)} THEN '+${facts.callingCode}' || ${national}`);
  }
  const nationalCase = arms.length ? ` ELSE CASE ${country!.found.expression} ${arms.join(' ')} END` : '';
  const expression =
    `CASE WHEN ${digits} = '' THEN NULL` +
    ` WHEN trim(${ref}) ~ '^[+]' THEN '+' || ${digits}` +
    ` WHEN ${digits} ~ '^00' THEN '+' || substr(${digits}, 3)` +
    `${nationalCase} END`;
  const countries = country?.found.codes ?? [];
  return {
    kind: 'phone_e164',
    expression,
    description: country
      ? `${column.name} in E.164: numbers with + or 00 keep their country code, national numbers get the calling code of ${country.column} (${countries.join(', ')}; libphonenumber-js metadata) without the national prefix; the length is not validated`
      : `${column.name} in E.164 where the number carries its country code (+ or 00); the table has no country column, so national numbers become NULL`,
    converted: (v) => `coalesce(${v} ~ '^[+][1-9][0-9]{6,14}$', false)`,
  };
}
