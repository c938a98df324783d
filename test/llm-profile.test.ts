import pg from 'pg';
import { PGlite } from '@electric-sql/pglite';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { detectPatterns, patternsOf, shareOf } from '../src/llm/value-patterns.ts';
import {
  PROFILE_COLUMNS_PER_QUERY,
  buildProfileQuery,
  profileTable,
  sourceTableOf,
  type QueryRunner,
} from '../src/llm/profile.ts';
import { matchTable } from '../src/llm/offline-matcher.ts';
import { cleaningConverts } from '../src/modules/discovery/cleaning.ts';
import { f1Of, loadFixtures, loadTargetTable, scoreMatch } from './helpers/matching-fixtures.ts';
import { scratchDatabase } from './helpers/scratch-db.ts';

describe('value patterns', () => {
  it.each([
    ['jane.doe+news@example.co.uk', 'email'],
    ['+49 30 1234567', 'phone'],
    ['(216) 555-0142', 'phone'],
    ['030 1234567', 'phone'],
    ['https://example.com/a?b=1', 'url'],
    ['www.example.org', 'url'],
    ['2024-02-29', 'date'],
    ['15.03.2024', 'date'],
    ['03/15/2024', 'date'],
    ['20190314', 'date'],
    ['12 Mar 2024', 'date'],
    ['2024-03-15T10:22:33Z', 'timestamp'],
    ['2024-03-15 10:22:33.123+00', 'timestamp'],
    ['$1,234.56', 'currency'],
    ['12.00 EUR', 'currency'],
    ['49.99', 'currency'],
    ['USD', 'currency_code'],
    ['usd', 'currency_code'],
    ['DE', 'country_code'],
    ['DEU', 'country_code'],
    ['CA', 'state_code'],
    ['NSW', 'state_code'],
    ['de-DE', 'language_code'],
    ['5f0c3b1e-9f4a-4c2e-8d7b-2a1c3e4f5a6b', 'uuid'],
    ['yes', 'boolean'],
    ['Female', 'gender'],
  ])('%s is %s', (value, pattern) => {
    expect(patternsOf(value)).toContain(pattern);
  });

  it.each([
    ['2024-02-30', 'date'],
    ['20191332', 'date'],
    ['1234567890', 'phone'],
    ['44101-2345', 'phone'],
    ['2024-03-15', 'phone'],
    ['12345.67', 'phone'],
    ['not an email@', 'email'],
    ['ZZ', 'country_code'],
    ['Usd', 'currency_code'],
  ])('%s is not %s', (value, pattern) => {
    expect(patternsOf(value)).not.toContain(pattern);
  });

  it('reports shares over non-blank values, largest first', () => {
    const shares = detectPatterns(['a@x.io', 'b@y.org', '', null, 'n/a', 'c@z.com']);
    expect(shares[0]).toEqual({ pattern: 'email', share: 0.75 });
  });

  it('treats booleans and genders as column-level patterns', () => {
    expect(shareOf(detectPatterns(['1', '0', '1', '1']), 'boolean')).toBe(1);
    expect(shareOf(detectPatterns(['1', '0', '2', '3', '4', '5']), 'boolean')).toBe(0);
    expect(shareOf(detectPatterns(['Y', 'N', 'N']), 'boolean')).toBe(1);
    expect(detectPatterns([])).toEqual([]);
  });
});

/** A real PostgreSQL: a scratch database on the test server when there is one, else PGlite. */
let run: QueryRunner;
let close: () => Promise<void>;

beforeAll(async () => {
  if (process.env.TEST_DATABASE_URL) {
    const scratch = scratchDatabase('profile');
    await scratch.create();
    const client = new pg.Client({ connectionString: scratch.url });
    await client.connect();
    run = async (sql, params) => (await client.query(sql, params)).rows;
    close = async () => {
      await client.end();
      await scratch.drop();
    };
  } else {
    const db = await PGlite.create();
    run = async (sql, params) =>
      (params.length ? (await db.query(sql, params)).rows : (await db.exec(sql)).at(-1)!.rows) as Record<
        string,
        unknown
      >[];
    close = () => db.close();
  }
  await run(
    `create schema crm;
     create table crm."Customer Master" (
       id serial primary key, "E-Mail" text, phone varchar(30), signup date, score numeric(6,2),
       active boolean, payload jsonb, country char(2), note text, "weird""name" text)`,
    [],
  );
  await run(
    `insert into crm."Customer Master" ("E-Mail", phone, signup, score, active, payload, country, note, "weird""name")
     select case when g % 10 = 0 then null when g % 10 = 1 then '' else 'user' || g || '@example.com' end,
            '+1 415 555 ' || lpad((g % 10000)::text, 4, '0'),
            date '2020-01-01' + g, (g % 100) + 0.25, g % 2 = 0,
            jsonb_build_object('k', g % 3), (array['US','DE','FR'])[1 + g % 3], null, 'x'
     from generate_series(1, 500) g`,
    [],
  );
});

afterAll(async () => {
  await close?.();
});

describe('profiling SQL', () => {
  const columns = [
    { name: 'id', type: 'integer' },
    { name: 'E-Mail', type: 'text' },
    { name: 'phone', type: 'character varying(30)' },
    { name: 'signup', type: 'date' },
    { name: 'score', type: 'numeric(6,2)' },
    { name: 'active', type: 'boolean' },
    { name: 'payload', type: 'jsonb' },
    { name: 'country', type: 'character(2)' },
    { name: 'note', type: 'text' },
    { name: 'weird"name', type: 'text' },
  ];

  it('profiles every column of a table in one statement', async () => {
    const query = buildProfileQuery('crm', 'Customer Master', columns);
    expect(query.sql).not.toContain(';');
    const byName = Object.fromEntries(
      (await profileTable(run, 'crm', 'Customer Master', columns)).map((p) => [p.column, p]),
    );
    expect(byName.id).toMatchObject({
      rowCount: 500,
      nullCount: 0,
      nullRate: 0,
      distinctCount: 500,
      distinctRatio: 1,
    });
    expect(byName.id.samples).toHaveLength(20);
    // 50 nulls and 50 blanks of 500 rows.
    expect(byName['E-Mail']).toMatchObject({ nullCount: 50, nullRate: 0.2, distinctCount: 401 });
    expect(byName['E-Mail'].patterns[0]).toEqual({ pattern: 'email', share: 1 });
    expect(byName['E-Mail'].samples.every((s) => s.includes('@'))).toBe(true);
    expect(shareOf(byName.phone.patterns, 'phone')).toBe(1);
    expect(byName.phone).toMatchObject({ minLength: 15, maxLength: 15 });
    expect(shareOf(byName.signup.patterns, 'date')).toBe(1);
    expect(shareOf(byName.score.patterns, 'currency')).toBe(1);
    expect(byName.active).toMatchObject({ distinctCount: 2, distinctRatio: 0.004 });
    expect(shareOf(byName.active.patterns, 'boolean')).toBe(1);
    expect(byName.payload.distinctCount).toBe(3);
    expect(shareOf(byName.country.patterns, 'country_code')).toBe(1);
    expect(byName.note).toMatchObject({
      nullCount: 500,
      nullRate: 1,
      distinctCount: 0,
      minLength: null,
      samples: [],
    });
    expect(byName['weird"name'].samples).toEqual(['x']);
  });

  it('reads only the first rows when asked, and samples deterministically', async () => {
    const a = await profileTable(run, 'crm', 'Customer Master', columns.slice(0, 2), {
      rowLimit: 100,
      sampleSize: 5,
    });
    const b = await profileTable(run, 'crm', 'Customer Master', columns.slice(0, 2), {
      rowLimit: 100,
      sampleSize: 5,
    });
    expect(a[0].rowCount).toBe(100);
    expect(a[0].samples).toHaveLength(5);
    expect(a).toEqual(b);
    const whole = await profileTable(run, 'crm', 'Customer Master', columns.slice(0, 1), { rowLimit: null });
    expect(whole[0].rowCount).toBe(500);
  });

  it('profiles a table wider than one statement takes in slices', async () => {
    const wide = Array.from({ length: 400 }, (_, i) => ({ name: `c${i}`, type: 'integer' }));
    // Six metrics per column as separate outputs would pass PostgreSQL's 1664-column limit.
    const single = buildProfileQuery('crm', 'wide', wide);
    expect(single.sql.match(/ as p\d+/g)).toHaveLength(400);
    const statements: string[] = [];
    const counting: QueryRunner = (sql, params) => {
      statements.push(sql);
      return run(sql, params);
    };
    await run(`create table crm.wide (${wide.map((c) => `${c.name} int default 1`).join(', ')})`, []);
    await run(`insert into crm.wide default values`, []);
    const profiles = await profileTable(counting, 'crm', 'wide', wide);
    expect(statements).toHaveLength(Math.ceil(400 / PROFILE_COLUMNS_PER_QUERY));
    expect(profiles).toHaveLength(400);
    expect(profiles[399]).toMatchObject({ column: 'c399', rowCount: 1, distinctCount: 1, samples: ['1'] });
  });

  it('keeps identifiers quoted and values parameterized', () => {
    const q = buildProfileQuery('s"x', 't', [{ name: 'a"; drop table t; --', type: 'text' }]);
    expect(q.sql).toContain('"s""x"."t"');
    expect(q.sql).toContain('"a""; drop table t; --"');
    expect(q.params).toEqual([10000, 20, 200]);
  });
});

describe('profiles feed the matcher', () => {
  it('matches the fixtures loaded into a real database as well as from their samples', async () => {
    const q = (name: string) => `"${name.replace(/"/g, '""')}"`;
    let tp = 0;
    let fp = 0;
    let fn = 0;
    for (const [n, fixture] of loadFixtures().entries()) {
      const schema = `fixture_${n}`;
      await run(`create schema ${schema}`, []);
      const sources = [];
      for (const t of fixture.tables) {
        await run(
          `create table ${schema}.${q(t.name)} (${t.columns.map((c) => `${q(c.name)} ${c.type}`).join(', ')})`,
          [],
        );
        const rows = Math.max(...t.columns.map((c) => c.samples.length));
        for (let r = 0; r < rows; r++) {
          const values = t.columns.map((c) => c.samples[r] ?? null);
          const placeholders = values.map((_, i) => `$${i + 1}`).join(', ');
          await run(`insert into ${schema}.${q(t.name)} values (${placeholders})`, values);
        }
        // The column types as the catalog reports them, like introspection does.
        const columns = (await run(
          `select a.attname as name, format_type(a.atttypid, a.atttypmod) as type from pg_attribute a
            where a.attrelid = $1::regclass and a.attnum > 0 and not a.attisdropped order by a.attnum`,
          [`${schema}.${q(t.name)}`],
        )) as { name: string; type: string }[];
        const profiles = await profileTable(run, schema, t.name, columns);
        expect(profiles).toHaveLength(t.columns.length);
        const table = {
          name: t.name,
          primary_key: t.columns.filter((c) => c.primary_key).map((c) => c.name),
          foreign_keys: t.columns.flatMap((c) =>
            c.references
              ? [
                  {
                    name: `${c.name}_fk`,
                    columns: [c.name],
                    references: { schema, table: c.references.table, columns: [c.references.column] },
                  },
                ]
              : [],
          ),
          columns: columns.map((c, i) => ({
            ...c,
            base_type: c.type,
            nullable: true,
            default: null,
            generated: null,
            description: null,
            position: i + 1,
          })),
        };
        sources.push(sourceTableOf(table, profiles));
      }
      // As discovery matches a PostgreSQL source: with the conversions its cleaning writes.
      const match = matchTable(loadTargetTable(fixture.target_table), sources, {
        converts: cleaningConverts,
      });
      const score = scoreMatch(fixture, match);
      console.log(`${fixture.file} profiled in SQL: F1=${score.f1.toFixed(3)}`);
      tp += score.tp;
      fp += score.fp;
      fn += score.fn;
    }
    expect(f1Of(tp, fp, fn).f1).toBeGreaterThanOrEqual(0.85);
  });
});
