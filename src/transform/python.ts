import { AppError } from '../app-error.ts';
import type { PortableType } from '../warehouse/types.ts';
import {
  planMapping,
  type ExpressionNode,
  type Mapping,
  type MappingPlan,
  type PlanOptions,
  type SourceTable,
  type TargetTable,
} from './mapping.ts';
import { PYTHON_RUNTIME } from './python-runtime.ts';
import { sourceTableSql } from './sql.ts';
import { quoteIdent } from '../warehouse/postgres-sql.ts';
import { quoteLiteral } from '../quality/sql.ts';

/*
 * The "Python mapping code" of a mapping: a standalone Python 3 script (standard library only) that
 * applies the same mapping as the generated SQL to CSV exports of the source tables, one file per
 * table with a header row. Expressions are translated from the libpg-query parse tree (never by
 * text substitution); a construct without a translation is refused with its name.
 *
 * Limits (also printed in the script's docstring):
 *  - CSV values are text unless the source column types are given (`sourceColumns`, as introspection
 *    reports them): then integers, numerics, booleans, dates, timestamps, json and uuid are parsed
 *    first, so comparisons and arithmetic behave as in the database.
 *  - money columns are read as numeric, exported as `column::numeric` by the export query of each table
 *    (`PythonInput.query`): COPY prints money in the exporting session's lc_monetary (`$1,234.56`,
 *    `-1.234,56 €`), which the script cannot read back without guessing the locale, so it refuses that
 *    form. Money values are then numbers: printed as text they show no lc_monetary format, and
 *    arithmetic on them is numeric (without the money type's rounding to cents).
 *  - NULL is the `--null` marker (default: an empty field). Python's csv module cannot tell `""` from
 *    an empty field, so with the default an empty string reads as NULL; export with a marker such as
 *    `\N` (COPY … WITH (FORMAT csv, HEADER, NULL '\N')) for an exact round trip.
 *  - Joins are hash joins on the equality conjuncts of ON (`a.x = b.y AND …`, any expressions on each
 *    side); other conjuncts filter the matches; an ON without equalities is a nested loop. Joined
 *    tables are held in memory, the primary table is streamed.
 *  - Regular expressions: POSIX bracket classes and \y \m \M are translated; other ARE-only syntax
 *    is not. Text comparison with < and > is by code point, not the database collation. timestamptz
 *    values are printed in UTC. Dates and timestamps are read in ISO form.
 */

export interface PythonOptions extends PlanOptions {
  /** Source column types per table key, e.g. `{ 'shop.customers': { id: 'integer', email: 'text' } }`. */
  sourceColumns?: Record<string, Record<string, string>>;
}

/** One CSV file the script reads, and the query that exports it in the form the script reads. */
export interface PythonInput {
  source_table: string;
  file: string;
  query: string;
}

type Node = ExpressionNode;

const unsupported = (what: string) =>
  new AppError('BAD_REQUEST', `Python generation: ${what} is not supported in mapping expressions`);

const py = (value: string) => JSON.stringify(value);

/** A database type name (as a cast or introspection writes it) → the Python conversion, or null for text. */
function conversionFor(typeName: string, typmods: number[] = []): string | null {
  const name = typeName
    .toLowerCase()
    .replace(/\(.*\)/, '')
    .trim();
  switch (name) {
    case 'int2':
    case 'smallint':
      return `lambda v: _to_int(v, 'smallint')`;
    case 'int4':
    case 'int':
    case 'integer':
    case 'serial':
      return `lambda v: _to_int(v, 'integer')`;
    case 'int8':
    case 'bigint':
    case 'bigserial':
      return `lambda v: _to_int(v, 'bigint')`;
    case 'numeric':
    case 'decimal':
      return typmods.length ? `lambda v: _to_numeric(v, ${typmods[0]}, ${typmods[1] ?? 0})` : '_to_numeric';
    case 'float4':
    case 'float8':
    case 'real':
    case 'double precision':
      return '_to_float';
    case 'bool':
    case 'boolean':
      return '_to_bool';
    case 'date':
      return '_to_date';
    case 'timestamp':
    case 'timestamp without time zone':
      return '_to_timestamp';
    case 'timestamptz':
    case 'timestamp with time zone':
      return '_to_timestamptz';
    case 'json':
    case 'jsonb':
      return '_to_json';
    case 'uuid':
      return '_to_uuid';
    case 'text':
    case 'varchar':
    case 'character varying':
      return typmods.length ? `lambda v: _to_varchar(v, ${typmods[0]})` : '_to_text';
    default:
      return null;
  }
}

const isMoney = (typeName: string | undefined) => typeName?.trim().toLowerCase() === 'money';

/**
 * How the script reads a source column of this type. money is read here only, not as a cast target:
 * the export turns it into numeric (see `exportColumn`), and nothing in the script would give `::money`
 * PostgreSQL's locale-dependent text.
 */
function sourceConversionFor(typeName: string): string | null {
  return isMoney(typeName) ? '_to_money' : conversionFor(typeName);
}

/** A column of an export query: money as numeric, which is exact whatever the session's lc_monetary. */
function exportColumn(column: string, typeName: string | undefined): string {
  return isMoney(typeName) ? `${quoteIdent(column)}::numeric AS ${quoteIdent(column)}` : quoteIdent(column);
}

const TARGET_CONVERSIONS: Record<PortableType, string> = {
  text: '_to_text',
  integer: "lambda v: _to_int(v, 'integer')",
  bigint: "lambda v: _to_int(v, 'bigint')",
  numeric: '_to_numeric',
  boolean: '_to_bool',
  date: '_to_date',
  timestamp: '_to_timestamp',
  timestamptz: '_to_timestamptz',
  json: '_to_json',
  uuid: '_to_uuid',
};

/** function name → [python helper, min args, max args] */
const FUNCTIONS: Record<string, [string, number, number]> = {
  lower: ['_lower', 1, 1],
  upper: ['_upper', 1, 1],
  btrim: ['_btrim', 1, 2],
  ltrim: ['_ltrim', 1, 2],
  rtrim: ['_rtrim', 1, 2],
  length: ['_length', 1, 1],
  char_length: ['_length', 1, 1],
  character_length: ['_length', 1, 1],
  substring: ['_substring', 2, 3],
  substr: ['_substring', 2, 3],
  replace: ['_replace', 3, 3],
  concat: ['_concat', 1, 100],
  concat_ws: ['_concat_ws', 2, 100],
  regexp_replace: ['_regexp_replace', 3, 4],
  left: ['_left', 2, 2],
  right: ['_right', 2, 2],
  initcap: ['_initcap', 1, 1],
  split_part: ['_split_part', 3, 3],
  position: ['_strpos', 2, 2],
  strpos: ['_strpos', 2, 2],
  md5: ['_md5', 1, 1],
  abs: ['_abs', 1, 1],
  round: ['_round', 1, 2],
  // The one-argument form only (seconds since the epoch); to_timestamp(text, format) has no translation.
  to_timestamp: ['_epoch_to_timestamptz', 1, 1],
};

const COMPARISONS = new Set(['=', '<>', '!=', '<', '>', '<=', '>=']);
const ARITHMETIC = new Set(['+', '-', '*', '/', '%']);
const REGEX_OPS: Record<string, [boolean, boolean]> = {
  '~': [false, false],
  '~*': [true, false],
  '!~': [false, true],
  '!~*': [true, true],
};

function constant(node: Node): string {
  if (node.isnull) return 'None';
  if (node.sval) return py(node.sval.sval ?? '');
  if (node.ival) return String(node.ival.ival ?? 0);
  if (node.fval) return `Decimal(${py(node.fval.fval)})`;
  if (node.boolval) return node.boolval.boolval ? 'True' : 'False';
  if (node.bsval) throw unsupported('a bit-string constant');
  throw unsupported('this constant');
}

function operatorName(node: Node): string {
  return (node.name as Node[]).map((n) => n.String.sval).join('.');
}

class Translator {
  private readonly resolveTable: (written: string) => SourceTable | undefined;
  private readonly onlyTable: string | null;

  constructor(resolveTable: (written: string) => SourceTable | undefined, onlyTable: string | null) {
    this.resolveTable = resolveTable;
    this.onlyTable = onlyTable;
  }

  /** The table keys an expression reads. */
  tablesOf(node: unknown, found = new Set<string>()): Set<string> {
    if (Array.isArray(node)) node.forEach((n) => this.tablesOf(n, found));
    else if (node && typeof node === 'object') {
      for (const [key, child] of Object.entries(node)) {
        if (key === 'ColumnRef') found.add(this.columnRef(child as Node).table);
        else this.tablesOf(child, found);
      }
    }
    return found;
  }

  columnRef(node: Node): { table: string; column: string } {
    const fields = node.fields as Node[];
    if (fields.some((f) => 'A_Star' in f)) throw unsupported('*');
    const names = fields.map((f) => f.String.sval as string);
    const column = names.at(-1)!;
    if (names.length === 1) {
      if (!this.onlyTable)
        throw new AppError('BAD_REQUEST', `Python generation: qualify column ${column} with its table`);
      return { table: this.onlyTable, column };
    }
    const written = names.slice(0, -1).join('.');
    const table = this.resolveTable(written);
    if (!table)
      throw new AppError(
        'BAD_REQUEST',
        `Python generation: ${names.join('.')} names an unknown table ${written}`,
      );
    return { table: table.key, column };
  }

  expr(wrapper: Node): string {
    const kind = Object.keys(wrapper)[0];
    const node = wrapper[kind] as Node;
    switch (kind) {
      case 'ColumnRef': {
        const { table, column } = this.columnRef(node);
        return `_c(r, ${py(table)}, ${py(column)})`;
      }
      case 'A_Const':
        return constant(node);
      case 'TypeCast':
        return this.cast(node);
      case 'FuncCall':
        return this.func(node);
      case 'A_Expr':
        return this.aExpr(node);
      case 'BoolExpr': {
        const args = (node.args as Node[]).map((a) => this.expr(a));
        if (node.boolop === 'NOT_EXPR') return `_not(${args[0]})`;
        const helper = node.boolop === 'AND_EXPR' ? '_and' : '_or';
        return `${helper}(${args.map((a) => `lambda: ${a}`).join(', ')})`;
      }
      case 'NullTest':
        return `(${this.expr(node.arg)} ${node.nulltesttype === 'IS_NULL' ? 'is' : 'is not'} None)`;
      case 'BooleanTest': {
        const arg = this.expr(node.arg);
        const tests: Record<string, string> = {
          IS_TRUE: `_is(${arg}, True)`,
          IS_NOT_TRUE: `(not _is(${arg}, True))`,
          IS_FALSE: `_is(${arg}, False)`,
          IS_NOT_FALSE: `(not _is(${arg}, False))`,
          IS_UNKNOWN: `_is(${arg}, None)`,
          IS_NOT_UNKNOWN: `(not _is(${arg}, None))`,
        };
        return tests[node.booltesttype];
      }
      case 'CoalesceExpr':
        return `_coalesce(${(node.args as Node[]).map((a) => `lambda: ${this.expr(a)}`).join(', ')})`;
      case 'MinMaxExpr':
        return `${node.op === 'IS_GREATEST' ? '_greatest' : '_least'}(${(node.args as Node[]).map((a) => this.expr(a)).join(', ')})`;
      case 'CaseExpr':
        return this.caseExpr(node);
      default:
        throw unsupported(`the construct ${kind}`);
    }
  }

  private cast(node: Node): string {
    const names = (node.typeName.names as Node[]).map((n) => n.String.sval as string);
    const typeName = names.at(-1)!;
    if (node.typeName.arrayBounds) throw unsupported(`a cast to an array type (${typeName}[])`);
    const typmods = ((node.typeName.typmods as Node[] | undefined) ?? []).map((m) =>
      Number(m.A_Const?.ival?.ival ?? 0),
    );
    const conversion = conversionFor(typeName, typmods);
    if (!conversion) throw unsupported(`a cast to ${typeName}`);
    return `(${conversion})(${this.expr(node.arg)})`;
  }

  private func(node: Node): string {
    const name = (node.funcname as Node[]).at(-1)!.String.sval.toLowerCase() as string;
    if (node.agg_star || node.agg_distinct || node.over || node.agg_order || node.agg_filter)
      throw unsupported(`the aggregate or window call ${name}(…)`);
    const args = ((node.args as Node[] | undefined) ?? []).map((a) => this.expr(a));
    if (name === 'greatest' || name === 'least') return `_${name}(${args.join(', ')})`;
    const known = FUNCTIONS[name];
    if (!known) throw unsupported(`the function ${name}()`);
    const [helper, min, max] = known;
    if (args.length < min || args.length > max) throw unsupported(`${name}() with ${args.length} arguments`);
    return `${helper}(${args.join(', ')})`;
  }

  private aExpr(node: Node): string {
    const op = operatorName(node);
    const left = node.lexpr ? this.expr(node.lexpr) : null;
    const right = () => this.expr(node.rexpr);
    const list = () => ((node.rexpr.List?.items as Node[]) ?? []).map((i) => this.expr(i));
    switch (node.kind) {
      case 'AEXPR_OP':
        if (left === null) {
          if (op === '-') return `_neg(${right()})`;
          if (op === '+') return right();
          throw unsupported(`the prefix operator ${op}`);
        }
        if (op === '||') return `_concat_op(${left}, ${right()})`;
        if (COMPARISONS.has(op)) return `_cmp(${py(op)}, ${left}, ${right()})`;
        if (ARITHMETIC.has(op)) return `_arith(${py(op)}, ${left}, ${right()})`;
        if (op in REGEX_OPS) {
          const [ignoreCase, negate] = REGEX_OPS[op];
          return `_regex_match(${left}, ${right()}, ${ignoreCase ? 'True' : 'False'}, ${negate ? 'True' : 'False'})`;
        }
        throw unsupported(`the operator ${op}`);
      case 'AEXPR_LIKE':
      case 'AEXPR_ILIKE': {
        const negate = op.startsWith('!');
        return `_like(${left}, ${right()}, ${node.kind === 'AEXPR_ILIKE' ? 'True' : 'False'}, ${negate ? 'True' : 'False'})`;
      }
      case 'AEXPR_NULLIF':
        return `_nullif(${left}, ${right()})`;
      case 'AEXPR_IN':
        return `_in(${left}, [${list().join(', ')}], ${op === '<>' ? 'True' : 'False'})`;
      case 'AEXPR_BETWEEN':
      case 'AEXPR_NOT_BETWEEN': {
        const [low, high] = list();
        const between = `_and(lambda: _cmp('>=', ${left}, ${low}), lambda: _cmp('<=', ${left}, ${high}))`;
        return node.kind === 'AEXPR_BETWEEN' ? between : `_not(${between})`;
      }
      case 'AEXPR_DISTINCT':
        return `_distinct(${left}, ${right()})`;
      case 'AEXPR_NOT_DISTINCT':
        return `_not(_distinct(${left}, ${right()}))`;
      default:
        throw unsupported(`the expression ${String(node.kind).replace('AEXPR_', '')}`);
    }
  }

  private caseExpr(node: Node): string {
    const subject = node.arg ? this.expr(node.arg) : null;
    let out = node.defresult ? this.expr(node.defresult) : 'None';
    for (const when of [...(node.args as Node[])].reverse()) {
      const w = when.CaseWhen as Node;
      const condition =
        subject === null
          ? `_true(${this.expr(w.expr)})`
          : `_true(_cmp('=', ${subject}, ${this.expr(w.expr)}))`;
      out = `(${this.expr(w.result)} if ${condition} else ${out})`;
    }
    return out;
  }
}

/** Splits `a AND b AND c` into its conjuncts. */
function conjuncts(node: Node): Node[] {
  const bool = node.BoolExpr as Node | undefined;
  if (bool?.boolop === 'AND_EXPR') return (bool.args as Node[]).flatMap(conjuncts);
  return [node];
}

function indent(text: string, spaces: number): string {
  return text
    .split('\n')
    .map((line) => (line ? ' '.repeat(spaces) + line : line))
    .join('\n');
}

/**
 * The script of a planned mapping and the exports it reads; deterministic (no timestamps), so diffs
 * show real changes.
 */
function pythonFromPlan(
  plan: MappingPlan,
  options: PythonOptions = {},
): { code: string; inputs: PythonInput[] } {
  const tables = [plan.primary, ...plan.joins];
  const byName = new Map<string, SourceTable>();
  for (const t of tables) {
    byName.set(t.key.toLowerCase(), t);
    byName.set(t.name.toLowerCase(), t);
  }
  const translator = new Translator(
    (w) => byName.get(w.toLowerCase()),
    tables.length === 1 ? plan.primary.key : null,
  );

  // Columns each table must have, for a clear message when a CSV lacks one.
  const needed = new Map<string, Set<string>>(tables.map((t) => [t.key, new Set<string>()]));
  const collect = (node: unknown) => {
    if (Array.isArray(node)) node.forEach(collect);
    else if (node && typeof node === 'object')
      for (const [key, child] of Object.entries(node)) {
        if (key === 'ColumnRef') {
          const { table, column } = translator.columnRef(child as Node);
          needed.get(table)?.add(column);
        } else collect(child);
      }
  };

  const columnLines = plan.columns.map((column) => {
    let value: string;
    if (column.source.kind === 'null') value = 'None';
    else if (column.source.kind === 'column') {
      needed.get(column.source.table)?.add(column.source.column);
      value = `_c(r, ${py(column.source.table)}, ${py(column.source.column)})`;
    } else {
      collect(column.source.ast);
      value = translator.expr(column.source.ast);
    }
    return `# ${column.name} (${column.type})\n_out((${TARGET_CONVERSIONS[column.type]})(${value})),`;
  });

  const joinBlocks = plan.joins.map((join, i) => {
    collect(join.joinOnAst);
    const keyPairs: [string, string][] = [];
    const residual: string[] = [];
    for (const part of conjuncts(join.joinOnAst)) {
      const op = part.A_Expr as Node | undefined;
      if (op?.kind === 'AEXPR_OP' && op.lexpr && operatorName(op) === '=') {
        const leftTables = translator.tablesOf(op.lexpr);
        const rightTables = translator.tablesOf(op.rexpr);
        const onlyJoined = (s: Set<string>) => s.size > 0 && [...s].every((k) => k === join.key);
        const withoutJoined = (s: Set<string>) => s.size > 0 && !s.has(join.key);
        if (onlyJoined(rightTables) && withoutJoined(leftTables)) {
          keyPairs.push([translator.expr(op.lexpr), translator.expr(op.rexpr)]);
          continue;
        }
        if (onlyJoined(leftTables) && withoutJoined(rightTables)) {
          keyPairs.push([translator.expr(op.rexpr), translator.expr(op.lexpr)]);
          continue;
        }
      }
      residual.push(translator.expr(part));
    }
    const tuple = (items: string[]) => `(${items.join(', ')}${items.length === 1 ? ',' : ''})`;
    return (
      [
        `# ${join.joinType.toUpperCase()} JOIN ${join.key} ON ${join.joinOn.replace(/\s+/g, ' ')}`,
        `rows = _join(rows, tables[${py(join.key)}], ${py(join.key)}, ${py(join.joinType)},`,
        `             lambda r: ${tuple(keyPairs.map(([l]) => l))},`,
        `             lambda r: ${tuple(keyPairs.map(([, r]) => r))},`,
        `             ${residual.length ? `lambda r: _and(${residual.map((x) => `lambda: ${x}`).join(', ')})` : 'None'})`,
      ].join('\n') + (i < plan.joins.length - 1 ? '\n' : '')
    );
  });

  const converters = tables.map((t) => {
    const types = options.sourceColumns?.[t.key] ?? {};
    // Only the columns the mapping reads: a column it ignores (a money column exported as COPY prints
    // it, say) must not stop the run.
    const entries = Object.keys(types)
      .filter((column) => needed.get(t.key)!.has(column))
      .sort()
      .map((column) => [column, sourceConversionFor(types[column])] as const)
      .filter(([, conversion]) => conversion !== null)
      .map(([column, conversion]) => `        ${py(column)}: ${conversion},`);
    return `    ${py(t.key)}: {\n${entries.join('\n')}${entries.length ? '\n' : ''}    },`;
  });
  const neededLines = tables.map(
    (t) => `    ${py(t.key)}: ${JSON.stringify([...needed.get(t.key)!].sort())},`,
  );
  const header = plan.columns.map((c) => c.name);

  const inputs: PythonInput[] = tables.map((t) => {
    const types = options.sourceColumns?.[t.key] ?? {};
    const columns = [...needed.get(t.key)!].sort();
    const list = columns.length ? columns.map((c) => exportColumn(c, types[c])).join(', ') : '*';
    return { source_table: t.key, file: `${t.key}.csv`, query: `SELECT ${list} FROM ${sourceTableSql(t)}` };
  });
  // The docstring is a raw string: three quotes in an identifier would end it, so they are broken up.
  const exportLines = inputs.map((i) =>
    `    \\copy (${i.query}) TO ${quoteLiteral(i.file)} WITH (FORMAT csv, HEADER, NULL '\\N')`.replaceAll(
      '"""',
      '""\\"',
    ),
  );

  const code = `#!/usr/bin/env python3
r"""Mapping of target table ${plan.target.name}, generated by dimas from the mapping; do not edit.

Applies the same transformation as the generated SQL to CSV exports of the source tables
(one file per table, with a header row): ${tables.map((t) => t.key).join(', ')}.

Usage:
    python3 ${plan.target.name}.py --input-dir DIR [--output FILE] [--null MARKER]

DIR holds <table>.csv for each source table (e.g. ${plan.primary.key}.csv); --table KEY=PATH points one
table elsewhere. NULL is written and read as MARKER (default: an empty field; Python's csv module cannot
tell "" from an empty field, so use a marker such as \\N for an exact round trip). Output: CSV with a
header, values printed as PostgreSQL prints them (booleans t/f, timestamptz in UTC).

Export the tables with psql as follows, then run with --null '\\N'. money columns must arrive as numeric,
as these queries give them: COPY prints money in the session's lc_monetary ($1,234.56 or 1.234,56 EUR),
which this script refuses rather than guess.
${exportLines.join('\n')}

Limits: joined tables are held in memory (the primary table is streamed); dates and timestamps are read
in ISO form; text is compared by code point, not by the database collation; money values are numbers
here: printed as text they show no lc_monetary format, and arithmetic on them is numeric (without the
money type's rounding to cents).
Standard library only; Python 3.8 or later.
"""
import argparse
import csv
import datetime as _dt
import decimal
import hashlib
import json
import math
import os
import re
import sys
import uuid as _uuid
from decimal import Decimal, ROUND_HALF_EVEN, ROUND_HALF_UP

decimal.getcontext().prec = 1000
${PYTHON_RUNTIME}

PRIMARY = ${py(plan.primary.key)}
JOINED = ${JSON.stringify(plan.joins.map((j) => j.key))}
HEADER = ${JSON.stringify(header)}
CONVERTERS = {
${converters.join('\n')}
}
NEEDED = {
${neededLines.join('\n')}
}


def map_row(r):
    return [
${indent(columnLines.join('\n'), 8)}
    ]


def transform(paths, null):
    tables = {key: list(_read_csv(key, paths[key], null, CONVERTERS[key], NEEDED[key])) for key in JOINED}
    rows = ({PRIMARY: row} for row in _read_csv(PRIMARY, paths[PRIMARY], null, CONVERTERS[PRIMARY], NEEDED[PRIMARY]))
${indent(joinBlocks.join('\n'), 4)}
    for number, r in enumerate(rows, 1):
        try:
            yield map_row(r)
        except MappingError as error:
            _err('output row %d: %s' % (number, error))


def main(argv=None):
    parser = argparse.ArgumentParser(description='Map CSV exports of the source tables to ${plan.target.name}.')
    parser.add_argument('--input-dir', default='.', help='directory holding <table>.csv per source table')
    parser.add_argument('--table', action='append', default=[], metavar='KEY=PATH', help='CSV file of one table')
    parser.add_argument('--output', default='-', help='output CSV file (default: standard output)')
    parser.add_argument('--null', default='', help='how NULL is written in the CSV files (default: empty)')
    args = parser.parse_args(argv)
    paths = {key: os.path.join(args.input_dir, key + '.csv') for key in [PRIMARY] + JOINED}
    for item in args.table:
        key, _, path = item.partition('=')
        if key not in paths: parser.error('unknown table %s (tables: %s)' % (key, ', '.join(paths)))
        paths[key] = path
    output = sys.stdout if args.output == '-' else open(args.output, 'w', newline='', encoding='utf-8')
    try:
        writer = csv.writer(output, lineterminator='\\n')
        writer.writerow(HEADER)
        for values in transform(paths, args.null):
            writer.writerow([args.null if v is None else v for v in values])
    except MappingError as error:
        sys.stderr.write('error: %s\\n' % error)
        return 1
    finally:
        if output is not sys.stdout: output.close()
    return 0


if __name__ == '__main__':
    sys.exit(main())
`;
  return { code, inputs };
}

/** The Python script of a mapping and its inputs (BAD_REQUEST naming what cannot be translated). */
export async function generatePython(
  mapping: Mapping,
  target: TargetTable,
  options: PythonOptions = {},
): Promise<{ code: string; inputs: PythonInput[] }> {
  return pythonFromPlan(await planMapping(mapping, target, options), options);
}

/** The Python script of a mapping (BAD_REQUEST naming what cannot be translated). */
export async function generatePythonScript(
  mapping: Mapping,
  target: TargetTable,
  options: PythonOptions = {},
): Promise<string> {
  return (await generatePython(mapping, target, options)).code;
}
