import { mkdirSync } from 'node:fs';
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
