/*
 * dimas from another TypeScript project, through its typed client entry. Run against a server with
 *   DIMAS_URL=http://localhost:3000 DIMAS_USERNAME=… DIMAS_DOMAIN=… DIMAS_PASSWORD=… npx tsx index.ts
 * test/client-entry.test.ts type-checks this project against the declarations and runs `tour`.
 */
import { createDimasClient, TRPCClientError } from 'dimas/client';

export interface Credentials {
  username: string;
  domain: string;
  password: string;
}

export async function tour(url: string, credentials: Credentials, workspaceName: string) {
  let token: string | null = null;
  const dimas = createDimasClient({ url, token: () => token });

  const login = await dimas.auth.login.mutate(credentials);
  token = login.token;
  // superjson: dates arrive as Date objects.
  const expiresInMs = login.expires_at.getTime() - Date.now();

  const session = await dimas.auth.session.query();
  await dimas.workspaces.create.mutate({ name: workspaceName, select: true });
  const current = await dimas.workspaces.current.query();
  const { roles } = await dimas.admin.listRoles.query({});

  // Errors carry the code and HTTP status of the REST answer.
  const refused = await createDimasClient({ url })
    .auth.session.query()
    .then(() => null)
    .catch((error: unknown) => (error instanceof TRPCClientError ? error.data : null));

  return {
    username: session.user.username,
    expiresInMs,
    workspace: current.name,
    roles: roles.map((role) => role.name),
    refused: refused as { code: string; httpStatus: number } | null,
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const env = process.env;
  const result = await tour(
    env.DIMAS_URL ?? 'http://localhost:3000',
    {
      username: env.DIMAS_USERNAME ?? '',
      domain: env.DIMAS_DOMAIN ?? '',
      password: env.DIMAS_PASSWORD ?? '',
    },
    env.DIMAS_WORKSPACE ?? `example${Date.now()}`,
  );
  console.log(result);
}
