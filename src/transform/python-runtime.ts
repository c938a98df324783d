import { readFileSync } from 'node:fs';

const RUNTIME_MARKER = '# ---- RUNTIME: copied into every generated script from here on ----\n';

/**
 * The helpers of src/transform/python-runtime.py that every generated script carries: a real Python
 * file, so py_compile and the unit tests in test/python/ check what scripts run. The script writes the
 * same imports itself, so only the part after the marker is copied.
 */
function readRuntime(): string {
  const source = readFileSync(new URL('./python-runtime.py', import.meta.url), 'utf8');
  const at = source.indexOf(RUNTIME_MARKER);
  if (at < 0) throw new Error('python-runtime.py has lost its RUNTIME marker');
  return '\n' + source.slice(at + RUNTIME_MARKER.length);
}

export const PYTHON_RUNTIME = readRuntime();
