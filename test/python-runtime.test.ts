import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);
const python = await run('python3', ['--version']).then(
  () => undefined,
  (error: Error) => `python3 is not on this machine (${error.message})`,
);

/*
 * The runtime that generated Python scripts carry is a real .py file: it must compile, and its
 * PostgreSQL semantics are unit-tested by Python itself (test/python/test_runtime.py).
 */
describe.skipIf(python)('the Python runtime of generated scripts', () => {
  it('compiles with py_compile', async () => {
    await expect(
      run('python3', ['-m', 'py_compile', 'src/transform/python-runtime.py']),
    ).resolves.toBeDefined();
  });

  it('passes its unit tests', async () => {
    const { stderr } = await run('python3', ['-m', 'unittest', 'discover', '-s', 'test/python']);
    expect(stderr).toMatch(/Ran \d+ tests/);
    expect(stderr).toMatch(/\nOK\s*$/);
  });
});
if (python) console.warn(`skipped: ${python}`);
