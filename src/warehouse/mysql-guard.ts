import { AppError } from '../app-error.ts';

/**
 * User SQL for a MySQL / MariaDB source. libpg-query cannot parse MySQL, so the statement is checked
 * lexically (comments and literals removed first) and then run in `START TRANSACTION READ ONLY`,
 * which makes the server refuse writes to tables. The lexical check is what stops the rest: DDL
 * commits the open transaction implicitly in MySQL (so READ ONLY alone would not stop it), files
 * (`INTO OUTFILE`), locks (`FOR UPDATE`, `GET_LOCK`), executable comments (`/*! … *\/`) and optimizer
 * hints (`/*+ … *\/`, which MySQL 8 obeys: `MAX_EXECUTION_TIME`, `SET_VAR`). Calls of the source's
 * stored functions, whose bodies the check cannot see, are refused by the catalog (`calledFunctions`
 * here, the lookup in mysql.ts).
 */

/**
 * The lexer below reads a statement as MySQL does with its default quoting: backslash escapes in
 * strings, double quotes around strings. `NO_BACKSLASH_ESCAPES` and `ANSI_QUOTES` (and the modes that
 * imply it) make the server read the same text otherwise (`'a\', 1 into outfile …` would end the
 * string early), so every connection of a MySQL source drops them from its session's `sql_mode`,
 * keeping the rest. Run on each new connection, before any statement.
 */
export const LEXING_SQL_MODE = `set session sql_mode = trim(both ',' from ${[
  'ANSI',
  'ANSI_QUOTES',
  'NO_BACKSLASH_ESCAPES',
  'ORACLE',
  'MSSQL',
  'DB2',
  'MAXDB',
  'POSTGRESQL',
].reduce((mode, name) => `replace(${mode}, ',${name},', ',')`, "concat(',', @@session.sql_mode, ',')")})`;

/**
 * What follows `--` for MySQL to read a comment: a space or an ASCII control character. A Unicode
 * space (no-break, ideographic, U+FEFF) is not one: MySQL reads on, so the guard must too.
 */
const startsDashComment = (c: string | undefined) => c === undefined || c <= ' ' || c === '\x7f';

const STARTS = new Set(['select', 'with', 'show', 'explain', 'describe', 'desc', 'values', 'table']);

// Words that may not appear outside literals, whatever the statement starts with.
const REFUSED: [RegExp, string][] = [
  [/\binto\b/, 'INTO (outfile, dumpfile, variables)'],
  [/\bfor\s+update\b/, 'FOR UPDATE'],
  [/\bfor\s+share\b/, 'FOR SHARE'],
  [/\block\s+in\s+share\s+mode\b/, 'LOCK IN SHARE MODE'],
  [
    /\b(get_lock|release_lock|release_all_locks|is_free_lock|load_file|sys_exec|sys_eval)\s*\(/,
    'a function with side effects',
  ],
  [
    /\b(insert|update|delete|replace|create|alter|drop|truncate|rename|grant|revoke|set|call|do|handler|load|lock|unlock|flush|kill|install|uninstall|prepare|execute)\b(?!\s*\()/,
    'a statement that changes something',
  ],
];

/** The statement with comments, string literals and quoted identifiers blanked out (their length kept). */
function blankOut(sql: string): string {
  let out = '';
  let i = 0;
  while (i < sql.length) {
    const c = sql[i];
    const next = sql[i + 1];
    if (c === '/' && next === '*') {
      if (sql[i + 2] === '!' || (sql[i + 2] === 'M' && sql[i + 3] === '!'))
        throw new AppError(
          'BAD_REQUEST',
          'Executable comments (/*! … */) are not allowed in source queries',
          {
            reason: 'NOT_READ_ONLY',
          },
        );
      // MySQL 8 runs optimizer hints: MAX_EXECUTION_TIME and SET_VAR there would override the statement
      // timeout (MariaDB 10 reads them as comments).
      if (sql[i + 2] === '+')
        throw new AppError(
          'BAD_REQUEST',
          'Optimizer hints (/*+ … */) are not allowed in source queries: on MySQL 8 they can override the statement timeout',
          { reason: 'NOT_READ_ONLY' },
        );
      const end = sql.indexOf('*/', i + 2);
      const stop = end < 0 ? sql.length : end + 2;
      out += ' '.repeat(stop - i);
      i = stop;
    } else if ((c === '-' && next === '-' && startsDashComment(sql[i + 2])) || c === '#') {
      const end = sql.indexOf('\n', i);
      const stop = end < 0 ? sql.length : end;
      out += ' '.repeat(stop - i);
      i = stop;
    } else if (c === "'" || c === '"' || c === '`') {
      let j = i + 1;
      while (j < sql.length) {
        if (sql[j] === '\\' && c !== '`') j += 2;
        else if (sql[j] === c && sql[j + 1] === c) j += 2;
        else if (sql[j] === c) break;
        else j++;
      }
      out += c + '_'.repeat(Math.max(0, Math.min(j, sql.length) - i - 1)) + c;
      i = j + 1;
    } else {
      out += c;
      i++;
    }
  }
  return out;
}

/** One read-only statement, or a 400 saying what is refused; returns it without a trailing `;`. */
export function assertMysqlReadOnly(sql: string): string {
  const statement = sql.trim().replace(/;\s*$/, '');
  if (!statement) throw new AppError('BAD_REQUEST', 'The query is empty');
  const bare = blankOut(statement).toLowerCase();
  if (bare.includes(';'))
    throw new AppError('BAD_REQUEST', 'Only one statement may run at a time', {
      reason: 'MULTIPLE_STATEMENTS',
    });
  const first = /^\s*\(*\s*([a-z]+)/.exec(bare)?.[1] ?? '';
  if (!STARTS.has(first))
    throw new AppError(
      'BAD_REQUEST',
      `Only read-only statements (SELECT, WITH, SHOW, EXPLAIN, DESCRIBE) run on the source; this one starts with ${first.toUpperCase() || 'nothing'}`,
      { reason: 'NOT_READ_ONLY' },
    );
  // SHOW only reads (SHOW CREATE TABLE names a verb that would otherwise be refused).
  for (const [pattern, what] of first === 'show' ? REFUSED.slice(0, 5) : REFUSED) {
    const hit = pattern.exec(bare);
    if (hit)
      throw new AppError(
        'BAD_REQUEST',
        `The query uses ${what} (${hit[0].trim().toUpperCase()}), which may not run on the source`,
        {
          reason: 'NOT_READ_ONLY',
        },
      );
  }
  return statement;
}

const IDENT_CHAR = /[\p{L}\p{N}_$\u0080-\uffff]/u;

/** The identifier ending at `end` (inclusive) of `sql`, backquoted or bare: its name and where it starts. */
function identifierBefore(sql: string, bare: string, end: number): { name: string; start: number } | null {
  if (bare[end] === '`') {
    const open = bare.lastIndexOf('`', end - 1);
    if (open < 0) return null;
    return { name: sql.slice(open + 1, end).replaceAll('``', '`'), start: open };
  }
  let start = end + 1;
  while (start > 0 && IDENT_CHAR.test(bare[start - 1])) start--;
  const name = sql.slice(start, end + 1);
  return name && !/^\d+$/.test(name) ? { name, start } : null;
}

const skipSpaceBack = (bare: string, i: number) => {
  while (i >= 0 && /\s/.test(bare[i])) i--;
  return i;
};

/**
 * The functions a statement calls by name (`f(`, `db.f (`, `` `db`.`f`( ``), outside comments and
 * literals: the candidates for stored functions, which the caller looks up in the source's catalog.
 * Also lists keywords followed by a parenthesis (`in (`); only names of existing stored functions matter.
 */
export function calledFunctions(statement: string): { schema: string | null; name: string }[] {
  const bare = blankOut(statement);
  const calls: { schema: string | null; name: string }[] = [];
  for (let k = bare.indexOf('('); k >= 0; k = bare.indexOf('(', k + 1)) {
    const fn = identifierBefore(statement, bare, skipSpaceBack(bare, k - 1));
    if (!fn) continue;
    const dot = skipSpaceBack(bare, fn.start - 1);
    const schema = bare[dot] === '.' ? identifierBefore(statement, bare, skipSpaceBack(bare, dot - 1)) : null;
    calls.push({ schema: schema?.name ?? null, name: fn.name });
  }
  return calls;
}
