import type { ServerResponse } from 'node:http';
import type { NextFunction, Request, Response } from 'express';
import type { AnyProcedure, AnyRouter } from '@trpc/server';
import { z } from 'zod';
import type { Logger } from 'pino';
import type { Context } from './context.ts';
import type { Meta } from './init.ts';
import { createCallerFactory } from './procedures.ts';
import { HTTP_STATUS, errorAnswer } from './errors.ts';

type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
type Call = (input: unknown) => Promise<unknown>;
type Caller = Record<string, unknown>;

/** Reads one query-string value as the type its schema declares (query strings carry only text). */
type QueryValueReader = (value: unknown) => unknown;

interface Route {
  /** The procedure's path in the router, split at dots, to reach it on a caller. */
  segments: string[];
  /** The procedure takes no input (`z.void()`), so nothing from the request is passed. */
  takesNoInput: boolean;
  /** Per query key, how its text becomes the declared type; keys absent here pass through as text. */
  queryReaders: Map<string, QueryValueReader>;
}

interface ParamRoute extends Route {
  pattern: RegExp;
}

/** The methods whose input is the JSON body. */
export const BODY_METHODS = new Set<string>(['POST', 'PUT', 'PATCH']);

/** The schema inside optional/nullable/default/pipe wrappers, through zod's public accessors. */
function innermost(schema: z.ZodType | undefined): z.ZodType | undefined {
  if (schema instanceof z.ZodOptional || schema instanceof z.ZodNullable)
    return innermost(schema.unwrap() as z.ZodType);
  if (schema instanceof z.ZodDefault || schema instanceof z.ZodPrefault)
    return innermost(schema.unwrap() as z.ZodType);
  if (schema instanceof z.ZodLazy) return innermost(schema.unwrap() as z.ZodType);
  if (schema instanceof z.ZodPipe) return innermost(schema.in as z.ZodType);
  return schema;
}

const readNumber = (value: unknown) =>
  typeof value === 'string' && value.trim() !== '' && Number.isFinite(Number(value)) ? Number(value) : value;
const readBoolean = (value: unknown) => (value === 'true' ? true : value === 'false' ? false : value);
const readBigInt = (value: unknown) => {
  if (typeof value !== 'string' || !/^-?\d+$/.test(value)) return value;
  return BigInt(value);
};
const readDate = (value: unknown) => {
  if (typeof value !== 'string') return value;
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? value : date;
};

/**
 * How a query parameter's text becomes the value its schema declares. A schema that coerces on its
 * own (`z.coerce.number()`) or reads text itself (`z.stringbool()`) gets the text unchanged; a value
 * that does not read as the type is passed on as text, so validation answers 400 with the field.
 */
function queryReaderFor(schema: z.ZodType | undefined): QueryValueReader | undefined {
  const inner = innermost(schema);
  if (inner instanceof z.ZodArray) {
    const element = queryReaderFor(inner.element as z.ZodType);
    return (value) => {
      const list = Array.isArray(value) ? value : [value];
      return element ? list.map(element) : list;
    };
  }
  if ((inner?.def as { coerce?: boolean } | undefined)?.coerce) return undefined;
  if (inner instanceof z.ZodNumber) return readNumber;
  if (inner instanceof z.ZodBoolean) return readBoolean;
  if (inner instanceof z.ZodBigInt) return readBigInt;
  if (inner instanceof z.ZodDate) return readDate;
  return undefined;
}

function queryReadersOf(input: z.ZodType | undefined): Map<string, QueryValueReader> {
  const readers = new Map<string, QueryValueReader>();
  const inner = innermost(input);
  if (!(inner instanceof z.ZodObject)) return readers;
  for (const [key, field] of Object.entries(inner.shape as Record<string, z.ZodType>)) {
    const reader = queryReaderFor(field);
    if (reader) readers.set(key, reader);
  }
  return readers;
}

function queryInput(req: Request, readers: Map<string, QueryValueReader>): Record<string, unknown> {
  const input: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(req.query as Record<string, unknown>)) {
    if (!value) continue;
    const single = Array.isArray(value) && value.length === 1 ? value[0] : value;
    const reader = readers.get(key);
    input[key] = reader ? reader(single) : single;
  }
  return input;
}

function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  res.statusCode = status;
  for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify(body));
}

/** The procedure at `segments` on a caller (tRPC's caller is a proxy keyed by the router's paths). */
function procedureOn(caller: Caller, segments: string[]): Call {
  let node: unknown = caller;
  for (const segment of segments) node = (node as Caller)[segment];
  return node as Call;
}

/**
 * The REST face of the routers: every procedure whose meta names a method and path (routes.tsv) answers
 * there, called through tRPC's public server-side caller, so guards, input and output validation and
 * the abort signal are tRPC's own. trpc-to-openapi writes the OpenAPI document from the same meta; its
 * adapter is not used because per request it scanned every route's regular expression. Routes are
 * resolved once here: static paths by map, the others by pattern.
 */
export function createRestHandler(
  router: AnyRouter,
  createContext: (opts: { req: Request }) => Context,
  logger: Logger,
  /** Routes (method, OpenAPI path) that another handler serves, such as streamed answers. */
  servedElsewhere: { method: string; path: string }[] = [],
) {
  const createCaller = createCallerFactory(router);
  const skipped = new Set(servedElsewhere.map((r) => `${r.method.toUpperCase()} ${r.path}`));
  const staticRoutes = new Map<string, Route>();
  const paramRoutes = new Map<string, ParamRoute[]>();
  for (const [path, procedure] of Object.entries(router._def.procedures as Record<string, AnyProcedure>)) {
    const openapi = (procedure._def.meta as Meta | undefined)?.openapi;
    if (!openapi || procedure._def.type === 'subscription') continue;
    const input = (procedure._def.inputs as z.ZodType[])[0];
    const inner = innermost(input);
    const route: Route = {
      segments: path.split('.'),
      takesNoInput:
        inner instanceof z.ZodVoid || inner instanceof z.ZodUndefined || inner instanceof z.ZodNever,
      // Body inputs are JSON and carry real numbers and booleans: only query inputs are read from text.
      queryReaders: queryReadersOf(input),
    };
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
    const given = {
      ...queryInput(req, route.queryReaders),
      ...(useBody ? ((req.body as object | undefined) ?? {}) : {}),
      ...params,
    };
    // A route that takes nothing gets nothing, unless something was sent: then the input rule
    // (body-rule.ts) names it rather than the route acting as if it had not been.
    const input = route.takesNoInput && !Object.keys(given).length ? undefined : given;
    // A client that goes away aborts the procedure (long queries and streams watch the signal).
    const controller = new AbortController();
    const abortOnClose = () => {
      if (!res.writableFinished) controller.abort();
    };
    res.once('close', abortOnClose);
    let ctx: Context | undefined;
    try {
      ctx = createContext({ req });
      const caller = createCaller(ctx, { signal: controller.signal }) as unknown as Caller;
      sendJson(res, 200, await procedureOn(caller, route.segments)(input));
    } catch (cause) {
      const { status, body, headers, internal } = errorAnswer(cause);
      if (internal)
        logger.error(
          { err: cause, path: route.segments.join('.'), requestId: ctx?.requestId },
          'internal error',
        );
      sendJson(res, status, body, headers);
    }
  };
}
