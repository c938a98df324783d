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
 * The REST adapter calls each procedure through tRPC's server-side caller (src/trpc/rest.ts). These
 * procedures pin down what REST clients rely on: output validation strips and refuses, input validation
 * answers 400 with its issues, query text becomes the declared types (and bodies are not coerced), a
 * middleware's context reaches the resolver, errors keep their status, a client abort reaches the work.
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
  filter: publicProcedure
    .meta(meta('GET', '/api/test/filter'))
    .input(
      z.object({
        limit: z.number().int().optional(),
        active: z.boolean().optional(),
        ids: z.array(z.number()).optional(),
        since: z.date().optional(),
      }),
    )
    .output(z.record(z.string(), z.unknown()))
    .query(({ input }) => ({ ...input, since: input.since?.toISOString() })),
  flags: publicProcedure
    .meta(meta('POST', '/api/test/flags'))
    .input(z.object({ active: z.boolean() }))
    .output(z.object({ active: z.boolean() }))
    .mutation(({ input }) => input),
  slow: publicProcedure
    .meta(meta('GET', '/api/test/slow'))
    .output(z.object({}))
    .query(async ({ signal }) => {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 10_000);
        signal?.addEventListener('abort', () => {
          clearTimeout(timer);
          markAborted(true);
          resolve();
        });
      });
      return {};
    }),
});

let markAborted: (value: boolean) => void = () => {};
const abortedSeen = new Promise<boolean>((resolve) => (markAborted = resolve));
let server: Server;
let base: string;

beforeAll(async () => {
  const logger = createLogger({ level: 'silent', stdout: false });
  const createContext = () =>
    ({ deps: { logger }, transport: 'rest', requestId: 'test' }) as unknown as Context;
  const app = express();
  app.use(express.json());
  app.use(createRestHandler(testRouter, createContext, logger));
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

  it('reads query text as the declared numbers, booleans, arrays and dates', async () => {
    expect(
      await request('GET', '/api/test/filter?limit=5&active=false&ids=7&since=2026-01-02T00:00:00Z'),
    ).toEqual({
      status: 200,
      body: { limit: 5, active: false, ids: [7], since: '2026-01-02T00:00:00.000Z' },
    });
    const bad = await request('GET', '/api/test/filter?limit=five');
    expect(bad.status).toBe(400);
    expect(bad.body.issues[0].path).toEqual(['limit']);
  });

  it('takes JSON bodies as they are: the text "false" is not a boolean', async () => {
    expect((await request('POST', '/api/test/flags', { active: 'false' })).status).toBe(400);
    expect(await request('POST', '/api/test/flags', { active: false })).toEqual({
      status: 200,
      body: { active: false },
    });
  });

  it('aborts the procedure when the client goes away', async () => {
    const controller = new AbortController();
    const pending = fetch(base + '/api/test/slow', { signal: controller.signal }).catch(() => null);
    await new Promise((resolve) => setTimeout(resolve, 200));
    controller.abort();
    await pending;
    const seen = await Promise.race([abortedSeen, new Promise((r) => setTimeout(() => r(false), 3000))]);
    expect(seen).toBe(true);
  });
});
