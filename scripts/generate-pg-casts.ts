/**
 * Writes src/llm/pg-casts.json: the built-in types of a PostgreSQL server and their casts, which the
 * matcher's type rule (src/llm/pg-casts.ts) reads. Run it against a database without extensions;
 * test/pg-casts.test.ts fails when the file and the test server's catalog differ.
 *
 *   node scripts/generate-pg-casts.ts [postgresql://postgres@127.0.0.1:5432/postgres]
 *
 * Read from the oldest server version in use: later versions only add casts (PostgreSQL 18 adds
 * bytea to and from smallint, integer and bigint), and a cast the table lacks only costs a
 * suggestion, while one it has and the server lacks fails the generated SQL.
 */
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import * as prettier from 'prettier';
import { readCastCatalog } from '../src/llm/pg-cast-catalog.ts';

const url = process.argv[2] ?? process.env.DATABASE_URL ?? 'postgresql://postgres@127.0.0.1:5432/postgres';
const client = new pg.Client({ connectionString: url });
await client.connect();
try {
  const catalog = await readCastCatalog(async (sql, params) => (await client.query(sql, params)).rows);
  const out = fileURLToPath(new URL('../src/llm/pg-casts.json', import.meta.url));
  // As the repository's formatter writes it, so that reading the same catalog again changes nothing.
  const text = await prettier.format(
    JSON.stringify({ generated_by: 'scripts/generate-pg-casts.ts', ...catalog }),
    { ...(await prettier.resolveConfig(out)), filepath: out },
  );
  writeFileSync(out, text);
  const casts = Object.values(catalog.types).reduce((n, t) => n + t.casts.length, 0);
  console.log(
    `${out}: ${Object.keys(catalog.types).length} types, ${casts} casts, ${Object.keys(catalog.names).length} other spellings (PostgreSQL ${catalog.server_version})`,
  );
} finally {
  await client.end();
}
