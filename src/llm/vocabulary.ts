import { readFileSync } from 'node:fs';
import { z } from 'zod';

/**
 * The matcher's vocabulary lives in `vocabulary.json` (data, reviewed like data); this module reads
 * it once, checks it against the schema below and hands out the lookup structures. A broken file
 * fails at startup with the path of the bad entry instead of matching badly.
 */

const word = z.string().regex(/^[a-z0-9][a-z0-9 '-]*$/, 'lower-case words separated by single spaces');

const vocabularySchema = z
  .object({
    $schema: z.string().optional(),
    about: z.string(),
    word_variants: z
      .record(z.string(), z.record(word, word))
      .describe('Single words → their canonical word(s), grouped by topic; applied before phrases'),
    phrases: z
      .record(z.string().regex(/^[a-z0-9_]+$/), z.array(word).min(1))
      .describe('Concept → the canonical word sequences that mean it; the longest match wins'),
    related: z
      .array(z.tuple([z.string(), z.string(), z.number().gt(0).lt(1)]))
      .describe('Concepts that are related but not the same, with how much one stands for the other'),
    token_weights: z
      .record(z.string(), z.number().positive())
      .describe('Concepts that say more or less than an ordinary word (default weight 1)'),
    qualifiers: z
      .array(word)
      .describe('Words that say which one of a kind (home, billing, mobile) without changing what it is'),
    stop_words: z.array(word).describe('Words with no meaning of their own in a column name'),
    other_entities: z
      .array(word)
      .describe('Nouns of things that are not the customer: their names and keys are not the customer’s'),
    person_table_nouns: z
      .array(word)
      .describe('Table nouns for people that are not customer words in a column name (a Contact table)'),
    record_key_words: z
      .array(word)
      .describe('Words that, before "id" in a key column, only say "this row" (object_id, record_id)'),
  })
  .strict();

type VocabularyFile = z.infer<typeof vocabularySchema>;

/** The vocabulary file checked: its schema, no word a variant twice, no relation to nothing. */
export function parseVocabulary(raw: unknown): VocabularyFile {
  const parsed = vocabularySchema.safeParse(raw);
  if (!parsed.success)
    throw new Error(`src/llm/vocabulary.json is invalid: ${z.prettifyError(parsed.error)}`);
  const v = parsed.data;
  const seen = new Map<string, string>();
  for (const [group, variants] of Object.entries(v.word_variants))
    for (const w of Object.keys(variants)) {
      const other = seen.get(w);
      if (other) throw new Error(`src/llm/vocabulary.json: "${w}" is a variant in "${other}" and "${group}"`);
      seen.set(w, group);
    }
  // A relation between concepts nothing produces would never apply: a typo, caught here.
  const producible = new Set<string>(Object.keys(v.phrases));
  for (const variants of Object.values(v.word_variants))
    for (const canonical of Object.values(variants)) for (const w of canonical.split(' ')) producible.add(w);
  for (const phrases of Object.values(v.phrases))
    for (const phrase of phrases) for (const w of phrase.split(' ')) producible.add(w);
  for (const [a, b] of v.related)
    for (const c of [a, b])
      if (!producible.has(c))
        throw new Error(`src/llm/vocabulary.json: related names "${c}", which no phrase or variant produces`);
  return v;
}

const file = parseVocabulary(
  JSON.parse(readFileSync(new URL('./vocabulary.json', import.meta.url), 'utf8')) as unknown,
);

/** Single-word variants → their canonical word(s). */
export const WORD_VARIANTS: Readonly<Record<string, string>> = Object.assign(
  {},
  ...Object.values(file.word_variants),
);
export const PHRASES: Readonly<Record<string, readonly string[]>> = file.phrases;
export const RELATED: readonly (readonly [string, string, number])[] = file.related;
export const TOKEN_WEIGHTS: Readonly<Record<string, number>> = file.token_weights;
export const QUALIFIERS: ReadonlySet<string> = new Set(file.qualifiers);
export const STOP_WORDS: ReadonlySet<string> = new Set(file.stop_words);
export const OTHER_ENTITIES: ReadonlySet<string> = new Set(file.other_entities);
export const RECORD_KEY_WORDS: ReadonlySet<string> = new Set(file.record_key_words);
export const PERSON_TABLE_NOUNS: ReadonlySet<string> = new Set(file.person_table_nouns);
