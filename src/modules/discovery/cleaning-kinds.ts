/** The kinds of cleaning discovery proposes (src/modules/discovery/cleaning.ts builds them). */
export const CLEANING_KINDS = [
  'country_alpha2',
  'phone_e164',
  'email_normalised',
  'epoch_seconds',
  'epoch_milliseconds',
  'boolean_text',
  'inverted_flag',
  'cents_to_units',
] as const;
export type CleaningKind = (typeof CLEANING_KINDS)[number];

/** What a stored transformation remembers of the proposal it came from (absent: written by a person). */
export interface ProposedBy {
  kind: CleaningKind;
  source_field: string;
  /** Share of the sampled non-blank source values the expression converts, in [0, 1]. */
  share: number;
  /** Non-blank source values in the sample the share was measured on. */
  sampled: number;
}
