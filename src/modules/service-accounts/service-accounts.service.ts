import { notFound } from '../../app-error.ts';
import type { CallerScope } from '../../deps.ts';
import { generateApiKey } from '../../auth/api-key.ts';
import { organizationOf } from '../../auth/tenancy.ts';
import { resolveRoles } from '../users/users.service.ts';
import { assertNameFree, flushNamed, SERVICE_ACCOUNT_NAMES } from '../users/names.ts';
import { ServiceAccount, type ServiceAccountEntity } from './service-accounts.entity.ts';

const DAY_MS = 86_400_000;

function accountView(account: ServiceAccountEntity) {
  return {
    id: account.id,
    name: account.name,
    description: account.description,
    is_active: account.isActive,
    roles: account.roles.isInitialized() ? account.roles.getItems().map((r) => r.name) : [],
    key_prefix: account.keyPrefix,
    key_expires_at: account.keyExpiresAt ?? null,
    last_used_at: account.lastUsedAt ?? null,
    created_at: account.createdAt,
    updated_at: account.updatedAt,
  };
}

async function findAccount(scope: CallerScope, accountId: string): Promise<ServiceAccountEntity> {
  const account = await scope.em.findOne(
    ServiceAccount,
    { id: accountId, organization: organizationOf(scope.principal) },
    { populate: ['roles'] },
  );
  if (!account) throw notFound('Service account');
  return account;
}

export async function listServiceAccounts(scope: CallerScope) {
  const accounts = await scope.em.find(
    ServiceAccount,
    { organization: organizationOf(scope.principal) },
    { populate: ['roles'], orderBy: { name: 'asc' } },
  );
  return { service_accounts: accounts.map(accountView) };
}

export async function getServiceAccount(scope: CallerScope, accountId: string) {
  return accountView(await findAccount(scope, accountId));
}

export async function createServiceAccount(
  scope: CallerScope,
  input: { name: string; description?: string; roles: string[]; expires_in_days?: number },
) {
  const organization = organizationOf(scope.principal);
  await assertNameFree(scope.em, SERVICE_ACCOUNT_NAMES, input.name, { organizationId: organization });
  const roles = await resolveRoles(scope.em, organization, input.roles);
  const key = generateApiKey();
  const account = scope.em.create(ServiceAccount, {
    organization,
    name: input.name,
    description: input.description ?? '',
    keyPrefix: key.prefix,
    keyHash: key.hash,
    keyCreatedAt: new Date(),
    keyExpiresAt: input.expires_in_days ? new Date(Date.now() + input.expires_in_days * DAY_MS) : null,
    createdBy: scope.principal.kind === 'user' ? scope.principal.id : null,
  });
  account.roles.set(roles);
  await flushNamed(scope.em, SERVICE_ACCOUNT_NAMES, input.name);
  return { service_account: accountView(account), api_key: key.key };
}

export async function updateServiceAccount(
  scope: CallerScope,
  input: { account_id: string; name?: string; description?: string; is_active?: boolean; roles?: string[] },
) {
  const account = await findAccount(scope, input.account_id);
  if (input.name && input.name !== account.name) {
    await assertNameFree(scope.em, SERVICE_ACCOUNT_NAMES, input.name, {
      organizationId: account.organization.id,
      except: account.id,
    });
    account.name = input.name;
  }
  if (input.description !== undefined) account.description = input.description;
  if (input.is_active !== undefined) account.isActive = input.is_active;
  if (input.roles)
    account.roles.set(await resolveRoles(scope.em, organizationOf(scope.principal), input.roles));
  await flushNamed(scope.em, SERVICE_ACCOUNT_NAMES, account.name);
  // A disabled account or changed roles must take effect on the very next request.
  scope.deps.authenticator.forget();
  return accountView(account);
}

export async function deleteServiceAccount(scope: CallerScope, accountId: string) {
  const account = await findAccount(scope, accountId);
  await scope.em.remove(account).flush();
  scope.deps.authenticator.forget();
  return { success: true as const };
}

export async function apiKeyInfo(scope: CallerScope, accountId: string) {
  const account = await findAccount(scope, accountId);
  const previousValid =
    account.previousKeyExpiresAt && account.previousKeyExpiresAt.getTime() > Date.now()
      ? account.previousKeyExpiresAt
      : null;
  return {
    key_prefix: account.keyPrefix,
    masked_key: `dms_${account.keyPrefix}_${'•'.repeat(8)}`,
    created_at: account.keyCreatedAt,
    expires_at: account.keyExpiresAt ?? null,
    last_used_at: account.lastUsedAt ?? null,
    previous_key_valid_until: previousValid,
  };
}

/** A new key; the old one keeps working for the grace period (none by default), then never again. */
export async function rotateKey(
  scope: CallerScope,
  input: { account_id: string; grace_period_minutes: number; expires_in_days?: number },
) {
  const account = await findAccount(scope, input.account_id);
  const key = generateApiKey();
  const now = Date.now();
  if (input.grace_period_minutes > 0) {
    account.previousKeyPrefix = account.keyPrefix;
    account.previousKeyHash = account.keyHash;
    account.previousKeyExpiresAt = new Date(now + input.grace_period_minutes * 60_000);
  } else {
    account.previousKeyPrefix = null;
    account.previousKeyHash = null;
    account.previousKeyExpiresAt = null;
  }
  account.keyPrefix = key.prefix;
  account.keyHash = key.hash;
  account.keyCreatedAt = new Date(now);
  account.keyExpiresAt = input.expires_in_days ? new Date(now + input.expires_in_days * DAY_MS) : null;
  await scope.em.flush();
  scope.deps.authenticator.forget();
  return { service_account: accountView(account), api_key: key.key };
}
