import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: [
      'node_modules/**',
      '.data/**',
      'coverage/**',
      'scratch/**',
      'dist/**',
      'examples/openapi-fetch/schema.d.ts',
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { globals: { process: 'readonly', console: 'readonly', URL: 'readonly' } },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/consistent-type-imports': 'error',
    },
  },
  {
    files: ['src/modules/**/*.ts', 'src/cache.ts'],
    rules: {
      'no-restricted-properties': [
        'error',
        {
          property: 'getConnection',
          message:
            "Use em.execute(sql, params): a raw connection runs outside the request's tenant session and so bypasses row-level security (src/auth/tenancy.ts).",
        },
      ],
    },
  },
);
