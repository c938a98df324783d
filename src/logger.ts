import { randomUUID } from 'node:crypto';
import { mkdirSync, openSync, write, writeSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { join } from 'node:path';
import pino, { type Logger } from 'pino';

export type { Logger };

/** Lines gathered beyond this many characters are written at once rather than at the end of the turn. */
const BATCH_CHARS = 64 * 1024;

/**
 * The log file, written in batches: the lines of one turn of the event loop go out in one write.
 * pino's file stream (sonic-boom) appends each line to a growing string and measures its byte length
 * again, a copy of up to 16 KB per line under load that made the log line the largest allocation of a
 * request; here a line costs an array push. A crash loses the lines of the current turn at most; the
 * process's exit, the log download and a clean stop write everything first.
 */
class LogFile {
  readonly #fd: number;
  #lines: string[] = [];
  #chars = 0;
  #writing = false;
  #scheduled = false;
  #idle: (() => void)[] = [];

  constructor(path: string) {
    this.#fd = openSync(path, 'a');
    openFiles.add(this);
  }

  write(line: string): boolean {
    this.#lines.push(line);
    this.#chars += line.length;
    if (this.#writing) return true;
    if (this.#chars >= BATCH_CHARS) this.#writeBatch();
    else if (!this.#scheduled) {
      this.#scheduled = true;
      setImmediate(() => {
        this.#scheduled = false;
        if (!this.#writing) this.#writeBatch();
      });
    }
    return true;
  }

  #writeBatch(): void {
    if (!this.#lines.length) {
      for (const resolve of this.#idle.splice(0)) resolve();
      return;
    }
    const batch = Buffer.from(this.#lines.join(''));
    this.#lines = [];
    this.#chars = 0;
    this.#writing = true;
    const writeFrom = (offset: number) =>
      write(this.#fd, batch, offset, batch.length - offset, null, (error, written) => {
        if (!error && offset + written < batch.length) return writeFrom(offset + written);
        // A log file that cannot be written (a full disk) must not take the API down with it.
        if (error) process.stderr.write(`dimas: writing the log file failed: ${error.message}\n`);
        this.#writing = false;
        this.#writeBatch();
      });
    writeFrom(0);
  }

  /** Resolves once every line written so far is in the file. */
  flush(): Promise<void> {
    if (!this.#writing && !this.#lines.length) return Promise.resolve();
    return new Promise((resolve) => {
      this.#idle.push(resolve);
      if (!this.#writing) this.#writeBatch();
    });
  }

  /** At exit: what is still gathered, synchronously (a write in flight completes on its own). */
  flushSync(): void {
    if (!this.#lines.length) return;
    const lines = this.#lines.join('');
    this.#lines = [];
    try {
      writeSync(this.#fd, lines);
    } catch {
      // Nothing more can be done for a log line while the process exits.
    }
  }
}

const openFiles = new Set<LogFile>();
process.once('exit', () => {
  for (const file of openFiles) file.flushSync();
});

/**
 * One logger for the process: to stdout (unless `stdout: false`), and to DIMAS_DATA_DIR/logs so that
 * super admins can download the control-plane log. Secrets never reach it: request bodies are not
 * logged and the Authorization header is redacted.
 */
export function createLogger(options: { level: string; logDir?: string; stdout?: boolean }): Logger {
  const streams: pino.StreamEntry[] = options.stdout === false ? [] : [{ stream: process.stdout }];
  let file: LogFile | undefined;
  if (options.logDir) {
    mkdirSync(options.logDir, { recursive: true });
    file = new LogFile(join(options.logDir, 'dimas.log'));
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

const logFiles = new WeakMap<Logger, LogFile>();

/** Writes out the lines still gathered for the log file (before it is read, or the process stops). */
export function flushLogFile(logger: Logger): Promise<void> {
  return logFiles.get(logger)?.flush() ?? Promise.resolve();
}

/**
 * The URL as the client sent it, read before any mount (`app.use('/trpc')`, the docs assets) strips its
 * prefix. Subscriptions carry the token in `connectionParams` of the query string: that value is masked.
 */
function loggedUrl(url: string): string {
  if (!url.includes('connectionParams=')) return url;
  return url.replace(/([?&]connectionParams=)[^&]*/, '$1[redacted]');
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
    const url = loggedUrl(req.url ?? '');
    // 'close' follows 'finish' on every response, and is the only event of an aborted one.
    res.once('close', () => {
      const aborted = !res.writableFinished;
      lines[res.statusCode >= 500 ? 'error' : aborted ? 'warn' : 'info'](
        {
          requestId: id,
          method: req.method,
          url,
          statusCode: res.statusCode,
          responseTime: Math.round(performance.now() - start),
        },
        aborted ? 'request aborted' : 'request completed',
      );
    });
    next();
  };
}
