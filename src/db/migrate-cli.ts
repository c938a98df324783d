import { join } from 'node:path';
import { loadEnv } from '../env.ts';
import { migrate, openDatabase } from './orm.ts';

/** `npm run db:migrate`: applies pending migrations to DATABASE_URL, or to the embedded database. */
const env = loadEnv();
const db = await openDatabase({
  databaseUrl: env.DATABASE_URL,
  dataDir: env.DATABASE_URL ? undefined : join(env.dataDir, 'pg'),
});
await migrate(db.orm);
await db.close();
console.log('migrations applied');
