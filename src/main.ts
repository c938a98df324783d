import { setFlagsFromString } from 'node:v8';
import { loadEnv } from './env.ts';
import { startServer } from './server.ts';

let env;
try {
  env = loadEnv();
} catch (error) {
  console.error((error as Error).message);
  process.exit(1);
}

// With a database server PGlite never loads, and the WebAssembly that runs is the SQL parser's
// (libpg-query). V8's optimizing tier compiles its generated grammar function with ~600 MB of scratch
// memory, to save a fraction of a millisecond per parse: the baseline tier is kept instead. The
// embedded mode keeps the optimizing tier, which PGlite's executor needs. Set before the parser loads.
if (env.DATABASE_URL) setFlagsFromString('--no-wasm-tier-up --no-wasm-dynamic-tiering');

// A reader of stdout that goes away (a log shipper restarting, a closed terminal) must not take the
// API down with an EPIPE: the log files in the data directory still receive every line.
process.stdout.on('error', () => {});

const running = await startServer(env);
const { logger } = running.deps;
logger.info({ url: running.url, database: running.deps.dbKind }, 'dimas is listening');
console.log(`\ndimas is listening on ${running.url} (database: ${running.deps.dbKind})`);
console.log(`API reference: ${running.url}/api/docs`);
for (const line of running.seedReport.lines) console.log(line);
if (running.seedReport.lines.length) console.log(`(kept in ${env.dataDir}/credentials.txt)`);

let stopping = false;
async function shutdown(signal: string) {
  if (stopping) return;
  stopping = true;
  logger.info({ signal }, 'shutting down');
  try {
    await running.close();
    console.log('dimas stopped cleanly');
    process.exit(0);
  } catch (error) {
    logger.error({ err: error }, 'shutdown failed');
    process.exit(1);
  }
}
process.on('SIGTERM', () => void shutdown('SIGTERM'));
process.on('SIGINT', () => void shutdown('SIGINT'));
