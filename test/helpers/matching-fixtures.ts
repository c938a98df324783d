import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { detectPatterns } from '../../src/llm/value-patterns.ts';
import { cleaningConverts } from '../../src/modules/discovery/cleaning.ts';
import {
  matchTable,
  type SourceTable,
  type TableMatch,
  type TargetTable,
} from '../../src/llm/offline-matcher.ts';

export interface MatchingFixture {
  file: string;
  system: string;
  target_table: string;
  tables: {
    name: string;
    columns: {
      name: string;
      type: string;
      primary_key?: boolean;
      references?: { table: string; column: string };
      samples: string[];
    }[];
  }[];
  /** target field → `table.column`; fields without a source are absent. */
  mapping: Record<string, string>;
}

const FIXTURE_DIR = join(import.meta.dirname, '..', 'fixtures', 'matching');
const TEMPLATE = join(import.meta.dirname, '..', '..', 'seeds', 'schemas', 'customer-360.json');

export function loadFixtures(): MatchingFixture[] {
  return readdirSync(FIXTURE_DIR)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((file) => ({ file, ...JSON.parse(readFileSync(join(FIXTURE_DIR, file), 'utf8')) }));
}

export function loadTargetTable(name: string): TargetTable {
  const template = JSON.parse(readFileSync(TEMPLATE, 'utf8')) as { tables: TargetTable[] };
  const table = template.tables.find((t) => t.name === name);
  if (!table) throw new Error(`customer-360 template has no table ${name}`);
  return table;
}

/** The fixture's tables as discovery sees them: types, keys and the patterns of the sampled values. */
function sourceTablesOf(fixture: MatchingFixture): SourceTable[] {
  return fixture.tables.map((t) => ({
    name: t.name,
    columns: t.columns.map((c) => ({
      name: c.name,
      type: c.type,
      isPrimaryKey: !!c.primary_key,
      references: c.references ?? null,
      patterns: detectPatterns(c.samples),
      samples: c.samples,
    })),
  }));
}

export interface Score {
  tp: number;
  fp: number;
  fn: number;
  precision: number;
  recall: number;
  f1: number;
  errors: string[];
}

export function scoreMatch(fixture: MatchingFixture, match: TableMatch): Score {
  let tp = 0;
  let fp = 0;
  let fn = 0;
  const errors: string[] = [];
  for (const field of match.fields) {
    const truth = fixture.mapping[field.target_field];
    const got = field.suggestion?.source_field;
    if (got && got === truth) tp++;
    else if (got || truth) {
      if (got) fp++;
      if (truth) fn++;
      errors.push(
        `${field.target_field}: expected ${truth ?? '—'}, got ${got ?? '—'} (${field.suggestion?.confidence ?? ''})`,
      );
    }
  }
  return f1Of(tp, fp, fn, errors);
}

export function f1Of(tp: number, fp: number, fn: number, errors: string[] = []): Score {
  const precision = tp + fp === 0 ? 1 : tp / (tp + fp);
  const recall = tp + fn === 0 ? 1 : tp / (tp + fn);
  const f1 = precision + recall === 0 ? 0 : (2 * precision * recall) / (precision + recall);
  return { tp, fp, fn, precision, recall, f1, errors };
}

/**
 * The matcher as discovery runs it on a PostgreSQL source: a pair without a cast is suggested when
 * discovery's cleaning converts it (epoch seconds into a timestamptz), as it writes that conversion.
 */
export function runFixture(fixture: MatchingFixture): { match: TableMatch; score: Score } {
  const match = matchTable(loadTargetTable(fixture.target_table), sourceTablesOf(fixture), {
    converts: cleaningConverts,
  });
  return { match, score: scoreMatch(fixture, match) };
}
