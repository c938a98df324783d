import {
  MAX_SAMPLE_LENGTH,
  parseProfileRow,
  PROFILE_COLUMNS_PER_QUERY,
  type ColumnProfile,
  type ProfileColumnInput,
  type ProfileQueryOptions,
  type QueryRunner,
} from '../llm/profile.ts';

const q = (name: string) => `\`${name.replaceAll('`', '``')}\``;
// Unit separator between sampled values: GROUP_CONCAT has no array form on MySQL 8.
const SEP = '\u001f';

/**
 * The profile of src/llm/profile.ts in MySQL SQL: one scan of the table's first rows, each column as
 * [non_null, blank, distinct, min_length, max_length] plus its distinct samples ordered by md5 (as
 * GROUP_CONCAT, cut to the sample size here). The row is then read by the same parser as PostgreSQL's.
 */
export async function mysqlProfileTable(
  run: QueryRunner,
  schema: string,
  table: string,
  columns: readonly ProfileColumnInput[],
  options: ProfileQueryOptions = {},
): Promise<ColumnProfile[]> {
  const rowLimit = options.rowLimit === undefined ? 10_000 : options.rowLimit;
  const sampleSize = Math.max(0, Math.floor(options.sampleSize ?? 20));
  const maxLen = Math.max(1, Math.floor(options.maxSampleLength ?? MAX_SAMPLE_LENGTH));
  const out: ColumnProfile[] = [];
  for (let start = 0; start < columns.length; start += PROFILE_COLUMNS_PER_QUERY) {
    const slice = columns.slice(start, start + PROFILE_COLUMNS_PER_QUERY);
    const selected = slice.map((c, i) => `${q(c.name)} as c${i}`).join(', ');
    const perColumn = slice.map((_, i) => {
      const t = `cast(c${i} as char)`;
      return `json_array(count(c${i}), coalesce(sum(trim(${t}) = ''), 0), count(distinct c${i}), min(char_length(${t})), max(char_length(${t}))) as p${i},
  group_concat(distinct case when trim(${t}) <> '' then concat(md5(${t}), left(${t}, ${maxLen})) end order by 1 separator '${SEP}') as s${i}`;
    });
    const params: unknown[] = [];
    let limit = '';
    if (rowLimit !== null) {
      params.push(Math.max(1, Math.floor(rowLimit)));
      limit = ' limit ?';
    }
    const sql = `select count(*) as row_count,\n  ${perColumn.join(',\n  ')}\nfrom (select ${selected} from ${q(schema)}.${q(table)}${limit}) sampled`;
    const rows = await run(sql, params);
    if (rows.length !== 1)
      throw new Error(`profile query for ${schema}.${table} returned ${rows.length} rows`);
    const row: Record<string, unknown> = { row_count: rows[0].row_count };
    slice.forEach((_, i) => {
      const raw = rows[0][`p${i}`];
      const cell = (typeof raw === 'string' ? JSON.parse(raw) : raw) as unknown[];
      const samples = rows[0][`s${i}`];
      const list = typeof samples === 'string' && samples ? samples.split(SEP).slice(0, sampleSize) : [];
      row[`p${i}`] = [...cell, list];
    });
    out.push(...parseProfileRow({ sql, params, columns: slice }, row));
  }
  return out;
}
