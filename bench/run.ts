import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * `npm run bench` runs every benchmark of this directory; `npm run bench -- api-overhead` runs one.
 * A benchmark is a file that runs itself when executed and prints its figures (ratios against a
 * baseline measured in the same run, so that machines of different speed compare). Each runs in its
 * own process, so that one benchmark's servers and memory do not weigh on the next.
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
const failed: string[] = [];
for (const name of wanted.length ? wanted : all) {
  console.log(`\n== ${name} ==`);
  // With this process's flags (`npm run bench` gives the server's V8 flags), so that a benchmark that
  // does a job's work in its own process measures it as the server would run it.
  const run = spawnSync(process.execPath, [...process.execArgv, join(here, `${name}.ts`)], {
    stdio: 'inherit',
  });
  if (run.status !== 0) failed.push(name);
}
if (failed.length) console.error(`\nfailed: ${failed.join(', ')}`);
process.exit(failed.length ? 1 : 0);
