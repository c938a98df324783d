import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import autocannon from 'autocannon';

export interface LoadResult {
  label: string;
  requestsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  requests: number;
  /** CPU time of the serving thread per request: unlike throughput, barely moved by other load on the machine. */
  cpuMicrosPerRequest: number;
}

export interface LoadOptions {
  url: string;
  headers?: Record<string, string>;
  connections?: number;
  durationSeconds?: number;
}

/**
 * One autocannon run in a worker thread, so that the load generator does not share the event loop
 * of the servers it measures. A run with errors or non-2xx answers is a failed benchmark, not a
 * fast one (a 401 is cheaper than a real answer).
 */
export async function load(label: string, options: LoadOptions): Promise<LoadResult> {
  // The servers run on this thread; the load generator runs on its own (workers: 1).
  const cpuBefore = process.threadCpuUsage();
  const result = await autocannon({
    url: options.url,
    headers: options.headers,
    connections: options.connections ?? 50,
    duration: options.durationSeconds ?? 10,
    workers: 1,
  });
  if (result.errors || result.timeouts || result.non2xx)
    throw new Error(
      `${label}: ${result.errors} errors, ${result.timeouts} timeouts, ${result.non2xx} non-2xx answers`,
    );
  const cpu = process.threadCpuUsage(cpuBefore);
  return {
    label,
    cpuMicrosPerRequest: (cpu.user + cpu.system) / Math.max(1, result.requests.total),
    requestsPerSecond: result.requests.average,
    p50Ms: result.latency.p50,
    p99Ms: result.latency.p99,
    requests: result.requests.total,
  };
}

export function formatResult(r: LoadResult): string {
  return `${r.label.padEnd(34)} ${r.requestsPerSecond.toFixed(0).padStart(7)} req/s   p50 ${r.p50Ms
    .toFixed(1)
    .padStart(
      5,
    )} ms   p99 ${r.p99Ms.toFixed(1).padStart(6)} ms   ${r.cpuMicrosPerRequest.toFixed(0).padStart(5)} µs CPU/request   (${r.requests} requests)`;
}

export const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};

export function urlFor(base: string, database: string): string {
  const url = new URL(base);
  url.pathname = `/${database}`;
  return url.toString();
}

export async function withClient<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

export function rssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+)/.exec(status)![1]) / 1024;
}

/** The dimas server as a child process (so its memory is measured alone), resolved once it listens. */
export function startServer(env: Record<string, string>): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], {
    cwd: join(dirname(fileURLToPath(import.meta.url)), '..'),
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (chunk) => {
      out += chunk;
      const match = /listening on (http:\/\/\S+)/.exec(out);
      if (match) resolve({ child, url: match[1] });
    });
    child.once('exit', (code) => reject(new Error(`the server exited with ${code}: ${out}`)));
  });
}
