import { defineEntity, p } from '@mikro-orm/core';
import { User } from '../users/users.entity.ts';

/** Only sha256(token) is stored, so a leaked table cannot be replayed (the Lucia guide's scheme). */
export const Session = defineEntity({
  name: 'Session',
  tableName: 'sessions',
  properties: {
    id: p.string().primary(),
    user: () => p.manyToOne(User).deleteRule('cascade').index(),
    expiresAt: p.datetime(),
    createdAt: p.datetime().onCreate(() => new Date()),
    ipAddress: p.string().nullable(),
    userAgent: p.text().nullable(),
  },
});

/** Failed logins, counted per username and per address inside a sliding window. */
export const LoginFailure = defineEntity({
  name: 'LoginFailure',
  tableName: 'login_failures',
  properties: {
    id: p.bigint('number').primary().autoincrement(),
    username: p.string().index(),
    ipAddress: p.string().index(),
    at: p.datetime().onCreate(() => new Date()),
  },
});
