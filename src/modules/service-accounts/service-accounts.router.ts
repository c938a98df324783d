import { z } from 'zod';
import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import { successOutput } from '../../trpc/common-schemas.ts';
import * as s from './service-accounts.schemas.ts';
import * as accounts from './service-accounts.service.ts';

const tag = 'service-accounts';
const orgAdmin = permissionProcedure('org.admin');
const base = '/api/api/service-accounts';

export const serviceAccountsRouter = router({
  list: orgAdmin
    .meta(rest('GET', base, 'List service accounts of the organization', tag))
    .input(z.object({}))
    .output(s.serviceAccountListOutput)
    .query(({ ctx }) => accounts.listServiceAccounts(ctx)),

  create: orgAdmin
    .meta(rest('POST', base, 'Create a service account; its API key is shown once', tag))
    .input(s.createServiceAccountInput)
    .output(s.serviceAccountWithKeyOutput)
    .mutation(({ ctx, input }) => accounts.createServiceAccount(ctx, input)),

  get: orgAdmin
    .meta(rest('GET', `${base}/{account_id}`, 'Get a service account', tag))
    .input(s.accountIdInput)
    .output(s.serviceAccountOutput)
    .query(({ ctx, input }) => accounts.getServiceAccount(ctx, input.account_id)),

  update: orgAdmin
    .meta(
      rest(
        'PATCH',
        `${base}/{account_id}`,
        'Update a service account (disabling stops its key at once)',
        tag,
      ),
    )
    .input(s.updateServiceAccountInput)
    .output(s.serviceAccountOutput)
    .mutation(({ ctx, input }) => accounts.updateServiceAccount(ctx, input)),

  delete: orgAdmin
    .meta(rest('DELETE', `${base}/{account_id}`, 'Delete a service account and its key', tag))
    .input(s.accountIdInput)
    .output(successOutput)
    .mutation(({ ctx, input }) => accounts.deleteServiceAccount(ctx, input.account_id)),

  apiKeyInfo: orgAdmin
    .meta(
      rest('GET', `${base}/{account_id}/api-key-info`, 'API key information without revealing the key', tag),
    )
    .input(s.accountIdInput)
    .output(s.apiKeyInfoOutput)
    .query(({ ctx, input }) => accounts.apiKeyInfo(ctx, input.account_id)),

  rotateKey: orgAdmin
    .meta(
      rest(
        'POST',
        `${base}/{account_id}/rotate-key`,
        'Rotate the API key, optionally keeping the old one for a grace period',
        tag,
      ),
    )
    .input(s.rotateKeyInput)
    .output(s.serviceAccountWithKeyOutput)
    .mutation(({ ctx, input }) => accounts.rotateKey(ctx, input)),
});
