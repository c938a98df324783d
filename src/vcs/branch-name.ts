/**
 * Why `name` cannot be the branch dimas pushes to, or null when it can. The rules are git's own
 * (`git check-ref-format --branch`, documented in git-check-ref-format(1)), checked before saving
 * because git itself would refuse the push much later, with a hint that does not name the setting.
 * Beyond git: `HEAD` (git would create refs/heads/HEAD and then warn that every HEAD is ambiguous),
 * names starting with `refs/` (the name is already prefixed with refs/heads/, so `refs/heads/x`
 * would become refs/heads/refs/heads/x) and `@` (git reads it as HEAD).
 */
export function branchNameProblem(name: string): string | null {
  if (name === '') return 'it is empty';
  if (name === 'HEAD') return 'HEAD names the current branch, not a branch';
  if (name === '@') return "'@' alone means HEAD";
  if (name.startsWith('refs/')) return "give the branch name without 'refs/' (refs/heads/ is implied)";
  if (name.startsWith('-')) return "it must not start with '-'";
  if (name.startsWith('/') || name.endsWith('/')) return "it must not start or end with '/'";
  if (name.includes('//')) return "it must not contain '//'";
  if (name.includes('..')) return "it must not contain '..'";
  if (name.includes('@{')) return "it must not contain '@{'";
  if (name.endsWith('.')) return "it must not end with '.'";
  // ASCII control characters (below space, and DEL) and the characters git gives a meaning to in
  // revisions and refspecs.
  for (const char of name) {
    const code = char.charCodeAt(0);
    if (code < 0x20 || code === 0x7f) return 'it must not contain control characters';
    if (char === ' ') return 'it must not contain a space';
    if ('~^:?*[\\'.includes(char)) return `it must not contain '${char}'`;
  }
  for (const component of name.split('/')) {
    if (component.startsWith('.')) return `no part between slashes may start with '.' (${component})`;
    if (component.endsWith('.lock')) return `no part between slashes may end with '.lock' (${component})`;
  }
  return null;
}
