"""Unit tests of src/transform/python-runtime.py: the PostgreSQL semantics generated scripts rely on.

Each expectation is what PostgreSQL 15 answers for the same SQL (noted beside it)."""
import importlib.util
import pathlib
import unittest
from decimal import Decimal

_PATH = pathlib.Path(__file__).resolve().parents[2] / 'src' / 'transform' / 'python-runtime.py'
_spec = importlib.util.spec_from_file_location('python_runtime', _PATH)
rt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rt)


class IntegerArithmetic(unittest.TestCase):
    def test_division_truncates_toward_zero(self):
        self.assertEqual(rt._arith('/', -7, 2), -3)  # select -7 / 2  → -3
        self.assertEqual(rt._arith('%', -7, 2), -1)  # select -7 % 2  → -1

    def test_division_by_zero_is_an_error(self):
        with self.assertRaisesRegex(rt.MappingError, 'division by zero'):
            rt._arith('/', 1, 0)

    def test_null_propagates(self):
        self.assertIsNone(rt._arith('+', None, 1))


class NumericValues(unittest.TestCase):
    def test_division_scale_follows_select_div_scale(self):
        self.assertEqual(str(rt._arith('/', Decimal('1'), Decimal('3'))), '0.33333333333333333333')  # 1::numeric / 3

    def test_rounding_is_half_away_from_zero(self):
        self.assertEqual(rt._round(Decimal('2.5')), Decimal('3'))  # round(2.5) → 3
        self.assertEqual(rt._round(Decimal('-2.5')), Decimal('-3'))  # round(-2.5) → -3
        self.assertEqual(rt._round(Decimal('1234.5678'), -2), Decimal('1200'))  # round(1234.5678, -2) → 1200

    def test_integer_casts_check_range_and_syntax(self):
        self.assertEqual(rt._to_int(' 42 '), 42)  # ' 42 '::integer → 42
        with self.assertRaisesRegex(rt.MappingError, 'out of range'):
            rt._to_int(2 ** 31)  # 2147483648::integer → integer out of range
        with self.assertRaisesRegex(rt.MappingError, 'invalid input syntax'):
            rt._to_int('4x')

    def test_money_reads_its_numeric_export_and_refuses_the_display_format(self):
        # select '-92233720368547758.08'::money::numeric → -92233720368547758.08 (scale kept)
        self.assertEqual(str(rt._to_money('-92233720368547758.08')), '-92233720368547758.08')
        self.assertEqual(str(rt._to_money('0.00')), '0.00')
        for shown in ('$1,234.56', '-$1,234.56', '1.234,56 EUR', '($1,234.56)'):
            with self.assertRaisesRegex(rt.MappingError, 'export the column as numeric'):
                rt._to_money(shown)


class ThreeValuedLogic(unittest.TestCase):
    def test_and_or_with_null(self):
        self.assertFalse(rt._and(lambda: None, lambda: False))  # null and false → false
        self.assertIsNone(rt._and(lambda: None, lambda: True))  # null and true → null
        self.assertTrue(rt._or(lambda: None, lambda: True))  # null or true → true

    def test_coalesce_takes_the_first_present_value(self):
        self.assertEqual(rt._coalesce(lambda: None, lambda: 'b'), 'b')


class TextOutput(unittest.TestCase):
    def test_booleans_print_as_t_and_f(self):
        self.assertEqual(rt._out(True), 't')
        self.assertEqual(rt._out(False), 'f')

    def test_boolean_input_accepts_postgres_spellings(self):
        self.assertTrue(rt._to_bool('yes'))
        self.assertFalse(rt._to_bool('off'))

    def test_string_functions(self):
        self.assertEqual(rt._initcap('hello wORLD'), 'Hello World')  # initcap('hello wORLD')
        self.assertEqual(rt._split_part('a,b,c', ',', 2), 'b')
        self.assertEqual(rt._btrim('  x  '), 'x')


if __name__ == '__main__':
    unittest.main()
