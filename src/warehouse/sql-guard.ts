import { hasSqlDetails, loadModule, parseSync } from 'libpg-query';
import { AppError } from '../app-error.ts';
import { charsBefore } from './postgres-sql.ts';

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
  /** Where the text starts in the SQL that was parsed, in bytes. */
  location: number;
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

interface RoutineName {
  schema: string | null;
  name: string;
}

/** What user SQL calls by name, for the warehouse to judge by its catalog (`catalogVerdictSql`). */
export interface CalledRoutines {
  /** Functions by name, with their schema when qualified (`pg_catalog.set_config`). */
  functions: RoutineName[];
  /** Operators by symbol, with their schema when qualified (each runs a function: `oprcode`). */
  operators: RoutineName[];
}

/**
 * What the warehouse needs to judge a statement before running it: `select`, the statement as a
 * plain SELECT (an EXPLAIN's query, parameters as NULL) for PostgreSQL to resolve
 * (`dependencyVerdictStatements`), and the routines it names (`calls`), judged by name beside it, or
 * alone where the warehouse cannot hold a temporary view.
 */
export interface RoutineCheck {
  select: string;
  /** Characters of the user's text before `select`; null where it is not their text (parameters). */
  selectAt: number | null;
  calls: CalledRoutines;
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
    return { kind, node: stmt[kind] as Node, text, location: stmt_location };
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
  const functions = new Map<string, RoutineName>();
  const operators = new Map<string, RoutineName>();
  const add = (into: Map<string, RoutineName>, list: unknown) => {
    const parts = nameParts(list);
    const name = parts.at(-1);
    if (!name) return;
    const schema = parts.length > 1 ? parts.at(-2)! : null;
    into.set(`${schema}.${name}`, { schema, name });
  };
  for (const [kind, node] of walk(root)) {
    if (kind === 'FuncCall') add(functions, node.funcname);
    // Operators are written in expressions, against a subquery (`= any (select …)`) and in ORDER BY … USING.
    if (kind === 'A_Expr') add(operators, node.name);
    if (kind === 'SubLink') add(operators, node.operName);
    if (kind === 'SortBy') add(operators, node.useOp);
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
  return { functions: [...functions.values()], operators: [...operators.values()] };
}

const WHITESPACE = new Set([0x20, 0x09, 0x0a, 0x0d]);

/**
 * The statement as a plain SELECT that a view can hold: parameters become NULL (a view has none;
 * their type is inferred from the context as a parameter's is), and an EXPLAIN gives its query: the
 * first tail of its text, after a space or a parenthesis, that parses as one SELECT (EXPLAIN's options
 * are words, so no earlier tail does).
 */
function selectForCheck({ kind, node, text, location }: ParsedStatement): string {
  let bytes = Buffer.from(text);
  let root: unknown = { [kind]: node };
  // Locations in the tree count bytes from the start of the text that was parsed.
  let offset = location;
  if (kind === 'ExplainStmt') {
    root = undefined;
    for (let start = 1; start < bytes.length && !root; start++) {
      const previous = bytes[start - 1];
      if (WHITESPACE.has(bytes[start]) || !(WHITESPACE.has(previous) || previous === 0x29)) continue;
      try {
        const { stmts } = parseSync(bytes.subarray(start).toString()) as { stmts?: { stmt: Node }[] };
        if (stmts?.length === 1 && 'SelectStmt' in stmts[0].stmt) {
          root = stmts[0].stmt;
          bytes = bytes.subarray(start);
          offset = 0;
        }
      } catch {
        // Not a statement from here: try the next word.
      }
    }
    if (!root) throw new AppError('BAD_REQUEST', 'the query of the EXPLAIN could not be read');
  }
  const parameters = [...walk(root)]
    .filter(([kind]) => kind === 'ParamRef')
    .map(([, param]) => (param.location as number) - offset)
    .sort((a, b) => a - b);
  if (!parameters.length) return bytes.toString();
  const parts: Buffer[] = [];
  let at = 0;
  for (const start of parameters) {
    let end = start + 1;
    while (end < bytes.length && bytes[end] >= 0x30 && bytes[end] <= 0x39) end++;
    parts.push(bytes.subarray(at, start), Buffer.from('null'));
    at = end;
  }
  parts.push(bytes.subarray(at));
  return Buffer.concat(parts).toString();
}

export type ReadOnlyKind = 'SELECT' | 'VALUES' | 'EXPLAIN';

/**
 * Accepts exactly one SELECT / WITH … SELECT / VALUES / EXPLAIN <one of those> statement, or throws
 * BAD_REQUEST naming what it got (e.g. "only read-only statements are allowed; got DeleteStmt").
 */
export async function assertReadOnlySql(
  sql: string,
): Promise<{ kind: ReadOnlyKind; statement: string; check: RoutineCheck }> {
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
  const select = selectForCheck(statements[0]);
  return { kind: result, statement: text, check: { calls, select, selectAt: charsBefore(sql, select) } };
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
 * These volatile ones only read a clock or a random generator, or a relation's size, when they are
 * built in or an extension's C code: a function of that name written in SQL or PL/pgSQL is judged
 * like any other.
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
 * The rule, on `pg_proc p`: what may not run in a read-only query. Languages 12 and 13 are
 * `internal` and `c`, whose oids are fixed in every PostgreSQL.
 */
const REFUSED = `(p.prokind = 'p' or p.provolatile = 'v'
    and not (p.proname = any(${array(HARMLESS_VOLATILE)}::name[]) and p.prolang in (12, 13)))`;

/**
 * Whether the database holds functions of its own (created after initdb: oid from
 * FirstNormalObjectId) that may not run. Without any, no dependency of a statement can lead to a
 * refused function that its names do not show.
 */
export const OWN_REFUSED_ROUTINES_SQL = `select exists (select from pg_proc p where p.oid >= 16384 and ${REFUSED}) as present`;

/** An object a statement depends on: its catalog (`pg_class`, `pg_proc`, …) and its oid. */
export interface CatalogObject {
  classid: number;
  objid: number;
}

/**
 * PostgreSQL resolves the statement as a temporary view (never run; rolled back), whose recorded
 * dependencies name every object of the database's own that running it would involve however it is
 * written: functions by name or by attribute notation (`t.f` runs `f(t)`), operators (qualified or
 * not, in any clause), casts, types, views, tables. The result at `verdictIndex` lists those that are
 * or may run routines (all but plain tables without row-level policies); when there are any,
 * `reachedVerdictSql` judges them. Built-in objects are pinned, and dependencies on them are never
 * recorded: the check by name (`catalogVerdictSql`) runs beside this one for them (a built-in
 * volatile function can only be run by naming it: no built-in operator, cast, domain or view runs
 * one that matters). The statements share the round trip that opens the transaction, which only then
 * turns read only (a read-only transaction may not create even a temporary view).
 */
export function dependencyVerdictStatements(select: string): { statements: string[]; verdictIndex: number } {
  const statements = [
    'savepoint routine_check',
    `create temp view routine_check as select 1 from (\n${select}\n) as checked`,
    `select distinct d.refclassid::int as classid, d.refobjid::int as objid
     from pg_rewrite w
     join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = w.oid
     left join pg_class c on d.refclassid = 'pg_class'::regclass and c.oid = d.refobjid
     where w.ev_class = 'pg_temp.routine_check'::regclass
       and (c.oid is null or c.oid <> w.ev_class and (c.relkind = 'v' or c.relrowsecurity))`,
    'rollback to savepoint routine_check',
  ];
  return { statements, verdictIndex: 2 };
}

/**
 * The first function that `REFUSED` holds among `objects` and the routines they run of their own,
 * followed as far as they go: a view's query, a table's row-level policies, an operator's function,
 * a domain's checks (and its base type's), an array's element type, an aggregate's steps. The
 * second step of `dependencyVerdictStatements`, for the statements that reach any such object.
 */
export function reachedVerdictSql(objects: CatalogObject[]): string {
  const seeds = objects.map((o) => `(${Math.trunc(o.classid)}::oid, ${Math.trunc(o.objid)}::oid)`).join(', ');
  return `with recursive reached(classid, objid) as (
      values ${seeds}
      union
      select next.classid, next.objid from reached r cross join lateral (
        select d.refclassid as classid, d.refobjid as objid from pg_rewrite w
          join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = w.oid
         where r.classid = 'pg_class'::regclass and w.ev_class = r.objid
        union all
        select d.refclassid, d.refobjid from pg_policy pol
          join pg_depend d on d.classid = 'pg_policy'::regclass and d.objid = pol.oid
         where r.classid = 'pg_class'::regclass and pol.polrelid = r.objid
        union all
        select 'pg_proc'::regclass, o.oprcode from pg_operator o
         where r.classid = 'pg_operator'::regclass and o.oid = r.objid
        union all
        select d.refclassid, d.refobjid from pg_constraint c
          join pg_depend d on d.classid = 'pg_constraint'::regclass and d.objid = c.oid
         where r.classid = 'pg_type'::regclass and c.contypid = r.objid
        union all
        select 'pg_type'::regclass, unnest(array[t.typbasetype, t.typelem]) from pg_type t
         where r.classid = 'pg_type'::regclass and t.oid = r.objid
        union all
        select d.refclassid, d.refobjid from pg_proc a
          join pg_depend d on d.classid = 'pg_proc'::regclass and d.objid = a.oid
         where r.classid = 'pg_proc'::regclass and a.oid = r.objid and a.prokind = 'a'
           and d.refclassid = 'pg_proc'::regclass
      ) next
      where next.objid <> 0
    )
    select p.oid::regprocedure::text as routine, p.prokind::text as kind
      from reached r join pg_proc p on r.classid = 'pg_proc'::regclass and p.oid = r.objid
     where ${REFUSED}
     order by routine
     limit 1`;
}

/**
 * The check by name: one statement, run on the connection that will run the user's SQL (so the
 * search path is its own), naming every called routine that `REFUSED` holds, or an operator whose
 * function it holds. Alone, where the warehouse cannot hold a temporary view (a standby, or a role
 * without TEMPORARY on the database), it cannot see the functions a statement runs without naming
 * them (a view's, a domain's, attribute notation). Names are inlined as literals so the statement
 * can share the simple-protocol round trip that opens the transaction.
 */
export function catalogVerdictSql(calls: CalledRoutines): string | null {
  if (!calls.functions.length && !calls.operators.length) return null;
  const names = (routines: RoutineName[], qualified: boolean) =>
    array(
      routines
        .filter((r) => (r.schema !== null) === qualified)
        .map((r) => (qualified ? `${r.schema}.${r.name}` : r.name).toLowerCase()),
    );
  const matches = (name: string, namespace: string, routines: RoutineName[]) =>
    `((${name} = any(${names(routines, false)}) and ${namespace}.nspname = any(current_schemas(true)))
      or ${namespace}.nspname || '.' || ${name} = any(${names(routines, true)}))`;
  return `select n.nspname || '.' || p.proname as routine, p.provolatile::text as volatility, p.prokind::text as kind
  from pg_proc p join pg_namespace n on n.oid = p.pronamespace
  where ${REFUSED} and ${matches('p.proname', 'n', calls.functions)}
  union all
  select 'operator ' || o.oprname || ' (' || p.proname || ')', p.provolatile::text, 'o'
  from pg_operator o join pg_proc p on p.oid = o.oprcode join pg_namespace n on n.oid = o.oprnamespace
  where ${REFUSED} and ${matches('o.oprname', 'n', calls.operators)}`;
}

/** The 400 for a refused routine, from the first row of a verdict. */
export function refusedRoutine(row: { routine: string; kind: string }): AppError {
  const why = row.kind === 'p' ? 'it is a procedure' : 'it is volatile (it may write or have side effects)';
  return new AppError('BAD_REQUEST', `${row.routine} is not allowed in read-only queries: ${why}`, {
    reason: 'ROUTINE_NOT_ALLOWED',
  });
}
