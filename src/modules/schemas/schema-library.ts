import { readdir, readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { targetSchemaSchema, type TargetSchema } from './schemas.schemas.ts';
import { newTestProblems } from './column-test-problems.ts';

const LIBRARY_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'seeds', 'schemas');

/** Read once per process (the files ship with the code); flush-mapping-cache drops it. */
let library: Promise<Map<string, TargetSchema>> | null = null;

async function load(): Promise<Map<string, TargetSchema>> {
  const templates = new Map<string, TargetSchema>();
  const files = (await readdir(LIBRARY_DIR)).filter((f) => f.endsWith('.json')).sort();
  for (const file of files) {
    const parsed = targetSchemaSchema.safeParse(JSON.parse(await readFile(join(LIBRARY_DIR, file), 'utf8')));
    // A broken template is a packaging defect; failing loudly beats serving half a library.
    if (!parsed.success) throw new Error(`Library template ${file} is invalid: ${parsed.error.message}`);
    // Workspace creation and setup-environment store a template as it is: its tests obey the rule too.
    const problems = newTestProblems(parsed.data, null);
    if (problems.length)
      throw new Error(`Library template ${file} is invalid: ${problems.map((p) => p.message).join('; ')}`);
    templates.set(file.replace(/\.json$/, ''), parsed.data);
  }
  return templates;
}

export async function libraryTemplates(): Promise<Map<string, TargetSchema>> {
  library ??= load().catch((error) => {
    library = null;
    throw error;
  });
  return library;
}

/** A copy, so that callers may change it freely. */
export async function libraryTemplate(name: string): Promise<TargetSchema | null> {
  const template = (await libraryTemplates()).get(name);
  return template ? structuredClone(template) : null;
}

export function flushLibraryCache(): number {
  const had = library ? 1 : 0;
  library = null;
  return had;
}

export function schemaSummary(name: string, schema: TargetSchema) {
  return {
    name,
    version: schema.version,
    description: schema.description ?? '',
    table_count: schema.tables.length,
    column_count: schema.tables.reduce((n, t) => n + t.columns.length, 0),
    tables: schema.tables.map((t) => t.name),
  };
}
