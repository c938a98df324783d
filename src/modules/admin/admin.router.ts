import { z } from 'zod';
import { permissionProcedure, router, superAdminProcedure } from '../../trpc/procedures.ts';
import { authedProcedure } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import { successOutput } from '../../trpc/common-schemas.ts';
import { createdUserOutput, userIdInput, userListOutput, userOutput } from '../auth/auth.schemas.ts';
import * as s from './admin.schemas.ts';
import * as admin from './admin.service.ts';
import * as settings from './admin-settings.service.ts';
import * as llmSettings from './llm-settings.service.ts';
import * as setup from './setup-environment.service.ts';

const tag = 'admin';
const orgAdmin = permissionProcedure('org.admin');
const manageSettings = permissionProcedure('settings.manage');

export const adminRouter = router({
  listUsers: orgAdmin
    .meta(rest('GET', '/api/admin/users', 'List users of the organization', tag))
    .input(s.userPageInput)
    .output(userListOutput)
    .query(({ ctx, input }) => admin.listUsers(ctx, input)),

  createUser: orgAdmin
    .meta(
      rest(
        'POST',
        '/api/admin/users',
        'Create a user (a temporary password is generated when none is given)',
        tag,
      ),
    )
    .input(s.createUserInput)
    .output(createdUserOutput)
    .mutation(({ ctx, input }) => admin.createOrganizationUser(ctx, input)),

  updateUser: orgAdmin
    .meta(rest('PUT', '/api/admin/users/{user_id}', 'Update a user', tag))
    .input(s.updateUserInput)
    .output(userOutput)
    .mutation(({ ctx, input }) => admin.updateOrganizationUser(ctx, input)),

  setUserPassword: superAdminProcedure
    .meta(rest('PUT', '/api/admin/users/{user_id}/password', "Set a user's password (super admin only)", tag))
    .input(s.setUserPasswordInput)
    .output(successOutput)
    .mutation(({ ctx, input }) => admin.setUserPassword(ctx, input)),

  setUserRoles: orgAdmin
    .meta(rest('PUT', '/api/admin/users/{user_id}/roles', 'Replace the role assignment of a user', tag))
    .input(s.updateUserRolesInput)
    .output(userOutput)
    .mutation(({ ctx, input }) => admin.setUserRoles(ctx, input)),

  deleteUser: orgAdmin
    .meta(rest('DELETE', '/api/admin/users/{user_id}', 'Delete a user', tag))
    .input(userIdInput)
    .output(successOutput)
    .mutation(({ ctx, input }) => admin.deleteOrganizationUser(ctx, input.user_id)),

  listRoles: orgAdmin
    .meta(rest('GET', '/api/admin/roles', 'List roles of the organization', tag))
    .input(z.object({}))
    .output(s.roleListOutput)
    .query(({ ctx }) => admin.listRoles(ctx)),

  createRole: orgAdmin
    .meta(rest('POST', '/api/admin/roles', 'Create a custom role', tag))
    .input(s.createRoleInput)
    .output(s.roleOutput)
    .mutation(({ ctx, input }) => admin.createRole(ctx, input)),

  updateRole: orgAdmin
    .meta(rest('PUT', '/api/admin/roles/{role_id}', 'Rename or describe a custom role', tag))
    .input(s.updateRoleInput)
    .output(s.roleOutput)
    .mutation(({ ctx, input }) => admin.updateRole(ctx, input)),

  setRolePermissions: orgAdmin
    .meta(
      rest('PUT', '/api/admin/roles/{role_id}/permissions', 'Replace the permissions of a custom role', tag),
    )
    .input(s.updateRolePermissionsInput)
    .output(s.roleOutput)
    .mutation(({ ctx, input }) => admin.setRolePermissions(ctx, input)),

  deleteRole: orgAdmin
    .meta(
      rest(
        'DELETE',
        '/api/admin/roles/{role_id}',
        'Delete a custom role (built-in roles cannot be deleted)',
        tag,
      ),
    )
    .input(s.roleIdInput)
    .output(successOutput)
    .mutation(({ ctx, input }) => admin.deleteRole(ctx, input.role_id)),

  permissions: orgAdmin
    .meta(rest('GET', '/api/admin/permissions', 'List all available permissions with descriptions', tag))
    .input(z.object({}))
    .output(s.permissionListOutput)
    .query(() => admin.listPermissions()),

  systemInfo: superAdminProcedure
    .meta(rest('GET', '/api/admin/system-info', 'System information including the deployment version', tag))
    .input(z.object({}))
    .output(s.systemInfoOutput)
    .query(({ ctx }) => admin.systemInfo(ctx)),
  // ---- cache and feature settings, user overrides, version control (issue 10) ----

  getCacheSettings: authedProcedure
    .meta(rest('GET', '/api/admin/cache-settings', 'Cache settings of the organization', tag))
    .input(z.object({}))
    .output(s.cacheSettingsOutput)
    .query(({ ctx }) => settings.getCacheSettings(ctx)),

  saveCacheSettings: manageSettings
    .meta(
      rest(
        'POST',
        '/api/admin/cache-settings',
        'Save cache settings; a cache switched on or off is cleared',
        tag,
      ),
    )
    .input(s.cacheSettingsInput)
    .output(s.saveCacheSettingsOutput)
    .mutation(({ ctx, input }) => settings.saveCacheSettings(ctx, input)),

  getFeatureSettings: authedProcedure
    .meta(rest('GET', '/api/admin/feature-settings', 'Feature flag settings and available features', tag))
    .input(z.object({}))
    .output(s.featureSettingsOutput)
    .query(({ ctx }) => settings.getFeatureSettings(ctx)),

  saveFeatureSettings: manageSettings
    .meta(rest('POST', '/api/admin/feature-settings', 'Save feature flag settings', tag))
    .input(s.featureSettingsInput)
    .output(s.featureSettingsOutput)
    .mutation(({ ctx, input }) => settings.saveFeatureSettings(ctx, input)),

  userFeatureAccess: authedProcedure
    .meta(
      rest(
        'GET',
        '/api/admin/user-feature-access',
        'Whether the caller may use user-level feature overrides',
        tag,
      ),
    )
    .input(z.object({}))
    .output(s.userFeatureAccessOutput)
    .query(({ ctx }) => settings.userFeatureAccess(ctx)),

  getUserFeatureOverrides: authedProcedure
    .meta(
      rest(
        'GET',
        '/api/admin/user-feature-overrides',
        "A user's feature overrides and effective settings (own organization only)",
        tag,
      ),
    )
    .input(s.userFeatureOverridesQuery)
    .output(s.userFeatureOverridesOutput)
    .query(({ ctx, input }) => settings.getUserFeatureOverrides(ctx, input)),

  saveUserFeatureOverrides: authedProcedure
    .meta(
      rest(
        'POST',
        '/api/admin/user-feature-overrides',
        'Save feature overrides of a user (own organization, overridable features only)',
        tag,
      ),
    )
    .input(s.userFeatureOverridesInput)
    .output(s.userFeatureOverridesOutput)
    .mutation(({ ctx, input }) => settings.saveUserFeatureOverrides(ctx, input)),

  clearUserFeatureOverrides: authedProcedure
    .meta(
      rest(
        'DELETE',
        '/api/admin/user-feature-overrides',
        "Clear all of a user's feature overrides (own organization only)",
        tag,
      ),
    )
    .input(s.userFeatureOverridesQuery)
    .output(s.userFeatureOverridesOutput)
    .mutation(({ ctx, input }) => settings.clearUserFeatureOverrides(ctx, input)),

  getVcsConfig: authedProcedure
    .meta(
      rest(
        'GET',
        '/api/admin/vcs-config',
        'Version-control integration configuration (token never returned)',
        tag,
      ),
    )
    .input(z.object({}))
    .output(s.vcsConfigOutput)
    .query(({ ctx }) => settings.getVcsConfig(ctx)),

  saveVcsConfig: manageSettings
    .meta(rest('POST', '/api/admin/vcs-config', 'Save the version-control integration configuration', tag))
    .input(s.vcsConfigInput)
    .output(s.vcsConfigOutput)
    .mutation(({ ctx, input }) => settings.saveVcsConfig(ctx, input)),

  testVcs: manageSettings
    .meta(
      rest(
        'POST',
        '/api/admin/vcs-test',
        'Test the version-control connection: list remote refs and check push access',
        tag,
      ),
    )
    .input(s.vcsConfigInput)
    .output(s.vcsTestOutput)
    .mutation(({ ctx, input }) => settings.testVcsConnection(ctx, input)),

  // ---- LLM parameters and mode (issue 6) ----

  getLlmParameters: authedProcedure
    .meta(
      rest('GET', '/api/admin/llm-parameters', 'LLM parameters of the organization (API key masked)', tag),
    )
    .input(z.object({}))
    .output(s.llmParametersOutput)
    .query(({ ctx }) => llmSettings.getLlmParameters(ctx)),

  saveLlmParameters: manageSettings
    .meta(
      rest(
        'POST',
        '/api/admin/llm-parameters',
        'Save the LLM parameters (keys left out keep their value; the API key is stored encrypted)',
        tag,
      ),
    )
    .input(s.llmParametersInput)
    .output(s.llmParametersOutput)
    .mutation(({ ctx, input }) => llmSettings.saveLlmParameters(ctx, input)),

  getLlmMode: authedProcedure
    .meta(rest('GET', '/api/admin/get-llm-mode', 'Current LLM mode (a process-level setting)', tag))
    .input(z.object({}))
    .output(s.llmModeOutput)
    .query(() => llmSettings.getLlmMode()),

  setLlmMode: superAdminProcedure
    .meta(
      rest(
        'POST',
        '/api/admin/set-llm-mode',
        'Set the LLM mode and reset the LLM manager (super admin)',
        tag,
      ),
    )
    .input(s.setLlmModeInput)
    .output(s.setLlmModeOutput)
    .mutation(({ input }) => llmSettings.setLlmMode(input.mode)),

  // ---- setup-environment (issue 10) ----

  setupEnvironment: superAdminProcedure
    .meta(
      rest(
        'POST',
        '/api/admin/setup-environment',
        'Set up a complete environment in one step, all or nothing: organization, admin user, workspace, data source, schema and initial mappings',
        tag,
      ),
    )
    .input(s.setupEnvironmentInput)
    .output(s.setupEnvironmentOutput)
    .mutation(({ ctx, input }) => setup.setupEnvironment(ctx, input)),
});
