import { createHash } from 'node:crypto';
import { stringify } from 'yaml';
import { AppError } from '../app-error.ts';
import {
  planMapping,
  type Mapping,
  type MappingPlan,
  type PlanOptions,
  type TargetTable,
} from './mapping.ts';
import { selectSqlFromPlan } from './sql.ts';
import { POSTGRES_TYPES } from '../warehouse/types.ts';
import { quoteIdent } from '../warehouse/postgres.ts';
import { PROFILE_TABLE, goldenRecordSelect, type GoldenRecordOptions } from '../quality/golden-records.ts';

/*
 * The transformation project (DESIGN §5): a dbt-compatible tree generated from the committed
 * mappings and the target schema. Pure functions: the caller stores or zips the files.
 *
 * Column tests come from the column test configs (`tests` on a schema.json column, or passed in):
 * `{ not_null?: true, unique?: true, accepted_values?: [..] | { values: [..] },
 *    relationships?: { to: '<target table>', field: '<column>' } }`. Primary-key columns always get
 * not_null and NOT NULL columns get not_null, because the database enforces them too. A one-column
 * key gets `unique`; a composite key is unique only as a combination (one order has several lines),
 * so it gets a singular test of its own, `tests/<table>_primary_key.sql`, which needs no package.
 */

interface ColumnTestConfig {
  not_null?: boolean;
  unique?: boolean;
  accepted_values?: unknown[] | { values: unknown[]; quote?: boolean };
  relationships?: { to: string; field: string };
  [key: string]: unknown;
}

export interface DbtModelInput {
  mapping: Mapping;
  target: TargetTable;
}

export interface DbtProjectOptions extends PlanOptions {
  /** dbt project and profile name; letters, digits and _ (others are replaced). */
  projectName: string;
  models: DbtModelInput[];
  /** Schema of source tables whose key has none (default public). */
  defaultSourceSchema?: string;
  /** Column test configs by target table and column; merged over `tests` of the schema columns. */
  columnTests?: Record<string, Record<string, ColumnTestConfig>>;
  /** The identity graph's unified profiles, as its last build made them: a model of the project. */
  identityProfile?: GoldenRecordOptions;
}

export interface ProjectFile {
  path: string;
  content: string;
}

type DataTest = string | Record<string, unknown>;

function dbtName(name: string): string {
  const cleaned = name.toLowerCase().replace(/[^a-z0-9_]/g, '_');
  return /^[a-z_]/.test(cleaned) ? cleaned : `_${cleaned}`;
}

const jinjaString = (value: string) => `'${value.replaceAll('\\', '\\\\').replaceAll("'", "\\'")}'`;

function dataTests(
  config: ColumnTestConfig | undefined,
  implied: { unique: boolean; notNull: boolean },
): DataTest[] {
  const tests: DataTest[] = [];
  if (implied.unique || config?.unique) tests.push('unique');
  if (implied.notNull || config?.not_null) tests.push('not_null');
  const accepted = config?.accepted_values;
  if (accepted) {
    const values = Array.isArray(accepted) ? accepted : accepted.values;
    const quote = Array.isArray(accepted) ? undefined : accepted.quote;
    tests.push({ accepted_values: { values, ...(quote === undefined ? {} : { quote }) } });
  }
  if (config?.relationships)
    tests.push({
      relationships: {
        to: `ref(${jinjaString(config.relationships.to)})`,
        field: config.relationships.field,
      },
    });
  return tests;
}

/** A fingerprint of what the project is generated from, so drift can be detected later. */
export function projectFingerprint(options: DbtProjectOptions): string {
  const canonical = (value: unknown): unknown =>
    Array.isArray(value)
      ? value.map(canonical)
      : value && typeof value === 'object'
        ? Object.fromEntries(
            Object.keys(value)
              .sort()
              .map((k) => [k, canonical((value as Record<string, unknown>)[k])]),
          )
        : value;
  const input = {
    projectName: options.projectName,
    defaultSourceSchema: options.defaultSourceSchema ?? 'public',
    includeSuggested: options.includeSuggested ?? true,
    columnTests: options.columnTests ?? {},
    models: [...options.models]
      .sort((a, b) => a.target.name.localeCompare(b.target.name))
      .map((m) => ({
        target: m.target,
        tables: m.mapping.tables,
        connections: m.mapping.connections,
        transformations: m.mapping.transformations ?? {},
      })),
  };
  return createHash('sha256')
    .update(JSON.stringify(canonical(input)))
    .digest('hex');
}

export async function generateDbtProject(options: DbtProjectOptions): Promise<ProjectFile[]> {
  const name = dbtName(options.projectName);
  const defaultSchema = options.defaultSourceSchema ?? 'public';
  const models = [...options.models].sort((a, b) => a.target.name.localeCompare(b.target.name));
  const seen = new Set<string>();
  for (const m of models) {
    if (seen.has(m.target.name))
      throw new AppError('BAD_REQUEST', `Two mappings for target table ${m.target.name}`);
    seen.add(m.target.name);
  }

  const plans: MappingPlan[] = [];
  for (const m of models) plans.push(await planMapping(m.mapping, m.target, options));

  const sources = new Map<string, Set<string>>();
  const files: ProjectFile[] = [];
  for (const plan of plans) {
    const { sql } = selectSqlFromPlan(plan, {
      renderTable: (table) => {
        const schema = table.schema ?? defaultSchema;
        if (!sources.has(schema)) sources.set(schema, new Set());
        sources.get(schema)!.add(table.name);
        return `{{ source(${jinjaString(schema)}, ${jinjaString(table.name)}) }}`;
      },
    });
    files.push({
      path: `models/${plan.target.name}.sql`,
      content: `-- Generated by dimas from the mapping of ${plan.target.name}; regenerate instead of editing.\n${sql}\n`,
    });
  }

  const profile = options.identityProfile;
  if (profile) {
    const use = (schema: string, table: string) => {
      if (!sources.has(schema)) sources.set(schema, new Set());
      sources.get(schema)!.add(table);
      return `{{ source(${jinjaString(schema)}, ${jinjaString(table)}) }}`;
    };
    const sql = goldenRecordSelect(profile, {
      graph: (table) => use(profile.schema, table),
      source: (table) => use(table.schema, table.name),
    });
    files.push({
      path: `models/${PROFILE_TABLE}.sql`,
      content: `-- Generated by dimas from the identity graph's last build; regenerate instead of editing.\n${sql}\n`,
    });
  }

  const project = {
    name,
    version: '1.0.0',
    'config-version': 2,
    profile: name,
    'model-paths': ['models'],
    'test-paths': ['tests'],
    'target-path': 'target',
    'clean-targets': ['target', 'dbt_packages'],
    models: { [name]: { '+materialized': 'table' } },
  };

  const profileModel = profile
    ? [
        {
          name: PROFILE_TABLE,
          description:
            'One row per identity cluster; each field chosen by its survivorship rule, lineage per field',
          columns: [
            {
              name: 'cluster_id',
              description: '',
              data_type: 'bigint',
              quote: true,
              data_tests: ['unique', 'not_null'],
            },
            ...profile.fields.map((f) => ({
              name: f.name,
              description: `rule: ${f.rule}`,
              data_type: 'text',
              quote: true,
            })),
            { name: 'lineage', description: 'field -> {table, record_key}', data_type: 'jsonb', quote: true },
          ],
        },
      ]
    : [];
  // The composite keys' uniqueness, as singular tests: rows returned are the duplicated combinations.
  const keyTests: ProjectFile[] = plans
    .filter((plan) => (plan.target.primary_key ?? []).length > 1)
    .map((plan) => {
      const columns = plan.target.primary_key!.map(quoteIdent).join(', ');
      return {
        path: `tests/${plan.target.name}_primary_key.sql`,
        content:
          `-- Generated by dimas: the primary key of ${plan.target.name} is unique as a combination; regenerate instead of editing.\n` +
          `select ${columns}, count(*) as duplicates\nfrom {{ ref(${jinjaString(plan.target.name)}) }}\n` +
          `group by ${columns}\nhaving count(*) > 1\n`,
      };
    });

  const schemaYml = {
    version: 2,
    models: [
      ...plans.map((plan) => {
        const primaryKey = new Set(plan.target.primary_key ?? []);
        const singleKey = primaryKey.size === 1;
        return {
          name: plan.target.name,
          description: plan.target.description ?? '',
          columns: plan.columns.map((column) => {
            const schemaColumn = plan.target.columns.find((c) => c.name === column.name);
            const config = {
              ...((schemaColumn?.tests as ColumnTestConfig | undefined) ?? {}),
              ...(options.columnTests?.[plan.target.name]?.[column.name] ?? {}),
            };
            const inKey = primaryKey.has(column.name);
            const tests = dataTests(config, {
              unique: inKey && singleKey,
              notNull: inKey || !column.nullable,
            });
            return {
              name: column.name,
              description: column.description ?? '',
              data_type: POSTGRES_TYPES[column.type],
              // The model names every column quoted (`AS "UserId"`): dbt's tests must too.
              quote: true,
              ...(tests.length ? { data_tests: tests } : {}),
            };
          }),
        };
      }),
      ...profileModel,
    ],
  };

  const sourcesYml = {
    version: 2,
    sources: [...sources.keys()].sort().map((schema) => ({
      name: schema,
      schema,
      tables: [...sources.get(schema)!].sort().map((table) => ({ name: table })),
    })),
  };

  const header = '# Generated by dimas; regenerate instead of editing.\n';
  return [
    { path: 'dbt_project.yml', content: header + stringify(project) },
    { path: 'models/schema.yml', content: header + stringify(schemaYml) },
    { path: 'models/sources.yml', content: header + stringify(sourcesYml) },
    ...files,
    ...keyTests,
  ];
}
