import { describe, expect, it } from 'vitest';
import runLoad from '../../bench/load.ts';
import { postgresUnavailable } from '../helpers/scratch-db.ts';

const skip = await postgresUnavailable();

/**
 * The load benchmark as a check: it fails (throws, naming each problem) unless all of its 10,000+
 * answers are 2xx with no error or timeout, and every discovery it runs alongside completes.
 */
describe.skipIf(skip)(`the realistic mix under load${skip ? ` (${skip})` : ''}`, () => {
  it('answers 12,000 requests at 64 connections, discoveries and materializations running, without one error', async () => {
    await expect(runLoad()).resolves.toBeUndefined();
  }, 600_000);
});
