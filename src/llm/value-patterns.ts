/**
 * Value-pattern detection over sampled column values. Names of legacy columns are often opaque
 * (TELF1, CMZIP, attr_7); what the values look like is the second opinion the matcher leans on.
 */

export type ValuePattern =
  | 'email'
  | 'phone'
  | 'url'
  | 'date'
  | 'timestamp'
  | 'currency'
  | 'currency_code'
  | 'country_code'
  | 'state_code'
  | 'language_code'
  | 'uuid'
  | 'boolean'
  | 'gender'
  | 'integer'
  | 'decimal';

export interface PatternShare {
  pattern: ValuePattern;
  /** Fraction of the non-blank sampled values that have the pattern, in [0, 1]. */
  share: number;
}

const words = (s: string) => new Set(s.split(/\s+/).filter(Boolean));

const COUNTRY_ALPHA2 = words(`
  AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS BT BV
  BW BY BZ CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE EG EH ER ES
  ET FI FJ FK FM FO FR GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM HN HR HT HU ID IE
  IL IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY
  MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU
  NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS RU RW SA SB SC SD SE SG SH SI SJ SK SL SM
  SN SO SR SS ST SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG UM US UY UZ VA VC VE
  VG VI VN VU WF WS YE YT ZA ZM ZW UK XK EU`);

const COUNTRY_ALPHA3 = words(`
  ABW AFG AGO AIA ALA ALB AND ARE ARG ARM ASM ATA ATF ATG AUS AUT AZE BDI BEL BEN BES BFA BGD BGR BHR
  BHS BIH BLM BLR BLZ BMU BOL BRA BRB BRN BTN BVT BWA CAF CAN CCK CHE CHL CHN CIV CMR COD COG COK COL
  COM CPV CRI CUB CUW CXR CYM CYP CZE DEU DJI DMA DNK DOM DZA ECU EGY ERI ESH ESP EST ETH FIN FJI FLK
  FRA FRO FSM GAB GBR GEO GGY GHA GIB GIN GLP GMB GNB GNQ GRC GRD GRL GTM GUF GUM GUY HKG HMD HND HRV
  HTI HUN IDN IMN IND IOT IRL IRN IRQ ISL ISR ITA JAM JEY JOR JPN KAZ KEN KGZ KHM KIR KNA KOR KWT LAO
  LBN LBR LBY LCA LIE LKA LSO LTU LUX LVA MAC MAF MAR MCO MDA MDG MDV MEX MHL MKD MLI MLT MMR MNE MNG
  MNP MOZ MRT MSR MTQ MUS MWI MYS MYT NAM NCL NER NFK NGA NIC NIU NLD NOR NPL NRU NZL OMN PAK PAN PCN
  PER PHL PLW PNG POL PRI PRK PRT PRY PSE PYF QAT REU ROU RUS RWA SAU SDN SEN SGP SGS SHN SJM SLB SLE
  SLV SMR SOM SPM SRB SSD STP SUR SVK SVN SWE SWZ SXM SYC SYR TCA TCD TGO THA TJK TKL TKM TLS TON TTO
  TUN TUR TUV TWN TZA UGA UKR UMI URY USA UZB VAT VCT VEN VGB VIR VNM VUT WLF WSM YEM ZAF ZMB ZWE`);

/** US states and territories, Canadian provinces, Australian states. */
const STATE_CODES = words(`
  AL AK AZ AR CA CO CT DE DC FL GA HI ID IL IN IA KS KY LA ME MD MA MI MN MS MO MT NE NV NH NJ NM NY NC
  ND OH OK OR PA RI SC SD TN TX UT VT VA WA WV WI WY PR GU VI AS MP
  AB BC MB NB NL NS NT NU ON PE QC SK YT
  NSW VIC QLD TAS ACT`);

const CURRENCY_CODES = words(`
  USD EUR GBP JPY CHF CAD AUD NZD SEK NOK DKK PLN CZK HUF RON BGN RUB TRY INR CNY HKD SGD KRW TWD THB
  MYR IDR PHP VND BRL MXN ARS CLP COP PEN ZAR EGP NGN KES MAD ILS AED SAR QAR KWD BHD OMR PKR BDT LKR
  UAH ISK`);

const LANGUAGES = words(`
  af am ar az be bg bn bs ca cs cy da de el en es et eu fa fi fr ga gl gu he hi hr hu hy id is it ja ka
  kk km kn ko lt lv mk ml mn mr ms mt my nb ne nl no pa pl pt ro ru si sk sl sq sr sv sw ta te th tl tr
  uk ur uz vi zh zu`);

const BOOLEAN_TOKENS = words('true false t f yes no y n 1 0 on off x');
const GENDER_TOKENS = words(
  'm f male female w d man woman other non-binary nonbinary diverse u unknown x mr mrs ms',
);

const EMAIL = /^[^\s@<>()[\],;:"]+@[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,}$/i;
const URL_RE = /^(https?:\/\/|www\.)[^\s]+$/i;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const INTEGER = /^[+-]?\d+$/;
const DECIMAL = /^[+-]?(\d+[.,]\d+|\d{1,3}(,\d{3})+(\.\d+)?|\d{1,3}(\.\d{3})+(,\d+)?)$/;
const CURRENCY_SYMBOL = /^[-+]?\s*[$€£¥₹₩₽]\s*-?\d[\d,.' ]*$|^-?\d[\d,.' ]*\s*[$€£¥₹₩₽]$/;
const CURRENCY_CODE_AMOUNT = /^([A-Z]{3})\s*-?\d[\d,.' ]*$|^-?\d[\d,.' ]*\s*([A-Z]{3})$/;
const TWO_DECIMALS = /^-?\d{1,3}(,?\d{3})*\.\d{2}$|^-?\d+,\d{2}$/;

const ISO_DATE = /^(\d{4})-(\d{2})-(\d{2})$/;
const SLASH_DATE = /^(\d{1,2})[/.-](\d{1,2})[/.-](\d{2}|\d{4})$/;
const YMD_SLASH = /^(\d{4})[/.](\d{1,2})[/.](\d{1,2})$/;
const COMPACT_DATE = /^(\d{4})(\d{2})(\d{2})$/;
const MONTH = '(jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\\.?';
const TEXT_DATE = new RegExp(`^(\\d{1,2}[ -]${MONTH}[ -]\\d{2,4}|${MONTH} \\d{1,2},? \\d{4})$`, 'i');
const TIMESTAMP = /^\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?\s*(Z|[+-]\d{2}(:?\d{2})?|UTC|GMT)?$/i;
const LOCAL_TIMESTAMP =
  /^(\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}|\d{4}[/.]\d{1,2}[/.]\d{1,2}),? \d{1,2}:\d{2}(:\d{2})?( ?[AP]M)?$/i;

const validDay = (y: number, m: number, d: number) =>
  y >= 1800 && y <= 2200 && m >= 1 && m <= 12 && d >= 1 && d <= new Date(Date.UTC(y, m, 0)).getUTCDate();

function isDate(v: string): boolean {
  let m = ISO_DATE.exec(v) ?? YMD_SLASH.exec(v);
  if (m) return validDay(+m[1], +m[2], +m[3]);
  // Legacy systems store dates as 8-digit numbers (YYYYMMDD); only a valid calendar day counts.
  m = COMPACT_DATE.exec(v);
  if (m) return validDay(+m[1], +m[2], +m[3]);
  m = SLASH_DATE.exec(v);
  if (m) {
    const a = +m[1];
    const b = +m[2];
    const y = m[3].length === 2 ? 2000 + +m[3] : +m[3];
    return validDay(y, b, a) || validDay(y, a, b);
  }
  return TEXT_DATE.test(v);
}

function isPhone(v: string): boolean {
  if (!/^\+?[\d\s().\-/]+(\s*(x|ext\.?)\s*\d{1,5})?$/i.test(v)) return false;
  const digits = v.replace(/(x|ext\.?)\s*\d+$/i, '').replace(/\D/g, '');
  if (digits.length < 7 || digits.length > 15) return false;
  // A bare run of digits is more often an id than a phone number, unless it is dialled like one.
  if (/^\d+$/.test(v)) return v.startsWith('0') && digits.length >= 9;
  // ZIP+4 and plain decimals look like dialled numbers but are not.
  if (/^\d{5}-\d{4}$/.test(v) || /^\d+[.,]\d+$/.test(v)) return false;
  if (isDate(v)) return false;
  return /^\+/.test(v) || /[\s().\-/]/.test(v);
}

/** Unix time in seconds or milliseconds between 2000 and 2050 (APIs export `created: 1571672154`). */
function isEpoch(v: string): boolean {
  const n = Number(v);
  if (v.length === 10) return n >= 946_684_800 && n < 2_524_608_000;
  if (v.length === 13) return n >= 946_684_800_000 && n < 2_524_608_000_000;
  return false;
}

function isCurrency(v: string): boolean {
  if (CURRENCY_SYMBOL.test(v)) return true;
  const m = CURRENCY_CODE_AMOUNT.exec(v);
  if (m) return CURRENCY_CODES.has(m[1] ?? m[2]);
  return TWO_DECIMALS.test(v);
}

/** The patterns one value has (a value can have several: "CA" is a country and a state). */
export function patternsOf(raw: string): ValuePattern[] {
  const v = raw.trim();
  if (!v) return [];
  const out: ValuePattern[] = [];
  const lower = v.toLowerCase();
  const upper = v.toUpperCase();
  if (EMAIL.test(v)) out.push('email');
  if (URL_RE.test(v)) out.push('url');
  if (UUID.test(v)) out.push('uuid');
  if (TIMESTAMP.test(v) || LOCAL_TIMESTAMP.test(v)) out.push('timestamp');
  else if (isDate(v)) out.push('date');
  if (isPhone(v)) out.push('phone');
  if (isCurrency(v)) out.push('currency');
  if (INTEGER.test(v)) {
    out.push('integer');
    if (isEpoch(v)) out.push('timestamp');
  } else if (DECIMAL.test(v)) out.push('decimal');
  // Billing exports often lower-case them ("usd").
  if (v.length === 3 && CURRENCY_CODES.has(upper) && (v === upper || v === lower)) out.push('currency_code');
  if ((v.length === 2 && COUNTRY_ALPHA2.has(upper)) || (v.length === 3 && COUNTRY_ALPHA3.has(upper)))
    out.push('country_code');
  if (v.length <= 3 && STATE_CODES.has(upper) && v === upper) out.push('state_code');
  const lang = /^([a-z]{2})(?:[-_]([A-Za-z]{2}|\d{3}))?$/.exec(v);
  if (lang && LANGUAGES.has(lang[1]) && (lang[2] === undefined || COUNTRY_ALPHA2.has(lang[2].toUpperCase())))
    out.push('language_code');
  if (BOOLEAN_TOKENS.has(lower)) out.push('boolean');
  if (GENDER_TOKENS.has(lower.replace(/\.$/, ''))) out.push('gender');
  return out;
}

/**
 * Shares of each pattern over the sampled values, largest first; patterns under `minShare` are
 * dropped. Booleans and genders are column-level: a column of 0/1 is boolean, a column of 0..9 is not.
 */
export function detectPatterns(values: readonly unknown[], minShare = 0.1): PatternShare[] {
  const texts = values
    .filter((v) => v !== null && v !== undefined)
    .map((v) => (v instanceof Date ? v.toISOString() : String(v)).trim())
    .filter((v) => v.length > 0);
  if (texts.length === 0) return [];
  const counts = new Map<ValuePattern, number>();
  for (const t of texts) for (const p of patternsOf(t)) counts.set(p, (counts.get(p) ?? 0) + 1);
  const distinct = new Set(texts.map((t) => t.toLowerCase().replace(/\.$/, '')));
  if (distinct.size > 3) counts.delete('boolean');
  if (distinct.size > 8) counts.delete('gender');
  return [...counts]
    .map(([pattern, n]) => ({ pattern, share: Math.round((n / texts.length) * 1000) / 1000 }))
    .filter((p) => p.share >= minShare)
    .sort((a, b) => b.share - a.share || a.pattern.localeCompare(b.pattern));
}

/** The share of one pattern in a detection result (0 when absent). */
export function shareOf(patterns: readonly PatternShare[] | undefined, pattern: ValuePattern): number {
  return patterns?.find((p) => p.pattern === pattern)?.share ?? 0;
}
