import type { AnyProcedure, AnyRouter } from '@trpc/server';
import { generateOpenApiDocument } from 'trpc-to-openapi';
import type { Meta } from './init.ts';
import { appRouter } from './router.ts';

let cached: ReturnType<typeof generateOpenApiDocument> | undefined;

/** The OpenAPI 3.1 document of every REST route, generated once from the procedures' schemas. */
export function openApiDocument(version: string) {
  cached ??= generateOpenApiDocument(appRouter, {
    title: 'dimas API',
    description:
      'Data Integration, Mapping and Audience Service. Authenticate with `Authorization: Bearer <token>` ' +
      '(a session token from POST /api/auth/login, or a service-account API key `dms_…`). ' +
      'Errors answer `{ message, code, issues? }`.',
    version,
    baseUrl: '/',
    docsUrl: '/api/docs',
  });
  return cached;
}

type ZodLike = { _zod?: { def: Record<string, unknown> & { type?: string; coerce?: boolean } } };

function pinCoercion(schema: ZodLike | undefined, seen: Set<unknown>): void {
  const def = schema?._zod?.def;
  if (!def || seen.has(schema)) return;
  seen.add(schema);
  switch (def.type) {
    case 'boolean':
    case 'number':
    case 'bigint':
      if (!def.coerce)
        Object.defineProperty(def, 'coerce', { get: () => false, set: () => {}, configurable: true });
      return;
    case 'object':
      for (const field of Object.values(def.shape as Record<string, ZodLike>)) pinCoercion(field, seen);
      return;
    case 'array':
      return pinCoercion(def.element as ZodLike, seen);
    case 'optional':
    case 'nullable':
    case 'default':
    case 'prefault':
      return pinCoercion(def.innerType as ZodLike, seen);
    case 'pipe':
      pinCoercion(def.in as ZodLike, seen);
      return pinCoercion(def.out as ZodLike, seen);
    case 'lazy':
      return pinCoercion((def.getter as () => ZodLike)(), seen);
  }
}

/**
 * The REST adapter switches on `coerce` for every boolean and number of an input before parsing,
 * request bodies included, and does it on the shared schema, so tRPC then coerces as well:
 * `{"is_active": "false"}` would read as true. JSON bodies carry real booleans and numbers, so for
 * procedures with a body the flag stays as declared (an explicit `z.coerce` keeps working). Dates are
 * left alone: ISO strings in REST bodies have to become Date objects.
 */
export function pinBodyCoercion(router: AnyRouter): void {
  const seen = new Set<unknown>();
  for (const procedure of Object.values(router._def.procedures) as AnyProcedure[]) {
    const method = (procedure._def.meta as Meta | undefined)?.openapi?.method;
    if (method === 'POST' || method === 'PUT' || method === 'PATCH')
      for (const input of procedure._def.inputs as ZodLike[]) pinCoercion(input, seen);
  }
}
