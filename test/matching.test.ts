import { describe, expect, it } from 'vitest';
import { conceptsOf, matchTable, type TableMatch } from '../src/llm/offline-matcher.ts';
import { detectPatterns } from '../src/llm/value-patterns.ts';
import { parseVocabulary } from '../src/llm/vocabulary.ts';
import { cleaningConverts } from '../src/modules/discovery/cleaning.ts';
import { canFeed } from '../src/llm/matcher-values.ts';
import { readFileSync } from 'node:fs';
import {
  f1Of,
  loadFixtures,
  loadTargetTable,
  runFixture,
  type MatchingFixture,
} from './helpers/matching-fixtures.ts';

const fixtures = loadFixtures();

function report(label: string, rows: { name: string; tp: number; fp: number; fn: number }[]) {
  const lines = rows.map((r) => {
    const s = f1Of(r.tp, r.fp, r.fn);
    return `  ${r.name.padEnd(40)} P=${s.precision.toFixed(3)} R=${s.recall.toFixed(3)} F1=${s.f1.toFixed(3)} (tp ${r.tp}, fp ${r.fp}, fn ${r.fn})`;
  });
  const total = rows.reduce((a, r) => ({ tp: a.tp + r.tp, fp: a.fp + r.fp, fn: a.fn + r.fn }), {
    tp: 0,
    fp: 0,
    fn: 0,
  });
  const t = f1Of(total.tp, total.fp, total.fn);
  console.log(
    `${label}\n${lines.join('\n')}\n  ${'ALL'.padEnd(40)} P=${t.precision.toFixed(3)} R=${t.recall.toFixed(3)} F1=${t.f1.toFixed(3)}`,
  );
  return t;
}

describe('matching fixtures', () => {
  it('has at least twelve source systems, each with a mapping that points at real columns and fields', () => {
    expect(fixtures.length).toBeGreaterThanOrEqual(12);
    expect(new Set(fixtures.map((f) => f.system)).size).toBe(fixtures.length);
    for (const f of fixtures) {
      const target = loadTargetTable(f.target_table);
      const fields = new Set(target.columns.map((c) => c.name));
      const sources = new Set(f.tables.flatMap((t) => t.columns.map((c) => `${t.name}.${c.name}`)));
      expect(Object.keys(f.mapping).length, f.file).toBeGreaterThanOrEqual(10);
      for (const [field, source] of Object.entries(f.mapping)) {
        expect(fields.has(field), `${f.file}: ${field}`).toBe(true);
        expect(sources.has(source), `${f.file}: ${source}`).toBe(true);
      }
      for (const t of f.tables)
        for (const c of t.columns) expect(c.samples.length, `${t.name}.${c.name}`).toBeGreaterThan(0);
    }
  });
});

describe('offline matcher quality', () => {
  it('reaches F1 >= 0.93 with its top suggestion over all fixtures', () => {
    const rows = fixtures.map((f) => {
      const { score } = runFixture(f);
      if (score.errors.length) console.log(`${f.file} misses:\n    ${score.errors.join('\n    ')}`);
      return { name: f.file, ...score };
    });
    const total = report('offline matcher, top suggestion vs. hand mapping:', rows);
    expect(total.f1).toBeGreaterThanOrEqual(0.93);
    for (const r of rows) expect(f1Of(r.tp, r.fp, r.fn).f1, r.name).toBeGreaterThanOrEqual(0.75);
  });

  /** The same source under another naming convention: the matcher reads names, not spellings. */
  const styles: Record<string, (words: string[]) => string> = {
    camelCase: (w) => w.map((x, i) => (i === 0 ? x : x[0].toUpperCase() + x.slice(1))).join(''),
    UPPER_SNAKE: (w) => w.join('_').toUpperCase(),
    'kebab-case': (w) => w.join('-'),
  };
  const wordsOf = (name: string) =>
    name
      .replace(/([a-z])([A-Z])/g, '$1 $2')
      .replace(/#/g, ' no ')
      .toLowerCase()
      .split(/[^a-z0-9]+/)
      .filter(Boolean);

  function restyle(f: MatchingFixture, style: (w: string[]) => string): MatchingFixture {
    const rename = (c: string) => style(wordsOf(c));
    return {
      ...f,
      tables: f.tables.map((t) => ({
        ...t,
        columns: t.columns.map((c) => ({ ...c, name: rename(c.name) })),
      })),
      mapping: Object.fromEntries(
        Object.entries(f.mapping).map(([k, v]) => {
          const [table, ...rest] = v.split('.');
          return [k, `${table}.${rename(rest.join('.'))}`];
        }),
      ),
    };
  }

  it.each(Object.keys(styles))('keeps F1 >= 0.85 when every source column is renamed to %s', (style) => {
    const rows = fixtures.map((f) => {
      const styled = restyle(f, styles[style]);
      return { name: f.file, ...runFixture(styled).score };
    });
    expect(report(`restyled to ${style}:`, rows).f1).toBeGreaterThanOrEqual(0.85);
  });

  it('gives confidences that behave like probabilities', () => {
    const right: number[] = [];
    const wrong: number[] = [];
    for (const f of fixtures) {
      const { match } = runFixture(f);
      for (const field of match.fields) {
        const s = field.suggestion;
        if (!s) continue;
        expect(s.confidence).toBeGreaterThanOrEqual(0);
        expect(s.confidence).toBeLessThanOrEqual(1);
        (s.source_field === f.mapping[field.target_field] ? right : wrong).push(s.confidence);
      }
    }
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    const brier = mean([...right.map((c) => (1 - c) ** 2), ...wrong.map((c) => c ** 2)]);
    console.log(
      `calibration: ${right.length} right (mean ${mean(right).toFixed(3)}), ${wrong.length} wrong (mean ${wrong.length ? mean(wrong).toFixed(3) : '—'}), Brier ${brier.toFixed(3)}`,
    );
    expect(mean(right)).toBeGreaterThan(wrong.length ? mean(wrong) : 0);
    expect(brier).toBeLessThan(0.1);
  });

  it('offers no pair whose generated SQL PostgreSQL cannot run', () => {
    for (const f of fixtures) {
      const target = loadTargetTable(f.target_table);
      const columnOf = new Map<string, { type: string; samples: string[] }>(
        f.tables.flatMap((t) => t.columns.map((c) => [`${t.name}.${c.name}`, c] as const)),
      );
      for (const field of runFixture(f).match.fields) {
        const fieldType = target.columns.find((c) => c.name === field.target_field)!.type;
        for (const c of field.candidates)
          expect(
            canFeed(columnOf.get(c.source_field)!, fieldType, cleaningConverts),
            `${f.file}: ${c.source_field}`,
          ).toBe(true);
      }
    }
    // The ERP's YYYYMMDD dates are numeric(8,0): no cast to date or timestamptz, no conversion yet.
    const erp = fixtures.find((f) => f.file === 'erp-customer-master.json')!;
    const { match } = runFixture(erp);
    for (const name of ['last_order_date', 'created_at', 'updated_at']) {
      const fieldMatch = match.fields.find((x) => x.target_field === name)!;
      expect(fieldMatch.suggestion, name).toBeNull();
      expect(fieldMatch.candidates.map((c) => c.source_field)).not.toContain(erp.mapping[name]);
    }
  });

  it('is deterministic', () => {
    for (const f of fixtures) expect(runFixture(f).match).toEqual(runFixture(f).match);
  });
});

describe('offline matcher behaviour', () => {
  it('reads abbreviations and synonyms as the same concept', () => {
    const same = [
      ['fname', 'first_name', 'given_name', 'FirstName', 'forename'],
      ['zip', 'postal_code', 'ZipCode', 'postcode'],
      ['mobile', 'phone_number', 'cell_phone', 'telephone', 'tel_no'],
      ['dob', 'birth_date', 'date_of_birth', 'birthday'],
      ['cust_id', 'customer_id', 'client_id', 'user_id'],
      ['addr1', 'address_line_1', 'street_address', 'street'],
      ['e-mail', 'email_address', 'EmailAddr', 'mail'],
      ['cntry', 'country_code', 'country'],
      ['signup_date', 'created_at', 'createdAt', 'registration_ts'],
    ];
    for (const group of same) {
      const first = conceptsOf(group[0]);
      for (const name of group) expect(conceptsOf(name), name).toEqual(first);
    }
    expect(conceptsOf('first_order_date')).not.toEqual(conceptsOf('last_order_date'));
    expect(conceptsOf('user_name')).not.toEqual(conceptsOf('full_name'));
  });

  const target = {
    name: 'people',
    primary_key: ['person_id'],
    columns: [
      { name: 'person_id', type: 'text' },
      { name: 'email', type: 'text' },
      { name: 'phone', type: 'text' },
      { name: 'birth_date', type: 'date' },
    ],
  };
  const col = (name: string, type: string, patterns: { pattern: any; share: number }[] = []) => ({
    name,
    type,
    patterns,
  });

  function field(m: TableMatch, name: string) {
    return m.fields.find((f) => f.target_field === name)!;
  }

  it('reports an ambiguity when two columns fit a field about equally', () => {
    const m = matchTable(target, [
      {
        name: 'contacts',
        columns: [
          col('home_phone', 'text', [{ pattern: 'phone', share: 1 }]),
          col('personal_phone', 'text', [{ pattern: 'phone', share: 1 }]),
        ],
      },
    ]);
    const phone = field(m, 'phone');
    expect(phone.suggestion).not.toBeNull();
    expect(phone.ambiguity?.candidates.map((c) => c.source_field).sort()).toEqual([
      'contacts.home_phone',
      'contacts.personal_phone',
    ]);
    expect(m.ambiguities).toContainEqual(phone.ambiguity);
  });

  it('lets values decide when the name says nothing, and vetoes a name the values contradict', () => {
    const m = matchTable(target, [
      {
        name: 'legacy',
        columns: [
          col('attr_7', 'text', [{ pattern: 'email', share: 0.96 }]),
          col('phone', 'text', [{ pattern: 'date', share: 1 }]),
          col('x1', 'numeric(8,0)', [
            { pattern: 'date', share: 1 },
            { pattern: 'integer', share: 1 },
          ]),
        ],
      },
    ]);
    expect(field(m, 'email').suggestion?.source_field).toBe('legacy.attr_7');
    expect(field(m, 'phone').suggestion).toBeNull();
    expect(field(m, 'email').suggestion!.evidence).toMatchObject({ name: 0, pattern: 0.96 });
  });

  it('assigns a source column to one field only and prefers the primary key for the key field', () => {
    const m = matchTable(target, [
      {
        name: 'persons',
        columns: [
          { name: 'ref', type: 'integer', isPrimaryKey: true },
          { name: 'person_id', type: 'integer', references: { table: 'other', column: 'id' } },
          col('email', 'text', [{ pattern: 'email', share: 1 }]),
        ],
      },
    ]);
    const used = m.fields.flatMap((f) => (f.suggestion ? [f.suggestion.source_field] : []));
    expect(new Set(used).size).toBe(used.length);
    expect(m.primary_table).toBe('persons');
    expect(field(m, 'email').suggestion?.confidence).toBeGreaterThan(0.95);
  });

  it('suggests nothing for a source that has nothing to offer', () => {
    const m = matchTable(target, [{ name: 'metrics', columns: [col('cpu_load', 'double precision')] }]);
    expect(m.fields.every((f) => f.suggestion === null)).toBe(true);
    expect(m.primary_table).toBeNull();
  });

  const values = (samples: string[]) => ({ patterns: detectPatterns(samples), samples });
  const customers = loadTargetTable('customers');
  const suggested = (m: TableMatch, name: string) => field(m, name).suggestion?.source_field ?? null;

  it('lets values lift a weak name: ISO codes in "cc", epoch seconds in "created"', () => {
    const members = [
      {
        name: 'members',
        columns: [
          { name: 'email', type: 'text', ...values(['a@x.io', 'b@y.de', 'c@z.fr']) },
          { name: 'cc', type: 'text', ...values(['DE', 'US', 'FR', 'ES', 'IT', 'GB']) },
          { name: 'created', type: 'bigint', ...values(['1571672154', '1601424000', '1704067200']) },
        ],
      },
    ];
    // PostgreSQL has no cast from bigint to timestamptz: the pair stands only with discovery's
    // to_timestamp() conversion, i.e. on a PostgreSQL source (a MySQL source gets no cleaning).
    const m = matchTable(customers, members, { converts: cleaningConverts });
    expect(suggested(m, 'country_code')).toBe('members.cc');
    expect(suggested(m, 'created_at')).toBe('members.created');
    expect(suggested(matchTable(customers, members), 'created_at')).toBeNull();
    expect(field(m, 'country_code').suggestion!.evidence.name).toBe(0);
    expect(field(m, 'country_code').suggestion!.evidence.pattern).toBe(1);
    // The same name with values that are not codes stays unmatched.
    const words = matchTable(customers, [
      { name: 'members', columns: [{ name: 'cc', type: 'text', ...values(['alpha', 'beta', 'gamma']) }] },
    ]);
    expect(suggested(words, 'country_code')).toBeNull();
  });

  it("reads a table's generic record key as the key of the entity the table is about", () => {
    for (const [table, key] of [
      ['Contact', 'Id'],
      ['hubspot_contacts', 'hs_object_id'],
      ['users', 'entity_id'],
      ['customers', 'id'],
    ]) {
      const m = matchTable(customers, [
        {
          name: table,
          columns: [
            { name: key, type: 'text', isPrimaryKey: true },
            { name: 'email', type: 'text', ...values(['a@x.io', 'b@y.de']) },
            { name: 'owner_id', type: 'text' },
          ],
        },
      ]);
      expect(suggested(m, 'customer_id'), `${table}.${key}`).toBe(`${table}.${key}`);
      // The owner's key is another entity's: neither the customer's key nor an external one.
      expect(suggested(m, 'external_id'), `${table}.owner_id`).toBeNull();
    }
  });

  it('splits glued names against the vocabulary and lets one qualifier word pass', () => {
    expect(conceptsOf('jobtitle')).toEqual(['job_title']);
    expect(conceptsOf('JobTitle')).toEqual(conceptsOf('Job Title'));
    expect(conceptsOf('lastmodifieddate')).toEqual(conceptsOf('last_modified_date'));
    const m = matchTable(customers, [
      {
        name: 'export',
        columns: [
          { name: 'default_address_city', type: 'text' },
          { name: 'location_country', type: 'text', ...values(['Germany', 'France']) },
          { name: 'hs_language', type: 'text', ...values(['de', 'en', 'fr']) },
        ],
      },
    ]);
    expect(suggested(m, 'city')).toBe('export.default_address_city');
    expect(suggested(m, 'country_code')).toBe('export.location_country');
    expect(suggested(m, 'preferred_language')).toBe('export.hs_language');
  });

  it('gives a general field the general column and a specific field the column named like it', () => {
    const phones = values(['+4915123456789', '+12025550143', '+34612345678']);
    const source = [
      {
        name: 'contacts',
        columns: [
          { name: 'mobilephone', type: 'text', ...phones },
          { name: 'phone', type: 'text', ...phones },
        ],
      },
    ];
    const general = matchTable(target, source);
    expect(suggested(general, 'phone')).toBe('contacts.phone');
    const both = matchTable(
      { ...target, columns: [...target.columns, { name: 'mobile_phone', type: 'text' }] },
      source,
    );
    expect(suggested(both, 'phone')).toBe('contacts.phone');
    expect(suggested(both, 'mobile_phone')).toBe('contacts.mobilephone');
    // Alone, a mobile number is still the customer's phone.
    const alone = matchTable(target, [{ name: 'contacts', columns: [source[0].columns[0]] }]);
    expect(suggested(alone, 'phone')).toBe('contacts.mobilephone');
  });

  it("keeps another entity's name away from the person's name", () => {
    const m = matchTable(customers, [
      {
        name: 'shop.products',
        columns: [
          { name: 'id', type: 'integer', isPrimaryKey: true },
          { name: 'name', type: 'text' },
        ],
      },
      {
        name: 'crm.crm_contacts',
        columns: [
          { name: 'contact_id', type: 'integer', isPrimaryKey: true },
          { name: 'full_name', type: 'text' },
        ],
      },
    ]);
    const candidates = field(m, 'full_name').candidates;
    const person = candidates.find((c) => c.source_field === 'crm.crm_contacts.full_name')!;
    const product = candidates.find((c) => c.source_field === 'shop.products.name');
    expect(suggested(m, 'full_name')).toBe('crm.crm_contacts.full_name');
    expect(product?.confidence ?? 0).toBeLessThan(0.5);
    expect(person.confidence - (product?.confidence ?? 0)).toBeGreaterThan(0.3);
    expect(field(m, 'full_name').ambiguity).toBeNull();
  });

  it('does not read text that never parses as a date into a date field', () => {
    const m = matchTable(customers, [
      {
        name: 'audience',
        columns: [{ name: 'Birthday', type: 'text', ...values(['04/12', '11/02', '09/15']) }],
      },
    ]);
    expect(suggested(m, 'date_of_birth')).toBeNull();
    const dated = matchTable(customers, [
      {
        name: 'audience',
        columns: [{ name: 'Birthday', type: 'text', ...values(['1986-04-12', '1979-11-02']) }],
      },
    ]);
    expect(suggested(dated, 'date_of_birth')).toBe('audience.Birthday');
  });

  it('reads its vocabulary from a data file and refuses a broken one with the place of the fault', () => {
    const file = JSON.parse(
      readFileSync(new URL('../src/llm/vocabulary.json', import.meta.url), 'utf8'),
    ) as Record<string, any>;
    expect(() => parseVocabulary(file)).not.toThrow();
    const twice = structuredClone(file);
    twice.word_variants.address.cust = 'customer';
    expect(() => parseVocabulary(twice)).toThrow(/"cust" is a variant in "entity nouns" and "address"/);
    const typo = structuredClone(file);
    typo.related.push(['customer', 'custmer', 0.5]);
    expect(() => parseVocabulary(typo)).toThrow(/related names "custmer"/);
    const badWeight = structuredClone(file);
    badWeight.token_weights.id = -1;
    expect(() => parseVocabulary(badWeight)).toThrow(/token_weights/);
    expect(() => parseVocabulary({ ...file, surprise: true })).toThrow(/surprise/);
  });
});
