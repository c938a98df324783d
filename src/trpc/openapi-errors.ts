import type { generateOpenApiDocument } from 'trpc-to-openapi';
import { HTTP_STATUS } from './errors.ts';

type Document = ReturnType<typeof generateOpenApiDocument>;

/** One body for every error status (DESIGN §4), with the extras errors.ts may add. */
const ERROR_SCHEMA = {
  type: 'object',
  required: ['message', 'code'],
  properties: {
    message: { type: 'string', description: 'What went wrong, for a person to read' },
    code: {
      type: 'string',
      enum: Object.keys(HTTP_STATUS),
      description: 'The outcome; each code has one HTTP status',
    },
    issues: {
      type: 'array',
      description: 'Validation problems (400): where and what',
      items: {
        type: 'object',
        required: ['message'],
        properties: {
          message: { type: 'string' },
          path: { type: 'array', items: { oneOf: [{ type: 'string' }, { type: 'integer' }] } },
          code: { type: 'string' },
        },
      },
    },
    reason: {
      type: 'string',
      description:
        'A finer cause where one code covers several (PASSWORD_CHANGE_REQUIRED, NO_WORKSPACE_SELECTED…)',
    },
    retry_after: { type: 'integer', description: '429: seconds to wait before trying again' },
  },
} as const;

const RETRY_AFTER = {
  description: 'Seconds to wait before trying again',
  schema: { type: 'integer', minimum: 0 },
};

/** The error responses, by status: name in components.responses and its description. */
const RESPONSES: Record<number, { name: string; description: string; retryAfter?: boolean }> = {
  400: { name: 'BadRequest', description: 'Invalid input (validation issues listed), or malformed JSON' },
  401: { name: 'Unauthorized', description: 'No credentials, or an expired or unknown token' },
  403: { name: 'Forbidden', description: 'The caller lacks the permission this operation requires' },
  404: { name: 'NotFound', description: 'Not found, or belongs to another organization' },
  409: {
    name: 'Conflict',
    description:
      'Conflicts with the current state: no workspace selected, a name already taken, a run already going',
  },
  413: {
    name: 'PayloadTooLarge',
    description: 'The request body exceeds the body limit, or a result exceeds the byte cap',
  },
  422: {
    name: 'UnprocessableContent',
    description: 'Well-formed but cannot be processed (SQL the warehouse refuses, an unusable configuration)',
  },
  429: { name: 'TooManyRequests', description: 'Rate limited; retry later', retryAfter: true },
  500: { name: 'InternalServerError', description: 'Unexpected failure; the message is generic' },
  503: {
    name: 'ServiceUnavailable',
    description: 'The database (or a required service) is unavailable; retry later',
    retryAfter: true,
  },
};

/** Statuses every operation can answer: each one reads the database (sessions, tenancy, data). */
const ALWAYS = [400, 413, 422, 429, 500, 503];
const PROTECTED = [401, 403];

/**
 * 409 where an operation can conflict: every write (unique names, runs in progress, the current
 * workspace) and every read that acts on the current workspace. Reads of the account and organization
 * administration (/api/auth, /api/admin) never touch a workspace.
 */
function canConflict(method: string, path: string): boolean {
  if (method !== 'get') return true;
  return !/^\/api\/(auth|admin)\//.test(path) && path !== '/api/workspaces';
}

const METHODS = new Set(['get', 'put', 'post', 'patch', 'delete']);

/**
 * Puts the statuses dimas really answers into the document, each with the one error schema, and marks
 * public operations `security: []` (explicitly open, rather than silent).
 */
export function describeErrors(document: Document): Document {
  const components = (document.components ??= {});
  const schemas = (components.schemas ??= {});
  // The generator's per-status error schemas say `additionalProperties: false` and would refuse
  // `reason` and `retry_after`; the shared one replaces them.
  for (const name of Object.keys(schemas)) if (name.startsWith('error.')) delete schemas[name];
  schemas.Error = ERROR_SCHEMA as never;
  const responses = (components.responses ??= {});
  for (const r of Object.values(RESPONSES))
    responses[r.name] = {
      description: r.description,
      ...(r.retryAfter ? { headers: { 'Retry-After': RETRY_AFTER } } : {}),
      content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } },
    } as never;

  for (const [path, item] of Object.entries(document.paths ?? {}))
    for (const [method, operation] of Object.entries(item ?? {})) {
      if (!METHODS.has(method) || !operation || typeof operation !== 'object') continue;
      const op = operation as {
        security?: unknown[];
        responses: Record<string, unknown>;
        parameters?: unknown[];
      };
      const isPublic = !op.security?.length;
      if (isPublic) op.security = [];
      const statuses = new Set(
        Object.keys(op.responses)
          .map(Number)
          .filter((s) => s >= 400),
      );
      for (const s of ALWAYS) statuses.add(s);
      if (!isPublic) for (const s of PROTECTED) statuses.add(s);
      if (!isPublic && canConflict(method, path)) statuses.add(409);
      for (const key of Object.keys(op.responses)) if (Number(key) >= 400) delete op.responses[key];
      for (const s of [...statuses].sort())
        op.responses[String(s)] = { $ref: `#/components/responses/${RESPONSES[s].name}` };
    }
  return document;
}
