import { z } from 'zod';
import { AppError } from '../app-error.ts';

/*
 * The body rule, one for every area: a mutation's body has the fields its input schema documents, at
 * the top level (fields of the route's own output may come back and are ignored, so that what a GET
 * answered can be sent again). Any other top-level field is a 400 naming it and the expected ones,
 * never dropped silently: `{"input_data": {...}}` sent to a route whose fields are flat would
 * otherwise save defaults and answer 200. A route whose documented body is itself a wrapper
 * (resolve-ambiguity's `resolve_input`) declares that wrapper as its one field, so the same rule
 * applies to it. Nested objects keep their own schemas' behaviour.
 */

type Shapes = Map<
  string,
  { keys: Set<string>; readOnly: Set<string>; method: string | null; route: string | null }
>;
let shapes: Shapes | null = null;

interface ProcedureLike {
  _def: {
    type?: string;
    inputs?: unknown[];
    output?: unknown;
    meta?: { openapi?: { method?: string; path?: string } };
  };
}

/** Reads, once, the top-level fields of every mutation whose inputs are plain objects. */
export function registerBodyShapes(procedures: Record<string, unknown>): void {
  const found: Shapes = new Map();
  for (const [path, value] of Object.entries(procedures)) {
    const def = (value as ProcedureLike)._def;
    if (def?.type !== 'mutation' || !def.inputs?.length) continue;
    const keys = new Set<string>();
    let open = false;
    for (const input of def.inputs) {
      if (!(input instanceof z.ZodObject)) {
        open = true;
        break;
      }
      const catchall = input._zod.def.catchall;
      if (catchall && !(catchall instanceof z.ZodNever)) open = true;
      for (const key of Object.keys(input.shape)) keys.add(key);
    }
    // A route's own output fields may come back (GET answer, edited, POSTed again): they are read-only
    // and ignored by the schema, not a wrapper.
    const readOnly = new Set(def.output instanceof z.ZodObject ? Object.keys(def.output.shape) : []);
    if (!open)
      found.set(path, {
        keys,
        readOnly,
        method: def.meta?.openapi?.method ?? null,
        route: def.meta?.openapi?.path ?? null,
      });
  }
  shapes = found;
}

/** Throws BAD_REQUEST when a mutation's raw input has top-level fields its schema does not list. */
export function checkBodyShape(path: string, type: string, raw: unknown): void {
  if (type !== 'mutation' || !shapes || !raw || typeof raw !== 'object' || Array.isArray(raw)) return;
  const shape = shapes.get(path);
  if (!shape) return;
  const unknown = Object.keys(raw).filter((k) => !shape.keys.has(k) && !shape.readOnly.has(k));
  if (!unknown.length) return;
  const where = shape.route ? `${shape.method} ${shape.route}` : path;
  const expected = [...shape.keys];
  throw new AppError(
    'BAD_REQUEST',
    `Unknown field${unknown.length > 1 ? 's' : ''} ${unknown.map((k) => `"${k}"`).join(', ')} in the body of ${where}: ` +
      (expected.length
        ? `it takes ${expected.join(', ')} at the top level of the body, not wrapped in another object`
        : 'it takes no fields'),
    {
      // The REST adapter shows validation issues under a generic message: each issue says it all.
      issues: unknown.map((k) => ({
        path: [k],
        message:
          `"${k}" is not a field of ${where}; ` +
          (expected.length
            ? `send ${expected.join(', ')} at the top level of the body, not wrapped in another object`
            : 'it takes no fields'),
      })),
    },
  );
}
