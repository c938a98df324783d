import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express from 'express';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../src/app-error.ts';
import { createLogger } from '../src/logger.ts';
import type { Context } from '../src/trpc/context.ts';
import { t } from '../src/trpc/init.ts';
import { publicProcedure, router } from '../src/trpc/procedures.ts';
import { createRestHandler } from '../src/trpc/rest.ts';

/*
 * The REST adapter runs each procedure's middleware chain itself (src/trpc/rest.ts). These procedures
 * pin down that it keeps tRPC's semantics: output validation strips and refuses, input validation
 * answers 400 with its issues, a middleware's context reaches the resolver, errors keep their status.
 */
const meta = (method: 'GET' | 'POST', path: `/${string}`) => ({ openapi: { method, path } });
const withTenant = t.middleware(({ next }) => next({ ctx: { tenant: 'acme' } }));

const testRouter = router({
  extraKeys: publicProcedure
    .meta(meta('GET', '/api/test/extra-keys'))
    .output(z.object({ name: z.string() }))
    .query(() => ({ name: 'visible', password_hash: 'must not leave the server' }) as { name: string }),
  wrongOutput: publicProcedure
    .meta(meta('GET', '/api/test/wrong-output'))
    .output(z.object({ count: z.number() }))
    .query(() => ({ count: 'many' }) as unknown as { count: number }),
  echo: publicProcedure
    .meta(meta('POST', '/api/test/echo'))
    .input(z.object({ limit: z.number().int().min(1) }))
    .output(z.object({ limit: z.number() }))
    .mutation(({ input }) => input),
  tenant: publicProcedure
    .use(withTenant)
    .meta(meta('GET', '/api/test/tenant'))
    .output(z.object({ tenant: z.string(), transport: z.string() }))
    .query(({ ctx }) => ({ tenant: ctx.tenant, transport: ctx.transport })),
  missing: publicProcedure
    .meta(meta('GET', '/api/test/missing/{id}'))
    .input(z.object({ id: z.string() }))
    .output(z.object({}))
    .query(({ input }) => {
      throw new AppError('NOT_FOUND', `No item ${input.id}`);
    }),
});

let server: Server;
let base: string;

beforeAll(async () => {
  const logger = createLogger({ level: 'silent', stdout: false });
  const createContext = () =>
    ({ deps: { logger }, transport: 'rest', requestId: 'test' }) as unknown as Context;
  const app = express();
  app.use(express.json());
  app.use(createRestHandler(testRouter, createContext));
  server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

async function request(method: string, path: string, body?: unknown) {
  const res = await fetch(base + path, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, any> };
}

describe('the REST adapter', () => {
  it('answers only the fields of the output schema', async () => {
    expect(await request('GET', '/api/test/extra-keys')).toEqual({ status: 200, body: { name: 'visible' } });
  });

  it('refuses an answer that does not match its schema with a bare 500', async () => {
    expect(await request('GET', '/api/test/wrong-output')).toEqual({
      status: 500,
      body: { message: 'Internal server error', code: 'INTERNAL_SERVER_ERROR' },
    });
  });

  it('answers 400 with the issues of an invalid input, and the parsed input otherwise', async () => {
    const bad = await request('POST', '/api/test/echo', { limit: 0 });
    expect(bad.status).toBe(400);
    expect(bad.body).toMatchObject({ message: 'Input validation failed', code: 'BAD_REQUEST' });
    expect(bad.body.issues[0].path).toEqual(['limit']);
    expect(await request('POST', '/api/test/echo', { limit: 3 })).toEqual({
      status: 200,
      body: { limit: 3 },
    });
  });

  it('passes the context a middleware adds on to the resolver, with the rest of it', async () => {
    expect(await request('GET', '/api/test/tenant')).toEqual({
      status: 200,
      body: { tenant: 'acme', transport: 'rest' },
    });
  });

  it('keeps the status of an AppError thrown by the resolver', async () => {
    expect(await request('GET', '/api/test/missing/42')).toEqual({
      status: 404,
      body: { message: 'No item 42', code: 'NOT_FOUND' },
    });
  });
});
