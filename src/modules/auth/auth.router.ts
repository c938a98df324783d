import {
  authedProcedure,
  permissionProcedure,
  publicProcedure,
  router,
  superAdminProcedure,
} from '../../trpc/procedures.ts';
import { publicRest, rest } from '../../trpc/openapi-meta.ts';
import { successOutput } from '../../trpc/common-schemas.ts';
import * as s from './auth.schemas.ts';
import * as auth from './auth.service.ts';
import { createUser } from '../users/users.service.ts';

const tag = 'auth';
const pending = { allowPendingPasswordChange: true };

export const authRouter = router({
  organizations: publicProcedure
    .meta(
      publicRest('GET', '/api/auth/organizations', 'List organizations available for login selection', tag),
    )
    .output(s.publicOrganizationsOutput)
    .query(({ ctx }) => auth.listPublicOrganizations(ctx)),

  login: publicProcedure
    .meta(
      publicRest('POST', '/api/auth/login', 'Log in with username, organization domain and password', tag),
    )
    .input(s.loginInput)
    .output(s.loginOutput)
    .mutation(({ ctx, input }) => auth.login(ctx, input)),

  adminLogin: publicProcedure
    .meta(publicRest('POST', '/api/auth/admin/login', 'Super admin login', tag))
    .input(s.superAdminLoginInput)
    .output(s.loginOutput)
    .mutation(({ ctx, input }) => auth.superAdminLogin(ctx, input)),

  session: authedProcedure
    .meta(rest('GET', '/api/auth/session', 'Current session information', tag, pending))
    .output(s.sessionOutput)
    .query(({ ctx }) => auth.sessionInfo(ctx.principal)),

  logout: authedProcedure
    .meta(
      rest(
        'POST',
        '/api/auth/logout',
        'Log out: end the current session (an API key is ended by rotating or revoking it)',
        tag,
        pending,
      ),
    )
    .output(successOutput)
    .mutation(({ ctx }) => auth.logout(ctx)),

  changePassword: authedProcedure
    .meta(
      rest(
        'POST',
        '/api/auth/change-password',
        'Change password; required first after a temporary password',
        tag,
        pending,
      ),
    )
    .input(s.changePasswordInput)
    .output(successOutput)
    .mutation(({ ctx, input }) => auth.changePassword(ctx, input)),

  sessions: permissionProcedure('org.admin')
    .meta(rest('GET', '/api/auth/sessions', 'List the active sessions of the organization', tag))
    .input(s.pageQuery)
    .output(s.sessionListOutput)
    .query(({ ctx, input }) => auth.listSessions(ctx, input)),

  getPreferences: authedProcedure
    .meta(rest('GET', '/api/auth/preferences', "Current user's preferences", tag))
    .output(s.preferencesOutput)
    .query(({ ctx }) => auth.getPreferences(ctx)),

  updatePreferences: authedProcedure
    .meta(
      rest(
        'PUT',
        '/api/auth/preferences',
        "Merge keys into the current user's preferences (null removes a key)",
        tag,
      ),
    )
    .input(s.preferencesInput)
    .output(s.preferencesOutput)
    .mutation(({ ctx, input }) => auth.mergePreferences(ctx, input.preferences)),

  adminListOrganizations: superAdminProcedure
    .meta(rest('GET', '/api/auth/admin/organizations', 'Super admin: list all organizations', tag))
    .input(s.pageQuery)
    .output(s.organizationListOutput)
    .query(({ ctx, input }) => auth.listOrganizations(ctx, input)),

  adminCreateOrganization: superAdminProcedure
    .meta(
      rest(
        'POST',
        '/api/auth/admin/organizations',
        'Super admin: create an organization (and its admin)',
        tag,
      ),
    )
    .input(s.createOrganizationInput)
    .output(s.createOrganizationOutput)
    .mutation(({ ctx, input }) => auth.createOrganization(ctx, input)),

  adminUpdateOrganization: superAdminProcedure
    .meta(rest('PUT', '/api/auth/admin/organizations/{org_id}', 'Super admin: update an organization', tag))
    .input(s.updateOrganizationInput)
    .output(s.organizationOutput)
    .mutation(({ ctx, input }) => auth.updateOrganization(ctx, input)),

  adminDeleteOrganization: superAdminProcedure
    .meta(
      rest(
        'DELETE',
        '/api/auth/admin/organizations/{org_id}',
        'Super admin: delete an organization and all it owns',
        tag,
      ),
    )
    .input(s.orgIdInput)
    .output(successOutput)
    .mutation(({ ctx, input }) => auth.deleteOrganization(ctx, input.org_id)),

  adminOrganizationWorkspaces: superAdminProcedure
    .meta(
      rest(
        'GET',
        '/api/auth/admin/organizations/{org_id}/workspaces',
        'Super admin: workspaces of an organization',
        tag,
      ),
    )
    .input(s.orgIdInput)
    .output(s.workspaceSummaryOutput)
    .query(({ ctx, input }) => auth.listOrganizationWorkspaces(ctx, input.org_id)),

  adminDeleteWorkspace: superAdminProcedure
    .meta(
      rest(
        'DELETE',
        '/api/auth/admin/workspaces/{tenant_id}/{workspace_name}',
        'Super admin: delete a workspace of an organization',
        tag,
      ),
    )
    .input(s.deleteWorkspaceInput)
    .output(successOutput)
    .mutation(({ ctx, input }) => auth.deleteOrganizationWorkspace(ctx, input)),

  adminListUsers: superAdminProcedure
    .meta(rest('GET', '/api/auth/admin/users', 'Super admin: list all users', tag))
    .input(s.adminUserListInput)
    .output(s.userListOutput)
    .query(({ ctx, input }) => auth.listAllUsers(ctx, input)),

  adminCreateUser: superAdminProcedure
    .meta(rest('POST', '/api/auth/admin/users', 'Super admin: create a user with a password', tag))
    .input(s.superAdminCreateUserInput)
    .output(s.createdUserOutput)
    .mutation(({ ctx, input }) =>
      createUser(ctx, {
        ...input,
        organizationId: input.organization_id,
        isSuperAdmin: input.is_super_admin,
      }),
    ),

  adminUpdateUser: superAdminProcedure
    .meta(rest('PUT', '/api/auth/admin/users/{user_id}', 'Super admin: update a user', tag))
    .input(s.superAdminUpdateUserInput)
    .output(s.userOutput)
    .mutation(({ ctx, input }) => auth.superAdminUpdateUser(ctx, input)),

  adminDeleteUser: superAdminProcedure
    .meta(rest('DELETE', '/api/auth/admin/users/{user_id}', 'Super admin: delete a user', tag))
    .input(s.userIdInput)
    .output(successOutput)
    .mutation(({ ctx, input }) => auth.superAdminDeleteUser(ctx, input.user_id)),

  /** Served as a .tar.gz by the plain route in app.ts, which calls this procedure for the guard and the file list. */
  adminLogsDownload: superAdminProcedure
    .meta(
      rest(
        'GET',
        '/api/auth/admin/logs/download',
        'Super admin: download control-plane logs as a .tar.gz archive',
        tag,
      ),
    )
    .output(s.logFilesOutput)
    .query(({ ctx }) => auth.listLogFiles(ctx)),
});
