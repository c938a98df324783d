/*
 * dimas over REST from a client generated from its OpenAPI document:
 *   npx openapi-typescript http://localhost:3000/api/openapi.json -o examples/openapi-fetch/schema.d.ts
 * then typed calls with openapi-fetch. test/openapi-client.test.ts generates the types, type-checks
 * this file against them and runs it against a server.
 */
import createClient from 'openapi-fetch';
import type { paths } from './schema.d.ts';

export interface Credentials {
  username: string;
  domain: string;
  password: string;
}

export async function tour(baseUrl: string, credentials: Credentials, workspaceName: string) {
  const anonymous = createClient<paths>({ baseUrl });
  // 1. Sign in: the token goes in the Authorization header from then on.
  const login = await anonymous.POST('/api/auth/login', { body: credentials });
  if (!login.data) throw new Error(`login failed: ${login.error.code} ${login.error.message}`);
  const api = createClient<paths>({
    baseUrl,
    headers: { authorization: `Bearer ${login.data.token}` },
  });

  // 2. Who am I?
  const session = await api.GET('/api/auth/session');
  // 3. A read that needs a current workspace before one is selected: a typed 409 error body.
  const noWorkspace = await api.GET('/api/workspaces/current');
  // 4-5. Create a workspace and select it.
  const created = await api.POST('/api/workspaces/create', {
    body: { name: workspaceName, description: 'made by openapi-fetch' },
  });
  const selected = await api.POST('/api/workspaces/select', { body: { workspace_name: workspaceName } });
  // 6. The current workspace, now that there is one.
  const current = await api.GET('/api/workspaces/current');
  // 7. One workspace by its path parameter.
  const byName = await api.GET('/api/workspaces/{workspace_name}', {
    params: { path: { workspace_name: workspaceName } },
  });
  // 8. Its workflow state.
  const workflow = await api.GET('/api/workspaces/{workspace_name}/workflow/state', {
    params: { path: { workspace_name: workspaceName } },
  });
  // 9. A page of the organization's users (query parameters).
  const users = await api.GET('/api/admin/users', { params: { query: { limit: 5, offset: 0 } } });
  // 10. The roles and the permission catalogue.
  const roles = await api.GET('/api/admin/roles');
  const permissions = await api.GET('/api/admin/permissions');
  // A malformed body: a typed 400 with its issues.
  const invalid = await api.POST('/api/workspaces/create', { body: { name: '9 starts with a digit' } });

  return {
    username: session.data?.user.username,
    noWorkspace: { status: noWorkspace.response.status, code: noWorkspace.error?.code },
    createdName: created.data?.name,
    selected: selected.data?.success,
    currentName: current.data?.name,
    byNameIsCurrent: byName.data?.is_current,
    workflowWorkspace: workflow.data?.workspace_name,
    userCount: users.data?.users.length,
    roleNames: roles.data?.roles.map((r) => r.name),
    permissionCount: permissions.data?.permissions.length,
    invalid: {
      status: invalid.response.status,
      code: invalid.error?.code,
      paths: invalid.error?.issues?.map((i) => i.path?.join('.')),
    },
  };
}
