import { randomUUID } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { join } from 'node:path';
import pino, { type Logger } from 'pino';

export type { Logger };

/**
 * One logger for the process: to stdout, and to DIMAS_DATA_DIR/logs so that super admins can
 * download the control-plane log. Secrets never reach it: request bodies are not logged and the
 * Authorization header is redacted.
 */
export function createLogger(options: { level: string; logDir?: string }): Logger {
  const streams: pino.StreamEntry[] = [{ stream: process.stdout }];
  if (options.logDir) {
    mkdirSync(options.logDir, { recursive: true });
    streams.push({ stream: pino.destination({ dest: join(options.logDir, 'dimas.log'), sync: false }) });
  }
  return pino(
    {
      level: options.level,
      redact: ['req.headers.authorization', 'req.headers.cookie', '*.password', '*.token'],
    },
    pino.multistream(streams),
  );
}

/**
 * One line per request when its response is done: id, method, url, status and time. The id comes from
 * `x-request-id` when the caller sends one and is echoed back. Written here rather than with pino-http,
 * which builds a child logger per request and cost a tenth of a cached authenticated call.
 */
export function requestLogger(logger: Logger) {
  return (req: IncomingMessage & { id?: string }, res: ServerResponse, next: () => void): void => {
    const id = (req.headers['x-request-id'] as string | undefined)?.slice(0, 100) || randomUUID();
    req.id = id;
    res.setHeader('x-request-id', id);
    const start = performance.now();
    // 'close' follows 'finish' on every response, and is the only event of an aborted one.
    res.once('close', () => {
      const aborted = !res.writableFinished;
      logger[res.statusCode >= 500 ? 'error' : aborted ? 'warn' : 'info'](
        {
          req: { id, method: req.method, url: req.url },
          res: { statusCode: res.statusCode },
          responseTime: Math.round(performance.now() - start),
        },
        aborted ? 'request aborted' : 'request completed',
      );
    });
    next();
  };
}
