import { pipeline } from 'node:stream/promises';
import { createReadStream } from 'node:fs';
import { dirname, join } from 'node:path';
import { createRequire } from 'node:module';
import express, { type NextFunction, type Request, type Response } from 'express';
import { isTrackedEnvelope } from '@trpc/server';
import helmet from 'helmet';
import cors from 'cors';
import archiver from 'archiver';
import { createExpressMiddleware } from '@trpc/server/adapters/express';
import type { AppDeps } from './deps.ts';
import { appRouter } from './trpc/router.ts';
import { createCallerFactory } from './trpc/procedures.ts';
import { createContextFactory } from './trpc/context.ts';
import { STREAMED_ROUTES, openApiDocument } from './trpc/openapi.ts';
import { BODY_METHODS, createRestHandler } from './trpc/rest.ts';
import { errorAnswer, errorResponseMeta } from './trpc/errors.ts';
import { AppError } from './app-error.ts';
import { packageVersion } from './version.ts';
import { trustProxySetting } from './env.ts';
import { TooDeepError, jsonDepthExceeds } from './json-depth.ts';
import { flushLogFile, requestLogger } from './logger.ts';
import type { DiscoveryEvent } from './modules/discovery/discovery.schemas.ts';

const require = createRequire(import.meta.url);
const createCaller = createCallerFactory(appRouter);

/** Anything thrown outside the tRPC adapters (plain routes, parsers) answers with the same error body. */
function sendError(res: Response, error: unknown, logger?: AppDeps['logger']): void {
  const { status, body, headers, internal, cause } = errorAnswer(error);
  if (internal) logger?.error({ err: cause }, 'internal error');
  if (!res.headersSent) res.status(status).set(headers).json(body);
  else res.destroy();
}

/**
 * Everything but the API reference answers JSON or files: helmet's headers that protect such answers
 * (OWASP's REST cheat sheet) — no sniffing, no framing, no loading as a resource of another site,
 * HTTPS only, no referrer. Its HTML-only headers are left out.
 */
const apiHelmet = helmet({
  contentSecurityPolicy: {
    useDefaults: false,
    directives: { 'default-src': ["'none'"], 'frame-ancestors': ["'none'"] },
  },
  crossOriginOpenerPolicy: false,
  originAgentCluster: false,
  xDnsPrefetchControl: false,
  xDownloadOptions: false,
  xPermittedCrossDomainPolicies: false,
  xXssProtection: false,
});

/**
 * The headers a helmet middleware sets, read once: with fixed directives they depend on no request,
 * and setting them in one pass spares every answer helmet's chain, which rebuilds the policy string.
 */
function headersSetBy(middleware: typeof apiHelmet): [string, string][] {
  const headers: [string, string][] = [];
  const recorder = {
    setHeader: (name: string, value: unknown) => headers.push([name, String(value)]),
    removeHeader: () => {},
  };
  let done = false;
  middleware({} as Request, recorder as unknown as Response, () => (done = true));
  if (!done) throw new Error('helmet did not set its headers synchronously');
  return headers;
}

const API_SECURITY_HEADERS = headersSetBy(apiHelmet);

export function createApp(deps: AppDeps) {
  const app = express();
  app.disable('x-powered-by');
  app.set('trust proxy', trustProxySetting(deps.env.TRUST_PROXY));

  // The API reference is the one HTML page: it gets helmet's whole set, with a policy fitting Swagger UI.
  // `upgrade-insecure-requests` only over HTTPS: reached over plain HTTP (a LAN address, no TLS in front),
  // it would make the browser fetch the page's own assets over https and show a blank page.
  const pageHelmet = (secure: boolean) =>
    helmet({
      contentSecurityPolicy: {
        directives: {
          'img-src': ["'self'", 'data:'],
          'script-src': ["'self'"],
          'style-src': ["'self'", "'unsafe-inline'"],
          'upgrade-insecure-requests': secure ? [] : null,
        },
      },
    });
  const securePageHeaders = pageHelmet(true);
  const plainPageHeaders = pageHelmet(false);
  const pageHeaders = (req: Request, res: Response, next: NextFunction) =>
    (req.secure ? securePageHeaders : plainPageHeaders)(req, res, next);
  const apiHeaders = (_req: Request, res: Response, next: NextFunction) => {
    for (const [name, value] of API_SECURITY_HEADERS) res.setHeader(name, value);
    next();
  };
  app.use((req, res, next) => (req.path.startsWith('/api/docs') ? pageHeaders : apiHeaders)(req, res, next));
  const origins = deps.env.CORS_ORIGINS.split(',')
    .map((o) => o.trim())
    .filter(Boolean);
  // No origins configured = same origin only, which needs no CORS headers (and no work per request).
  // Retry-After is no CORS-safelisted response header: a browser hides it from scripts unless exposed.
  if (origins.length)
    app.use(
      cors({
        origin: origins.includes('*') ? true : origins,
        credentials: true,
        exposedHeaders: ['Retry-After'],
      }),
    );
  app.use(requestLogger(deps.logger));
  const maxDepth = deps.env.BODY_MAX_DEPTH;
  const parseJson = express.json({
    limit: deps.env.BODY_LIMIT,
    verify: (_req, _res, body) => {
      if (jsonDepthExceeds(body, maxDepth)) throw new TooDeepError(maxDepth);
    },
  });
  // GET, HEAD and DELETE carry no body here: they skip the parser rather than have it look for one.
  app.use((req, res, next) => (BODY_METHODS.has(req.method) ? parseJson(req, res, next) : next()));
  const restContext = createContextFactory(deps, 'rest');
  // First: the API routes are the traffic, and express would otherwise test every route below first.
  app.use(createRestHandler(appRouter, restContext, deps.logger, STREAMED_ROUTES));

  app.get('/api/health', async (_req, res) => {
    try {
      await deps.orm.em.execute('select 1');
      res.json({ status: 'ok', database: deps.dbKind });
    } catch {
      res.status(503).json({ message: 'The database is unavailable', code: 'SERVICE_UNAVAILABLE' });
    }
  });

  app.get('/api/openapi.json', (_req, res) => {
    res.json(openApiDocument(packageVersion));
  });
  mountApiReference(app);

  /** Binary downloads: the procedure guards and lists, the route streams. */
  app.get('/api/auth/admin/logs/download', async (req, res) => {
    try {
      const ctx = restContext({ req });
      // The procedure takes nothing: a query given anyway goes to it, so the input rule names it.
      const { files } = await createCaller(ctx).auth.adminLogsDownload(
        (Object.keys(req.query).length ? req.query : undefined) as undefined,
      );
      await flushLogFile(deps.logger);
      const dir = join(deps.env.dataDir, 'logs');
      res.setHeader('content-type', 'application/gzip');
      res.setHeader(
        'content-disposition',
        `attachment; filename="dimas-logs-${new Date().toISOString().slice(0, 10)}.tar.gz"`,
      );
      const archive = archiver('tar', { gzip: true });
      archive.on('error', (err) => sendError(res, err));
      archive.pipe(res);
      for (const file of files) archive.append(createReadStream(join(dir, file.name)), { name: file.name });
      await archive.finalize();
    } catch (error) {
      sendError(res, error, deps.logger);
    }
  });

  app.get('/api/workspaces/:workspace_name/download', async (req, res) => {
    try {
      const ctx = restContext({ req });
      const { filename, files } = await createCaller(ctx).workspaces.download({
        ...(req.query as Record<string, never>),
        workspace_name: String(req.params.workspace_name),
      });
      res.setHeader('content-type', 'application/zip');
      res.setHeader('content-disposition', `attachment; filename="${filename}"`);
      const archive = archiver('zip');
      archive.on('error', (err) => sendError(res, err));
      archive.pipe(res);
      for (const file of files) archive.append(file.content, { name: file.path });
      await archive.finalize();
    } catch (error) {
      sendError(res, error, deps.logger);
    }
  });

  app.get('/api/api/audiences/exports/:export_id/download', async (req, res) => {
    try {
      const file = await createCaller(restContext({ req })).audiences.exportFile({
        ...(req.query as Record<string, never>),
        export_id: String(req.params.export_id),
      });
      const { size, stream } = await file.open();
      res.setHeader('content-type', 'text/csv; charset=utf-8');
      res.setHeader('content-disposition', `attachment; filename="${file.filename}"`);
      res.setHeader('content-length', String(size));
      // pipeline closes the file when the client goes away mid-download, and the response on a read error.
      await pipeline(stream, res).catch(() => undefined);
    } catch (error) {
      sendError(res, error, deps.logger);
    }
  });

  /**
   * Discovery as server-sent events. The abort signal goes to createCaller (a signal given to the call
   * itself is ignored), so a client that disconnects stops the generator at its next step. Failures
   * before the first event (guard, validation, no workspace, a run already going) answer as JSON.
   */
  app.post('/api/workspaces/discover', async (req, res) => {
    const controller = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) controller.abort();
    });
    let heartbeat: NodeJS.Timeout | undefined;
    try {
      const ctx = restContext({ req });
      // EventSource sends the id of the last event it got when it reconnects: the stream resumes there.
      const lastEventId = req.headers['last-event-id'];
      const body = (req.body ?? {}) as Record<string, unknown>;
      const events = await createCaller(ctx, { signal: controller.signal }).discovery.discover(
        typeof lastEventId === 'string' && lastEventId ? { ...body, lastEventId } : body,
      );
      const iterator = events[Symbol.asyncIterator]();
      // The first event decides between the stream and a JSON error (the per-caller stream cap, no
      // workspace, a run already going…).
      const first = await iterator.next();
      res.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache, no-transform',
        connection: 'keep-alive',
        'x-accel-buffering': 'no',
      });
      heartbeat = setInterval(() => res.write(': heartbeat\n\n'), deps.env.SSE_HEARTBEAT_MS);
      for (let step = first; !step.done; step = await iterator.next()) {
        if (controller.signal.aborted) {
          await iterator.return?.(undefined);
          break;
        }
        // The procedure yields tracked events (id, data) for tRPC clients; REST writes the same id.
        const value: unknown = step.value;
        const [id, event] = isTrackedEnvelope<DiscoveryEvent>(value)
          ? value
          : [undefined, value as DiscoveryEvent];
        res.write(`event: ${event.type}\n${id ? `id: ${id}\n` : ''}data: ${JSON.stringify(event)}\n\n`);
      }
      res.end();
    } catch (error) {
      if (res.headersSent) {
        deps.logger.error({ err: error }, 'discovery stream failed');
        res.end();
      } else sendError(res, error, deps.logger);
    } finally {
      clearInterval(heartbeat);
    }
  });

  // tRPC queries carry their input as JSON in the query string: the same depth limit applies.
  app.use('/trpc', (req, res, next) => {
    const input = req.method === 'GET' ? new URL(req.url, 'http://x').searchParams.get('input') : null;
    if (input && jsonDepthExceeds(input, maxDepth))
      return sendError(
        res,
        new AppError('BAD_REQUEST', `The JSON input is nested deeper than ${maxDepth} levels`),
      );
    next();
  });
  app.use(
    '/trpc',
    createExpressMiddleware({
      router: appRouter,
      createContext: createContextFactory(deps, 'trpc'),
      responseMeta: errorResponseMeta,
    }),
  );
  app.use((_req, res) => sendError(res, new AppError('NOT_FOUND', 'Not found')));

  // Body parser failures are the client's: each becomes an AppError, and every answer takes one path.
  app.use((error: unknown, _req: Request, res: Response, _next: NextFunction) => {
    const err = error as { type?: string; status?: number };
    if (err.type === 'entity.too.large')
      return sendError(res, new AppError('PAYLOAD_TOO_LARGE', `Request body exceeds ${deps.env.BODY_LIMIT}`));
    if (err instanceof TooDeepError || err.type === 'entity.verify.failed')
      return sendError(
        res,
        new AppError('BAD_REQUEST', `The JSON body is nested deeper than ${maxDepth} levels`),
      );
    if (err.type === 'entity.parse.failed')
      return sendError(res, new AppError('BAD_REQUEST', 'Malformed JSON in request body'));
    if (err.status && err.status >= 400 && err.status < 500)
      return sendError(res, new AppError('BAD_REQUEST', 'Bad request'));
    sendError(res, error, deps.logger);
  });
  return app;
}

/** /api/docs: Swagger UI served from this server, so it works behind a firewall with no internet. */
function mountApiReference(app: express.Express) {
  // The package's main module loads the whole UI bundle; only its directory is needed.
  const assets = dirname(require.resolve('swagger-ui-dist/package.json'));
  app.use('/api/docs/assets', express.static(assets, { index: false }));
  app.get('/api/docs/init.js', (_req, res) => {
    res
      .type('application/javascript')
      .send(
        `window.ui = SwaggerUIBundle({ url: '/api/openapi.json', dom_id: '#ui', deepLinking: true, persistAuthorization: true });`,
      );
  });
  app.get(['/api/docs', '/api/docs/'], (_req, res) => {
    res.type('html').send(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dimas API reference</title>
<link rel="stylesheet" href="/api/docs/assets/swagger-ui.css"></head>
<body><div id="ui"></div>
<script src="/api/docs/assets/swagger-ui-bundle.js"></script>
<script src="/api/docs/init.js"></script></body></html>`);
  });
}
