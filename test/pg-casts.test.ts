import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canFeed, typeCompatibility } from '../src/llm/matcher-values.ts';
import { castable, isBuiltInType, type CatalogType } from '../src/llm/pg-casts.ts';
import { lookupCatalogTypes, readCastCatalog } from '../src/llm/pg-cast-catalog.ts';
import { detectPatterns } from '../src/llm/value-patterns.ts';
import { POSTGRES_TYPES } from '../src/warehouse/types.ts';
import { cleaningConverts } from '../src/modules/discovery/cleaning.ts';
import { scratchDatabase, withClient } from './helpers/scratch-db.ts';

/*
 * The matcher's type rule against PostgreSQL itself: the checked-in table against the test server's
 * catalog, and the rule's answer for every pair of a list of types against what the server says when
 * it is asked `select cast(null::<source> as <target>)`.
 */

const db = scratchDatabase('pgcasts');
let catalogOfServer: Awaited<ReturnType<typeof readCastCatalog>>;
let userTypes: Map<string, CatalogType>;

/** Types as introspection (format_type), the MySQL load and people spell them, modifiers and arrays included. */
const BUILT_IN = [
  'smallint',
  'integer',
  'bigint',
  'numeric(10,2)',
  'numeric(8,0)',
  'real',
  'double precision',
  'money',
  'boolean',
  'text',
  'character varying(40)',
  'varchar(10)',
  'character(2)',
  '"char"',
  'name',
  'date',
  'time without time zone',
  'time(3) with time zone',
  'timestamp without time zone',
  'timestamp(3) with time zone',
  'timestamptz',
  'interval',
  'interval day to second',
  'uuid',
  'json',
  'jsonb',
  'bytea',
  'inet',
  'cidr',
  'macaddr',
  'bit(8)',
  'bit varying(16)',
  'xml',
  'tsvector',
  'int4range',
  'point',
  'oid',
  'integer[]',
  'text[]',
  'jsonb[]',
  'character varying(20)[]',
  'int4',
  'float8',
];

/** Made in the scratch database: what a real source may hold besides the built-in types. */
const USER_TYPES_SQL = `
  create extension hstore;
  create extension citext;
  create type mood as enum ('happy', 'sad');
  create domain posint as integer check (value > 0);
  create domain birth_json as jsonb;
  create domain short_code as varchar(5);
  create domain tiny_posint as posint check (value < 100);
  create domain mood_domain as mood;
  create type address as (street text, city text);
  create type floatrange as range (subtype = float8);`;
const USER = [
  'mood',
  'mood[]',
  'posint',
  'birth_json',
  'short_code',
  'tiny_posint',
  'mood_domain',
  'address',
  'floatrange',
  'hstore',
  'citext',
];

beforeAll(async () => {
  await db.create();
  catalogOfServer = await withClient(db.url, (client) =>
    readCastCatalog(async (sql, params) => (await client.query(sql, params)).rows),
  );
  await db.sql(USER_TYPES_SQL);
  userTypes = await withClient(db.url, (client) =>
    lookupCatalogTypes(async (sql, params) => (await client.query(sql, params)).rows, USER),
  );
});

afterAll(() => db.drop());

/** PostgreSQL's own answer for each pair: a cast it refuses raises cannot_coerce, anything else is a test error. */
async function serverAnswers(pairs: [string, string][]): Promise<boolean[]> {
  return withClient(db.url, async (client) => {
    await client.query(`create function pg_temp.castable(s text, t text) returns boolean language plpgsql as $$
      begin
        execute format('select cast(null::%s as %s)', s, t);
        return true;
      exception when cannot_coerce then
        return false;
      end $$`);
    const { rows } = await client.query<{ ok: boolean }>(
      'select pg_temp.castable(p.s, p.t) as ok from unnest($1::text[], $2::text[]) with ordinality p(s, t, i) order by p.i',
      [pairs.map((p) => p[0]), pairs.map((p) => p[1])],
    );
    return rows.map((r) => r.ok);
  });
}

const disagreements = (
  pairs: [string, string][],
  server: boolean[],
  rule: (s: string, t: string) => unknown,
) =>
  pairs.flatMap(([s, t], i) => {
    const ours = rule(s, t);
    return ours === server[i] ? [] : [`${s} -> ${t}: PostgreSQL ${server[i]}, rule ${String(ours)}`];
  });

describe('the built-in cast table', () => {
  it('is the catalog of the test server (regenerate with scripts/generate-pg-casts.ts)', () => {
    const file = JSON.parse(readFileSync(new URL('../src/llm/pg-casts.json', import.meta.url), 'utf8')) as {
      types: unknown;
      names: unknown;
    };
    expect(file.types).toEqual(catalogOfServer.types);
    expect(file.names).toEqual(catalogOfServer.names);
  });
});

describe('the type rule against PostgreSQL', () => {
  it('answers as the server does for every pair of built-in types', async () => {
    for (const type of BUILT_IN) expect(isBuiltInType(type), type).toBe(true);
    // As a field's type, `json` is schema.json's portable json (stored as jsonb); pg_catalog.json is PostgreSQL's.
    const targets = BUILT_IN.map((t) => (t === 'json' ? 'pg_catalog.json' : t));
    const pairs = BUILT_IN.flatMap((s) => targets.map((t) => [s, t] as [string, string]));
    const server = await serverAnswers(pairs);
    expect(disagreements(pairs, server, (s, t) => castable(s, t))).toEqual([]);
    // Not a table of yeses: most pairs of this list have no cast.
    expect(server.filter(Boolean).length).toBeLessThan(pairs.length / 2);
  });

  it("answers as the server does for schema.json's portable field types", async () => {
    const portable = Object.keys(POSTGRES_TYPES) as (keyof typeof POSTGRES_TYPES)[];
    const pairs = [...BUILT_IN, ...USER].flatMap((s) => portable.map((t) => [s, t] as [string, string]));
    const server = await serverAnswers(
      pairs.map(([s, t]) => [s, POSTGRES_TYPES[t as keyof typeof POSTGRES_TYPES]] as [string, string]),
    );
    expect(
      disagreements(pairs, server, (s, t) => castable(s, t, isBuiltInType(s) ? null : userTypes.get(s))),
    ).toEqual([]);
  });

  it('answers for enums, domains, composite, range and extension types from the source catalog', async () => {
    expect([...userTypes.keys()].sort()).toEqual([...USER].sort());
    expect(userTypes.get('tiny_posint')).toMatchObject({ base: 'integer' });
    expect(userTypes.get('mood')).toMatchObject({ base: 'mood', category: 'E' });
    const targets = [...BUILT_IN.map((t) => (t === 'json' ? 'pg_catalog.json' : t))];
    const pairs = USER.flatMap((s) => targets.map((t) => [s, t] as [string, string]));
    const server = await serverAnswers(pairs);
    expect(disagreements(pairs, server, (s, t) => castable(s, t, userTypes.get(s)))).toEqual([]);
    // The extension's own casts count: hstore into jsonb, which the family rule alone refused.
    expect(canFeed({ type: 'hstore', catalogType: userTypes.get('hstore') }, 'json')).toBe(true);
    expect(typeCompatibility({ type: 'hstore', catalogType: userTypes.get('hstore') }, 'json')).toBe(0.1);
  });
});

describe('canFeed', () => {
  it('refuses what PostgreSQL cannot cast and keeps the scores of what it can', () => {
    const refused: [string, string][] = [
      ['jsonb', 'date'],
      ['jsonb', 'timestamptz'],
      ['jsonb', 'uuid'],
      ['json', 'integer'],
      ['json', 'numeric'],
      ['json', 'boolean'],
      ['bytea', 'integer'],
      ['interval', 'date'],
      ['uuid', 'integer'],
      ['boolean', 'date'],
      ['inet', 'integer'],
      ['money', 'integer'],
      ['boolean', 'bigint'],
      ['date', 'integer'],
      ['numeric(8,0)', 'date'],
      ['bigint', 'timestamptz'],
      ['integer[]', 'integer'],
      ['text[]', 'json'],
    ];
    for (const [s, t] of refused) {
      expect(canFeed({ type: s }, t), `${s} -> ${t}`).toBe(false);
      expect(typeCompatibility({ type: s }, t), `${s} -> ${t}`).toBe(0);
    }
    const fed: [string, string, number][] = [
      ['jsonb', 'integer', 0.1],
      ['jsonb', 'numeric', 0.1],
      ['jsonb', 'boolean', 0.1],
      ['json', 'json', 1],
      ['json', 'text', 0.3],
      ['character varying(40)', 'date', 0.25],
      ['text', 'uuid', 0.2],
      ['timestamp(3) with time zone', 'date', 0.85],
      ['numeric(10,2)', 'integer', 0.75],
      ['integer[]', 'text', 0.3],
    ];
    for (const [s, t, score] of fed) {
      expect(canFeed({ type: s }, t), `${s} -> ${t}`).toBe(true);
      expect(typeCompatibility({ type: s }, t), `${s} -> ${t}`).toBe(score);
    }
  });

  it('keeps the family rule for a type nobody described', () => {
    expect(castable('datetime', 'date')).toBeNull();
    expect(canFeed({ type: 'datetime' }, 'date')).toBe(true);
    expect(canFeed({ type: 'some_enum' }, 'text')).toBe(true);
    expect(canFeed({ type: 'some_enum' }, 'integer')).toBe(true);
    // information_schema's ARRAY and arrays of unknown elements are still arrays.
    expect(canFeed({ type: 'ARRAY' }, 'integer')).toBe(false);
    expect(canFeed({ type: 'ARRAY' }, 'text')).toBe(true);
    expect(canFeed({ type: 'some_enum[]' }, 'integer')).toBe(false);
  });

  it('takes a pair without a cast when the caller converts it, on the values that convert', () => {
    const epoch = ['1571672154', '1601424000', '1704067200'];
    const created = { name: 'created', type: 'bigint', samples: epoch, patterns: detectPatterns(epoch) };
    expect(canFeed(created, 'timestamptz')).toBe(false);
    expect(canFeed(created, 'timestamptz', cleaningConverts)).toBe(true);
    // to_timestamp() gives a timestamptz; discovery converts into nothing else.
    expect(canFeed(created, 'date', cleaningConverts)).toBe(false);
    const counts = ['3', '120', '7'];
    const visits = { name: 'visits', type: 'bigint', samples: counts, patterns: detectPatterns(counts) };
    expect(canFeed(visits, 'timestamptz', cleaningConverts)).toBe(false);
    const flags = { name: 'active', type: 'smallint', samples: ['0', '1'] };
    expect(canFeed(flags, 'boolean')).toBe(false);
    expect(canFeed(flags, 'boolean', cleaningConverts)).toBe(true);
  });
});
