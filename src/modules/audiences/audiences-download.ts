import { createReadStream } from 'node:fs';
import type { Request, Response } from 'express';
import type { EntityManager } from '@mikro-orm/postgresql';
import { AppError, type AppErrorCode } from '../../app-error.ts';
import type { AppDeps } from '../../deps.ts';
import { hasPermission } from '../../auth/permissions.ts';
import { GENERIC_INTERNAL_MESSAGE, HTTP_STATUS, toAppError } from '../../trpc/errors.ts';
import { exportFile } from './audiences-exports.service.ts';

export const AUDIENCE_EXPORT_DOWNLOAD_PATH = '/api/api/audiences/exports/:export_id/download';

/**
 * GET /api/api/audiences/exports/{export_id}/download: the CSV file of an export, streamed. A plain
 * express route (REST procedures answer JSON only) with the guard of the reading routes, workspace.read.
 * Mount it before the OpenAPI middleware: `app.get(AUDIENCE_EXPORT_DOWNLOAD_PATH, audienceExportDownload(deps))`.
 */
export function audienceExportDownload(deps: AppDeps) {
  return async (req: Request, res: Response): Promise<void> => {
    try {
      const em = deps.orm.em.fork() as EntityManager;
      const bearer = /^Bearer\s+(\S+)\s*$/i.exec(req.get('authorization') ?? '')?.[1];
      const principal = bearer ? await deps.authenticator.authenticate(em, bearer) : null;
      if (!principal) throw new AppError('UNAUTHORIZED', 'Missing or invalid credentials');
      if (principal.mustChangePassword)
        throw new AppError(
          'FORBIDDEN',
          'Change your temporary password first (POST /api/auth/change-password)',
          {
            reason: 'PASSWORD_CHANGE_REQUIRED',
          },
        );
      if (!hasPermission(principal.permissions, 'workspace.read'))
        throw new AppError('FORBIDDEN', 'Missing permission workspace.read');
      const file = await exportFile({ em, deps, principal }, String(req.params.export_id));
      res.setHeader('content-type', 'text/csv; charset=utf-8');
      res.setHeader('content-disposition', `attachment; filename="${file.filename}"`);
      if (file.size != null) res.setHeader('content-length', String(file.size));
      const stream = createReadStream(file.path);
      stream.on('error', () => res.destroy());
      stream.pipe(res);
    } catch (error) {
      const appError = toAppError(error);
      const status = HTTP_STATUS[appError.code as AppErrorCode] ?? 500;
      if (status >= 500) deps.logger.error({ err: error }, 'audience export download failed');
      res.status(status).json({
        message: status >= 500 ? GENERIC_INTERNAL_MESSAGE : appError.message,
        code: appError.code,
        ...(appError.details.reason ? { reason: appError.details.reason } : {}),
      });
    }
  };
}
