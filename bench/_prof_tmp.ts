import pg from 'pg';
import { resolveIdentities } from '../src/quality/identity-graph.ts';
const admin = new pg.Client({ connectionString: 'postgresql://postgres@127.0.0.1:5432/postgres' });
await admin.connect();
await admin.query('drop database if exists dimas_prof');
await admin.query('create database dimas_prof');
const c = new pg.Client({ connectionString: 'postgresql://postgres@127.0.0.1:5432/dimas_prof' });
await c.connect();
const blocks = Number(process.env.BLOCKS ?? 5883);
await c.query('create schema bench');
await c.query(`create table bench.ident_src as
    select g as id, 'E' || (g / 8) || '_' || ((g % 8) / 2) || '@Example.com ' as email,
      '+1 (555) ' || lpad((g / 8)::text, 7, '0') || '-' || ((g % 8 + 1) / 2) as phone, 'C' || g as customer_id
    from generate_series(0, ${blocks * 8 - 1}) g`);
const runner = {
  query: async (sql: string, params?: unknown[]) => {
    const t = performance.now();
    const r = await c.query(sql, params);
    const ms = performance.now() - t;
    if (ms > 500) console.log(ms.toFixed(0), sql.slice(0, 160).replace(/\s+/g, ' '));
    return r;
  },
};
const r = await resolveIdentities(runner, {
  schema: 'bi',
  sources: [
    {
      table: { schema: 'bench', name: 'ident_src' },
      keyColumn: 'id',
      identifiers: [
        { column: 'email', type: 'email' },
        { column: 'phone', type: 'phone' },
        { column: 'customer_id', type: 'customer_id' },
      ],
    },
  ],
});
console.log(r);
await c.end();
await admin.query('drop database dimas_prof with (force)');
await admin.end();
