import { execFileSync } from 'node:child_process';
import { parse as parseYaml } from 'yaml';
import type { ProjectFile } from '../../src/transform/dbt.ts';

/*
 * dbt-core, as far as the generated project needs it (dbt itself cannot be installed here): Jinja in
 * model SQL and YAML values, and where `dbt run` builds each model.
 */

const STRING = `'((?:[^'\\\\]|\\\\.)*)'`;
const jinjaStringValue = (body: string) => body.replace(/\\(.)/gs, '$1');

export interface JinjaContext {
  source(source: string, table: string): string;
  ref(model: string): string;
}

/** `{{ 'text' }}`, `{{ source('a', 'b') }}`, `{{ ref('a') }}`; any other Jinja fails, as dbt would. */
export function renderJinja(text: string, ctx: JinjaContext): string {
  let out = '';
  let i = 0;
  while (i < text.length) {
    const open = text.slice(i).search(/\{[{%#]/);
    if (open < 0) return out + text.slice(i);
    out += text.slice(i, i + open);
    i += open;
    if (text[i + 1] !== '{') throw new Error(`dbt would read a Jinja tag at ${text.slice(i, i + 30)}`);
    let j = i + 2;
    let expression = '';
    while (j < text.length && !text.startsWith('}}', j)) {
      if (text[j] === "'") {
        let k = j + 1;
        while (k < text.length && text[k] !== "'") k += text[k] === '\\' ? 2 : 1;
        expression += text.slice(j, k + 1);
        j = k + 1;
      } else expression += text[j++];
    }
    if (j >= text.length) throw new Error(`dbt would find {{ unclosed in ${text}`);
    const e = expression.trim();
    let m: RegExpExecArray | null;
    if ((m = new RegExp(`^${STRING}$`, 's').exec(e))) out += jinjaStringValue(m[1]);
    else if ((m = new RegExp(`^source\\(\\s*${STRING}\\s*,\\s*${STRING}\\s*\\)$`, 's').exec(e)))
      out += ctx.source(jinjaStringValue(m[1]), jinjaStringValue(m[2]));
    else if ((m = new RegExp(`^ref\\(\\s*${STRING}\\s*\\)$`, 's').exec(e)))
      out += ctx.ref(jinjaStringValue(m[1]));
    else throw new Error(`dbt would evaluate the Jinja expression ${e}`);
    i = j + 2;
  }
  return out;
}

/** A string value of a YAML file as dbt renders it (native: a plain string stays as it is). */
export const renderValue = (value: string, ctx: JinjaContext) =>
  /(\{[{%#]|[#}%]\})/.test(value) ? renderJinja(value, ctx) : value;

/** Renders `call` after the macro files with Jinja2, as dbt does (python3 with jinja2). */
function renderMacro(macros: string, call: string, context: Record<string, unknown>): string {
  const script = `import sys, json, jinja2
d = json.load(sys.stdin)
print(json.dumps(jinja2.Environment().from_string(d['macros'] + d['call']).render(**d['context'])))`;
  return JSON.parse(
    execFileSync('python3', ['-c', script], { input: JSON.stringify({ macros, call, context }) }).toString(),
  ) as string;
}

/**
 * The schema `dbt run` builds a model in, for a profile whose target schema is `profileSchema`:
 * the model's `+schema` from dbt_project.yml (the deepest of its fqn — project, folders, model — that
 * sets one; a `config()` in the model would fail renderJinja), passed to the project's
 * generate_schema_name macro (any .sql file of its macro-paths) or, without one, dbt's default,
 * which puts the profile's schema and `_` before a configured one. dbt strips the macro's output.
 */
export function dbtModelSchema(files: ProjectFile[], model: string, profileSchema: string): string {
  const file = (path: string) => files.find((f) => f.path === path)?.content;
  const project = parseYaml(file('dbt_project.yml') ?? '') as Record<string, any>;
  const path = files.find((f) => f.path.endsWith(`/${model}.sql`) && f.path.startsWith('models/'))?.path;
  if (!path) throw new Error(`dbt: no model ${model}`);
  const fqn = [project.name as string, ...path.slice('models/'.length, -'.sql'.length).split('/')];
  const ctx: JinjaContext = {
    source: () => {
      throw new Error('source() in dbt_project.yml');
    },
    ref: () => {
      throw new Error('ref() in dbt_project.yml');
    },
  };
  let node: any = project.models;
  let custom: string | null = null;
  for (const part of fqn) {
    node = node?.[part];
    if (typeof node?.['+schema'] === 'string') custom = renderValue(node['+schema'], ctx);
  }
  const macroPaths: string[] = project['macro-paths'] ?? ['macros'];
  const macros = files
    .filter((f) => macroPaths.some((p) => f.path.startsWith(`${p}/`)) && f.path.endsWith('.sql'))
    .map((f) => f.content)
    .join('\n');
  if (/\{%-?\s*macro\s+generate_schema_name\s*\(/.test(macros))
    return renderMacro(macros, '{{ generate_schema_name(custom, node) }}', {
      custom,
      node: { name: model, fqn },
      target: { schema: profileSchema },
    }).trim();
  return custom === null ? profileSchema : `${profileSchema}_${custom.trim()}`;
}
