// The child process of createDataDirInChildProcess: creates one PGlite data directory and exits.
import { PGlite } from '@electric-sql/pglite';
import { embeddedInstanceOptions } from './embedded.ts';

const db = await PGlite.create(process.argv[2], await embeddedInstanceOptions());
await db.close();
