import { hasSqlDetails, loadModule, parseSync } from 'libpg-query';
import { AppError } from '../app-error.ts';

/*
 * User SQL is classified by the real PostgreSQL parser (libpg-query, WASM), never by regular
 * expressions: comments, quoting and data-modifying CTEs are seen exactly as the server sees them.
 * The READ ONLY transaction the statement then runs in is the second line of defence.
 */

let loaded: Promise<void> | undefined;

/** The parser is WASM: it loads once per process, on first use. */
function ready(): Promise<void> {
  loaded ??= loadModule();
  return loaded;
}

type Node = Record<string, unknown>;

interface ParsedStatement {
  kind: string;
  node: Node;
  text: string;
}

const MUTATING = new Set([
  'InsertStmt',
  'UpdateStmt',
  'DeleteStmt',
  'MergeStmt',
  'CopyStmt',
  'CreateTableAsStmt',
  'LockStmt',
  'CallStmt',
  'DoStmt',
]);

/*
 * Functions that would escape the guard's guarantees inside a read-only transaction: changing the
 * statement timeout, signalling other sessions, reading server files, reaching other databases.
 */
const FORBIDDEN_FUNCTIONS = new Set([
  'set_config',
  'pg_cancel_backend',
  'pg_terminate_backend',
  'pg_reload_conf',
  'pg_rotate_logfile',
  'pg_read_file',
  'pg_read_binary_file',
  'pg_ls_dir',
  'pg_stat_file',
  'lo_import',
  'lo_export',
  'dblink',
  'dblink_exec',
  'dblink_connect',
  'dblink_send_query',
  'pg_advisory_lock',
  'pg_advisory_xact_lock',
  'pg_notify',
]);

function parseError(error: unknown, sql: string): AppError {
  if (hasSqlDetails(error)) {
    const position = error.sqlDetails.cursorPosition;
    const line = sql.slice(0, position).split('\n').length;
    // No `issues`: the REST adapter would replace the message (which carries the position) with a generic one.
    return new AppError(
      'BAD_REQUEST',
      `SQL syntax error at position ${position + 1} (line ${line}): ${error.message}`,
      {
        reason: 'SQL_SYNTAX_ERROR',
      },
    );
  }
  return new AppError('BAD_REQUEST', `SQL could not be parsed: ${(error as Error).message}`);
}

async function parseStatements(sql: string): Promise<ParsedStatement[]> {
  if (!sql.trim()) return [];
  await ready();
  let tree: { stmts?: { stmt: Node; stmt_location?: number; stmt_len?: number }[] };
  try {
    tree = parseSync(sql);
  } catch (error) {
    throw parseError(error, sql);
  }
  const bytes = Buffer.from(sql);
  return (tree.stmts ?? []).map(({ stmt, stmt_location = 0, stmt_len = 0 }) => {
    const kind = Object.keys(stmt)[0];
    // Locations count bytes; a length of 0 means "to the end". The text excludes the final semicolon.
    const text = bytes.subarray(stmt_location, stmt_len ? stmt_location + stmt_len : undefined).toString();
    return { kind, node: stmt[kind] as Node, text };
  });
}

/** Depth-first walk over every node of a parse tree (objects keyed by node type, arrays, lists). */
function* walk(value: unknown, key = ''): Generator<[string, Node]> {
  if (Array.isArray(value)) {
    for (const item of value) yield* walk(item);
    return;
  }
  if (!value || typeof value !== 'object') return;
  const node = value as Node;
  if (key) yield [key, node];
  for (const [childKey, child] of Object.entries(node))
    yield* walk(child, /^[A-Z]/.test(childKey) ? childKey : '');
}

function functionName(call: Node): string {
  const parts = (call.funcname as { String: { sval: string } }[] | undefined) ?? [];
  return parts.at(-1)?.String.sval.toLowerCase() ?? '';
}

function refuseUnsafeNodes(root: unknown) {
  for (const [kind, node] of walk(root)) {
    if (MUTATING.has(kind))
      throw new AppError('BAD_REQUEST', `only read-only statements are allowed; got ${kind}`);
    if (kind === 'SelectStmt' && node.intoClause)
      throw new AppError('BAD_REQUEST', 'only read-only statements are allowed; got SELECT INTO');
    if (kind === 'SelectStmt' && node.lockingClause)
      throw new AppError(
        'BAD_REQUEST',
        'only read-only statements are allowed; got SELECT … FOR UPDATE/SHARE',
      );
    if (kind === 'FuncCall' && FORBIDDEN_FUNCTIONS.has(functionName(node)))
      throw new AppError('BAD_REQUEST', `function ${functionName(node)} is not allowed in read-only queries`);
  }
}

export type ReadOnlyKind = 'SELECT' | 'VALUES' | 'EXPLAIN';

/**
 * Accepts exactly one SELECT / WITH … SELECT / VALUES / EXPLAIN <one of those> statement, or throws
 * BAD_REQUEST naming what it got (e.g. "only read-only statements are allowed; got DeleteStmt").
 */
export async function assertReadOnlySql(sql: string): Promise<{ kind: ReadOnlyKind; statement: string }> {
  const statements = await parseStatements(sql);
  if (statements.length === 0) throw new AppError('BAD_REQUEST', 'the SQL holds no statement');
  if (statements.length > 1)
    throw new AppError('BAD_REQUEST', `exactly one statement is allowed; got ${statements.length}`);
  const [{ kind, node, text }] = statements;
  let result: ReadOnlyKind;
  if (kind === 'SelectStmt') result = node.valuesLists ? 'VALUES' : 'SELECT';
  else if (kind === 'ExplainStmt') {
    const inner = Object.keys((node.query as Node) ?? {})[0];
    if (inner !== 'SelectStmt')
      throw new AppError('BAD_REQUEST', `only read-only statements are allowed; got ExplainStmt of ${inner}`);
    result = 'EXPLAIN';
  } else throw new AppError('BAD_REQUEST', `only read-only statements are allowed; got ${kind}`);
  refuseUnsafeNodes({ [kind]: node });
  return { kind: result, statement: text };
}

/** A column an expression reads: `column` or `table.column` (or `schema.table.column`). */
export interface ColumnReference {
  table: string | null;
  column: string;
  /** The reference as written, dot-joined. */
  ref: string;
}

const CLAUSES_OUTSIDE_EXPRESSION = [
  'fromClause',
  'whereClause',
  'groupClause',
  'havingClause',
  'windowClause',
  'sortClause',
  'limitCount',
  'limitOffset',
  'withClause',
  'distinctClause',
  'valuesLists',
  'intoClause',
  'lockingClause',
  'larg',
];

/**
 * Checks that `expression` is ONE SQL expression (what a mapping puts in a SELECT list) by parsing
 * `SELECT <expression>`; returns the column references it reads. BAD_REQUEST otherwise.
 */
export async function parseSqlExpression(expression: string): Promise<{ columns: ColumnReference[] }> {
  if (!expression.trim()) throw new AppError('BAD_REQUEST', 'the expression is empty');
  const prefix = 'SELECT ';
  let statements: ParsedStatement[];
  try {
    statements = await parseStatements(prefix + expression);
  } catch (error) {
    if (error instanceof AppError) {
      // Positions refer to the expression as the user wrote it, not to our SELECT wrapper.
      const shift = (text: string) =>
        text.replace(/position (\d+)/g, (_, n) => `position ${Math.max(1, Number(n) - prefix.length)}`);
      throw new AppError(
        'BAD_REQUEST',
        shift(error.message).replace('SQL syntax error', 'expression syntax error'),
        error.details,
      );
    }
    throw error;
  }
  if (statements.length !== 1 || statements[0].kind !== 'SelectStmt')
    throw new AppError('BAD_REQUEST', 'the expression must be a single SQL expression (no ; or statements)');
  const select = statements[0].node;
  const present = CLAUSES_OUTSIDE_EXPRESSION.filter((clause) => select[clause] !== undefined);
  if (present.length)
    throw new AppError(
      'BAD_REQUEST',
      `the expression must be a single SQL expression; found ${present.join(', ')}`,
    );
  const targets = (select.targetList as { ResTarget: Node }[] | undefined) ?? [];
  if (targets.length !== 1)
    throw new AppError(
      'BAD_REQUEST',
      `the expression must be a single SQL expression; found ${targets.length} (a top-level comma?)`,
    );
  const target = targets[0].ResTarget;
  if (target.name) throw new AppError('BAD_REQUEST', 'the expression must not carry an alias (AS …)');
  refuseUnsafeNodes(target.val);
  const columns: ColumnReference[] = [];
  const seen = new Set<string>();
  for (const [kind, node] of walk(target.val)) {
    if (kind !== 'ColumnRef') continue;
    const fields = node.fields as Node[];
    if (fields.some((f) => 'A_Star' in f)) throw new AppError('BAD_REQUEST', 'the expression must not use *');
    const names = fields.map((f) => (f.String as { sval: string }).sval);
    const ref = names.join('.');
    if (seen.has(ref)) continue;
    seen.add(ref);
    columns.push({
      table: names.length > 1 ? names.slice(0, -1).join('.') : null,
      column: names.at(-1)!,
      ref,
    });
  }
  return { columns };
}
