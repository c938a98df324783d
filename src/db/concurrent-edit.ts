import { OptimisticLockError, UniqueConstraintViolationException } from '@mikro-orm/core';
import type { EntityManager } from '@mikro-orm/postgresql';

/** Tries of one edit before its caller gets the 409: enough for a dozen edits of one document at once. */
const ATTEMPTS = 20;

/**
 * Another request wrote first: it changed a row this edit read (the revision moved on), or it created
 * the row this edit was creating (a mapping's first edits arrive together). The next try reads what
 * it wrote; a name that is really taken is then refused by the edit's own check.
 */
const lostRace = (error: unknown) =>
  error instanceof OptimisticLockError || error instanceof UniqueConstraintViolationException;

/**
 * Workspaces, mappings and organization settings hold documents (the target schema, settings,
 * connections) that a request reads, changes and writes back whole. Their rows carry a revision
 * (MikroORM's optimistic lock), so a write based on an older read fails instead of erasing what
 * another request wrote in between; this runs such an edit again on fresh reads until it lands, so
 * concurrent edits of one document all take effect.
 *
 * `edit` reads what it changes through its scope's entity manager: the first try gets the caller's,
 * each later one a new fork of it (same tenant session, nothing loaded), and its result comes from the
 * try that landed. The caller's entity manager keeps a failed try's unsaved changes, so a caller
 * returns the result rather than flushing again. `edit` must do nothing outside the control-plane
 * database that a second run would repeat. Edits that are not wrapped answer 409 when they lose.
 */
export function concurrentEdit<Args extends [{ em: EntityManager }, ...unknown[]], Result>(
  edit: (...args: Args) => Promise<Result>,
): (...args: Args) => Promise<Result> {
  return async (...args) => {
    const [scope, ...rest] = args;
    for (let attempt = 1; ; attempt++) {
      const tryScope = attempt === 1 ? scope : { ...scope, em: scope.em.fork() as EntityManager };
      try {
        return await edit(...([tryScope, ...rest] as Args));
      } catch (error) {
        if (!lostRace(error) || attempt === ATTEMPTS) throw error;
        // A short random wait keeps the losers of one round from colliding again in the next.
        await new Promise((resolve) => setTimeout(resolve, Math.random() * 4 * attempt));
      }
    }
  };
}
