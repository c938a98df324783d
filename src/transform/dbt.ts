import { createHash } from 'node:crypto';
import { parse as parseYaml, stringify } from 'yaml';
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
import type { ColumnTestConfig } from '../quality/rules.ts';
import { tableTests } from '../quality/table-tests.ts';

/*
 * The transformation project (DESIGN §5): a dbt-compatible tree generated from the committed
 * mappings and the target schema. Pure functions: the caller stores or zips the files.
 *
 * A table's tests are the list of src/quality/table-tests.ts, the one the monitoring runner runs:
 * each column's `tests` (from schema.json, or passed in) plus not_null on key and NOT NULL columns
 * and unique on a one-column key; a composite key is unique only as a combination, a singular test
 * of its own, `tests/<table>_primary_key.sql`, which needs no package. range and regex have no
 * dbt test and stay monitoring's.
 *
 * Names and values are written so that dbt reads them as they are (see dbtText and the sources):
 * columns are `quote: true` (the model names each one quoted); relationships' `field`, which dbt's
 * test writes as given, is written quoted; accepted values double their single quotes, which dbt's
 * test puts between quotes as given; source and table names that are no plain dbt names get one,
 * their real schema and identifier written beside (pre-quoted when they hold a double quote, which
 * dbt does not escape).
 */

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

function dbtName(name: string): string {
  const cleaned = name.toLowerCase().replace(/[^a-z0-9_]/g, '_');
  return /^[a-z_]/.test(cleaned) ? cleaned : `_${cleaned}`;
}

const jinjaString = (value: string) => `'${value.replaceAll('\\', '\\\\').replaceAll("'", "\\'")}'`;

/**
 * A YAML string dbt reads as this very text. dbt renders test arguments and most schema.yml and
 * sources.yml values as Jinja (a value holding `{{`, `{%`, `{#` and their closings), and calls
 * ref(), source(), var(), env_var() and doc() written bare: such a value is given as a Jinja string
 * expression instead, which renders to itself.
 */
function dbtText(value: string): string {
  return /\{[{%#]|[#%}]\}/.test(value) || /^\s*(env_var|ref|var|source|doc)\s*\(/.test(value)
    ? `{{ ${jinjaString(value)} }}`
    : value;
}

/** The text dbtText wrote, or a Jinja string expression's value. */
function readDbtText(value: string): string {
  const m = /^\{\{ '((?:[^'\\]|\\.)*)' \}\}$/s.exec(value);
  return m ? m[1].replace(/\\(.)/gs, '$1') : value;
}

/** Model SQL as Jinja reads it: a `{` opening a Jinja tag in the SQL (a name, a literal) is printed. */
const escapeJinja = (sql: string) => sql.replace(/\{(?=[{%#])/g, "{{ '{' }}");

const DBT_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** A dbt name for a source or table: itself when plain, else a readable one made unique by a hash. */
function sourceName(name: string): string {
  if (DBT_NAME.test(name)) return name;
  const hash = createHash('sha256').update(name).digest('hex').slice(0, 8);
  return `${dbtName(name).slice(0, 40)}_${hash}`;
}

/** The sources the models read, named for dbt; `source()` calls and sources.yml come from here. */
class Sources {
  private readonly schemas = new Map<string, Set<string>>();

  use(schema: string, table: string): string {
    if (!this.schemas.has(schema)) this.schemas.set(schema, new Set());
    this.schemas.get(schema)!.add(table);
    return `{{ source(${jinjaString(sourceName(schema))}, ${jinjaString(sourceName(table))}) }}`;
  }

  yml() {
    // dbt quotes a name between double quotes without doubling one inside: such a name is written
    // quoted, with quoting off.
    const quoted = (name: string) => (name.includes('"') ? quoteIdent(name) : name);
    return {
      version: 2,
      sources: [...this.schemas.keys()].sort().map((schema) => ({
        name: sourceName(schema),
        schema: dbtText(quoted(schema)),
        ...(schema.includes('"') ? { quoting: { schema: false } } : {}),
        tables: [...this.schemas.get(schema)!].sort().map((table) => ({
          name: sourceName(table),
          ...(sourceName(table) === table ? {} : { identifier: dbtText(quoted(table)) }),
          ...(table.includes('"') ? { quoting: { identifier: false } } : {}),
        })),
      })),
    };
  }
}

/** SQL written by `write`, its `{{ source() }}` calls inserted after the rest is Jinja-escaped. */
function modelSql(write: (source: (schema: string, table: string) => string) => string, sources: Sources) {
  const calls: string[] = [];
  // NUL cannot occur in SQL text, so the placeholders cannot clash with the SQL around them.
  const sql = write((schema, table) => `\0${calls.push(sources.use(schema, table)) - 1}\0`);
  return escapeJinja(sql).replace(/\0(\d+)\0/g, (_, i: string) => calls[Number(i)]);
}

export type DataTest = string | Record<string, unknown>;

function dataTests(config: ColumnTestConfig): DataTest[] {
  const tests: DataTest[] = [];
  if (config.unique) tests.push('unique');
  if (config.not_null) tests.push('not_null');
  if (config.accepted_values)
    tests.push({
      accepted_values: {
        values: config.accepted_values.map((v) =>
          typeof v === 'string' ? dbtText(v.replaceAll("'", "''")) : v,
        ),
      },
    });
  if (config.relationships)
    tests.push({
      relationships: {
        to: `ref(${jinjaString(config.relationships.to)})`,
        field: dbtText(quoteIdent(config.relationships.field)),
      },
    });
  return tests;
}

/** A data test of schema.yml as dimas reads it back: the values and names it was written from. */
export interface ReadDataTest {
  kind: string;
  /** accepted_values: the values compared. */
  values?: unknown[];
  /** relationships: the referenced model and column. */
  to?: string;
  field?: string;
}

export function readDataTest(test: DataTest): ReadDataTest {
  const kind = typeof test === 'string' ? test : Object.keys(test)[0];
  const args = (typeof test === 'string' ? {} : (test[kind] ?? {})) as Record<string, unknown>;
  const text = (v: unknown) => (typeof v === 'string' ? readDbtText(v) : v);
  if (kind === 'accepted_values') {
    const quote = args.quote !== false;
    const values = (Array.isArray(args.values) ? args.values : []).map(text);
    return {
      kind,
      values: values.map((v) => (quote && typeof v === 'string' ? v.replaceAll("''", "'") : v)),
    };
  }
  if (kind === 'relationships') {
    const to = /^ref\('((?:[^'\\]|\\.)*)'\)$/.exec(String(args.to ?? ''))?.[1];
    const field = text(args.field);
    return {
      kind,
      ...(to === undefined ? {} : { to: to.replace(/\\(.)/g, '$1') }),
      // A project generated before fields were quoted wrote the bare name.
      ...(typeof field === 'string'
        ? { field: /^".*"$/s.test(field) ? field.slice(1, -1).replaceAll('""', '"') : field }
        : {}),
    };
  }
  return { kind };
}

/**
 * A generated model or test as the database runs it: `{{ source() }}` calls resolved through the
 * project's sources.yml to the tables they name, `{{ ref() }}` calls by `ref` (left when it gives
 * null), and the Jinja-escaped text printed back.
 */
export function resolveProjectSql(
  files: ProjectFile[],
  sql: string,
  ref: (model: string) => string | null = () => null,
): string {
  const yml = parseYaml(files.find((f) => f.path === 'models/sources.yml')?.content ?? '') as {
    sources?: {
      name: string;
      schema?: string;
      quoting?: { schema?: boolean };
      tables?: { name: string; identifier?: string; quoting?: { identifier?: boolean } }[];
    }[];
  } | null;
  const real = (value: string, quoting: boolean | undefined) =>
    quoting === false ? value : quoteIdent(value);
  const relation = (sourceName: string, tableName: string): string | null => {
    const source = yml?.sources?.find((s) => s.name === sourceName);
    const table = source?.tables?.find((t) => t.name === tableName);
    if (!source || !table) return null;
    return (
      `${real(readDbtText(source.schema ?? source.name), source.quoting?.schema)}.` +
      real(readDbtText(table.identifier ?? table.name), table.quoting?.identifier)
    );
  };
  const arg = `'((?:[^'\\\\]|\\\\.)*)'`;
  const unescape = (s: string) => s.replace(/\\(.)/g, '$1');
  return sql.replace(
    new RegExp(`\\{\\{\\s*(?:source\\(${arg},\\s*${arg}\\)|ref\\(${arg}\\)|(${arg}))\\s*\\}\\}`, 'g'),
    (whole, schema?: string, table?: string, model?: string, literal?: string, text?: string) => {
      if (schema !== undefined) return relation(unescape(schema), unescape(table!)) ?? whole;
      if (model !== undefined) return ref(unescape(model)) ?? whole;
      return literal === undefined ? whole : unescape(text!);
    },
  );
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

  const sources = new Sources();
  const files: ProjectFile[] = [];
  for (const plan of plans) {
    const sql = modelSql(
      (source) =>
        selectSqlFromPlan(plan, { renderTable: (table) => source(table.schema ?? defaultSchema, table.name) })
          .sql,
      sources,
    );
    files.push({
      path: `models/${plan.target.name}.sql`,
      content: `-- Generated by dimas from the mapping of ${plan.target.name}; regenerate instead of editing.\n${sql}\n`,
    });
  }

  const profile = options.identityProfile;
  if (profile) {
    const sql = modelSql(
      (source) =>
        goldenRecordSelect(profile, {
          graph: (table) => source(profile.schema, table),
          source: (table) => source(table.schema, table.name),
        }),
      sources,
    );
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
              description: dbtText(`rule: ${f.rule}`),
              data_type: 'text',
              quote: true,
            })),
            { name: 'lineage', description: 'field -> {table, record_key}', data_type: 'jsonb', quote: true },
          ],
        },
      ]
    : [];

  // The tests of each table, with the column tests passed in over the schema's.
  const tests = new Map(
    plans.map((plan) => {
      const extra = options.columnTests?.[plan.target.name] ?? {};
      return [
        plan.target.name,
        tableTests({
          ...plan.target,
          columns: plan.target.columns.map((c) =>
            extra[c.name]
              ? { ...c, tests: { ...((c.tests as object | undefined) ?? {}), ...extra[c.name] } }
              : c,
          ),
        }),
      ];
    }),
  );
  // The composite keys' uniqueness, as singular tests: rows returned are the duplicated combinations.
  const keyTests: ProjectFile[] = plans.flatMap((plan) => {
    const key = tests.get(plan.target.name)!.key;
    if (!key) return [];
    const columns = key.columns.map(quoteIdent).join(', ');
    return [
      {
        path: `tests/${plan.target.name}_primary_key.sql`,
        content:
          `-- Generated by dimas: the primary key of ${plan.target.name} is unique as a combination; regenerate instead of editing.\n` +
          `select ${escapeJinja(columns)}, count(*) as duplicates\nfrom {{ ref(${jinjaString(plan.target.name)}) }}\n` +
          `group by ${escapeJinja(columns)}\nhaving count(*) > 1\n`,
      },
    ];
  });

  const schemaYml = {
    version: 2,
    models: [
      ...plans.map((plan) => {
        const tableTests = tests.get(plan.target.name)!;
        return {
          name: plan.target.name,
          description: dbtText(plan.target.description ?? ''),
          columns: plan.columns.map((column) => {
            const config = tableTests.columns.find((c) => c.column === column.name)?.config;
            const data = config ? dataTests(config) : [];
            return {
              name: column.name,
              description: dbtText(column.description ?? ''),
              data_type: POSTGRES_TYPES[column.type],
              // The model names every column quoted (`AS "UserId"`): dbt's tests must too.
              quote: true,
              ...(data.length ? { data_tests: data } : {}),
            };
          }),
        };
      }),
      ...profileModel,
    ],
  };

  const header = '# Generated by dimas; regenerate instead of editing.\n';
  return [
    { path: 'dbt_project.yml', content: header + stringify(project) },
    { path: 'models/schema.yml', content: header + stringify(schemaYml) },
    { path: 'models/sources.yml', content: header + stringify(sources.yml()) },
    ...files,
    ...keyTests,
  ];
}
