import { resolve } from 'node:path';
import { z } from 'zod';
import { LLM_MODES } from './llm/provider.ts';
import { DEFAULT_BLOCKED_NETWORKS, parseNetworkList } from './warehouse/network-guard.ts';
import { DEFAULT_IN_PROCESS_LIMIT } from './quality/identity-graph.ts';
import { passwordPolicyIssues } from './auth/password.ts';

const booleanFlag = z.stringbool().default(true);

const networkList = z
  .string()
  .default(DEFAULT_BLOCKED_NETWORKS.join(','))
  .superRefine((text, ctx) => {
    try {
      parseNetworkList(text);
    } catch (error) {
      ctx.addIssue({ code: 'custom', message: (error as Error).message });
    }
  });

const envSchema = z.object({
  NODE_ENV: z.enum(['development', 'production', 'test']).default('development'),
  HOST: z.string().default('127.0.0.1'),
  PORT: z.coerce.number().int().min(0).max(65535).default(8000),
  DATABASE_URL: z.string().url().optional(),
  DIMAS_DATA_DIR: z.string().default('./.data'),
  DIMAS_SECRET_KEY: z
    .string()
    .regex(/^[0-9a-f]{64}$/i, 'must be 64 hex characters (32 bytes)')
    .optional(),
  SESSION_TTL_HOURS: z.coerce
    .number()
    .positive()
    .default(24 * 7),
  AUTH_CACHE_TTL_MS: z.coerce.number().int().min(0).default(5000),
  SUPERADMIN_USERNAME: z.string().min(3).default('superadmin'),
  // Held to the password policy below (it needs SUPERADMIN_USERNAME).
  SUPERADMIN_PASSWORD: z.string().optional(),
  SEED_DEMO: booleanFlag,
  CORS_ORIGINS: z.string().default(''),
  BODY_LIMIT: z.string().default('1mb'),
  // Deeper JSON (bodies, tRPC query input) answers 400 before it is parsed any further.
  BODY_MAX_DEPTH: z.coerce.number().int().min(2).max(1000).default(64),
  // express's `trust proxy`: unset = off (the socket's peer address is the client's).
  TRUST_PROXY: z.string().default('false'),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  LOGIN_MAX_FAILURES_PER_USER: z.coerce.number().int().positive().default(5),
  LOGIN_MAX_FAILURES_PER_ADDRESS: z.coerce.number().int().positive().default(30),
  LOGIN_FAILURE_WINDOW_SECONDS: z.coerce.number().int().positive().default(900),
  SSE_MAX_STREAMS_PER_USER: z.coerce.number().int().min(1).max(100).default(3),
  // A `: heartbeat` comment on idle event streams, so that proxies do not close them.
  SSE_HEARTBEAT_MS: z.coerce.number().int().min(100).max(300_000).default(15_000),
  GIT_COMMIT: z.string().optional(),
  WAREHOUSE_STATEMENT_TIMEOUT_MS: z.coerce.number().int().min(100).default(30_000),
  WAREHOUSE_ROW_CAP: z.coerce.number().int().min(1).max(1_000_000).default(10_000),
  WAREHOUSE_RESULT_BYTE_CAP: z.coerce
    .number()
    .int()
    .min(1024)
    .default(16 * 1024 * 1024),
  // Networks no warehouse connection may reach (CIDR list; empty: none). Checked on every resolved address.
  WAREHOUSE_BLOCKED_NETWORKS: networkList,
  // Networks no HTTP request to a tenant-chosen address (webhooks, git remotes, LLM endpoint) may reach.
  OUTBOUND_BLOCKED_NETWORKS: networkList,
  // How long one exchange with a git remote (a connection test, a push) may take in all: a commit
  // waits for its push, and a remote that accepts the connection and never answers must not hold it.
  VCS_REMOTE_TIMEOUT_MS: z.coerce.number().int().min(100).max(600_000).default(15_000),
  WAREHOUSE_ALLOW_SOCKET_PATHS: z.stringbool().default(false),
  WAREHOUSE_REFUSE_SUPERUSER: z.stringbool().default(false),
  DEMO_WAREHOUSE_PORT: z.coerce.number().int().min(0).max(65535).optional(),
  LLM_MODE: z.enum(LLM_MODES).default('offline'),
  // A running job whose worker has not written a heartbeat for this long is retried elsewhere.
  JOB_HEARTBEAT_TIMEOUT_SECONDS: z.coerce.number().int().min(2).default(60),
  /** Runs of one job kind a process works on at once; unset: 4 on PostgreSQL, 1 embedded. */
  JOB_CONCURRENCY: z.coerce.number().int().min(1).max(32).optional(),
  /** Finished job runs older than this many days are deleted hourly, except those still shown or read; 0 keeps all. */
  JOB_RUNS_RETENTION_DAYS: z.coerce.number().int().min(0).default(90),
  // Identity graphs up to this many identifiers (and twice as many pairs) get their components in
  // the job's process (~40 bytes each); larger ones in the warehouse, so that the process does not
  // grow with them.
  IDENTITY_IN_PROCESS_IDENTIFIERS: z.coerce.number().int().min(0).default(DEFAULT_IN_PROCESS_LIMIT),
});

export type Env = z.infer<typeof envSchema> & { dataDir: string };

// The super admin is created from SUPERADMIN_PASSWORD at first start: a password the policy refuses
// stops the start here, naming the rule, rather than failing the first start's seeding.
const checkedEnvSchema = envSchema.superRefine((env, ctx) => {
  if (env.SUPERADMIN_PASSWORD === undefined) return;
  const account = { username: env.SUPERADMIN_USERNAME };
  for (const issue of passwordPolicyIssues(account, env.SUPERADMIN_PASSWORD, 'SUPERADMIN_PASSWORD'))
    ctx.addIssue({ code: 'custom', path: issue.path, message: issue.message });
});

/** TRUST_PROXY in express's terms: true/false, a hop count, or addresses, subnets and names. */
export function trustProxySetting(value: string): boolean | number | string {
  const trimmed = value.trim();
  if (trimmed === '' || trimmed === 'false') return false;
  if (trimmed === 'true') return true;
  if (/^\d+$/.test(trimmed)) return Number(trimmed);
  return trimmed;
}

/** Parses the environment once; a bad value stops the process with a message naming the variable. */
export function loadEnv(source: NodeJS.ProcessEnv = process.env): Env {
  const parsed = checkedEnvSchema.safeParse(source);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => `  ${i.path.join('.')}: ${i.message}`);
    throw new Error(`Invalid environment:\n${lines.join('\n')}`);
  }
  return { ...parsed.data, dataDir: resolve(parsed.data.DIMAS_DATA_DIR) };
}
