import { randomUUID } from 'node:crypto';
import { p } from '@mikro-orm/core';

/** The columns most tables share: a random uuid key and creation/update times. */
export const uuidPrimaryKey = () =>
  p
    .uuid()
    .primary()
    .onCreate(() => randomUUID());

export const timestamps = () => ({
  createdAt: p.datetime().onCreate(() => new Date()),
  updatedAt: p
    .datetime()
    .onCreate(() => new Date())
    .onUpdate(() => new Date()),
});
