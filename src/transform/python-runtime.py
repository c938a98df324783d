"""
The helper functions every generated Python script carries (standard library only). They follow
PostgreSQL's semantics where the generated SQL relies on them: NULL propagation and three-valued
logic, integer division truncating toward zero, numeric division scale (select_div_scale),
half-away-from-zero numeric rounding, text output of each type (booleans t/f, dates ISO, timestamps
with trimmed fractions, timestamptz in UTC, jsonb key order). Errors name the value, like PG's.

The generated script starts with the same imports and then holds everything below the RUNTIME line,
so this file is checked by Python tooling (py_compile, test/python/) exactly as scripts run it.
"""
import csv
import datetime as _dt
import decimal
import hashlib
import json
import math
import re
import uuid as _uuid
from decimal import Decimal, ROUND_HALF_EVEN, ROUND_HALF_UP

decimal.getcontext().prec = 1000

# ---- RUNTIME: copied into every generated script from here on ----
class MappingError(Exception):
    pass


def _err(message):
    raise MappingError(message)


_UTC = _dt.timezone.utc
_INT_RE = re.compile(r'^\s*[+-]?[0-9]+\s*$')
_NUM_RE = re.compile(r'^\s*(?:[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|infinity|inf))\s*$', re.I)
_INT_RANGES = {'smallint': (-32768, 32767), 'integer': (-2 ** 31, 2 ** 31 - 1), 'bigint': (-2 ** 63, 2 ** 63 - 1)}
_DATE_RE = re.compile(r'^\s*([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})(?:[ T].*)?$')
_TS_RE = re.compile(
    r'^\s*([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})'
    r'(?:[ T]([0-9]{1,2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?)?'
    r'\s*(Z|[+-][0-9]{2}(?::?[0-9]{2})?)?\s*$', re.I)
_TRUE = {'t', 'tr', 'tru', 'true', 'y', 'ye', 'yes', 'on', '1'}
_FALSE = {'f', 'fa', 'fal', 'fals', 'false', 'n', 'no', 'of', 'off', '0'}


class _Json(str):
    pass


def _type_name(v):
    if isinstance(v, bool): return 'boolean'
    if isinstance(v, int): return 'integer'
    if isinstance(v, Decimal): return 'numeric'
    if isinstance(v, float): return 'double precision'
    if isinstance(v, _dt.datetime): return 'timestamp with time zone' if v.tzinfo else 'timestamp'
    if isinstance(v, _dt.date): return 'date'
    if isinstance(v, _Json): return 'jsonb'
    return 'text'


def _fmt_num(d):
    if d.is_nan(): return 'NaN'
    if d.is_infinite(): return 'Infinity' if d > 0 else '-Infinity'
    if d.is_zero(): d = abs(d)
    return format(d, 'f')


def _fmt_float(v):
    if v != v: return 'NaN'
    if v in (float('inf'), float('-inf')): return 'Infinity' if v > 0 else '-Infinity'
    if v == 0: return '-0' if math.copysign(1, v) < 0 else '0'
    d = Decimal(repr(v))
    adjusted = d.adjusted()
    if -4 <= adjusted < 15:
        text = format(d, 'f')
        return text[:-2] if text.endswith('.0') else text
    digits = ''.join(str(x) for x in d.as_tuple().digits).rstrip('0') or '0'
    mantissa = digits[0] + ('.' + digits[1:] if len(digits) > 1 else '')
    return ('-' if v < 0 else '') + mantissa + 'e' + ('+' if adjusted >= 0 else '-') + '%02d' % abs(adjusted)


def _fmt_ts(v):
    text = '%04d-%02d-%02d %02d:%02d:%02d' % (v.year, v.month, v.day, v.hour, v.minute, v.second)
    if v.microsecond:
        text += ('.%06d' % v.microsecond).rstrip('0')
    return text


def _to_text(v):
    """The ::text cast."""
    if v is None or isinstance(v, str): return v
    if isinstance(v, bool): return 'true' if v else 'false'
    if isinstance(v, int): return str(v)
    if isinstance(v, Decimal): return _fmt_num(v)
    if isinstance(v, float): return _fmt_float(v)
    if isinstance(v, _dt.datetime):
        if v.tzinfo: return _fmt_ts(v.astimezone(_UTC)) + '+00'
        return _fmt_ts(v)
    if isinstance(v, _dt.date): return '%04d-%02d-%02d' % (v.year, v.month, v.day)
    return str(v)


def _out(v):
    """The type's output function (what COPY and concat() print)."""
    if isinstance(v, bool): return 't' if v else 'f'
    return _to_text(v)


def _to_varchar(v, length=None):
    text = _to_text(v)
    return text if text is None or length is None else text[:length]


def _to_int(v, kind='integer'):
    if v is None: return None
    if isinstance(v, bool):
        result = int(v)
    elif isinstance(v, int):
        result = v
    elif isinstance(v, Decimal):
        if not v.is_finite(): _err('cannot convert %s to %s' % (_fmt_num(v), kind))
        result = int(v.to_integral_value(rounding=ROUND_HALF_UP))
    elif isinstance(v, float):
        if v != v or v in (float('inf'), float('-inf')): _err('%s out of range' % kind)
        result = int(round(v))
    elif isinstance(v, str):
        if not _INT_RE.match(v): _err('invalid input syntax for type %s: "%s"' % (kind, v))
        result = int(v)
    else:
        _err('cannot cast type %s to %s' % (_type_name(v), kind))
    low, high = _INT_RANGES[kind]
    if not low <= result <= high: _err('%s out of range' % kind)
    return result


def _to_numeric(v, precision=None, scale=None):
    if v is None: return None
    if isinstance(v, bool): _err('cannot cast type boolean to numeric')
    if isinstance(v, int):
        d = Decimal(v)
    elif isinstance(v, Decimal):
        d = v
    elif isinstance(v, float):
        d = Decimal(repr(v))
    elif isinstance(v, str):
        if not _NUM_RE.match(v): _err('invalid input syntax for type numeric: "%s"' % v)
        d = Decimal(v.strip())
    else:
        _err('cannot cast type %s to numeric' % _type_name(v))
    if d.is_finite() and d.as_tuple().exponent > 0: d = d.quantize(Decimal(1))
    if scale is not None and d.is_finite():
        d = d.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
    if precision is not None and d.is_finite() and not d.is_zero() and d.adjusted() >= precision - (scale or 0):
        _err('numeric field overflow')
    return d


_MONEY_RE = re.compile(r'^\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)\s*$')


def _to_money(v):
    """A money column, exported as money::numeric (exact, with the currency's fraction digits). COPY of
    the column itself prints the session's lc_monetary format ($1,234.56, -1.234,56 EUR, (1,234.56)), in
    which separators and the sign cannot be told apart without that locale: refused, never guessed."""
    if v is None: return None
    if not _MONEY_RE.match(v):
        _err('money value "%s" is in a display format (lc_monetary); export the column as numeric '
             '(column::numeric, as the export queries in the docstring do)' % v)
    return Decimal(v.strip())


def _to_float(v):
    if v is None: return None
    if isinstance(v, bool): _err('cannot cast type boolean to double precision')
    if isinstance(v, (int, Decimal, float)): return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            _err('invalid input syntax for type double precision: "%s"' % v)
    _err('cannot cast type %s to double precision' % _type_name(v))


def _to_bool(v):
    if v is None or isinstance(v, bool): return v
    if isinstance(v, int): return v != 0
    if isinstance(v, str):
        text = v.strip().lower()
        if text in _TRUE: return True
        if text in _FALSE: return False
        _err('invalid input syntax for type boolean: "%s"' % v)
    _err('cannot cast type %s to boolean' % _type_name(v))


def _to_date(v):
    if v is None: return None
    if isinstance(v, _dt.datetime): return (v.astimezone(_UTC) if v.tzinfo else v).date()
    if isinstance(v, _dt.date): return v
    if isinstance(v, str):
        match = _DATE_RE.match(v)
        if not match: _err('invalid input syntax for type date: "%s" (this script reads YYYY-MM-DD)' % v)
        try:
            return _dt.date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
        except ValueError:
            _err('date/time field value out of range: "%s"' % v)
    _err('cannot cast type %s to date' % _type_name(v))


def _parse_ts(v, kind):
    match = _TS_RE.match(v)
    if not match: _err('invalid input syntax for type %s: "%s" (this script reads ISO timestamps)' % (kind, v))
    y, mo, d, h, mi, s, frac, zone = match.groups()
    micro = 0
    if frac:
        micro = int(Decimal('0.' + frac).quantize(Decimal('0.000001'), rounding=ROUND_HALF_EVEN) * 1000000)
    try:
        value = _dt.datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(s or 0)) + _dt.timedelta(microseconds=micro)
    except ValueError:
        _err('date/time field value out of range: "%s"' % v)
    tz = None
    if zone:
        if zone.upper() == 'Z':
            tz = _UTC
        else:
            digits = zone[1:].replace(':', '')
            offset = _dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:4] or 0))
            tz = _dt.timezone(offset if zone[0] == '+' else -offset)
    return value, tz


def _to_timestamp(v):
    if v is None: return None
    if isinstance(v, _dt.datetime): return v.astimezone(_UTC).replace(tzinfo=None) if v.tzinfo else v
    if isinstance(v, _dt.date): return _dt.datetime(v.year, v.month, v.day)
    if isinstance(v, str): return _parse_ts(v, 'timestamp')[0]
    _err('cannot cast type %s to timestamp' % _type_name(v))


def _to_timestamptz(v):
    if v is None: return None
    if isinstance(v, _dt.datetime): return v.astimezone(_UTC) if v.tzinfo else v.replace(tzinfo=_UTC)
    if isinstance(v, _dt.date): return _dt.datetime(v.year, v.month, v.day, tzinfo=_UTC)
    if isinstance(v, str):
        value, tz = _parse_ts(v, 'timestamp with time zone')
        return value.replace(tzinfo=tz or _UTC).astimezone(_UTC)
    _err('cannot cast type %s to timestamp with time zone' % _type_name(v))


def _epoch_to_timestamptz(v):
    """to_timestamp(double precision): seconds since 1970-01-01 UTC, rounded to microseconds."""
    if v is None: return None
    v = _number(v)
    if isinstance(v, float):
        if v != v or v in (float('inf'), float('-inf')): _err('timestamp cannot be NaN or infinite')
        v = Decimal(repr(v))
    micros = int((Decimal(v) * 1000000).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
    try:
        return _dt.datetime(1970, 1, 1, tzinfo=_UTC) + _dt.timedelta(microseconds=micros)
    except OverflowError:
        _err('timestamp out of range: "%s"' % v)


def _jsonb_dump(o):
    if o is None: return 'null'
    if o is True: return 'true'
    if o is False: return 'false'
    if isinstance(o, int): return str(o)
    if isinstance(o, Decimal): return _fmt_num(o)
    if isinstance(o, str): return json.dumps(o, ensure_ascii=False)
    if isinstance(o, list): return '[' + ', '.join(_jsonb_dump(x) for x in o) + ']'
    keys = sorted(o, key=lambda k: (len(k.encode('utf-8')), k.encode('utf-8')))
    return '{' + ', '.join(json.dumps(k, ensure_ascii=False) + ': ' + _jsonb_dump(o[k]) for k in keys) + '}'


def _to_json(v):
    if v is None or isinstance(v, _Json): return v
    if isinstance(v, str):
        try:
            return _Json(_jsonb_dump(json.loads(v, parse_float=Decimal)))
        except ValueError:
            _err('invalid input syntax for type json: "%s"' % v)
    _err('cannot cast type %s to jsonb' % _type_name(v))


def _to_uuid(v):
    if v is None: return None
    if isinstance(v, str):
        try:
            return str(_uuid.UUID(v.strip()))
        except ValueError:
            _err('invalid input syntax for type uuid: "%s"' % v)
    _err('cannot cast type %s to uuid' % _type_name(v))


def _c(r, table, column):
    row = r.get(table)
    return None if row is None else row[column]


def _text(v):
    return v if v is None or isinstance(v, str) else _to_text(v)


def _number(v):
    if isinstance(v, str):
        return _to_int(v, 'bigint') if _INT_RE.match(v) else _to_numeric(v)
    if isinstance(v, bool): _err('operator does not exist for type boolean')
    return v


def _like_type(s, other):
    if isinstance(other, bool): return _to_bool(s)
    if isinstance(other, (int, Decimal, float)): return _number(s)
    if isinstance(other, _dt.datetime): return _to_timestamptz(s) if other.tzinfo else _to_timestamp(s)
    if isinstance(other, _dt.date): return _to_date(s)
    return s


def _pair(a, b):
    if isinstance(a, str) and not isinstance(b, str): a = _like_type(a, b)
    elif isinstance(b, str) and not isinstance(a, str): b = _like_type(b, a)
    if isinstance(a, _dt.datetime) and not isinstance(b, _dt.datetime) and isinstance(b, _dt.date):
        b = _to_timestamptz(b) if a.tzinfo else _to_timestamp(b)
    elif isinstance(b, _dt.datetime) and not isinstance(a, _dt.datetime) and isinstance(a, _dt.date):
        a = _to_timestamptz(a) if b.tzinfo else _to_timestamp(a)
    return a, b


def _cmp(op, a, b):
    if a is None or b is None: return None
    a, b = _pair(a, b)
    try:
        if op == '=': return a == b
        if op in ('<>', '!='): return a != b
        if op == '<': return a < b
        if op == '>': return a > b
        if op == '<=': return a <= b
        if op == '>=': return a >= b
    except TypeError:
        _err('operator does not exist: %s %s %s' % (_type_name(a), op, _type_name(b)))
    _err('operator %s is not supported' % op)


def _bool(v):
    return v if v is None or isinstance(v, bool) else _to_bool(v)


def _and(*thunks):
    result = True
    for thunk in thunks:
        v = _bool(thunk())
        if v is False: return False
        if v is None: result = None
    return result


def _or(*thunks):
    result = False
    for thunk in thunks:
        v = _bool(thunk())
        if v is True: return True
        if v is None: result = None
    return result


def _not(v):
    v = _bool(v)
    return None if v is None else not v


def _true(v):
    return _bool(v) is True


def _coalesce(*thunks):
    for thunk in thunks:
        v = thunk()
        if v is not None: return v
    return None


def _nullif(a, b):
    return None if _cmp('=', a, b) is True else a


def _in(a, items, negate=False):
    if a is None: return None
    saw_null = False
    for item in items:
        eq = _cmp('=', a, item)
        if eq is True: return not negate
        if eq is None: saw_null = True
    return None if saw_null else negate


def _distinct(a, b):
    if a is None or b is None: return (a is None) != (b is None)
    return _cmp('<>', a, b)


def _dscale(d):
    exponent = d.as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _nbase_first(d):
    if d.is_zero(): return 0, 0
    d = abs(d)
    weight = d.adjusted() // 4
    return weight, int(d.scaleb(-4 * weight))


def _num_div(a, b):
    if b.is_zero(): _err('division by zero')
    w1, f1 = _nbase_first(a)
    w2, f2 = _nbase_first(b)
    qweight = w1 - w2 - (1 if f1 <= f2 else 0)
    rscale = min(max(16 - qweight * 4, _dscale(a), _dscale(b), 0), 1000)
    return (a / b).quantize(Decimal(1).scaleb(-rscale), rounding=ROUND_HALF_UP)


def _arith(op, a, b):
    if a is None or b is None: return None
    if isinstance(a, _dt.date) and not isinstance(a, _dt.datetime) and op in ('+', '-'):
        if isinstance(b, _dt.date) and op == '-': return (a - _to_date(b)).days
        return a + _dt.timedelta(days=_to_int(_number(b)) * (1 if op == '+' else -1))
    a, b = _number(a), _number(b)
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if op == '+': return a + b
        if op == '-': return a - b
        if op == '*': return a * b
        if op == '%': _err('operator does not exist: double precision % double precision')
        if b == 0: _err('division by zero')
        return a / b
    if isinstance(a, int) and isinstance(b, int):
        if op == '+': return a + b
        if op == '-': return a - b
        if op == '*': return a * b
        if b == 0: _err('division by zero')
        quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return quotient if op == '/' else a - b * quotient
    a, b = _to_numeric(a), _to_numeric(b)
    if op == '+': return a + b
    if op == '-': return a - b
    if op == '*': return a * b
    if op == '/': return _num_div(a, b)
    if b.is_zero(): _err('division by zero')
    return a % b


def _neg(v):
    if v is None: return None
    v = _number(v)
    return -v


def _concat_op(a, b):
    if a is None or b is None: return None
    return _to_text(a) + _to_text(b)


def _concat(*args):
    return ''.join(_out(a) for a in args if a is not None)


def _concat_ws(sep, *args):
    if sep is None: return None
    return _text(sep).join(_out(a) for a in args if a is not None)


def _lower(v):
    v = _text(v)
    return None if v is None else v.lower()


def _upper(v):
    v = _text(v)
    return None if v is None else v.upper()


def _btrim(v, chars=' '):
    v, chars = _text(v), _text(chars)
    return None if v is None or chars is None else v.strip(chars)


def _ltrim(v, chars=' '):
    v, chars = _text(v), _text(chars)
    return None if v is None or chars is None else v.lstrip(chars)


def _rtrim(v, chars=' '):
    v, chars = _text(v), _text(chars)
    return None if v is None or chars is None else v.rstrip(chars)


def _length(v):
    v = _text(v)
    return None if v is None else len(v)


def _substring(v, start, count=None):
    v = _text(v)
    if v is None or start is None: return None
    if isinstance(start, str) and not _INT_RE.match(start):
        match = re.search(_regex(start), v)
        if not match: return None
        return match.group(1) if match.groups() else match.group(0)
    start = _to_int(start)
    if count is None: return v[max(start, 1) - 1:]
    count = _to_int(count)
    if count < 0: _err('negative substring length not allowed')
    end = start + count
    return v[max(start, 1) - 1:max(end - 1, 0)]


def _replace(v, old, new):
    v, old, new = _text(v), _text(old), _text(new)
    if v is None or old is None or new is None: return None
    return v if old == '' else v.replace(old, new)


def _left(v, n):
    v = _text(v)
    if v is None or n is None: return None
    n = _to_int(n)
    return v[:n] if n >= 0 else v[:max(len(v) + n, 0)]


def _right(v, n):
    v = _text(v)
    if v is None or n is None: return None
    n = _to_int(n)
    if n >= 0: return v[len(v) - n:] if n else ''
    return v[-n:]


def _initcap(v):
    v = _text(v)
    if v is None: return None
    out, previous = [], False
    for ch in v:
        out.append(ch.lower() if previous else ch.upper())
        previous = ch.isalnum()
    return ''.join(out)


def _split_part(v, delimiter, n):
    v, delimiter = _text(v), _text(delimiter)
    if v is None or delimiter is None or n is None: return None
    n = _to_int(n)
    if n == 0: _err('field position must not be zero')
    parts = v.split(delimiter) if delimiter else [v]
    if v == '': parts = []
    index = n - 1 if n > 0 else len(parts) + n
    return parts[index] if 0 <= index < len(parts) else ''


def _strpos(v, sub):
    v, sub = _text(v), _text(sub)
    if v is None or sub is None: return None
    return v.find(sub) + 1


def _md5(v):
    v = _text(v)
    return None if v is None else hashlib.md5(v.encode('utf-8')).hexdigest()


def _abs(v):
    v = _number(v)
    return None if v is None else abs(v)


def _round(v, places=None):
    v = _number(v)
    if v is None: return None
    if isinstance(v, float):
        if places is not None: _err('function round(double precision, integer) does not exist')
        return float(round(v))
    if isinstance(v, int) and places is None: return v
    places = 0 if places is None else _to_int(places)
    return _to_numeric(v).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP) if places >= 0 else \
        _to_numeric(v).scaleb(places).quantize(Decimal(1), rounding=ROUND_HALF_UP).scaleb(-places).quantize(Decimal(1))


def _greatest(*values):
    present = [v for v in values if v is not None]
    if not present: return None
    best = present[0]
    for v in present[1:]:
        if _cmp('>', v, best): best = v
    return best


def _least(*values):
    present = [v for v in values if v is not None]
    if not present: return None
    best = present[0]
    for v in present[1:]:
        if _cmp('<', v, best): best = v
    return best


_POSIX_CLASSES = {'digit': '0-9', 'alpha': 'a-zA-Z', 'alnum': 'a-zA-Z0-9', 'upper': 'A-Z', 'lower': 'a-z',
                  'space': r'\s', 'xdigit': '0-9A-Fa-f', 'punct': r'!-/:-@\[-\x60{-~', 'word': r'\w'}


def _regex(pattern):
    """POSIX (ARE) to Python: bracket classes and word boundaries; the rest is shared syntax."""
    pattern = re.sub(r'\[:([a-z]+):\]', lambda m: _POSIX_CLASSES.get(m.group(1), m.group(0)), pattern)
    return pattern.replace(r'\y', r'\b').replace(r'\m', r'\b(?=\w)').replace(r'\M', r'\b(?<=\w)')


def _regexp_replace(v, pattern, replacement, flags=''):
    v, pattern, replacement, flags = _text(v), _text(pattern), _text(replacement), _text(flags)
    if v is None or pattern is None or replacement is None or flags is None: return None
    unknown = set(flags) - set('gi')
    if unknown: _err('regexp_replace flags %s are not supported by this script' % ''.join(sorted(unknown)))

    def expand(match):
        out, i = [], 0
        while i < len(replacement):
            ch = replacement[i]
            if ch == '\\' and i + 1 < len(replacement):
                nxt = replacement[i + 1]
                if nxt.isdigit() and nxt != '0':
                    out.append(match.group(int(nxt)) or '')
                elif nxt == '&':
                    out.append(match.group(0))
                else:
                    out.append(nxt)
                i += 2
                continue
            out.append(ch)
            i += 1
        return ''.join(out)

    return re.sub(_regex(pattern), expand, v, count=0 if 'g' in flags else 1,
                  flags=re.IGNORECASE if 'i' in flags else 0)


def _regex_match(v, pattern, ignore_case=False, negate=False):
    v, pattern = _text(v), _text(pattern)
    if v is None or pattern is None: return None
    found = re.search(_regex(pattern), v, re.IGNORECASE if ignore_case else 0) is not None
    return found != negate


def _like(v, pattern, ignore_case=False, negate=False):
    v, pattern = _text(v), _text(pattern)
    if v is None or pattern is None: return None
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == '\\' and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append('.*' if ch == '%' else '.' if ch == '_' else re.escape(ch))
        i += 1
    found = re.fullmatch(''.join(out), v, re.DOTALL | (re.IGNORECASE if ignore_case else 0)) is not None
    return found != negate


def _is(v, expected):
    v = _bool(v)
    return v is expected


def _read_csv(table, path, null, converters, needed):
    with open(path, newline='', encoding='utf-8') as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None: _err('%s: the file is empty (a header row is required)' % path)
        missing = [c for c in needed if c not in header]
        if missing: _err('%s (table %s) lacks the columns %s' % (path, table, ', '.join(missing)))
        for line, values in enumerate(reader, 2):
            if len(values) != len(header):
                _err('%s:%d: %d fields, the header has %d' % (path, line, len(values), len(header)))
            row = {}
            for name, value in zip(header, values):
                if value == null:
                    row[name] = None
                else:
                    convert = converters.get(name)
                    try:
                        row[name] = convert(value) if convert else value
                    except MappingError as error:
                        _err('%s:%d: column %s: %s' % (path, line, name, error))
            yield row


def _join(rows, right_rows, right_table, join_type, left_key, right_key, residual):
    index = {}
    for position, right in enumerate(right_rows):
        key = right_key({right_table: right})
        if any(v is None for v in key): continue
        index.setdefault(tuple(key), []).append(position)
    matched = set()
    for left in rows:
        key = left_key(left)
        hits = [] if any(v is None for v in key) else index.get(tuple(key), [])
        found = False
        for position in hits:
            combined = dict(left)
            combined[right_table] = right_rows[position]
            if residual is None or _true(residual(combined)):
                found = True
                matched.add(position)
                yield combined
        if not found and join_type in ('left', 'full'):
            combined = dict(left)
            combined[right_table] = None
            yield combined
    if join_type in ('right', 'full'):
        for position, right in enumerate(right_rows):
            if position not in matched:
                yield {right_table: right}
