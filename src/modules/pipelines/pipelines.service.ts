import { createHash, randomUUID } from 'node:crypto';
import { parse as parseYaml } from 'yaml';
import { AppError, notFound } from '../../app-error.ts';
import type { CallerScope, Scope } from '../../deps.ts';
import { quoteIdent, qualified, warehouses } from '../../warehouse/postgres.ts';
import type { Warehouse } from '../../warehouse/warehouse.ts';
import {
  generateDbtProject,
  projectFingerprint,
  readDataTest,
  resolveProjectSql,
  type DataTest,
  type DbtModelInput,
  type DbtProjectOptions,
  type ProjectFile,
} from '../../transform/dbt.ts';
import type { Mapping, TargetTable } from '../../transform/mapping.ts';
import { registerWorkspaceExtension } from '../workspaces/workspace-extensions.ts';
import {
  connectionConfig,
  requiredConnectionConfig,
  currentWorkspace,
  targetSchemaOf,
  type WorkspaceEntity,
} from '../workspaces/workspaces.service.ts';
import { TableMapping } from '../mappings/mappings.entity.ts';
import { mappingChanged } from '../mappings/mappings.service.ts';
import { latestCommits } from '../mappings/mappings-files.ts';
import { canonicalJson } from '../mappings/mappings-code.service.ts';
import { TransformationProject, type ProjectModelInput } from './pipelines.entity.ts';
import { IdentityGraph } from '../monitoring/monitoring.entity.ts';
import { profileOptionsOf, type RecordedProfilePlan } from '../../quality/golden-records.ts';
import { mappedSourceConfig } from '../sources/source-copy.ts';

/** Where the project's files sit in the workspace's file projection (git-diff, download, VCS). */
const PROJECT_DIR = 'transformation';

const sha = (value: unknown) => createHash('sha256').update(canonicalJson(value)).digest('hex');

/**
 * What the project is generated from: each table's newest committed transformation, over the table
 * definition it was committed against, with descriptions and column tests taken from the current
 * schema.json (so test configs edited since the commit reach the project).
 */
async function projectInputs(scope: Scope, workspace: WorkspaceEntity, only?: string[]) {
  const schema = targetSchemaOf(workspace);
  const commits = await latestCommits(scope.em, workspace);
  const models: DbtModelInput[] = [];
  const inputs: ProjectModelInput[] = [];
  const skipped: { table_name: string; reason: string }[] = [];
  for (const name of only ?? [])
    if (!commits.has(name)) skipped.push({ table_name: name, reason: 'no committed transformation' });
  for (const [tableName, commit] of commits) {
    if (only && !only.includes(tableName)) continue;
    const current = schema?.tables.find((t) => t.name === tableName) as TargetTable | undefined;
    if (!current) {
      skipped.push({ table_name: tableName, reason: 'the table is no longer in the target schema' });
      continue;
    }
    const committed = commit.targetTable as unknown as TargetTable;
    const target: TargetTable = {
      ...committed,
      description: current.description ?? committed.description ?? null,
      columns: committed.columns.map((c) => {
        const now = current.columns.find((x) => x.name === c.name);
        return now ? { ...c, description: now.description ?? c.description, tests: now.tests } : c;
      }),
    };
    const effective = (commit.mapping as { effective?: Mapping }).effective;
    if (!effective) {
      skipped.push({ table_name: tableName, reason: 'the commit predates project generation; commit again' });
      continue;
    }
    models.push({ mapping: effective, target });
    inputs.push({
      table_name: tableName,
      committed_version: commit.version,
      mapping_fingerprint: sha(effective),
      schema_fingerprint: sha(current),
    });
  }
  const sourceSchema = mappedSourceConfig(scope, workspace)?.schemas[0] ?? 'public';
  // The unified profiles, once the identity graph has been built with them, are a model too.
  const graph = await scope.em.findOne(IdentityGraph, {
    organization: workspace.organization.id,
    workspace: workspace.id,
  });
  const built = graph?.lastResult as RecordedProfilePlan | null | undefined;
  const identityProfile =
    graph && Array.isArray(built?.sources) && Array.isArray(built?.profile_fields)
      ? profileOptionsOf(graph.schemaName, built)
      : null;
  // Where materialize builds the target tables (mappings.jobs.ts): `dbt run` builds there too.
  const targetSchema = connectionConfig(scope, workspace, 'target')?.schemas[0];
  const options: DbtProjectOptions = {
    projectName: workspace.name,
    models,
    defaultSourceSchema: sourceSchema,
    ...(targetSchema === undefined ? {} : { targetSchema }),
    ...(identityProfile ? { identityProfile } : {}),
  };
  return { options, inputs, skipped };
}

async function findProject(scope: Scope, workspace: WorkspaceEntity) {
  return scope.em.findOne(TransformationProject, {
    organization: workspace.organization.id,
    workspace: workspace.id,
  });
}

async function requireProject(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const project = await findProject(scope, workspace);
  if (!project)
    throw new AppError(
      'NOT_FOUND',
      `Workspace ${workspace.name} has no transformation project; generate it first`,
      {
        reason: 'NO_PROJECT',
      },
    );
  return { workspace, project };
}

const summary = (files: { path: string; content: string }[]) =>
  files.map((f) => ({ path: f.path, size: Buffer.byteLength(f.content) }));

export async function generateProject(scope: CallerScope, input: { table_names?: string[] }) {
  const workspace = await currentWorkspace(scope);
  const { options, inputs, skipped } = await projectInputs(scope, workspace, input.table_names);
  if (options.models.length === 0)
    throw new AppError(
      'CONFLICT',
      input.table_names
        ? `None of the tables asked for can be generated in workspace ${workspace.name}: ` +
            skipped.map((s) => `${s.table_name} (${s.reason})`).join(', ')
        : `No committed transformation to generate a project from in workspace ${workspace.name}: commit a mapping's transformation first`,
      { reason: 'NOTHING_COMMITTED' },
    );
  const files = await generateDbtProject(options);
  const fingerprint = projectFingerprint(options);
  const generatedAt = new Date();
  // One statement, so that concurrent first generations do not both insert (the loser answered 409
  // "A record with the same unique values already exists"): the last one written is the project.
  await scope.em.execute(
    `insert into transformation_projects
       (id, organization_id, workspace_id, files, fingerprint, models, generated_by, generated_at, created_at, updated_at)
     values (?, ?, ?, ?::jsonb, ?, ?::jsonb, ?, ?, now(), now())
     on conflict (workspace_id) do update set files = excluded.files, fingerprint = excluded.fingerprint,
       models = excluded.models, generated_by = excluded.generated_by, generated_at = excluded.generated_at,
       updated_at = now()`,
    [
      randomUUID(),
      workspace.organization.id,
      workspace.id,
      JSON.stringify(files),
      fingerprint,
      JSON.stringify(inputs),
      scope.principal.username ?? null,
      generatedAt,
    ],
  );
  return {
    workspace_name: workspace.name,
    generated_at: generatedAt,
    fingerprint,
    files: summary(files),
    models: inputs.map((m) => ({ table_name: m.table_name, committed_version: m.committed_version })),
    skipped,
  };
}

async function drift(scope: Scope, workspace: WorkspaceEntity) {
  const project = await findProject(scope, workspace);
  if (!project) return null;
  const generatedTables = project.models.map((m) => m.table_name);
  const { options, inputs } = await projectInputs(scope, workspace);
  // The current fingerprint over the same tables the project was generated for (plus new ones).
  const current = projectFingerprint({
    ...options,
    models: options.models.filter((m) => generatedTables.includes(m.target.name)),
  });
  const mappings = await scope.em.find(TableMapping, {
    organization: workspace.organization.id,
    workspace: workspace.id,
  });
  const now = new Map(inputs.map((i) => [i.table_name, i]));
  const changes = [];
  for (const before of project.models) {
    const after = now.get(before.table_name);
    const reasons: ('mapping_committed' | 'schema_changed' | 'table_removed' | 'uncommitted_changes')[] = [];
    if (!after) reasons.push('table_removed');
    else {
      if (
        after.committed_version !== before.committed_version ||
        after.mapping_fingerprint !== before.mapping_fingerprint
      )
        reasons.push('mapping_committed');
      if (after.schema_fingerprint !== before.schema_fingerprint) reasons.push('schema_changed');
    }
    const mapping = mappings.find((m) => m.tableName === before.table_name);
    if (mapping && (await mappingChanged(scope.em, workspace, mapping))) reasons.push('uncommitted_changes');
    if (reasons.length)
      changes.push({
        table_name: before.table_name,
        reasons,
        project_version: before.committed_version,
        committed_version: after?.committed_version ?? null,
      });
  }
  for (const after of inputs)
    if (!generatedTables.includes(after.table_name))
      changes.push({
        table_name: after.table_name,
        reasons: ['table_added' as const],
        project_version: null,
        committed_version: after.committed_version,
      });
  changes.sort((a, b) => a.table_name.localeCompare(b.table_name));
  // Uncommitted edits alone do not put the project out of date: it is built from commits.
  const inSync =
    current === project.fingerprint &&
    changes.every((c) => c.reasons.every((r) => r === 'uncommitted_changes'));
  return { project, current, changes, inSync };
}

export async function projectStatus(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const found = await drift(scope, workspace);
  if (!found)
    return {
      workspace_name: workspace.name,
      generated: false,
      generated_at: null,
      generated_by: null,
      fingerprint: null,
      in_sync: null,
      files: [],
      models: [],
    };
  const { project, inSync } = found;
  return {
    workspace_name: workspace.name,
    generated: true,
    generated_at: project.generatedAt,
    generated_by: project.generatedBy ?? null,
    fingerprint: project.fingerprint,
    in_sync: inSync,
    files: summary(project.files),
    models: project.models.map((m) => ({ table_name: m.table_name, committed_version: m.committed_version })),
  };
}

export async function driftStatus(scope: CallerScope) {
  const workspace = await currentWorkspace(scope);
  const found = await drift(scope, workspace);
  if (!found)
    return {
      workspace_name: workspace.name,
      generated: false,
      in_sync: false,
      project_fingerprint: null,
      current_fingerprint: null,
      changes: [],
    };
  return {
    workspace_name: workspace.name,
    generated: true,
    in_sync: found.inSync,
    project_fingerprint: found.project.fingerprint,
    current_fingerprint: found.current,
    changes: found.changes,
  };
}

const modelPath = (tableName: string) => `models/${tableName}.sql`;

export async function modelSql(scope: CallerScope, tableName: string) {
  const { project } = await requireProject(scope);
  const file = project.files.find((f) => f.path === modelPath(tableName));
  const model = project.models.find((m) => m.table_name === tableName);
  if (!file || !model) throw notFound(`Model ${tableName} in the transformation project`);
  return {
    table_name: tableName,
    path: file.path,
    sql: file.content,
    committed_version: model.committed_version,
    generated_at: project.generatedAt,
  };
}

export async function deleteProject(scope: CallerScope) {
  const { workspace, project } = await requireProject(scope);
  const count = project.files.length;
  await scope.em.remove(project).flush();
  return {
    success: true as const,
    message: `Transformation project of ${workspace.name} deleted`,
    deleted_files: count,
  };
}

// ---- test-model ----

/**
 * `{{ source('shop', 'customers') }}` → "shop"."customers" (as sources.yml names it), `{{ ref() }}`
 * by `ref`: the model or test as the database runs it.
 */
function renderModel(files: ProjectFile[], sql: string, ref?: (model: string) => string | null): string {
  return resolveProjectSql(files, sql, ref)
    .replace(/^--.*$/gm, '')
    .trim();
}

interface TestResult {
  name: string;
  column: string;
  test: string;
  status: 'pass' | 'fail' | 'error';
  failures: number;
  failing_rows: Record<string, unknown>[];
  message: string | null;
}

const FAILING_ROWS = 10;

/** A database's own refusal (it carries a SQLSTATE), as opposed to a lost connection or a bug. */
const isDatabaseError = (error: unknown): error is Error & { code: string } =>
  error instanceof Error && typeof (error as { code?: unknown }).code === 'string';

/**
 * Runs the model on the source database into a temporary table (dropped at commit) capped at the
 * sample size, then each data test of schema.yml on it; relationships are checked against the
 * referenced model's table in the target warehouse.
 *
 * A test fails on what dbt's own test of the project returns, as the monitoring runner counts it
 * (src/quality/rules.ts): not_null the rows holding null; unique the values more than one row holds;
 * accepted_values the values outside the list, compared in the column's own type (1.50 is the accepted
 * 1.5); relationships the rows whose value the referenced column does not hold. The message tells the
 * rows beside a count of values. Each test runs under a savepoint: one the database refuses (an accepted
 * value that is no value of the column's type, a type without equality) is that test's `error` and the
 * others still run.
 */
export async function testModel(scope: CallerScope, input: { table_name: string; sample_size: number }) {
  const { workspace, project } = await requireProject(scope);
  const file = project.files.find((f) => f.path === modelPath(input.table_name));
  if (!file) throw notFound(`Model ${input.table_name} in the transformation project`);
  const schemaYml = parseYaml(project.files.find((f) => f.path === 'models/schema.yml')?.content ?? '') as {
    models?: { name: string; columns?: { name: string; data_tests?: DataTest[] }[] }[];
  };
  const columns = schemaYml.models?.find((m) => m.name === input.table_name)?.columns ?? [];
  const sourceConfig =
    mappedSourceConfig(scope, workspace) ?? requiredConnectionConfig(scope, workspace, 'source');
  const source = await warehouses(scope.deps).open(sourceConfig, `${workspace.id}:source`);
  const targetConfig = connectionConfig(scope, workspace, 'target');
  const temp = quoteIdent('dimas_model_test');
  const sql = renderModel(project.files, file.content);
  const timeout = scope.deps.env.WAREHOUSE_STATEMENT_TIMEOUT_MS;

  const relationshipChecks: {
    result: TestResult;
    values: { v: string; n: string }[];
    to: string;
    field: string;
  }[] = [];
  // The model carries users' mapping expressions and runs inside a write (its temporary table): the
  // read-only rules first, as for a materialization.
  await source.assertUserSqlAllowed(sql);
  const { rowsTested, results } = await source.transaction(async (tx) => {
    await tx.query(`set local statement_timeout = ${timeout}`);
    await tx.query(
      `create temporary table ${temp} on commit drop as select * from (\n${sql}\n) as model limit ${input.sample_size}`,
    );
    const rowsTested = Number((await tx.query<{ n: string }>(`select count(*) as n from ${temp}`)).rows[0].n);
    const results: TestResult[] = [];
    /** `run` under a savepoint; a refusal by the database rolls back to it and is returned as the message. */
    const guarded = async <T>(run: () => Promise<T>): Promise<{ value: T } | { error: string }> => {
      await tx.query('savepoint dimas_model_test_step');
      try {
        const value = await run();
        await tx.query('release savepoint dimas_model_test_step');
        return { value };
      } catch (error) {
        if (!isDatabaseError(error)) throw error;
        await tx.query('rollback to savepoint dimas_model_test_step');
        return { error: error.message };
      }
    };
    /** The rows failing `where`; `values`: also how many distinct values of `column` they hold. */
    const failing = async (where: string, column: string, params: unknown[] = [], values = false) => {
      const col = quoteIdent(column);
      const count = await tx.query<{ n: string; v: string }>(
        `select count(*) as n${values ? `, count(distinct ${col}) as v` : ''} from ${temp} where ${where}`,
        params,
      );
      const rows = await tx.query(
        `select * from ${temp} where ${where} order by ${col} limit ${FAILING_ROWS}`,
        params,
      );
      const failingRows = Number(count.rows[0].n);
      return {
        failures: values ? Number(count.rows[0].v) : failingRows,
        rows: failingRows,
        failing_rows: rows.rows,
      };
    };
    for (const column of columns) {
      const col = quoteIdent(column.name);
      for (const test of column.data_tests ?? []) {
        const kind = typeof test === 'string' ? test : Object.keys(test)[0];
        const base = { name: `${kind}_${input.table_name}_${column.name}`, column: column.name, test: kind };
        let check: (() => ReturnType<typeof failing>) | null = null;
        let counted = '';
        if (kind === 'not_null') check = () => failing(`${col} is null`, column.name);
        else if (kind === 'unique') {
          counted = 'repeat';
          check = () =>
            failing(
              `${col} in (select ${col} from ${temp} where ${col} is not null group by ${col} having count(*) > 1)`,
              column.name,
              [],
              true,
            );
        } else if (kind === 'accepted_values') {
          counted = 'are not accepted';
          // As dbt reads them: a value with a quote is written with it doubled.
          const values = readDataTest(test).values ?? [];
          // Untyped parameters take the column's type, as dbt's quoted literals do.
          check = values.length
            ? () =>
                failing(
                  `${col} not in (${values.map((_, i) => `$${i + 1}`).join(', ')})`,
                  column.name,
                  values.map(String),
                  true,
                )
            : () => failing('false', column.name);
        } else if (kind === 'relationships') {
          // field is written quoted, as dbt's test needs it: read back as the column's name.
          const { to, field } = readDataTest(test);
          const result: TestResult = {
            ...base,
            status: 'pass',
            failures: 0,
            failing_rows: [],
            message: null,
          };
          results.push(result);
          if (!to || !field) {
            Object.assign(result, {
              status: 'error',
              message: `relationships test needs to: ref('table') and field`,
            });
            continue;
          }
          const values = await guarded(
            async () =>
              (
                await tx.query<{ v: string; n: string }>(
                  `select ${col}::text as v, count(*) as n from ${temp} where ${col} is not null group by 1`,
                )
              ).rows,
          );
          if ('error' in values) {
            Object.assign(result, { status: 'error', message: values.error });
            continue;
          }
          relationshipChecks.push({ result, values: values.value, to, field });
          continue;
        } else {
          results.push({
            ...base,
            status: 'error',
            failures: 0,
            failing_rows: [],
            message: `unknown test ${kind}`,
          });
          continue;
        }
        const outcome = await guarded(check);
        if ('error' in outcome) {
          results.push({ ...base, status: 'error', failures: 0, failing_rows: [], message: outcome.error });
          continue;
        }
        const { failures, rows, failing_rows } = outcome.value;
        results.push({
          ...base,
          status: failures ? 'fail' : 'pass',
          failures,
          failing_rows,
          message: !failures
            ? null
            : counted
              ? `${failures} values of ${column.name} ${counted}: ${kind} fails (${rows} of ${rowsTested} rows hold them)`
              : `${failures} of ${rowsTested} rows fail ${kind} on ${column.name}`,
        });
      }
    }
    // The project's singular tests of this model (a composite key's uniqueness): rows returned fail.
    for (const test of project.files.filter((f) => /^tests\/[^/]+\.sql$/.test(f.path))) {
      const query = renderModel(project.files, test.content, (name) =>
        name === input.table_name ? temp : null,
      );
      if (query.includes('{{')) continue;
      const name = test.path.slice('tests/'.length, -'.sql'.length);
      const outcome = await guarded(async () => ({
        failures: Number(
          (await tx.query<{ n: string }>(`select count(*) as n from (\n${query}\n) as failing`)).rows[0].n,
        ),
        rows: (await tx.query(`select * from (\n${query}\n) as failing limit ${FAILING_ROWS}`)).rows,
      }));
      if ('error' in outcome) {
        results.push({
          name,
          column: '',
          test: 'singular',
          status: 'error',
          failures: 0,
          failing_rows: [],
          message: outcome.error,
        });
        continue;
      }
      const { failures, rows } = outcome.value;
      results.push({
        name,
        column: '',
        test: 'singular',
        status: failures ? 'fail' : 'pass',
        failures,
        failing_rows: rows,
        message: failures ? `${test.path} returns ${failures} rows` : null,
      });
    }
    return { rowsTested, results };
  });

  if (relationshipChecks.length) {
    let target: Warehouse | null = null;
    if (targetConfig) target = await warehouses(scope.deps).open(targetConfig, `${workspace.id}:target`);
    for (const check of relationshipChecks) {
      if (!target || !targetConfig) {
        Object.assign(check.result, {
          status: 'error',
          message: 'No target warehouse configured to check relationships',
        });
        continue;
      }
      const table = { schema: targetConfig.schemas[0], name: check.to };
      try {
        // The source and the target are different databases: values travel as text, with how many
        // rows hold each, so that the rows without a match are counted as dbt counts them. They are
        // compared as dbt's join compares them, in the referenced column's type (numbers as numbers:
        // an integer 1 matches a numeric 1.0, which as text it did not).
        const [referenced] = (
          await target.readOnlyQuery(
            `select format_type(a.atttypid, a.atttypmod) as type, t.typcategory as category
               from pg_attribute a join pg_type t on t.oid = a.atttypid
              where a.attrelid = to_regclass($1) and a.attname = $2 and a.attnum > 0 and not a.attisdropped`,
            { params: [qualified(table), check.field], limit: 1 },
          )
        ).rows as { type: string; category: string }[];
        if (!referenced) {
          Object.assign(check.result, {
            status: 'error',
            message: `${table.schema}.${table.name}.${check.field} does not exist in the target warehouse`,
          });
          continue;
        }
        const field = `t.${quoteIdent(check.field)}`;
        const matches =
          referenced.category === 'N'
            ? `${field}::numeric = u.v::numeric`
            : `${field} = u.v::${referenced.type}`;
        const missing = await target.readOnlyQuery(
          `select v, n from unnest($1::text[], $2::bigint[]) as u(v, n)
            where not exists (select 1 from ${qualified(table)} t where ${matches}) order by 1`,
          {
            params: [check.values.map((r) => r.v), check.values.map((r) => r.n)],
            limit: 100_000,
          },
        );
        const rows = missing.rows.reduce((sum, r) => sum + Number(r.n), 0);
        Object.assign(check.result, {
          status: rows ? 'fail' : 'pass',
          failures: rows,
          failing_rows: missing.rows.slice(0, FAILING_ROWS).map((r) => ({ [check.result.column]: r.v })),
          message: rows
            ? `${rows} of ${rowsTested} rows (${missing.row_count} values of ${check.result.column}) have no match in ${table.schema}.${table.name}.${check.field}`
            : null,
        });
      } catch (error) {
        if (!(error instanceof AppError)) throw error;
        Object.assign(check.result, { status: 'error', message: error.message });
      }
    }
  }
  const count = (status: string) => results.filter((r) => r.status === status).length;
  return {
    table_name: input.table_name,
    sample_size: input.sample_size,
    rows_tested: rowsTested,
    passed: count('pass'),
    failed: count('fail'),
    errors: count('error'),
    tests: results,
  };
}

// ---- the workspace's files and facts ----

registerWorkspaceExtension({
  name: 'pipelines',
  async files(scope, workspace) {
    const project = await findProject(scope, workspace);
    return (project?.files ?? []).map((f) => ({ path: `${PROJECT_DIR}/${f.path}`, content: f.content }));
  },
  async facts(scope, workspace) {
    const found = await drift(scope, workspace);
    return { project_generated: !!found, project_drift: found ? !found.inSync : null };
  },
});
