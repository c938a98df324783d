import { Migration } from '@mikro-orm/migrations';

// The evidence object must answer `overlap` on every object the mapping view returns; evidence stored
// before it was measured has none, and only a rediscovery would refresh it.
const withOverlap = (item: string) =>
  `case when jsonb_typeof(${item}->'evidence') = 'object' and not jsonb_exists(${item}->'evidence', 'overlap')
     then jsonb_set(${item}, '{evidence,overlap}', 'null'::jsonb) else ${item} end`;

/**
 * Discovery's evidence gained `overlap` (the share of a source column's sampled values the target
 * column already holds). Stored evidence says null, "not measured", until the next discovery measures it.
 */
export class Migration20261126090000 extends Migration {
  override name = 'Migration20261126090000_evidence_overlap';

  override up(): void | Promise<void> {
    // jsonb_exists is the function behind ?, which would read as a placeholder.
    this.addSql(`update "mappings" set "connections" = (
        select jsonb_agg(${withOverlap('c')} order by i)
          from jsonb_array_elements("connections") with ordinality as e(c, i))
      where jsonb_typeof("connections") = 'array' and jsonb_array_length("connections") > 0;`);
    this.addSql(`update "mappings" set "ambiguities" = (
        select jsonb_agg(case when jsonb_typeof(a->'candidates') = 'array'
            then jsonb_set(a, '{candidates}', (
              select coalesce(jsonb_agg(${withOverlap('k')} order by j), '[]'::jsonb)
                from jsonb_array_elements(a->'candidates') with ordinality as f(k, j)))
            else a end order by i)
          from jsonb_array_elements("ambiguities") with ordinality as e(a, i))
      where jsonb_typeof("ambiguities") = 'array' and jsonb_array_length("ambiguities") > 0;`);
  }

  override down(): void | Promise<void> {
    // An older build reads evidence with an extra key as it did before; nothing to undo.
  }
}
