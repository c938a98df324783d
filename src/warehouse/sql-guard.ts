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

/** What user SQL calls, for the warehouse to judge by its catalog (`catalogVerdictSql`). */
export interface CalledRoutines {
  /** Functions by name, with their schema when qualified (`pg_catalog.set_config`). */
  functions: { schema: string | null; name: string }[];
  /** Operator symbols (each runs a function: `pg_operator.oprcode`). */
  operators: string[];
}

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

function nameParts(list: unknown): string[] {
  return ((list as { String?: { sval: string } }[] | undefined) ?? []).flatMap((part) =>
    part.String ? [part.String.sval] : [],
  );
}

/**
 * Refuses statements that write, and collects every function and operator the tree calls. Whether a
 * function may run is not decided here by its name: the warehouse decides it from its own catalog.
 */
function refuseUnsafeNodes(root: unknown): CalledRoutines {
  const functions = new Map<string, { schema: string | null; name: string }>();
  const operators = new Set<string>();
  for (const [kind, node] of walk(root)) {
    if (kind === 'FuncCall') {
      const parts = nameParts(node.funcname);
      const name = parts.at(-1);
      if (name) {
        const schema = parts.length > 1 ? parts.at(-2)! : null;
        functions.set(`${schema}.${name}`, { schema, name });
      }
    }
    if (kind === 'A_Expr') for (const symbol of nameParts(node.name)) operators.add(symbol);
    if (MUTATING.has(kind))
      throw new AppError('BAD_REQUEST', `only read-only statements are allowed; got ${kind}`);
    if (kind === 'SelectStmt' && node.intoClause)
      throw new AppError('BAD_REQUEST', 'only read-only statements are allowed; got SELECT INTO');
    if (kind === 'SelectStmt' && node.lockingClause)
      throw new AppError(
        'BAD_REQUEST',
        'only read-only statements are allowed; got SELECT … FOR UPDATE/SHARE',
      );
  }
  return { functions: [...functions.values()], operators: [...operators] };
}

export type ReadOnlyKind = 'SELECT' | 'VALUES' | 'EXPLAIN';

/**
 * Accepts exactly one SELECT / WITH … SELECT / VALUES / EXPLAIN <one of those> statement, or throws
 * BAD_REQUEST naming what it got (e.g. "only read-only statements are allowed; got DeleteStmt").
 */
export async function assertReadOnlySql(
  sql: string,
): Promise<{ kind: ReadOnlyKind; statement: string; calls: CalledRoutines }> {
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
  const calls = refuseUnsafeNodes({ [kind]: node });
  return { kind: result, statement: text, calls };
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
export async function parseSqlExpression(
  expression: string,
): Promise<{ columns: ColumnReference[]; calls: CalledRoutines }> {
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
  const calls = refuseUnsafeNodes(target.val);
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
  return { columns, calls };
}

/*
 * Volatile functions may write, run SQL text (query_to_xml), signal other backends, change settings,
 * take locks or read files; immutable and stable ones cannot (PostgreSQL refuses writes in them).
 * These volatile ones only read a clock or a random generator, or a relation's size.
 */
const HARMLESS_VOLATILE = [
  'random',
  'random_normal',
  'clock_timestamp',
  'timeofday',
  'gen_random_uuid',
  'uuid_generate_v4',
  'pg_relation_size',
  'pg_total_relation_size',
  'pg_table_size',
  'pg_indexes_size',
  'pg_database_size',
];

// E'' with both escapes doubled reads the same whatever standard_conforming_strings says.
const literal = (value: string) => `E'${value.replaceAll('\\', '\\\\').replaceAll("'", "''")}'`;
const array = (values: string[]) => `array[${values.map(literal).join(',')}]::text[]`;

/**
 * One statement, run on the connection that will run the user's SQL (so the search path is its
 * own), naming every called routine that the catalog says may not run: a volatile function not on
 * the short allow list, a procedure, or an operator whose function is such. Names are inlined as
 * literals so the statement can share the simple-protocol round trip that opens the transaction.
 */
export function catalogVerdictSql(calls: CalledRoutines): string | null {
  if (!calls.functions.length && !calls.operators.length) return null;
  const unqualified = calls.functions.filter((f) => !f.schema).map((f) => f.name.toLowerCase());
  const qualified = calls.functions
    .filter((f) => f.schema)
    .map((f) => `${f.schema!.toLowerCase()}.${f.name.toLowerCase()}`);
  return `select n.nspname || '.' || p.proname as routine, p.provolatile::text as volatility, p.prokind::text as kind
  from pg_proc p join pg_namespace n on n.oid = p.pronamespace
  where (p.provolatile = 'v' and p.proname <> all(${array(HARMLESS_VOLATILE)}) or p.prokind = 'p')
    and ((p.proname = any(${array(unqualified)}) and n.nspname = any(current_schemas(true)))
      or n.nspname || '.' || p.proname = any(${array(qualified)}))
  union all
  select 'operator ' || o.oprname || ' (' || p.proname || ')', p.provolatile::text, 'o'
  from pg_operator o join pg_proc p on p.oid = o.oprcode join pg_namespace n on n.oid = o.oprnamespace
  where o.oprname = any(${array(calls.operators)}) and n.nspname = any(current_schemas(true))
    and p.provolatile = 'v' and p.proname <> all(${array(HARMLESS_VOLATILE)})`;
}

/** The 400 for a refused routine, from the first row of `catalogVerdictSql`. */
export function refusedRoutine(row: { routine: string; kind: string }): AppError {
  const why = row.kind === 'p' ? 'it is a procedure' : 'it is volatile (it may write or have side effects)';
  return new AppError('BAD_REQUEST', `${row.routine} is not allowed in read-only queries: ${why}`, {
    reason: 'ROUTINE_NOT_ALLOWED',
  });
}
