import { readdirSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

/**
 * `npm run bench` runs every benchmark of this directory; `npm run bench -- api-overhead` runs one.
 * A benchmark is a module whose default export runs it and prints its figures (ratios against a
 * baseline measured in the same run, so that machines of different speed compare).
 */
const here = dirname(fileURLToPath(import.meta.url));
const NOT_BENCHMARKS = new Set(['run.ts', 'harness.ts']);
const all = readdirSync(here)
  .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts') && !NOT_BENCHMARKS.has(f))
  .map((f) => basename(f, '.ts'))
  .sort();
const wanted = process.argv.slice(2).map((a) => basename(a).replace(/\.ts$/, ''));
const unknown = wanted.filter((w) => !all.includes(w));
if (unknown.length) {
  console.error(`unknown benchmark ${unknown.join(', ')}; there are: ${all.join(', ')}`);
  process.exit(2);
}
for (const name of wanted.length ? wanted : all) {
  console.log(`\n== ${name} ==`);
  const module = (await import(pathToFileURL(join(here, `${name}.ts`)).href)) as {
    default: () => Promise<void>;
  };
  await module.default();
}
process.exit(0);
