import type { ServerResponse } from 'node:http';
import type { NextFunction, Request, Response } from 'express';
import { TRPCError, type AnyProcedure, type AnyRouter } from '@trpc/server';
import {
  getErrorShape,
  getHTTPStatusCodeFromError,
  getParseFn,
  getTRPCErrorFromUnknown,
  middlewareMarker,
  type AnyMiddlewareFunction,
  type MiddlewareResult,
} from '@trpc/server/unstable-core-do-not-import';
import type { AppErrorCode } from '../app-error.ts';
import type { Context } from './context.ts';
import type { Meta } from './init.ts';
import { HTTP_STATUS } from './errors.ts';

type ZodLike = { _zod?: { def: Record<string, unknown> & { type?: string; coerce?: boolean } } };
type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';

interface Route {
  path: string;
  procedure: AnyProcedure;
  /** The procedure's middleware chain, which tRPC keeps on its definition (ending with the resolver). */
  middlewares: AnyMiddlewareFunction[];
  /** The procedure takes no input (`z.void()`), so nothing from the request is passed. */
  takesNoInput: boolean;
  /** Query keys declared as arrays: a single `?key=v` still has to arrive as `[v]`. */
  arrayKeys: string[];
}

interface ParamRoute extends Route {
  pattern: RegExp;
}

/** The methods whose input is the JSON body. */
export const BODY_METHODS = new Set<string>(['POST', 'PUT', 'PATCH']);

function unwrap(schema: ZodLike | undefined): ZodLike | undefined {
  const def = schema?._zod?.def;
  switch (def?.type) {
    case 'optional':
    case 'nullable':
    case 'default':
    case 'prefault':
      return unwrap(def.innerType as ZodLike);
    case 'lazy':
      return unwrap((def.getter as () => ZodLike)());
    case 'pipe':
      return unwrap(def.in as ZodLike);
    default:
      return schema;
  }
}

const kindOf = (schema: ZodLike | undefined) => unwrap(schema)?._zod?.def.type;

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
 * Query coercion switches `coerce` on in the schema objects themselves, and a schema can be shared by a
 * query input and a body: `{"is_active": "false"}` in a body would then read as true. JSON bodies carry
 * real booleans and numbers, so the schemas of body inputs are pinned to their declared flag first (an
 * explicit `z.coerce` keeps working). Dates are left alone: ISO strings in bodies have to become Dates.
 */
function pinBodyCoercion(router: AnyRouter): void {
  const seen = new Set<unknown>();
  for (const procedure of Object.values(router._def.procedures) as AnyProcedure[]) {
    const method = (procedure._def.meta as Meta | undefined)?.openapi?.method;
    if (method && BODY_METHODS.has(method))
      for (const input of procedure._def.inputs as ZodLike[]) pinCoercion(input, seen);
  }
}

/** Query strings carry only text: numbers, booleans and dates of a query input are read from it. */
function coerceQuerySchema(schema: ZodLike | undefined): void {
  const def = unwrap(schema)?._zod?.def;
  if (def?.type !== 'object') return;
  for (const field of Object.values(def.shape as Record<string, ZodLike>)) {
    const inner = unwrap(field);
    const type = inner?._zod?.def.type;
    if (type === 'array') coerceQuerySchema(inner!._zod!.def.element as ZodLike);
    else if (type === 'number' || type === 'boolean' || type === 'bigint' || type === 'date')
      inner!._zod!.def.coerce = true;
    else if (type === 'object') coerceQuerySchema(inner);
  }
}

function queryInput(req: Request, arrayKeys: string[]): Record<string, unknown> {
  const input: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(req.query as Record<string, unknown>))
    if (value) input[key] = Array.isArray(value) && value.length === 1 ? value[0] : value;
  for (const key of arrayKeys)
    if (input[key] !== undefined && !Array.isArray(input[key])) input[key] = [input[key]];
  return input;
}

/** What every middleware of a procedure receives besides `next`. */
interface Call {
  ctx: Context;
  type: AnyProcedure['_def']['type'];
  path: string;
  input: unknown;
  getRawInput: () => Promise<unknown>;
  meta: Meta | undefined;
}

interface NextOptions {
  ctx?: Record<string, unknown>;
  input?: unknown;
  getRawInput?: () => Promise<unknown>;
}

/**
 * A procedure's middlewares (guard, input parsers, output validator, resolver) run in order, as tRPC's
 * own caller runs them and with the same options, but built as plain object literals: tRPC copies its
 * call options through a transpiled object-spread helper twice per level, which alone measured a tenth
 * of a cached authenticated call (bench/api-overhead.ts). Guards and validation stay tRPC's own.
 */
async function runMiddlewares(
  middlewares: AnyMiddlewareFunction[],
  index: number,
  call: Call,
): Promise<MiddlewareResult<unknown>> {
  try {
    return await middlewares[index]({
      ctx: call.ctx,
      type: call.type,
      path: call.path,
      input: call.input,
      getRawInput: call.getRawInput,
      meta: call.meta,
      signal: undefined,
      next: nextStep(middlewares, index + 1, call),
    } as Parameters<AnyMiddlewareFunction>[0]);
  } catch (cause) {
    return { ok: false, error: getTRPCErrorFromUnknown(cause), marker: middlewareMarker };
  }
}

/**
 * tRPC's output validator with the same outcome (the parsed data, or a 500 "Output validation failed"),
 * in place of tRPC's own, which copies its result through the spread helper that runMiddlewares avoids.
 */
function outputValidator(parse: (value: unknown) => unknown): AnyMiddlewareFunction {
  return async function validateOutput({ next }) {
    const result = await next();
    if (!result.ok) return result;
    try {
      return { ...result, data: await parse(result.data) };
    } catch (cause) {
      throw new TRPCError({ message: 'Output validation failed', code: 'INTERNAL_SERVER_ERROR', cause });
    }
  };
}

/*
 * The two functions below only return closures: tsx (which runs the server) keeps function names by
 * attaching them at run time to every closure written as a named property, once per request here.
 */
function nextStep(middlewares: AnyMiddlewareFunction[], index: number, call: Call) {
  return (next?: NextOptions) =>
    runMiddlewares(middlewares, index, {
      ctx: next?.ctx ? ({ ...call.ctx, ...next.ctx } as Context) : call.ctx,
      type: call.type,
      path: call.path,
      input: next && 'input' in next ? next.input : call.input,
      getRawInput: next?.getRawInput ?? call.getRawInput,
      meta: call.meta,
    });
}

function rawInputOf(input: unknown) {
  return () => Promise.resolve(input);
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  res.statusCode = status;
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify(body));
}

/**
 * The REST face of the routers: every procedure whose meta names a method and path (routes.tsv) answers
 * there, through the procedure itself, so guards, input and output validation are those of tRPC.
 * trpc-to-openapi still writes the OpenAPI document from the same meta; its adapter is not used because
 * per request it scanned every route's regular expression, built a fetch Request only for an abort
 * signal, and created a caller proxy — a third of the cost of a cached authenticated call
 * (bench/api-overhead.ts). Routes are resolved once here: static paths by map, the others by pattern.
 */
export function createRestHandler(
  router: AnyRouter,
  createContext: (opts: { req: Request }) => Context,
  /** Routes (method, OpenAPI path) that another handler serves, such as streamed answers. */
  servedElsewhere: { method: string; path: string }[] = [],
) {
  pinBodyCoercion(router);
  const skipped = new Set(servedElsewhere.map((r) => `${r.method.toUpperCase()} ${r.path}`));
  const staticRoutes = new Map<string, Route>();
  const paramRoutes = new Map<string, ParamRoute[]>();
  for (const [path, procedure] of Object.entries(router._def.procedures as Record<string, AnyProcedure>)) {
    const openapi = (procedure._def.meta as Meta | undefined)?.openapi;
    if (!openapi || procedure._def.type === 'subscription') continue;
    const input = (procedure._def.inputs as ZodLike[])[0];
    const inputKind = kindOf(input);
    const shape = inputKind === 'object' ? (unwrap(input)!._zod!.def.shape as Record<string, ZodLike>) : {};
    const def = procedure._def as unknown as { middlewares?: AnyMiddlewareFunction[]; output?: unknown };
    if (!def.middlewares?.length) throw new Error(`The procedure ${path} has no middleware chain to run`);
    const middlewares = def.middlewares.map((middleware) =>
      (middleware as { _type?: string })._type === 'output'
        ? outputValidator(getParseFn(def.output as Parameters<typeof getParseFn>[0]))
        : middleware,
    );
    const route: Route = {
      path,
      procedure,
      middlewares,
      takesNoInput: inputKind === 'void' || inputKind === 'undefined' || inputKind === 'never',
      arrayKeys: Object.keys(shape).filter((key) => kindOf(shape[key]) === 'array'),
    };
    if (!BODY_METHODS.has(openapi.method)) coerceQuerySchema(input);
    const routePath = `/${openapi.path.replace(/^\/|\/$/g, '')}`;
    if (skipped.delete(`${openapi.method} ${routePath}`)) continue;
    if (!routePath.includes('{')) staticRoutes.set(`${openapi.method} ${routePath}`, route);
    else {
      const pattern = new RegExp(`^${routePath.replace(/\{(.+?)\}/g, (_, key) => `(?<${key}>[^/]+)`)}$`);
      const list = paramRoutes.get(openapi.method) ?? [];
      list.push({ ...route, pattern });
      paramRoutes.set(openapi.method, list);
    }
  }
  if (skipped.size) throw new Error(`No procedure answers ${[...skipped].join(', ')}`);

  function match(method: string, path: string): { route: Route; params: Record<string, string> } | null {
    const route = staticRoutes.get(`${method} ${path}`);
    if (route) return { route, params: {} };
    for (const candidate of paramRoutes.get(method) ?? []) {
      const groups = candidate.pattern.exec(path)?.groups;
      if (groups) {
        const params: Record<string, string> = {};
        for (const [key, value] of Object.entries(groups)) params[key] = decodeURIComponent(value);
        return { route: candidate, params };
      }
    }
    return null;
  }

  return async (req: Request, res: Response, next: NextFunction): Promise<void> => {
    if (!req.path.startsWith('/api/')) return next();
    const method = req.method === 'HEAD' ? 'GET' : (req.method as Method);
    let found: ReturnType<typeof match>;
    try {
      const path = req.path.length > 1 && req.path.endsWith('/') ? req.path.slice(0, -1) : req.path;
      found = match(method, path);
    } catch {
      return sendJson(res, 400, { message: 'Malformed percent-encoding in the path', code: 'BAD_REQUEST' });
    }
    if (!found) return next();
    const { route, params } = found;
    const useBody = BODY_METHODS.has(method);
    const contentType = req.headers['content-type'];
    // A POST without a body (logout, cancel…) needs no content type.
    const hasBody = Number(req.headers['content-length'] ?? 0) > 0 || !!req.headers['transfer-encoding'];
    if (useBody && hasBody && !contentType?.startsWith('application/json'))
      return sendJson(res, HTTP_STATUS.UNSUPPORTED_MEDIA_TYPE, {
        message: contentType ? `Unsupported content-type "${contentType}"` : 'Missing content-type header',
        code: 'UNSUPPORTED_MEDIA_TYPE',
      });
    // A body method may take its optional parameters from the query as well (`PUT …?schema_type=source`);
    // the body wins where both name one.
    const input = route.takesNoInput
      ? undefined
      : {
          ...queryInput(req, route.arrayKeys),
          ...(useBody ? ((req.body as object | undefined) ?? {}) : {}),
          ...params,
        };
    let ctx: Context | undefined;
    try {
      ctx = createContext({ req });
      const { _def } = route.procedure;
      const result = await runMiddlewares(route.middlewares, 0, {
        ctx,
        type: _def.type,
        path: route.path,
        input: undefined,
        getRawInput: rawInputOf(input),
        meta: _def.meta as Meta | undefined,
      });
      if (!result.ok) throw result.error;
      sendJson(res, 200, result.data);
    } catch (cause) {
      const error =
        cause instanceof TRPCError ? cause : new TRPCError({ code: 'INTERNAL_SERVER_ERROR', cause });
      const shape = getErrorShape({
        config: router._def._config,
        error,
        type: route.procedure._def.type,
        path: route.path,
        input,
        ctx,
      }) as Record<string, unknown>;
      const isInputValidation =
        error.code === 'BAD_REQUEST' && error.cause instanceof Error && error.cause.name === 'ZodError';
      sendJson(res, HTTP_STATUS[error.code as AppErrorCode] ?? getHTTPStatusCodeFromError(error), {
        ...shape,
        message: isInputValidation ? 'Input validation failed' : shape.message,
        code: error.code,
        issues: isInputValidation ? (error.cause as Error & { issues?: unknown }).issues : undefined,
      });
    }
  };
}
