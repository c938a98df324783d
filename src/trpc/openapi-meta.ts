import type { Meta } from './init.ts';

type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';

/** The REST face of a procedure: its fixed path from routes.tsv, a summary and the area tag. */
export function rest(
  method: Method,
  path: `/${string}`,
  summary: string,
  tag: string,
  extra: Partial<Meta> = {},
): Meta {
  const { openapi, ...rest } = extra;
  return {
    ...rest,
    openapi: { method, path, summary, tags: [tag], protect: true, ...openapi },
  };
}

/** A route that needs no credentials. */
export function publicRest(method: Method, path: `/${string}`, summary: string, tag: string): Meta {
  return rest(method, path, summary, tag, { openapi: { method, path, protect: false } });
}
