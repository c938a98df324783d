/*
 * The script of the browser test's page: what a frontend does with the client entry. It logs in,
 * subscribes to discovery (token through connectionParams, since EventSource sends no headers) and
 * lists each event in the page.
 */
import { createDimasClient } from '../../src/client/index.ts';

interface PageConfig {
  username: string;
  domain: string;
  password: string;
}

const config = (window as unknown as { DIMAS_TEST: PageConfig }).DIMAS_TEST;
const list = document.getElementById('events')!;
const status = document.getElementById('status')!;

async function main() {
  let token: string | null = null;
  const client = createDimasClient({ url: window.location.origin, token: () => token });
  const session = await client.auth.login.mutate(config);
  token = session.token;
  status.textContent = `signed in as ${session.user.username}`;
  await new Promise<void>((resolve, reject) => {
    const subscription = client.discovery.discover.subscribe(
      {},
      {
        onData: ({ data: event }) => {
          const item = document.createElement('li');
          item.dataset.type = event.type;
          item.textContent =
            event.type === 'suggestion' ? `${event.target_field} ← ${event.source_field}` : event.type;
          list.append(item);
          if (event.type === 'completed' || event.type === 'cancelled' || event.type === 'error') {
            subscription.unsubscribe();
            resolve();
          }
        },
        onError: reject,
      },
    );
  });
  status.textContent = 'done';
}

main().catch((error: unknown) => {
  status.textContent = `failed: ${error instanceof Error ? error.message : String(error)}`;
});
