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

/** The OpenAPI 3.1 document of every REST route, generated once from the procedures' schemas. */
export function openApiDocument(version: string) {
  cached ??= describeErrors(
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
  );
  // The package is private (package.json: no license granted); the document says so rather than nothing.
  cached.info.license = { name: 'Proprietary', identifier: 'LicenseRef-dimas-proprietary' };
  return cached;
}
