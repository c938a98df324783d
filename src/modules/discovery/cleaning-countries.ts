import countries from 'i18n-iso-countries';
import { getCountryCallingCode, isSupportedCountry, Metadata, type CountryCode } from 'libphonenumber-js';

/*
 * Country and phone facts for the cleaning proposals, read from maintained packages rather than
 * typed by hand: country names, aliases and codes from i18n-iso-countries (every locale it ships),
 * calling codes and national (trunk) prefixes from libphonenumber-js's metadata.
 */

/** `Deutschland`, `U.S.`, `côte d'ivoire` → a key with case, accents and punctuation gone. */
const fold = (s: string) =>
  s
    .normalize('NFD')
    .replace(/\p{M}/gu, '')
    .toLowerCase()
    .replace(/[^\p{L}\p{N}]/gu, '');

let lookup: Map<string, string> | undefined;

/**
 * Folded spelling → alpha-2. Codes first (an alpha-2 or alpha-3 code is never read as a name), then
 * English names and aliases, then every other locale's; the first claim of a spelling wins.
 */
function countryLookup(): Map<string, string> {
  if (lookup) return lookup;
  const map = new Map<string, string>();
  const claim = (spelling: string, code: string) => {
    const key = fold(spelling);
    if (key && !map.has(key)) map.set(key, code);
  };
  for (const [alpha2, alpha3] of Object.entries(countries.getAlpha2Codes()).map(
    ([a2]) => [a2, countries.alpha2ToAlpha3(a2)] as const,
  )) {
    claim(alpha2, alpha2);
    if (alpha3) claim(alpha3, alpha2);
  }
  const langs = [
    'en',
    ...countries
      .langs()
      .filter((l) => l !== 'en')
      .sort(),
  ];
  for (const lang of langs)
    for (const [code, names] of Object.entries(countries.getNames(lang, { select: 'all' })))
      for (const name of names as string[]) claim(name, code);
  lookup = map;
  return map;
}

/** The ISO 3166-1 alpha-2 code a free-text country value names, or null when the package knows none. */
export function countryCodeOf(value: string): string | null {
  const key = fold(value);
  return key ? (countryLookup().get(key) ?? null) : null;
}

/** The alpha-3 code of an alpha-2 one (to widen a lookup beyond the sampled spellings). */
export const alpha3Of = (alpha2: string): string | null => countries.alpha2ToAlpha3(alpha2) ?? null;

export interface DialingFacts {
  /** `49` for DE, `1` for US. */
  callingCode: string;
  /** The national (trunk) prefix dialled before a national number (`0` in DE, `1` in the US), if any. */
  nationalPrefix: string | null;
}

/** Dialling facts of an alpha-2 country from libphonenumber-js's metadata; null for an unknown one. */
export function dialingFacts(alpha2: string): DialingFacts | null {
  if (!isSupportedCountry(alpha2)) return null;
  const metadata = new Metadata();
  metadata.selectNumberingPlan(alpha2 as CountryCode);
  // The typings leave out nationalPrefix(), which the metadata's numbering plan has at run time.
  const plan = metadata.numberingPlan as unknown as { nationalPrefix(): string | undefined } | undefined;
  const prefix = plan?.nationalPrefix() ?? null;
  return {
    callingCode: getCountryCallingCode(alpha2 as CountryCode),
    nationalPrefix: prefix && /^[0-9]+$/.test(prefix) ? prefix : null,
  };
}
