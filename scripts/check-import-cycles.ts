/**
 * Fails when value imports between files of src/ form a cycle. Type-only imports are erased at run
 * time and do not count; everything else does (a cycle of value imports makes module evaluation order
 * matter, and is how two areas end up knowing each other's internals).
 *
 * Also fails when the job queue (jobs/) imports an area (modules/), even for types only: the areas
 * use the queue and register their handlers with it, never the other way round.
 *
 *   node scripts/check-import-cycles.ts [dir]
 */
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import ts from 'typescript';

const root = resolve(process.argv[2] ?? 'src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return path.endsWith('.ts') && !path.endsWith('.d.ts') ? [path] : [];
  });
}

/** The relative modules a file needs at run time (with `withTypes`, also those it needs for types). */
function valueImports(file: string, withTypes = false): string[] {
  const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, false);
  const targets: string[] = [];
  for (const statement of source.statements) {
    let specifier: ts.Expression | undefined;
    if (ts.isImportDeclaration(statement)) {
      const clause = statement.importClause;
      if (clause?.isTypeOnly && !withTypes) continue;
      const bindings = clause?.namedBindings;
      const onlyTypes =
        clause &&
        !clause.name &&
        bindings &&
        ts.isNamedImports(bindings) &&
        bindings.elements.length > 0 &&
        bindings.elements.every((element) => element.isTypeOnly);
      if (onlyTypes && !withTypes) continue;
      specifier = statement.moduleSpecifier;
    } else if (ts.isExportDeclaration(statement) && statement.moduleSpecifier && !statement.isTypeOnly) {
      specifier = statement.moduleSpecifier;
    }
    if (specifier && ts.isStringLiteral(specifier) && specifier.text.startsWith('.'))
      targets.push(resolve(dirname(file), specifier.text));
  }
  return targets;
}

/** Tarjan's strongly connected components; every component with more than one file is a cycle. */
function cycles(graph: Map<string, string[]>): string[][] {
  let counter = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (node: string) => {
    index.set(node, counter);
    low.set(node, counter++);
    stack.push(node);
    onStack.add(node);
    for (const next of graph.get(node) ?? []) {
      if (!graph.has(next)) continue;
      if (!index.has(next)) {
        visit(next);
        low.set(node, Math.min(low.get(node)!, low.get(next)!));
      } else if (onStack.has(next)) low.set(node, Math.min(low.get(node)!, index.get(next)!));
    }
    if (low.get(node) === index.get(node)) {
      const component: string[] = [];
      let member: string;
      do {
        member = stack.pop()!;
        onStack.delete(member);
        component.push(member);
      } while (member !== node);
      if (component.length > 1 || (graph.get(node) ?? []).includes(node)) found.push(component);
    }
  };
  for (const node of graph.keys()) if (!index.has(node)) visit(node);
  return found;
}

const graph = new Map(sourceFiles(root).map((file) => [file, valueImports(file)]));
const found = cycles(graph);
const queueDir = join(root, 'jobs') + '/';
const areasDir = join(root, 'modules') + '/';
const queueToAreas = [...graph.keys()]
  .filter((file) => file.startsWith(queueDir))
  .flatMap((file) =>
    valueImports(file, true)
      .filter((target) => target.startsWith(areasDir))
      .map((target) => `  ${relative(process.cwd(), file)} → ${relative(process.cwd(), target)}`),
  );
if (queueToAreas.length > 0) {
  console.error('The job queue imports areas (modules/ register with jobs/, not the other way round):');
  for (const line of queueToAreas) console.error(line);
  process.exitCode = 1;
}
if (found.length === 0) {
  console.log(`No value import cycles among ${graph.size} files of ${relative(process.cwd(), root) || '.'}`);
} else {
  for (const component of found) {
    const members = new Set(component);
    console.error(`Import cycle among ${component.length} files:`);
    for (const file of component.sort())
      for (const target of graph.get(file)!.filter((t) => members.has(t)))
        console.error(`  ${relative(process.cwd(), file)} → ${relative(process.cwd(), target)}`);
  }
  process.exitCode = 1;
}
