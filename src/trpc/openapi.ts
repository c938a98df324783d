import { generateOpenApiDocument } from 'trpc-to-openapi';
import { appRouter } from './router.ts';

let cached: ReturnType<typeof generateOpenApiDocument> | undefined;

/** The OpenAPI 3.1 document of every REST route, generated once from the procedures' schemas. */
export function openApiDocument(version: string) {
  cached ??= generateOpenApiDocument(appRouter, {
    title: 'dimas API',
    description:
      'Data Integration, Mapping and Audience Service. Authenticate with `Authorization: Bearer <token>` ' +
      '(a session token from POST /api/auth/login, or a service-account API key `dms_…`). ' +
      'Errors answer `{ message, code, issues? }`.',
    version,
    baseUrl: '/',
    docsUrl: '/api/docs',
  });
  return cached;
}
