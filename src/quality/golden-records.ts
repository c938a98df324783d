import { createHash } from 'node:crypto';
import { CHANGED_CLUSTERS } from './identity-graph.ts';
import {
  defaultNormalizer,
  normalizerSteps,
  type IdentitySource,
  type Normalizer,
} from './identity-schema.ts';
import { qualified, quoteIdent, quoteLiteral, toNumber, type SqlRunner, type TableRef } from './sql.ts';

/*
 * Golden records: one row per identity cluster that holds a record, each field chosen among the
 * values that the cluster's member records hold, by a survivorship rule per field, with the record
 * it came from.
 *
 *   most_frequent    the value most records of the cluster hold; ties go to the most recent record,
 *                    then to the source listed first (the default rule)
 *   most_recent      the value of the record with the latest timestamp (the source's timestamp column)
 *   source_priority  the value from the first source in the priority list that has one
 *   first_non_null   the first value in source order, then record key order (byte order, as
 *                    the graph's records compare their keys)
 *
 * Ties left after a rule's order (rows of one record key that hold different values) go to the
 * value first in byte order, so that two builds of the same rows pick the same value.
 *
 * A record belongs to the cluster of its identifiers; identifiers flagged by the runaway-merge
 * guards (high degree, oversized component) do not place a record anywhere, so a record that carries
 * only flagged ones is in no profile: the build counts those by source table. A record key repeated
 * over rows that no identifier links can span clusters: it belongs to the cluster of its first
 * identifier (value, then type, in byte order). Not the smallest cluster id: an incremental build
 * numbers new identifiers after the old ones, a full build in value order, and the two must agree.
 */

export type SurvivorshipRule = 'most_frequent' | 'most_recent' | 'source_priority' | 'first_non_null';
export const DEFAULT_SURVIVORSHIP_RULE: SurvivorshipRule = 'most_frequent';

export const PROFILE_TABLE = 'unified_profiles';

export interface ProfileSource extends IdentitySource {
  /** The record's recency, for `most_recent` and for breaking ties. */
  timestampColumn?: string;
}

export interface ProfileField {
  name: string;
  rule: SurvivorshipRule;
  /** Where the field's values come from: a column of a source (by index in `sources`). */
  columns: { source: number; column: string; normalize?: Normalizer }[];
}

export interface GoldenRecordOptions {
  /** The identity graph's schema. */
  schema: string;
  sources: ProfileSource[];
  fields: ProfileField[];
  /** Source tables (`schema.table`) in priority order; unlisted ones follow in source order. */
  sourcePriority?: string[];
}

/** How the SQL names a relation: qualified tables when run, dbt `source()` calls in the project. */
export interface RelationNames {
  graph(table: 'identity_records' | 'identity_nodes' | 'identity_clusters'): string;
  source(table: TableRef): string;
}

const qualifiedRelations = (schema: string): RelationNames => ({
  graph: (table) => `${quoteIdent(schema)}.${table}`,
  source: (table) => qualified(table),
});

const ORDER_BY: Record<SurvivorshipRule, string> = {
  most_frequent: 'frequency desc, ts desc nulls last, priority, record_key',
  most_recent: 'ts desc nulls last, priority, record_key',
  source_priority: 'priority, ts desc nulls last, record_key',
  first_non_null: 'priority, record_key',
};

const tableName = (t: TableRef) => `${t.schema}.${t.name}`;

/**
 * The cluster a record belongs to, in a query grouped by `r.source_table, r.record_key` over its
 * identifiers' nodes `n`: almost every record's identifiers are in one cluster (one row links them),
 * and only a record whose identifiers are in several looks up its first identifier's.
 */
function ownerCluster(records: string, nodes: string) {
  return `case when min(n.cluster_id) = max(n.cluster_id) then min(n.cluster_id) else (
    select first.cluster_id from ${records} o join ${nodes} first on first.node_id = o.node_id
    where o.record_key = r.record_key and o.source_table = r.source_table and first.flagged is null
    order by first.id_value collate "C", first.id_type collate "C" limit 1) end`;
}

/**
 * The identifier type a field reads, when each of its columns is an identifier column of that type
 * normalised as the graph normalises it: its values are then the graph's identifiers, by value.
 */
function identifierTypeOf(field: ProfileField, sources: ProfileSource[]): string | null {
  const types = field.columns.map((column) => {
    const id = sources[column.source]?.identifiers.find((i) => i.column === column.column);
    const same = id && (id.normalize ?? defaultNormalizer(id.type)) === (column.normalize ?? 'trim');
    return same ? id.type : null;
  });
  return types.length > 0 && types.every((t) => t !== null && t === types[0]) ? types[0] : null;
}

function priorities(options: GoldenRecordOptions): number[] {
  const listed = options.sourcePriority ?? [];
  return options.sources.map((s, i) => {
    const at = listed.indexOf(tableName(s.table));
    return at === -1 ? listed.length + i : at;
  });
}

/**
 * The SELECT of the profile table: cluster_id, one text column per field, and `lineage`; one row per
 * cluster that holds a member record. A cluster of identifiers flagged by the runaway-merge guards
 * (a shared support phone, the singletons of an oversized component) has none, nor has one whose
 * only records belong to another cluster: its row would have been a person with every field null.
 * The graph's tables and its flags still list those identifiers.
 *
 * Each source is joined to the cluster members once, bringing every field's value from that source
 * in one row (`candidate`, one branch per source and per column of a field taken from it: a field
 * may read two columns of one source); each field then picks among the rows where it has a value.
 * Joining once per source instead of once per field and source took a fifth off the statement at
 * the benchmark's three fields over three sources (the join on the record key is a costly part),
 * and saves more the more fields read a source.
 */
export function goldenRecordSelect(
  options: GoldenRecordOptions,
  names: RelationNames,
  /** Only the profiles of the clusters of these member records: a relation of the refresh. */
  scope?: { members: string },
): string {
  const priority = priorities(options);
  const ctes = [
    scope
      ? `member as (select source_table, record_key, cluster_id from ${scope.members})`
      : `member as (
  select r.source_table, r.record_key,
    ${ownerCluster(names.graph('identity_records'), names.graph('identity_nodes'))} as cluster_id
  from ${names.graph('identity_records')} r join ${names.graph('identity_nodes')} n on n.node_id = r.node_id
  where n.flagged is null
  group by 1, 2)`,
  ];
  const branches: string[] = [];
  options.sources.forEach((source, index) => {
    const columnsOf = options.fields.map((field) => field.columns.filter((c) => c.source === index));
    const slots = Math.max(0, ...columnsOf.map((columns) => columns.length));
    if (slots === 0) return;
    if (!source.keyColumn) throw new Error(`Source ${tableName(source.table)} has no record key`);
    const ts = source.timestampColumn
      ? `t.${quoteIdent(source.timestampColumn)}::timestamptz`
      : 'null::timestamptz';
    for (let slot = 0; slot < slots; slot++) {
      // Each value is cleaned once per joined row, in a lateral subquery that `offset 0` keeps the
      // planner from merging into the outer one (it would copy the cleaning into the accepting step
      // again). It reads the member row too, so that it runs after the join: a refresh of a few
      // clusters cleans their records' values, not the whole source's.
      const cleaned: string[] = [];
      const values = columnsOf.map((columns, f) => {
        const column = columns[slot];
        if (!column) return `null::text as v${f}`;
        const { clean, accepted } = normalizerSteps(column.normalize ?? 'trim');
        cleaned.push(`${clean(`t.${quoteIdent(column.column)}::text`)} as c${cleaned.length}`);
        return `${accepted(`k.c${cleaned.length - 1}`)} as v${f}`;
      });
      branches.push(`select m.cluster_id, m.source_table, m.record_key, ${ts} as ts, ${priority[index]} as priority,
    ${values.join(', ')}
  from member m join ${names.source(source.table)} t on t.${quoteIdent(source.keyColumn)}::text = m.record_key
  cross join lateral (select m.record_key, ${cleaned.join(', ')} offset 0) k
  where m.source_table = ${quoteLiteral(tableName(source.table))}`);
    }
  });
  if (branches.length > 0) ctes.push(`candidate as (\n  ${branches.join('\n  union all\n  ')})`);
  options.fields.forEach((field, f) => {
    // A field of identifiers never takes one the runaway-merge guards flagged (a support line on
    // hundreds of records is no one's phone): the graph found it shared, so it is not the person's.
    // Few identifiers are flagged: a full build hashes them, a refresh looks its values up by key.
    const type = identifierTypeOf(field, options.sources);
    const own = type
      ? ` and not exists (select from ${names.graph('identity_nodes')} n
      where n.id_value = c.v${f} and n.id_type = ${quoteLiteral(type)} and n.flagged is not null)`
      : '';
    // Only the most_frequent rule orders by how many records hold the value: the others skip the window.
    const ranked =
      field.rule === 'most_frequent'
        ? `(select c.*, count(*) over (partition by cluster_id, v${f}) as frequency from candidate c where v${f} is not null${own}) c`
        : `candidate c where v${f} is not null${own}`;
    ctes.push(`f${f} as (
  select distinct on (cluster_id) cluster_id, v${f} as value, source_table, record_key
  from ${ranked}
  order by cluster_id, ${ORDER_BY[field.rule]}, v${f} collate "C")`);
  });
  const columns = options.fields.map((field, f) => `f${f}.value as ${quoteIdent(field.name)}`);
  const lineage = options.fields.map(
    (field, f) =>
      `${quoteLiteral(field.name)}, case when f${f}.cluster_id is not null then ` +
      `jsonb_build_object('table', f${f}.source_table, 'record_key', f${f}.record_key) end`,
  );
  const joins = options.fields.map((_, f) => `left join f${f} on f${f}.cluster_id = c.cluster_id`);
  return (
    `with ${ctes.join(',\n')}\n` +
    `select c.cluster_id, c.size as identifiers${columns.map((c) => `, ${c}`).join('')},\n` +
    `  jsonb_strip_nulls(jsonb_build_object(${lineage.join(', ') || ''})) as lineage\n` +
    `from ${names.graph('identity_clusters')} c\n${joins.join('\n')}\n` +
    // A refresh looks its few clusters up by the key; a full build semi-joins all members.
    (scope
      ? 'where c.cluster_id = any(array(select distinct cluster_id from member))'
      : 'where c.cluster_id in (select cluster_id from member)')
  );
}

/** What the profile table holds, as its build recorded it. */
export interface ProfileCounts {
  profiles: number;
  /**
   * Records of the graph (`identity_records`) in no profile: every identifier they carry is flagged
   * by the runaway-merge guards, which place no record (a form with only the support line on it, the
   * records of a component over `max_cluster_size`). Every other record is in exactly one profile.
   */
  recordsWithoutProfile: number;
  /** The same records by source table (`schema.table`), only tables that have some. */
  recordsWithoutProfileBySource: Record<string, number>;
}

export interface ProfileBuild extends ProfileCounts {
  /** `incremental`: only the clusters the graph's incremental build changed were rebuilt. */
  mode: 'full' | 'incremental';
}

/**
 * The table's comment: the SELECT's hash, the graph run the profiles were built after and their
 * counts, so that a refresh counts by what it changed rather than by reading the table, and a reader
 * of the graph learns them without counting (not every cluster has a profile, nor every record one).
 */
const STAMP =
  /^(dimas unified profiles: plan \w+, graph run \w+), profiles (\d+), records without profile (\{.*\})$/;

function parseStamp(comment: unknown): (ProfileCounts & { head: string }) | null {
  const recorded = STAMP.exec(String(comment ?? ''));
  if (!recorded) return null;
  let bySource: Record<string, number>;
  try {
    bySource = JSON.parse(recorded[3]) as Record<string, number>;
  } catch {
    return null;
  }
  const counts = Object.values(bySource);
  if (!counts.every((n) => Number.isSafeInteger(n) && n > 0)) return null;
  return {
    head: recorded[1],
    profiles: Number(recorded[2]),
    recordsWithoutProfile: counts.reduce((a, b) => a + b, 0),
    recordsWithoutProfileBySource: bySource,
  };
}

/** The counts of `<schema>.unified_profiles` as its last build recorded them (null without one). */
export async function recordedProfileCounts(
  runner: SqlRunner,
  schema: string,
): Promise<ProfileCounts | null> {
  const { rows } = await runner.query(`select obj_description(to_regclass($1), 'pg_class') as stamp`, [
    `${quoteIdent(schema)}.${PROFILE_TABLE}`,
  ]);
  const stamp = parseStamp(rows[0]?.stamp);
  return (
    stamp && {
      profiles: stamp.profiles,
      recordsWithoutProfile: stamp.recordsWithoutProfile,
      recordsWithoutProfileBySource: stamp.recordsWithoutProfileBySource,
    }
  );
}

/**
 * A scalar subquery: the records in no profile, as a jsonb object of counts by source table. They are
 * the records of the flagged identifiers that have no unflagged one. Few identifiers are flagged:
 * their records are looked up by index (the graph's keys are built by then), and each record's other
 * identifiers by its key, never by a join the planner could turn into a hash of every record.
 */
function recordsWithoutProfileSql(schema: string): string {
  const graph = (name: string) => `${quoteIdent(schema)}.${name}`;
  const [records, nodes] = [graph('identity_records'), graph('identity_nodes')];
  return `(select coalesce(jsonb_object_agg(source_table, records), '{}') from (
     select source_table, count(*) as records from (
       select distinct r.source_table, r.record_key from ${records} r
       where r.node_id = any(array(select node_id from ${nodes} where flagged is not null))) f
     where (select true from ${records} o
            cross join lateral (select flagged from ${nodes} n where n.node_id = o.node_id limit 1) n
            where o.record_key = f.record_key and o.source_table = f.source_table and n.flagged is null
            limit 1) is null
     group by source_table) c)`;
}

/** The counts of a jsonb object of them, as the driver returns it. */
const countsOf = (value: unknown): Record<string, number> =>
  Object.fromEntries(
    Object.entries((value ?? {}) as Record<string, unknown>).map(([k, v]) => [k, toNumber(v)!]),
  );

/**
 * Builds `<schema>.unified_profiles` from the graph, in the transaction of the graph's build that
 * calls it (readers see the previous profiles until commit).
 *
 * After an incremental graph build (`afterIncrementalGraph`), only the profiles of the clusters it
 * changed are rebuilt, when the table holds the profiles of the graph's previous build under the
 * same plan: the table's comment records the SELECT's hash and the graph run it was built after.
 * Otherwise (another plan, profiles of an older graph, a table someone replaced, or so many changed
 * clusters that a whole build is faster: `manyClustersChanged`) it is rebuilt whole.
 */
export async function buildGoldenRecords(
  runner: SqlRunner,
  options: GoldenRecordOptions,
  afterIncrementalGraph = false,
): Promise<ProfileBuild> {
  const table = `${quoteIdent(options.schema)}.${PROFILE_TABLE}`;
  const select = goldenRecordSelect(options, qualifiedRelations(options.schema));
  const plan = createHash('sha256').update(select).digest('hex');
  const { rows: runs } = await runner.query(
    `select run_id, clusters, flagged_nodes from ${quoteIdent(options.schema)}.identity_runs
     order by run_id desc limit 2`,
  );
  const stamp = (run: unknown) => `dimas unified profiles: plan ${plan}, graph run ${String(run ?? 'none')}`;
  // Without flagged identifiers every record is in a profile: nothing to count.
  const anyFlagged = !runs[0] || toNumber(runs[0].flagged_nodes) !== 0;
  let previous: ProfileCounts | null = null;
  if (afterIncrementalGraph && runs.length === 2) {
    const { rows } = await runner.query(`select obj_description(to_regclass($1), 'pg_class') as stamp`, [
      table,
    ]);
    const recorded = parseStamp(rows[0]?.stamp);
    if (recorded?.head === stamp(runs[1].run_id) && !(await manyClustersChanged(runner, runs[0].clusters)))
      previous = recorded;
  }
  let profiles: number;
  let withoutProfile: Record<string, number>;
  if (previous !== null) {
    const refreshed = await refreshChangedProfiles(runner, options, table, anyFlagged);
    profiles = previous.profiles + refreshed.profilesAdded;
    withoutProfile = refreshed.mayHaveMovedRecords
      ? countsOf((await runner.query(`select ${recordsWithoutProfileSql(options.schema)} as c`)).rows[0]?.c)
      : previous.recordsWithoutProfileBySource;
  } else {
    await runner.query(`drop table if exists ${table}`);
    await runner.query(`create table ${table} as ${select}`);
    await runner.query(`alter table ${table} add primary key (cluster_id)`);
    // Counted, not taken from the statement's row count, which PGlite does not report for `create
    // table as` (the graph's build counts its tables the same way); the records in no profile with them.
    const { rows } = await runner.query(
      `select (select count(*) from ${table}) as n,
         ${anyFlagged ? recordsWithoutProfileSql(options.schema) : `'{}'::jsonb`} as without`,
    );
    profiles = toNumber(rows[0]?.n) ?? 0;
    withoutProfile = countsOf(rows[0]?.without);
  }
  await runner.query(
    `comment on table ${table} is ${quoteLiteral(
      `${stamp(runs[0]?.run_id)}, profiles ${profiles}, records without profile ${JSON.stringify(withoutProfile)}`,
    )}`,
  );
  return {
    profiles,
    recordsWithoutProfile: Object.values(withoutProfile).reduce((a, b) => a + b, 0),
    recordsWithoutProfileBySource: withoutProfile,
    mode: previous === null ? 'full' : 'incremental',
  };
}

/**
 * A refresh rebuilds a changed cluster's profile from lookups of its records, a full build reads
 * every record once: per cluster the refresh cost 3-4.5 times as much (500,000 identifiers in three
 * sources, 125,000 profiles; 5% more people: 0.14 of a full build, 15%: 0.58, 30%: 1.42), so past
 * a fifth of the clusters changed all profiles are rebuilt. Below the floor a refresh takes well
 * under a second.
 */
const MANY_CHANGED_CLUSTERS_MIN = 1_000;
async function manyClustersChanged(runner: SqlRunner, clusters: unknown): Promise<boolean> {
  const { rows } = await runner.query(`select count(*) as changed from ${CHANGED_CLUSTERS} where not gone`);
  const changed = toNumber(rows[0]?.changed) ?? 0;
  return changed > MANY_CHANGED_CLUSTERS_MIN && changed * 5 > (toNumber(clusters) ?? 0);
}

/**
 * Rebuilds the profiles of the clusters the incremental graph build changed and of every cluster
 * whose members may have moved with them: a record key repeated over rows that no identifier links
 * can span clusters and belongs to its first identifier's, so a new row of it can take it from a
 * cluster no new record touched. The clusters of every identifier of a touched cluster's records
 * are rebuilt too, each from all of its records. The graph is read by index lookups of the changed
 * clusters (`= any(array(…))`, as the incremental build reads it), never by a join the planner
 * could turn into a scan of the graph. Answers how many profiles it added (less those it removed).
 *
 * And whether a record may have entered or left the records in no profile (`anyFlagged`: the graph
 * has flagged identifiers). An incremental build flags no identifier and unflags none, and only adds
 * rows: only a record with a new row changes, and only if it has a flagged identifier, now or before
 * (then still). Every such record is either among the touched ones, through an unflagged identifier,
 * or carries a flagged identifier of a changed cluster; when neither shows one, the count stands.
 */
async function refreshChangedProfiles(
  runner: SqlRunner,
  options: GoldenRecordOptions,
  table: string,
  anyFlagged: boolean,
): Promise<{ profilesAdded: number; mayHaveMovedRecords: boolean }> {
  const q = (sql: string) => runner.query(sql);
  const graph = (name: string) => `${quoteIdent(options.schema)}.${name}`;
  const [records, nodes] = [graph('identity_records'), graph('identity_nodes')];
  /** The records with an identifier in one of `clusters`' clusters. */
  const recordsOf = (clusters: string) =>
    `select distinct source_table, record_key from ${records}
     where node_id = any(array(select node_id from ${nodes}
       where cluster_id = any(array(select cluster_id from ${clusters})) and flagged is null))`;
  /** Every identifier row of the records listed in `listed`. */
  const rowsOf = (listed: string) =>
    `select r.source_table, r.record_key, r.node_id from ${records} r
     where r.record_key = any(array(select record_key from ${listed}))
       and (r.source_table, r.record_key) in (select source_table, record_key from ${listed})`;
  await q(
    `create temp table _gr_touched on commit drop as ${recordsOf(`${CHANGED_CLUSTERS} where not gone`)}`,
  );
  const moved =
    anyFlagged &&
    (
      await q(
        `select exists (select from ${nodes} where cluster_id = any(array(
             select cluster_id from ${CHANGED_CLUSTERS} where not gone)) and flagged is not null)
           or exists (select from (${rowsOf('_gr_touched')}) r
             where (select flagged from ${nodes} n where n.node_id = r.node_id) is not null) as moved`,
      )
    ).rows[0]?.moved === true;
  await q(
    `create temp table _gr_clusters on commit drop as
     select cluster_id from ${CHANGED_CLUSTERS} where not gone
     union
     select n.cluster_id from (${rowsOf('_gr_touched')}) r
     cross join lateral (select cluster_id from ${nodes} n where n.node_id = r.node_id and n.flagged is null limit 1) n`,
  );
  // Usually no cluster was added to the touched ones, and their records are already listed.
  await q(
    `create temp table _gr_records on commit drop as select * from _gr_touched union ${recordsOf(
      `_gr_clusters except select cluster_id from ${CHANGED_CLUSTERS} where not gone`,
    )}`,
  );
  await q(
    `create temp table _gr_members on commit drop as
     select * from (
       select r.source_table, r.record_key, ${ownerCluster(records, nodes)} as cluster_id
       from (${rowsOf('_gr_records')}) r
       cross join lateral (select cluster_id from ${nodes} n where n.node_id = r.node_id and n.flagged is null limit 1) n
       group by 1, 2) m
     where cluster_id = any(array(select cluster_id from _gr_clusters))`,
  );
  await q('analyze _gr_clusters, _gr_members');
  const deleted = await q(
    `delete from ${table} where cluster_id = any(array(
       select cluster_id from ${CHANGED_CLUSTERS} union select cluster_id from _gr_clusters))`,
  );
  const inserted = await q(
    `insert into ${table} ${goldenRecordSelect(options, qualifiedRelations(options.schema), {
      members: '_gr_members',
    })}`,
  );
  return { profilesAdded: (inserted.rowCount ?? 0) - (deleted.rowCount ?? 0), mayHaveMovedRecords: moved };
}

/** How a build records its profile plan (in its summary), so the project can regenerate the SQL. */
export interface RecordedProfilePlan {
  sources: {
    table: string;
    identifiers: { column: string; type: string }[];
    key_column: string | null;
    timestamp_column: string | null;
  }[];
  profile_fields?: {
    name: string;
    rule: SurvivorshipRule;
    columns?: { table: string; column: string; normalize?: Normalizer }[];
  }[];
  source_priority?: string[];
}

/** The golden-record options of a recorded build (null when it recorded no field columns). */
export function profileOptionsOf(schema: string, recorded: RecordedProfilePlan): GoldenRecordOptions | null {
  const sources: ProfileSource[] = recorded.sources.map((s) => {
    const [tableSchema, name] = s.table.split('.');
    return {
      table: { schema: tableSchema, name },
      identifiers: s.identifiers,
      ...(s.key_column ? { keyColumn: s.key_column } : {}),
      ...(s.timestamp_column ? { timestampColumn: s.timestamp_column } : {}),
    };
  });
  const fields: ProfileField[] = [];
  for (const field of recorded.profile_fields ?? []) {
    if (!field.columns) return null;
    fields.push({
      name: field.name,
      rule: field.rule,
      columns: field.columns.map((c) => ({
        source: recorded.sources.findIndex((s) => s.table === c.table),
        column: c.column,
        ...(c.normalize ? { normalize: c.normalize } : {}),
      })),
    });
  }
  if (fields.some((f) => f.columns.some((c) => c.source < 0))) return null;
  return { schema, sources, fields, sourcePriority: recorded.source_priority ?? [] };
}
