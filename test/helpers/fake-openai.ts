import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** One answer of the fake endpoint, taken in order; an empty queue answers `whenEmpty()`, else 500. */
export interface CannedAnswer {
  status?: number;
  content?: string;
  /** Token usage of the answer; `null` leaves it out, as some compatible servers do. */
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number } | null;
  delayMs?: number;
}

interface RecordedRequest {
  headers: IncomingMessage['headers'];
  body: any;
  url: string;
}

/**
 * A local OpenAI-compatible chat-completions endpoint: tests push canned answers to `queue` and read
 * what dimas sent in `requests`. `start()` resolves to the base URL (`…/v1`) to configure.
 */
export function fakeOpenAi(options: { model?: string; whenEmpty?: () => CannedAnswer } = {}) {
  const queue: CannedAnswer[] = [];
  const requests: RecordedRequest[] = [];
  let server: Server | undefined;

  function answer(res: ServerResponse, c: CannedAnswer) {
    if (c.status && c.status !== 200) {
      res.writeHead(c.status, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'upstream exploded', type: 'server_error' } }));
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({
        id: 'chatcmpl-test',
        object: 'chat.completion',
        created: Math.floor(Date.now() / 1000),
        model: options.model ?? 'test-model-0613',
        choices: [
          { index: 0, finish_reason: 'stop', message: { role: 'assistant', content: c.content ?? '' } },
        ],
        ...(c.usage === null
          ? {}
          : { usage: c.usage ?? { prompt_tokens: 1200, completion_tokens: 300, total_tokens: 1500 } }),
      }),
    );
  }

  return {
    queue,
    requests,
    async start(): Promise<string> {
      server = createServer((req, res) => {
        let raw = '';
        req.on('data', (chunk) => (raw += chunk));
        req.on('end', () => {
          if (req.method !== 'POST' || req.url !== '/v1/chat/completions')
            return void res.writeHead(404).end();
          requests.push({ headers: req.headers, body: JSON.parse(raw), url: req.url });
          const c = queue.shift() ?? options.whenEmpty?.() ?? { status: 500 };
          if (c.delayMs) setTimeout(() => !res.destroyed && answer(res, c), c.delayMs);
          else answer(res, c);
        });
      });
      await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
      return `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
    },
    async close(): Promise<void> {
      server?.closeAllConnections();
      await new Promise((resolve) => server?.close(resolve) ?? resolve(undefined));
    },
  };
}
