// The parts of autocannon's API the benchmarks use (the package ships no types).
declare module 'autocannon' {
  interface Histogram {
    average: number;
    total: number;
    p50: number;
    p99: number;
  }
  interface Result {
    requests: Histogram;
    latency: Histogram;
    errors: number;
    timeouts: number;
    non2xx: number;
  }
  interface Options {
    url: string;
    headers?: Record<string, string>;
    connections?: number;
    duration?: number;
    workers?: number;
  }
  export default function autocannon(options: Options): Promise<Result>;
}
