/** Fixed values every test server shares (never used outside tests). */
export const SUPERADMIN_USERNAME = 'superadmin';
export const SUPERADMIN_PASSWORD = 'test-root-passphrase';
export const TEST_SECRET_KEY = '0f'.repeat(32);
export const TEST_PASSWORD = 'correct-horse-battery';
