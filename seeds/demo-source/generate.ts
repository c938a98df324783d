import { readFileSync } from 'node:fs';

/**
 * The demo source data set: a few thousand rows of a small shop, generated from a fixed seed so every
 * installation sees the same rows. The mess is deliberate — it is what discovery and mappings are for.
 */

export const DEMO_SOURCE_SCHEMA = 'shop';
export const DEMO_TARGET_SCHEMA = 'analytics';

export const demoSchemaSql = () => readFileSync(new URL('./schema.sql', import.meta.url), 'utf8');

/** mulberry32: small, fast and deterministic. */
function random(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (min: number, max: number) => min + Math.floor(next() * (max - min + 1)),
    pick: <T>(items: readonly T[]): T => items[Math.floor(next() * items.length)],
    chance: (p: number) => next() < p,
  };
}

const FIRST = [
  'James',
  'Mary',
  'John',
  'Patricia',
  'Robert',
  'Jennifer',
  'Michael',
  'Linda',
  'William',
  'Elizabeth',
  'David',
  'Barbara',
  'Richard',
  'Susan',
  'Joseph',
  'Jessica',
  'Thomas',
  'Sarah',
  'Charles',
  'Karen',
  'Lukas',
  'Anna',
  'Leon',
  'Marie',
  'Felix',
  'Sophie',
  'Paul',
  'Emma',
  'Jonas',
  'Mia',
  'Louis',
  'Camille',
  'Hugo',
  'Chloé',
  'Oliver',
  'Amelia',
  'Harry',
  'Isla',
  'Noah',
  'Olivia',
  'José',
  'María',
  'Sean',
  'Siobhan',
  'Zoë',
  'Björn',
] as const;
const LAST = [
  'Smith',
  'Johnson',
  'Williams',
  'Brown',
  'Jones',
  'Garcia',
  'Miller',
  'Davis',
  'Rodriguez',
  'Martinez',
  'Müller',
  'Schmidt',
  'Schneider',
  'Fischer',
  'Weber',
  'Meyer',
  'Wagner',
  'Becker',
  'Martin',
  'Bernard',
  'Dubois',
  'Thomas',
  'Robert',
  'Taylor',
  'Wilson',
  'Evans',
  "O'Brien",
  'McDonald',
  'van der Berg',
  'Nguyen',
] as const;

interface Country {
  code: string;
  spellings: string[];
  cities: [string, string][];
  phone: (r: ReturnType<typeof random>) => string;
  weight: number;
}

const digits = (r: ReturnType<typeof random>, n: number) =>
  Array.from({ length: n }, () => r.int(0, 9)).join('');

const COUNTRIES: Country[] = [
  {
    code: 'US',
    spellings: ['US', 'USA', 'United States', 'us', 'U.S.'],
    cities: [
      ['New York', '10001'],
      ['San Francisco', '94107'],
      ['Austin', '73301'],
      ['Chicago', '60601'],
      ['Seattle', '98101'],
    ],
    weight: 45,
    phone: (r) => {
      const [a, b, c] = [String(r.int(201, 989)), `555`, digits(r, 4)];
      return r.pick([
        `+1 ${a} ${b} ${c}`,
        `(${a}) ${b}-${c}`,
        `${a}.${b}.${c}`,
        `${a}${b}${c}`,
        `+1${a}${b}${c}`,
        `1-${a}-${b}-${c}`,
      ]);
    },
  },
  {
    code: 'DE',
    spellings: ['DE', 'Germany', 'Deutschland', 'de'],
    cities: [
      ['Berlin', '10115'],
      ['München', '80331'],
      ['Hamburg', '20095'],
      ['Köln', '50667'],
    ],
    weight: 20,
    phone: (r) => {
      const n = digits(r, 7);
      return r.pick([`+49 30 ${n}`, `030 ${n}`, `0049 30 ${n}`, `+49 (0)30 ${n}`, `030/${n}`]);
    },
  },
  {
    code: 'GB',
    spellings: ['GB', 'UK', 'United Kingdom', 'England', 'gb'],
    cities: [
      ['London', 'EC1A 1BB'],
      ['Manchester', 'M1 1AE'],
      ['Bristol', 'BS1 4DJ'],
    ],
    weight: 15,
    phone: (r) => {
      const n = digits(r, 6);
      return r.pick([
        `+44 20 7946 ${n.slice(0, 4)}`,
        `020 7946 ${n.slice(0, 4)}`,
        `07700 ${n}`,
        `+447700${n}`,
      ]);
    },
  },
  {
    code: 'FR',
    spellings: ['FR', 'France', 'fr'],
    cities: [
      ['Paris', '75001'],
      ['Lyon', '69001'],
      ['Marseille', '13001'],
    ],
    weight: 12,
    phone: (r) => {
      const p = Array.from({ length: 4 }, () => digits(r, 2));
      return r.pick([`+33 1 ${p.join(' ')}`, `01 ${p.join(' ')}`, `01.${p.join('.')}`, `+331${p.join('')}`]);
    },
  },
  {
    code: 'CA',
    spellings: ['CA', 'Canada'],
    cities: [
      ['Toronto', 'M5H 2N2'],
      ['Vancouver', 'V5K 0A1'],
      ['Montréal', 'H2Y 1C6'],
    ],
    weight: 8,
    phone: (r) => `+1 ${r.int(204, 905)} 555 ${digits(r, 4)}`,
  },
];

const DOMAINS = [
  'gmail.com',
  'yahoo.com',
  'outlook.com',
  'hotmail.com',
  'icloud.com',
  'gmx.de',
  'web.de',
  'orange.fr',
  'proton.me',
];
const CATEGORIES: Record<string, { names: string[]; brands: string[]; price: [number, number] }> = {
  Apparel: {
    names: ['T-Shirt', 'Hoodie', 'Rain Jacket', 'Chino Pants', 'Wool Sweater', 'Denim Jacket'],
    brands: ['Northwind', 'Contoso Wear', 'Fabrikam'],
    price: [15, 180],
  },
  Footwear: {
    names: ['Running Shoe', 'Trail Shoe', 'Sneaker', 'Leather Boot', 'Sandal'],
    brands: ['Stride', 'Northwind'],
    price: [40, 220],
  },
  Electronics: {
    names: ['Wireless Earbuds', 'Smart Watch', 'Bluetooth Speaker', 'USB-C Charger', 'E-Reader'],
    brands: ['Voltix', 'Adatum'],
    price: [19, 399],
  },
  Home: {
    names: ['Coffee Grinder', 'French Press', 'Desk Lamp', 'Throw Blanket', 'Ceramic Mug Set'],
    brands: ['Hearth & Co', 'Tailspin'],
    price: [12, 150],
  },
  Outdoor: {
    names: ['Tent 2P', 'Sleeping Bag', 'Hiking Backpack', 'Water Bottle', 'Headlamp'],
    brands: ['Summit', 'Fabrikam'],
    price: [10, 450],
  },
  Beauty: {
    names: ['Face Cream', 'Shampoo', 'Sunscreen SPF50', 'Lip Balm'],
    brands: ['Glow', 'Purely'],
    price: [5, 60],
  },
};
const COLORS = ['Black', 'White', 'Navy', 'Olive', 'Red', 'Grey', 'Sand'];
const STATUSES = [
  'completed',
  'completed',
  'completed',
  'completed',
  'shipped',
  'shipped',
  'pending',
  'cancelled',
  'refunded',
  'Completed',
  'COMPLETE',
];
const CHANNELS = ['web', 'web', 'web', 'mobile_app', 'mobile_app', 'marketplace', 'store'];
const COUPONS = ['WELCOME10', 'SPRING20', 'FREESHIP', 'VIP15', 'welcome10'];
const UTM = [
  ['google', 'cpc', 'brand_search'],
  ['google', 'cpc', 'generic_shoes'],
  ['facebook', 'paid_social', 'spring_sale'],
  ['instagram', 'paid_social', 'influencer_q2'],
  ['newsletter', 'email', 'weekly_digest'],
  ['bing', 'cpc', 'brand_search'],
  ['tiktok', 'paid_social', 'spring_sale'],
  [null, null, null],
  [null, null, null],
  ['(direct)', '(none)', null],
] as const;
const EVENT_TYPES = [
  'page_view',
  'page_view',
  'page_view',
  'page_view',
  'product_view',
  'product_view',
  'search',
  'add_to_cart',
  'begin_checkout',
  'purchase',
  'login',
  'signup',
];
const PAGES = [
  '/',
  '/category/apparel',
  '/category/footwear',
  '/category/electronics',
  '/sale',
  '/cart',
  '/checkout',
  '/account',
  '/search',
];
const LEAD_SOURCES = [
  'Website',
  'web form',
  'Trade Show',
  'Referral',
  'Webinar',
  'Partner',
  'Cold Call',
  null,
];
const STAGES = [
  'subscriber',
  'lead',
  'marketing_qualified_lead',
  'sales_qualified_lead',
  'opportunity',
  'customer',
  'Customer',
  'evangelist',
];
const COMPANIES = [
  'Acme Corp',
  'Globex',
  'Initech',
  'Umbrella GmbH',
  'Stark Industries',
  'Wayne Enterprises',
  'Hooli',
  'Soylent SA',
  null,
];
const TITLES = [
  'Marketing Manager',
  'CEO',
  'Head of Growth',
  'Data Analyst',
  'Buyer',
  'Student',
  'Engineer',
  null,
];

const BASE = Date.UTC(2023, 0, 1);
const DAY = 86_400_000;
const iso = (ms: number) => new Date(ms).toISOString();
const dateOnly = (ms: number) => iso(ms).slice(0, 10);
const strip = (s: string) =>
  s
    .normalize('NFD')
    .replace(/[\u0300-\u036f]/g, '')
    .replace(/[^a-zA-Z]/g, '')
    .toLowerCase();

type Value = string | number | boolean | null;

function literal(v: Value): string {
  if (v === null) return 'null';
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  return `'${v.replaceAll("'", "''")}'`;
}

function inserts(table: string, columns: string[], rows: Value[][], batch = 500): string[] {
  const out: string[] = [];
  for (let i = 0; i < rows.length; i += batch)
    out.push(
      `insert into ${table} (${columns.join(', ')}) values\n` +
        rows
          .slice(i, i + batch)
          .map((r) => `(${r.map(literal).join(', ')})`)
          .join(',\n'),
    );
  return out;
}

function weightedCountry(r: ReturnType<typeof random>): Country {
  let n = r.int(
    1,
    COUNTRIES.reduce((s, c) => s + c.weight, 0),
  );
  for (const c of COUNTRIES) if ((n -= c.weight) <= 0) return c;
  return COUNTRIES[0];
}

function messyEmail(r: ReturnType<typeof random>, email: string): string {
  const [local, domain] = email.split('@');
  return r.pick([
    email,
    email,
    email,
    `${local[0].toUpperCase()}${local.slice(1)}@${domain}`,
    email.toUpperCase(),
    `${local}@${domain[0].toUpperCase()}${domain.slice(1)}`,
  ]);
}

interface Person {
  first: string;
  last: string;
  email: string;
  country: Country;
  city: [string, string];
  phone: string;
}

/** Row counts: products 120, customers 1500 (+~30 duplicates), orders 3500, items ~8000, events 6000, CRM 1200. */
export function demoSourceStatements(seed = 20261122): string[] {
  const r = random(seed);
  const statements: string[] = [];

  const products: Value[][] = [];
  const prices: number[] = [];
  let pid = 0;
  for (const [category, spec] of Object.entries(CATEGORIES))
    for (const base of spec.names)
      for (let v = 0; v < 4 && pid < 120; v++) {
        pid++;
        const price = Math.round((spec.price[0] + r.next() * (spec.price[1] - spec.price[0])) * 100) / 100;
        prices[pid] = price;
        const color = COLORS[(pid + v) % COLORS.length];
        products.push([
          pid,
          `${category.slice(0, 3).toUpperCase()}-${String(pid).padStart(4, '0')}-${color.slice(0, 2).toUpperCase()}`,
          `${base} ${color}`,
          category,
          r.chance(0.9) ? r.pick(spec.brands) : null,
          price,
          'USD',
          r.chance(0.93),
          iso(BASE - r.int(30, 700) * DAY),
        ]);
      }
  const productCount = pid;
  statements.push(
    ...inserts(
      'shop.products',
      ['product_id', 'sku', 'name', 'category', 'brand', 'price', 'currency', 'is_active', 'created_at'],
      products,
    ),
  );

  const people: Person[] = [];
  const customers: Value[][] = [];
  const signup: number[] = [];
  for (let id = 1; id <= 1500; id++) {
    const country = weightedCountry(r);
    const first = r.pick(FIRST);
    const last = r.pick(LAST);
    const email = `${strip(first)}${r.pick(['.', '_', ''])}${strip(last)}${r.chance(0.4) ? r.int(1, 99) : ''}@${r.pick(DOMAINS)}`;
    const person: Person = {
      first,
      last,
      email,
      country,
      city: r.pick(country.cities),
      phone: country.phone(r),
    };
    people.push(person);
    const signed = BASE + r.int(0, 640) * DAY + r.int(0, DAY - 1);
    signup[id] = signed;
    customers.push([
      id,
      r.chance(0.03) ? null : messyEmail(r, email),
      r.chance(0.1) ? first.toLowerCase() : first,
      r.chance(0.05) ? null : r.chance(0.08) ? last.toUpperCase() : last,
      r.chance(0.15) ? null : person.phone,
      r.chance(0.06) ? null : r.pick(country.spellings),
      r.chance(0.08) ? null : person.city[0],
      r.chance(0.2) ? null : person.city[1],
      r.chance(0.35) ? null : dateOnly(Date.UTC(r.int(1950, 2005), r.int(0, 11), r.int(1, 28))),
      r.pick(['female', 'male', 'F', 'M', 'unknown', null, null]),
      r.chance(0.2) ? null : r.chance(0.55),
      dateOnly(signed),
      iso(signed),
      r.chance(0.5) ? iso(signed + r.int(1, 200) * DAY) : null,
    ]);
  }
  // The same person signing up twice: the e-mail differs only in case, the phone in format.
  for (let d = 0; d < 30; d++) {
    const id = 1501 + d;
    const source = people[r.int(0, people.length - 1)];
    const signed = BASE + r.int(100, 700) * DAY;
    signup[id] = signed;
    people.push(source);
    customers.push([
      id,
      source.email.toUpperCase(),
      source.first,
      source.last,
      source.country.phone(r),
      source.country.code,
      source.city[0],
      source.city[1],
      null,
      null,
      null,
      dateOnly(signed),
      iso(signed),
      null,
    ]);
  }
  const customerCount = customers.length;
  statements.push(
    ...inserts(
      'shop.customers',
      [
        'customer_id',
        'email',
        'first_name',
        'last_name',
        'phone',
        'country',
        'city',
        'postal_code',
        'birth_date',
        'gender',
        'marketing_opt_in',
        'signup_date',
        'created_at',
        'updated_at',
      ],
      customers,
    ),
  );

  const orders: Value[][] = [];
  const items: Value[][] = [];
  let itemId = 0;
  for (let id = 1; id <= 3500; id++) {
    const guest = r.chance(0.07);
    const customer = guest ? null : r.int(1, customerCount);
    const when = (customer ? signup[customer] : BASE) + r.int(0, 300) * DAY + r.int(0, DAY - 1);
    let subtotal = 0;
    const lines = r.int(1, 4);
    for (let l = 0; l < lines; l++) {
      const product = r.int(1, productCount);
      const quantity = r.chance(0.8) ? 1 : r.int(2, 5);
      const unit = prices[product];
      const discount = r.chance(0.15)
        ? Math.round(unit * quantity * r.pick([0.1, 0.15, 0.2]) * 100) / 100
        : null;
      subtotal += unit * quantity - (discount ?? 0);
      items.push([++itemId, id, product, quantity, unit, discount]);
    }
    subtotal = Math.round(subtotal * 100) / 100;
    const shipping = subtotal > 75 ? 0 : r.pick([4.99, 5.95, 9.99]);
    const person = customer ? people[customer - 1] : null;
    orders.push([
      id,
      customer,
      `SO-${String(100000 + id)}`,
      r.pick(STATUSES),
      r.pick(CHANNELS),
      iso(when),
      person ? (r.chance(0.1) ? null : r.pick(person.country.spellings)) : r.pick(COUNTRIES).code,
      'USD',
      subtotal,
      shipping,
      Math.round((subtotal + shipping) * 100) / 100,
      r.chance(0.18) ? r.pick(COUPONS) : null,
    ]);
  }
  statements.push(
    ...inserts(
      'shop.orders',
      [
        'order_id',
        'customer_id',
        'order_number',
        'status',
        'channel',
        'order_date',
        'shipping_country',
        'currency',
        'subtotal',
        'shipping_cost',
        'total_amount',
        'coupon_code',
      ],
      orders,
    ),
    ...inserts(
      'shop.order_items',
      ['order_item_id', 'order_id', 'product_id', 'quantity', 'unit_price', 'discount_amount'],
      items,
    ),
  );

  const events: Value[][] = [];
  let eventId = 0;
  while (eventId < 6000) {
    const session = `s_${r.int(1e8, 9e8).toString(36)}${eventId.toString(36)}`;
    const anonymous = `anon_${r.int(1e9, 9e9).toString(36)}`;
    const customer = r.chance(0.45) ? r.int(1, customerCount) : null;
    const [source, medium, campaign] = r.pick(UTM);
    const device = r.pick(['desktop', 'mobile', 'mobile', 'tablet', 'Mobile', null]);
    let at = BASE + r.int(0, 700) * DAY + r.int(0, DAY - 1);
    const length = r.int(1, 12);
    for (let e = 0; e < length && eventId < 6000; e++) {
      const type = e === 0 ? 'page_view' : r.pick(EVENT_TYPES);
      const product = type === 'product_view' || type === 'add_to_cart' ? r.int(1, productCount) : null;
      events.push([
        ++eventId,
        session,
        type === 'login' || e > 0 ? customer : null,
        anonymous,
        type,
        product ? `https://shop.example.com/p/${product}` : `https://shop.example.com${r.pick(PAGES)}`,
        e === 0
          ? r.pick(['https://www.google.com/', 'https://www.facebook.com/', null, null, 'https://t.co/x'])
          : null,
        source,
        medium,
        campaign,
        device,
        product,
        iso(at),
      ]);
      at += r.int(5, 240) * 1000;
    }
  }
  statements.push(
    ...inserts(
      'shop.web_events',
      [
        'event_id',
        'session_id',
        'customer_id',
        'anonymous_id',
        'event_type',
        'page_url',
        'referrer',
        'utm_source',
        'utm_medium',
        'utm_campaign',
        'device_type',
        'product_id',
        'occurred_at',
      ],
      events,
    ),
  );

  // The CRM knows ~500 customers too, under other spellings, plus leads the shop never saw.
  const contacts: Value[][] = [];
  const dateFormats = [
    (ms: number) => dateOnly(ms),
    (ms: number) => {
      const d = new Date(ms);
      return `${String(d.getUTCMonth() + 1).padStart(2, '0')}/${String(d.getUTCDate()).padStart(2, '0')}/${d.getUTCFullYear()}`;
    },
    (ms: number) => {
      const d = new Date(ms);
      return `${String(d.getUTCDate()).padStart(2, '0')}.${String(d.getUTCMonth() + 1).padStart(2, '0')}.${d.getUTCFullYear()}`;
    },
    (ms: number) => iso(ms),
  ];
  for (let c = 1; c <= 1200; c++) {
    const known = c <= 500;
    let person: Person;
    if (known) person = people[r.int(0, 1499)];
    else {
      const country = weightedCountry(r);
      const first = r.pick(FIRST);
      const last = r.pick(LAST);
      person = {
        first,
        last,
        email: `${strip(first)}.${strip(last)}@${r.pick(['acme.com', 'globex.com', 'initech.io', 'hooli.com', ...DOMAINS])}`,
        country,
        city: r.pick(country.cities),
        phone: country.phone(r),
      };
    }
    const created = BASE - r.int(0, 400) * DAY + r.int(0, 900) * DAY;
    const emailText = r.chance(0.04)
      ? null
      : r.pick([
          person.email,
          person.email.toUpperCase(),
          ` ${person.email}`,
          `${person.email} `,
          messyEmail(r, person.email),
        ]);
    contacts.push([
      `CRM-${String(c).padStart(6, '0')}`,
      emailText,
      r.pick([
        `${person.first} ${person.last}`,
        `${person.last}, ${person.first}`,
        `${person.first.toUpperCase()} ${person.last.toUpperCase()}`,
        `${person.first} ${person.last[0]}.`,
      ]),
      r.chance(0.2) ? null : person.country.phone(r),
      r.pick(COMPANIES),
      r.pick(TITLES),
      r.chance(0.1) ? null : r.pick(person.country.spellings),
      r.pick(LEAD_SOURCES),
      known ? r.pick(['customer', 'Customer', 'evangelist']) : r.pick(STAGES),
      r.chance(0.03) ? null : r.pick(dateFormats)(created),
      r.chance(0.25) ? null : iso(created + r.int(0, 200) * DAY),
      r.chance(0.15) ? null : r.chance(0.05),
    ]);
  }
  statements.push(
    ...inserts(
      'shop.crm_contacts',
      [
        'contact_id',
        'email',
        'full_name',
        'phone',
        'company',
        'job_title',
        'country',
        'lead_source',
        'lifecycle_stage',
        'created_date',
        'last_activity_at',
        'do_not_contact',
      ],
      contacts,
    ),
  );
  return statements;
}
