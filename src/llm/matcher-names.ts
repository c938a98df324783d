import {
  OTHER_ENTITIES,
  PERSON_TABLE_NOUNS,
  PHRASES,
  QUALIFIERS,
  RECORD_KEY_WORDS,
  RELATED,
  STOP_WORDS,
  TOKEN_WEIGHTS,
  WORD_VARIANTS,
} from './vocabulary.ts';

/**
 * Names → concepts for the offline matcher: a column or field name is split into words, each word
 * normalised against the vocabulary (variants, plurals, glued words, abbreviations), and the words
 * read as the concepts they form ("CUST_TEL_NO" → customer, phone). Two concept lists are then
 * compared by weighted coverage.
 */

const PHRASE_OF = new Map<string, string>();
const CONCEPTS = new Set(Object.keys(PHRASES));
export const ENTITIES = new Set(['customer', 'account']);
const ADDRESS_PARTS = new Set(['city', 'state', 'postal_code', 'country', 'address_line_2']);
const KNOWN_WORDS = new Set<string>([...STOP_WORDS, ...QUALIFIERS, ...Object.keys(WORD_VARIANTS)]);
/** Words an abbreviation may stand for: canonical words, not other abbreviations or brand names. */
const FULL_WORDS = new Set<string>();
let longestPhrase = 1;

function splitWords(name: string): string[] {
  return name
    .replace(/#/g, ' number ')
    .replace(/([a-z])([A-Z])/g, '$1 $2')
    .replace(/([A-Z]+)([A-Z][a-z])/g, '$1 $2')
    .replace(/([a-zA-Z])(\d)/g, '$1 $2')
    .replace(/(\d)([a-zA-Z])/g, '$1 $2')
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter(Boolean);
}

for (const value of Object.values(WORD_VARIANTS)) for (const w of value.split(' ')) FULL_WORDS.add(w);
for (const phrases of Object.values(PHRASES))
  for (const phrase of phrases) for (const w of phrase.split(' ')) FULL_WORDS.add(w);
for (const w of FULL_WORDS) KNOWN_WORDS.add(w);

const isKnown = (w: string) =>
  KNOWN_WORDS.has(w) ||
  (w.length > 3 && w.endsWith('s') && KNOWN_WORDS.has(w.slice(0, -1))) ||
  (w.length > 4 && w.endsWith('ies') && KNOWN_WORDS.has(`${w.slice(0, -3)}y`));

function singular(w: string): string {
  if (KNOWN_WORDS.has(w)) return w;
  if (w.length > 4 && w.endsWith('ies') && KNOWN_WORDS.has(`${w.slice(0, -3)}y`)) return `${w.slice(0, -3)}y`;
  if (w.length > 3 && w.endsWith('s') && KNOWN_WORDS.has(w.slice(0, -1))) return w.slice(0, -1);
  return w;
}

/** A glued word ("signupdate", "totalorders") split into 2–3 known words, at most one of two letters. */
function wordBreak(w: string): string[] | null {
  const n = w.length;
  const best = (start: number, parts: number, shortUsed: boolean): string[] | null => {
    if (start === n) return [];
    if (parts === 0) return null;
    for (let end = n; end >= start + 2; end--) {
      const piece = w.slice(start, end);
      const short = piece.length === 2;
      if ((short && shortUsed) || !isKnown(piece)) continue;
      const rest = best(end, parts - 1, shortUsed || short);
      if (rest) return [piece, ...rest];
    }
    return null;
  };
  const parts = best(0, 3, false);
  return parts && parts.length > 1 ? parts : null;
}

const VOWELS = /[aeiou]/g;
const isSubsequence = (short: string, long: string) => {
  let i = 0;
  for (const ch of long) if (ch === short[i]) i++;
  return i === short.length;
};

/** A consonant-heavy abbreviation ("cntry", "phn", "addr") read as the known word it abbreviates. */
function expandAbbreviation(w: string): string | null {
  if (w.length < 3 || w.length > 6) return null;
  if (w.length > 4 && (w.match(VOWELS)?.length ?? 0) / w.length > 0.4) return null;
  let best: { word: string; score: number } | null = null;
  for (const word of FULL_WORDS) {
    if (word.length <= w.length || word[0] !== w[0] || !isSubsequence(w, word)) continue;
    let prefix = 0;
    while (prefix < w.length && w[prefix] === word[prefix]) prefix++;
    const score = prefix + w.length / word.length;
    if (!best || score > best.score || (score === best.score && word < best.word)) best = { word, score };
  }
  return best?.word ?? null;
}

/** The vocabulary never changes, so what a word normalizes to is computed once per process. */
const NORMALIZED = new Map<string, string[]>();
const NORMALIZED_MAX = 50_000;

function normalizeWord(w: string, depth = 0): string[] {
  if (depth > 0) return normalizeUncached(w, depth);
  let out = NORMALIZED.get(w);
  if (!out) {
    out = normalizeUncached(w, 0);
    if (NORMALIZED.size >= NORMALIZED_MAX) NORMALIZED.clear();
    NORMALIZED.set(w, out);
  }
  return out;
}

function normalizeUncached(w: string, depth: number): string[] {
  if (/^\d+$/.test(w)) return [String(Number.parseInt(w, 10))];
  const variant = WORD_VARIANTS[w];
  if (variant !== undefined) return variant.split(' ');
  if (KNOWN_WORDS.has(w)) return [w];
  const s = singular(w);
  if (s !== w) return normalizeWord(s, depth);
  if (depth > 0) return [w];
  const parts = wordBreak(w);
  if (parts) return parts.flatMap((p) => normalizeWord(p, depth + 1));
  const expanded = expandAbbreviation(w);
  if (expanded) return normalizeWord(expanded, depth + 1);
  return [w];
}

for (const [concept, phrases] of Object.entries(PHRASES)) {
  for (const phrase of phrases) {
    const normalized = phrase
      .split(' ')
      .flatMap((w) => normalizeWord(w))
      .join(' ');
    // A phrase written out as people write it wins over another phrase's normalized form.
    PHRASE_OF.set(phrase, concept);
    if (!PHRASE_OF.has(normalized)) PHRASE_OF.set(normalized, concept);
    longestPhrase = Math.max(longestPhrase, phrase.split(' ').length, normalized.split(' ').length);
  }
}

const CONCEPTS_OF = new Map<string, readonly string[]>();

/** The concepts a column (or field) name stands for, e.g. "CUST_TEL_NO" → [customer, phone]. */
export function conceptsOf(name: string, stripPrefix = ''): string[] {
  const key = `${stripPrefix}\u0000${name}`;
  let concepts = CONCEPTS_OF.get(key);
  if (!concepts) {
    concepts = Object.freeze(computeConcepts(name, stripPrefix));
    if (CONCEPTS_OF.size >= NORMALIZED_MAX) CONCEPTS_OF.clear();
    CONCEPTS_OF.set(key, concepts);
  }
  return [...concepts];
}

function computeConcepts(name: string, stripPrefix: string): string[] {
  const raw =
    stripPrefix && name.toLowerCase().startsWith(stripPrefix) ? name.slice(stripPrefix.length) : name;
  const words = splitWords(raw);
  const normalized = words.map((w) => normalizeWord(w));
  const out: string[] = [];
  let i = 0;
  while (i < words.length) {
    let matched = false;
    for (let len = Math.min(longestPhrase, words.length - i); len >= 1 && !matched; len--) {
      const rawKey = words.slice(i, i + len).join(' ');
      const normKey = normalized
        .slice(i, i + len)
        .flat()
        .join(' ');
      const concept = PHRASE_OF.get(rawKey) ?? PHRASE_OF.get(normKey);
      if (concept) {
        // "Event Name", "Plan Name": the name of some other thing, not of the person.
        const previous = out[out.length - 1];
        const foreign = previous !== undefined && !CONCEPTS.has(previous) && !QUALIFIERS.has(previous);
        out.push(concept === 'full_name' && rawKey === 'name' && foreign ? 'name' : concept);
        i += len;
        matched = true;
      }
    }
    if (matched) continue;
    // No phrase spans this word: its normalized parts may still form phrases among themselves.
    const parts = normalized[i];
    let j = 0;
    while (j < parts.length) {
      let done = false;
      for (let len = parts.length - j; len >= 1 && !done; len--) {
        const concept = PHRASE_OF.get(parts.slice(j, j + len).join(' '));
        if (concept) {
          out.push(concept);
          j += len;
          done = true;
        }
      }
      if (!done) {
        if (!STOP_WORDS.has(parts[j])) out.push(parts[j]);
        j++;
      }
    }
    i++;
  }
  let concepts = [...new Set(out.filter((t) => !STOP_WORDS.has(t)))];
  // "Address City", "address_zip": the city of the address, not the street line.
  if (concepts.includes('street') && concepts.some((c) => ADDRESS_PARTS.has(c)))
    concepts = concepts.filter((c) => c !== 'street');
  // "num_orders" counts orders; "order_no" identifies one.
  if (concepts.length > 1 && concepts[0] === 'number') concepts[0] = 'count';
  // A column named after the entity alone ("customer", "cust", "attendee #") holds its key.
  if (concepts.length === 1 && ENTITIES.has(concepts[0])) concepts.push('id');
  return concepts;
}

/**
 * Legacy files prefix every field with the file's short code (CMCUST, CMNAME, CMADR1). The prefix
 * is stripped when doing so turns more names into known words.
 */
export function commonPrefix(names: readonly string[]): string {
  if (names.length < 4) return '';
  const lower = names.map((n) => n.toLowerCase());
  let prefix = lower[0];
  for (const n of lower) while (!n.startsWith(prefix)) prefix = prefix.slice(0, -1);
  prefix = /^[a-z]*/.exec(prefix)?.[0] ?? '';
  for (let len = Math.min(4, prefix.length); len >= 2; len--) {
    const p = prefix.slice(0, len);
    if (isKnown(p)) continue;
    const knownBefore = lower.filter((n) => isKnown(splitWords(n)[0] ?? '')).length;
    const knownAfter = lower.filter((n) => {
      const first = splitWords(n.slice(len))[0] ?? '';
      return isKnown(first) || wordBreak(first) !== null || expandAbbreviation(first) !== null;
    }).length;
    if (knownAfter > knownBefore && knownAfter >= lower.length / 2) return p;
  }
  return '';
}

const RELATION = new Map<string, Map<string, number>>();
for (const [a, b, s] of RELATED) {
  for (const [x, y] of [
    [a, b],
    [b, a],
  ]) {
    if (!RELATION.has(x)) RELATION.set(x, new Map());
    RELATION.get(x)!.set(y, s);
  }
}

function tokenSimilarity(a: string, b: string): number {
  if (a === b) return 1;
  const related = RELATION.get(a)?.get(b);
  if (related !== undefined) return related;
  if (/^\d+$/.test(a) || /^\d+$/.test(b)) return 0;
  // Unknown words that share a stem ("reservation"/"reserv") are probably the same word.
  if (CONCEPTS.has(a) || CONCEPTS.has(b)) return 0;
  if (a.length >= 4 && b.length >= 4 && (a.startsWith(b) || b.startsWith(a))) return 0.7;
  return 0;
}

/** Stands for a loose word in `cover`: weighs little and matches nothing. */
const LOOSE = '\u0000loose';

const weightOf = (t: string) => (t === LOOSE ? 0.3 : /^\d+$/.test(t) ? 0.35 : (TOKEN_WEIGHTS[t] ?? 1));

/** The weighted share of `from` that `to` covers. */
export function cover(from: readonly string[], to: readonly string[]): number {
  let total = 0;
  let covered = 0;
  for (const a of from) {
    const w = weightOf(a);
    let best = 0;
    for (const b of to) best = Math.max(best, tokenSimilarity(a, b));
    total += w;
    covered += w * best;
  }
  return covered / total;
}

/**
 * How much two concept lists mean the same: the weighted share of each side that the other covers,
 * multiplied; 1 for the same meaning, 0 for nothing in common.
 */
export function conceptSimilarity(source: readonly string[], target: readonly string[]): number {
  if (source.length === 0 || target.length === 0) return 0;
  // A product, not a mean: a name half about something else ("email_verified" for "email") is weak.
  const forward = cover(source, target);
  const backward = cover(target, source);
  // One word the vocabulary does not know, beside an exact match ("location_city", "hs_language"),
  // is a vendor prefix or a qualifier more often than another meaning: it counts for a little only.
  if (backward === 1 && forward < 1 && source.length >= 2) {
    const extra = source.filter((a) => !target.some((b) => tokenSimilarity(a, b) > 0));
    const exact = source.every((a) => extra.includes(a) || target.some((b) => tokenSimilarity(a, b) === 1));
    if (extra.length === 1 && exact && isLoose(extra[0]))
      return cover(
        source.map((a) => (a === extra[0] ? LOOSE : a)),
        target,
      );
  }
  return forward * backward;
}

const isLoose = (w: string) => !CONCEPTS.has(w) && (!isKnown(w) || QUALIFIERS.has(w));

/** Words of a name that say which one of a kind it is ("mobile", "billing", "home"). */
export function qualifiersOf(name: string): string[] {
  return wordsOf(name).filter((w) => QUALIFIERS.has(w));
}

/** Nouns of things other than the customer that a name speaks of ("owner_id", "product name"). */
export function otherEntitiesOf(name: string): string[] {
  return wordsOf(name).filter((w) => OTHER_ENTITIES.has(w) || OTHER_ENTITIES.has(singularOf(w)));
}

/** The words of a name, glued ones ("mobilephone", "ownerid") broken against the vocabulary. */
const wordsOf = (name: string) => splitWords(name).flatMap((w) => (isKnown(w) ? [w] : (wordBreak(w) ?? [w])));

/**
 * A table's concepts, a table of people ("Contact", "leads") read as a table of customers: its
 * record key is the customer's key. Only for tables: "contact number" in a column is a phone.
 */
export function tableConceptsOf(name: string): string[] {
  const concepts = conceptsOf(name).map((c) => (PERSON_TABLE_NOUNS.has(singularOf(c)) ? 'customer' : c));
  return [...new Set(concepts)];
}

const singularOf = (w: string) => (w.endsWith('ies') ? `${w.slice(0, -3)}y` : w.replace(/s$/, ''));

/**
 * A key column whose name says only "this row's id" (`id`, `Id`, `hs_object_id`, `record_id`,
 * `entity_id`): vendor prefixes and record words set aside, nothing but an identifier is left.
 */
export function isRecordKeyName(concepts: readonly string[]): boolean {
  const rest = concepts.filter((c) => !RECORD_KEY_WORDS.has(c) && (CONCEPTS.has(c) || isKnown(c)));
  return rest.length > 0 && rest.every((c) => c === 'id' || c === 'number' || c === 'code' || c === 'key');
}

/** A name made only of words the vocabulary does not know ("CC", "attr_7"): it says nothing. */
export function isOpaqueName(concepts: readonly string[]): boolean {
  return concepts.length > 0 && concepts.every((c) => !CONCEPTS.has(c) && !isKnown(c));
}
