import { generateOpenApiDocument } from 'trpc-to-openapi';
import { appRouter } from './router.ts';
import { describeErrors } from './openapi-errors.ts';

type Document = ReturnType<typeof generateOpenApiDocument>;

let cached: Document | undefined;

/**
 * Routes whose 200 is not JSON: app.ts streams them (the REST adapter leaves them alone), and the
 * generator would call every answer application/json. Binary downloads carry no schema; the discovery
 * stream keeps the event schema.
 */
export const STREAMED_ROUTES: {
  method: 'get' | 'post';
  path: string;
  contentType: string;
  binary: boolean;
}[] = [
  { method: 'post', path: '/api/workspaces/discover', contentType: 'text/event-stream', binary: false },
  { method: 'get', path: '/api/auth/admin/logs/download', contentType: 'application/gzip', binary: true },
  {
    method: 'get',
    path: '/api/workspaces/{workspace_name}/download',
    contentType: 'application/zip',
    binary: true,
  },
];

function describeStreamedResponses(document: Document) {
  for (const route of STREAMED_ROUTES) {
    const ok = document.paths?.[route.path]?.[route.method]?.responses?.['200'];
    if (!ok || !('content' in ok) || !ok.content?.['application/json']) continue;
    const schema = route.binary
      ? { type: 'string', format: 'binary' }
      : ok.content['application/json'].schema;
    ok.content = { [route.contentType]: { schema } } as typeof ok.content;
  }
  return document;
}

/**
 * Request bodies refuse keys they do not declare, in nested objects too (body-rule.ts); the generator
 * leaves such objects open by saying nothing, so the document says `additionalProperties: false`
 * there. Objects that declare what else they take (free-form and keyed maps, target schema documents)
 * keep it.
 */
function describeClosedBodies(document: Document) {
  const close = (schema: unknown): void => {
    if (!schema || typeof schema !== 'object') return;
    const s = schema as Record<string, unknown>;
    if ((s.type === 'object' || s.properties) && s.additionalProperties === undefined)
      s.additionalProperties = false;
    for (const child of Object.values((s.properties ?? {}) as Record<string, unknown>)) close(child);
    for (const key of ['anyOf', 'oneOf']) for (const option of (s[key] ?? []) as unknown[]) close(option);
    close(s.items);
    close(s.additionalProperties);
  };
  for (const item of Object.values(document.paths ?? {}))
    for (const operation of Object.values(item ?? {})) {
      const body = (operation as { requestBody?: { content?: Record<string, { schema?: unknown }> } })
        ?.requestBody;
      close(body?.content?.['application/json']?.schema);
    }
  return document;
}

/** The OpenAPI 3.1 document of every REST route, generated once from the procedures' schemas. */
export function openApiDocument(version: string) {
  cached ??= describeErrors(
    describeClosedBodies(
      describeStreamedResponses(
        generateOpenApiDocument(appRouter, {
          title: 'dimas API',
          description:
            'Data Integration, Mapping and Audience Service. Authenticate with `Authorization: Bearer <token>` ' +
            '(a session token from POST /api/auth/login, or a service-account API key `dms_…`). ' +
            'Errors answer `{ message, code, issues?, reason?, retry_after? }` with the status of the code.',
          version,
          baseUrl: '/',
          docsUrl: '/api/docs',
        }),
      ),
    ),
  );
  // The package is private (package.json: no license granted); the document says so rather than nothing.
  cached.info.license = { name: 'Proprietary', identifier: 'LicenseRef-dimas-proprietary' };
  return cached;
}
