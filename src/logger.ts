import { randomUUID } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { join } from 'node:path';
import pino, { type Logger } from 'pino';

export type { Logger };

/**
 * Bytes of log lines gathered before a write to the log file: one write per few dozen requests
 * instead of one per request, which under load cost more than serializing the lines. A crash loses
 * at most this much; a clean stop and the log download flush first.
 */
const LOG_FILE_BUFFER_BYTES = 4096;

/**
 * One logger for the process: to stdout (unless `stdout: false`), and to DIMAS_DATA_DIR/logs so that
 * super admins can download the control-plane log. Secrets never reach it: request bodies are not
 * logged and the Authorization header is redacted.
 */
export function createLogger(options: { level: string; logDir?: string; stdout?: boolean }): Logger {
  const streams: pino.StreamEntry[] = options.stdout === false ? [] : [{ stream: process.stdout }];
  let file: ReturnType<typeof pino.destination> | undefined;
  if (options.logDir) {
    mkdirSync(options.logDir, { recursive: true });
    const dest = join(options.logDir, 'dimas.log');
    file = pino.destination({ dest, sync: false, minLength: LOG_FILE_BUFFER_BYTES });
    streams.push({ stream: file });
  }
  const logger = pino(
    {
      level: options.level,
      redact: ['req.headers.authorization', 'req.headers.cookie', '*.password', '*.token'],
    },
    pino.multistream(streams),
  );
  if (file) logFiles.set(logger, file);
  return logger;
}

const logFiles = new WeakMap<Logger, ReturnType<typeof pino.destination>>();

/** Writes out the lines still gathered for the log file (before it is read, or the process stops). */
export function flushLogFile(logger: Logger): Promise<void> {
  const file = logFiles.get(logger);
  if (!file || (file as unknown as { destroyed: boolean }).destroyed) return Promise.resolve();
  return new Promise((resolve) => file.flush(() => resolve()));
}

/**
 * One line per request when its response is done: request id, method, url, status and milliseconds.
 * The id comes from `x-request-id` when the caller sends one and is echoed back; errors logged while
 * serving carry the same `requestId`. Written here rather than with pino-http, which builds a child
 * logger per request, and with flat fields, which pino writes without its nested-object serializer.
 */
export function requestLogger(logger: Logger) {
  // Request lines hold no field that redaction looks for (headers, passwords, tokens), and skipping it
  // saves a third of the cost of each line; every other line keeps the logger's redaction.
  const lines = logger.child({}, { redact: [] });
  return (req: IncomingMessage & { id?: string }, res: ServerResponse, next: () => void): void => {
    const id = (req.headers['x-request-id'] as string | undefined)?.slice(0, 100) || randomUUID();
    req.id = id;
    res.setHeader('x-request-id', id);
    const start = performance.now();
    // 'close' follows 'finish' on every response, and is the only event of an aborted one.
    res.once('close', () => {
      const aborted = !res.writableFinished;
      lines[res.statusCode >= 500 ? 'error' : aborted ? 'warn' : 'info'](
        {
          requestId: id,
          method: req.method,
          url: req.url,
          statusCode: res.statusCode,
          responseTime: Math.round(performance.now() - start),
        },
        aborted ? 'request aborted' : 'request completed',
      );
    });
    next();
  };
}
