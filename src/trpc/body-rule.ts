import { z } from 'zod';
import { AppError } from '../app-error.ts';

/*
 * The input rule, one for every route (REST and tRPC alike, bodies, query objects and nested objects):
 * a field the route's input schema does not declare is a 400 naming it, never dropped silently. A
 * plain `z.object` strips unknown keys, so `{"input_data": {...}}` sent to a route whose fields are
 * flat, or a `target_schema` sent where none is taken, would otherwise answer 200 having stored
 * defaults or nothing. Rather than rely on every schema being written strict, each procedure's input
 * is checked against a strict copy of it: every object that would strip refuses instead. Objects that
 * say they are open keep their keys and are left alone: free-form maps (`z.record`, DESIGN §4) and
 * `z.looseObject` documents (a target schema's tables and columns keep extra keys as given).
 * Intersections are left as they are (each side would refuse the other's keys).
 */

const strictCopies = new WeakMap<z.ZodType, z.ZodType>();

/** The same schema with `changes` in its definition (getters such as a default's value kept). */
function withDef(schema: z.ZodType, changes: Record<string, unknown>): z.ZodType {
  const def = Object.defineProperties({}, Object.getOwnPropertyDescriptors(schema._zod.def));
  for (const [key, value] of Object.entries(changes))
    Object.defineProperty(def, key, { value, enumerable: true, configurable: true, writable: true });
  return schema.clone(def as typeof schema._zod.def);
}

/** `schema` with every stripping object made strict, or `schema` itself when it has none. */
function strictCopy(schema: z.ZodType): z.ZodType {
  const known = strictCopies.get(schema);
  if (known) return known;
  // A recursive schema (through a getter in a shape) meets itself as it is while its copy is built.
  strictCopies.set(schema, schema);
  const copy = buildStrictCopy(schema);
  strictCopies.set(schema, copy);
  return copy;
}

function buildStrictCopy(schema: z.ZodType): z.ZodType {
  const def = schema._zod.def as unknown as Record<string, unknown> & { type: string };
  const inner = (key: string) => {
    const child = def[key] as z.ZodType | undefined;
    if (!child) return schema;
    const copy = strictCopy(child);
    return copy === child ? schema : withDef(schema, { [key]: copy });
  };
  switch (def.type) {
    case 'object': {
      const object = schema as z.ZodObject;
      const shape: Record<string, z.ZodType> = {};
      let changed = def.catchall === undefined;
      for (const [key, field] of Object.entries(object.shape as Record<string, z.ZodType>)) {
        shape[key] = strictCopy(field);
        if (shape[key] !== field) changed = true;
      }
      return changed ? withDef(schema, { shape, catchall: def.catchall ?? z.never() }) : schema;
    }
    case 'array':
      return inner('element');
    case 'record':
      return inner('valueType');
    case 'optional':
    case 'nullable':
    case 'default':
    case 'prefault':
    case 'nonoptional':
    case 'readonly':
    case 'catch':
      return inner('innerType');
    case 'pipe':
      // `.transform()` reads its `in`; `z.preprocess` validates its `out`. A pipe of two schemas checks
      // what the first let through, which only the first decides.
      return (def.in as z.ZodType)._zod.def.type === 'transform' ? inner('out') : inner('in');
    case 'union': {
      const options = def.options as z.ZodType[];
      const copies = options.map(strictCopy);
      return copies.some((c, i) => c !== options[i]) ? withDef(schema, { options: copies }) : schema;
    }
    case 'tuple': {
      const items = def.items as z.ZodType[];
      const copies = items.map(strictCopy);
      const rest = def.rest ? strictCopy(def.rest as z.ZodType) : def.rest;
      return copies.some((c, i) => c !== items[i]) || rest !== def.rest
        ? withDef(schema, { items: copies, rest })
        : schema;
    }
    case 'lazy':
      return z.lazy(() => strictCopy((schema as z.ZodLazy).unwrap() as z.ZodType));
    default:
      return schema;
  }
}

interface InputRule {
  /** The strict copy of the input; null when the procedure takes no input at all. */
  strict: z.ZodType | null;
  /** The input as declared: what else is wrong with a request is told along with its unknown keys. */
  original: z.ZodType;
  /** Where the input comes from, for messages: `the body of POST /api/x`, `the input of a.b`. */
  where: string;
  place: 'body' | 'query' | 'input';
  /** The top-level fields a caller sends (path parameters left out), when the input is an object. */
  fields: string[];
}

let rules: Map<string, InputRule> | null = null;

interface ProcedureLike {
  _def: {
    inputs?: unknown[];
    meta?: { openapi?: { method?: string; path?: string } };
  };
}

function innermostObject(schema: z.ZodType): z.ZodObject | null {
  if (schema instanceof z.ZodObject) return schema;
  if (
    schema instanceof z.ZodOptional ||
    schema instanceof z.ZodNullable ||
    schema instanceof z.ZodDefault ||
    schema instanceof z.ZodPrefault
  )
    return innermostObject(schema.unwrap() as z.ZodType);
  if (schema instanceof z.ZodPipe) return innermostObject(schema.in as z.ZodType);
  return null;
}

/** Builds, once, the strict copy of every procedure's input. */
export function registerInputRules(procedures: Record<string, unknown>): void {
  const found = new Map<string, InputRule>();
  for (const [path, value] of Object.entries(procedures)) {
    const def = (value as ProcedureLike)._def;
    const inputs = (def?.inputs ?? []) as z.ZodType[];
    // Several `.input()` calls are merged by tRPC into one object; so are their fields here.
    const input = !inputs.length
      ? z.void()
      : inputs.length === 1
        ? inputs[0]
        : inputs.every((i) => i instanceof z.ZodObject)
          ? z.object(Object.assign({}, ...inputs.map((i) => (i as z.ZodObject).shape)))
          : null;
    if (!input) continue;
    const openapi = def.meta?.openapi;
    const method = openapi?.method?.toUpperCase();
    const place = !openapi ? 'input' : method === 'GET' || method === 'DELETE' ? 'query' : 'body';
    const pathParams = new Set([...(openapi?.path ?? '').matchAll(/\{([^}]+)\}/g)].map((m) => m[1]));
    const takesNothing = [z.ZodVoid, z.ZodUndefined, z.ZodNever].some((type) => input instanceof type);
    found.set(path, {
      strict: takesNothing ? null : strictCopy(input),
      original: input,
      where: openapi ? `the ${place} of ${method} ${openapi.path}` : `the input of ${path}`,
      place,
      fields: Object.keys(innermostObject(input)?.shape ?? {}).filter((k) => !pathParams.has(k)),
    });
  }
  rules = found;
}

type Issue = z.core.$ZodIssue;
interface Unknown {
  parent: (string | number)[];
  key: string;
}

/**
 * The unknown keys among a strict parse's issues. Within a union, a key counts when a branch would
 * take the value but for unknown keys (the closest such branch), or when every branch refuses it.
 */
function unknownKeysOf(issues: readonly Issue[], prefix: (string | number)[] = []): Unknown[] {
  const found: Unknown[] = [];
  for (const issue of issues) {
    const at = [...prefix, ...issue.path.map((k) => (typeof k === 'number' ? k : String(k)))];
    if (issue.code === 'unrecognized_keys') for (const key of issue.keys) found.push({ parent: at, key });
    else if (issue.code === 'invalid_union' && issue.errors.length) {
      const branches = issue.errors.map((branch) => ({
        unknown: unknownKeysOf(branch, at),
        clean: branch.every((i) => i.code === 'unrecognized_keys'),
      }));
      const clean = branches.filter((b) => b.clean).sort((a, b) => a.unknown.length - b.unknown.length);
      if (clean.length) found.push(...clean[0].unknown);
      else {
        const id = (u: Unknown) => JSON.stringify([...u.parent.map(String), u.key]);
        const everywhere = branches
          .slice(1)
          .reduce(
            (common, b) => common.filter((u) => b.unknown.some((v) => id(v) === id(u))),
            branches[0].unknown,
          );
        found.push(...everywhere);
      }
    }
  }
  return found;
}

const dotted = (u: Unknown) => [...u.parent.map(String), u.key].join('.');

/** What a route takes at the top level, told beside an unknown top-level key; `bodyVerb` leads a body's list. */
function whatItTakes(rule: InputRule, noun: string, bodyVerb: 'it takes' | 'send'): string {
  if (!rule.fields.length) return `it takes no ${noun}s`;
  const fields = rule.fields.join(', ');
  return rule.place === 'body'
    ? `${bodyVerb} ${fields} at the top level of the body, not wrapped in another object`
    : `it takes ${fields}`;
}

/** Throws BAD_REQUEST naming every field of the raw input that its procedure's schema does not declare. */
export async function refuseUnknownFields(path: string, raw: unknown): Promise<void> {
  const rule = rules?.get(path);
  if (!rule) return;
  let unknown: Unknown[];
  if (!rule.strict)
    unknown =
      raw && typeof raw === 'object' && !Array.isArray(raw)
        ? Object.keys(raw).map((key) => ({ parent: [], key }))
        : [];
  else {
    const result = await rule.strict.safeParseAsync(raw);
    if (result.success) return;
    unknown = unknownKeysOf(result.error.issues);
  }
  if (!unknown.length) return;
  // Other problems come along, so that an unknown key does not hide why the rest is refused.
  const checked = rule.strict ? await rule.original.safeParseAsync(raw) : null;
  const others = (checked?.success === false ? checked.error.issues : [])
    // A schema written strict names the same keys itself.
    .filter((issue) => issue.code !== 'unrecognized_keys')
    .map((issue) => ({
      ...issue,
      path: issue.path.map((k) => (typeof k === 'number' ? k : String(k))),
    }));
  const names = unknown.map((u) => `"${dotted(u)}"`).join(', ');
  const noun = rule.place === 'query' ? 'parameter' : 'field';
  const topLevel = unknown.some((u) => !u.parent.length);
  const expected = topLevel ? `: ${whatItTakes(rule, noun, 'it takes')}` : '';
  throw new AppError(
    'BAD_REQUEST',
    `Unknown ${noun}${unknown.length > 1 ? 's' : ''} ${names} in ${rule.where}${expected}` +
      (others.length
        ? ` (and ${others.length} other problem${others.length > 1 ? 's' : ''}: see issues)`
        : ''),
    {
      // The REST adapter shows validation issues under a generic message: each issue says it all.
      issues: [
        ...unknown.map((u) => ({
          code: 'unrecognized_keys',
          path: [...u.parent, u.key],
          keys: [u.key],
          message:
            `"${dotted(u)}" is not a ${noun} of ${rule.where.replace(/^the (body|query|input) of /, '')}` +
            (u.parent.length ? '' : `; ${whatItTakes(rule, noun, 'send')}`),
        })),
        ...others,
      ],
    },
  );
}
