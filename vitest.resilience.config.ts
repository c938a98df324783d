import { defineConfig } from 'vitest/config';

/**
 * Fault and load tests (`npm run test:resilience`): database cuts behind a proxy, a server killed
 * during a job, the load mix of bench/load.ts. Each runs its own server processes on scratch databases of a PostgreSQL server, one file at a
 * time; they take longer than the suite of `npm test` and stay out of it.
 */
export default defineConfig({
  test: {
    include: ['test/resilience/**/*.test.ts'],
    testTimeout: 180_000,
    hookTimeout: 120_000,
    pool: 'forks',
    poolOptions: { forks: { maxForks: 1, minForks: 1 } },
    reporters: ['default'],
  },
});
