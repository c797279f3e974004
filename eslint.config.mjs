// ESLint: typescript-eslint's type-aware rules on src/ and test/, the plain JS rules on the build script.
// Layout is prettier's (npm run format), layering dependency-cruiser's (.dependency-cruiser.cjs), unused exports,
// files and dependencies knip's (knip.json). `npm run lint` runs all four; `npm run lint:fix` fixes what it can.
import js from '@eslint/js';
import { defineConfig } from 'eslint/config';
import tseslint from 'typescript-eslint';

export default defineConfig(
  { ignores: ['bin/**', 'node_modules/**', 'test/bench/results/**'] },
  { linterOptions: { reportUnusedDisableDirectives: 'error' } },

  {
    files: ['src/**/*.ts', 'test/**/*.ts'],
    extends: [js.configs.recommended, tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      // Issue 12: no `x!`. A value that may be missing is checked, and the check says what happens when it is not there.
      '@typescript-eslint/no-non-null-assertion': 'error',
      // The code's style: `import type { Y }` from a module used only for types, `import { x, type Y }` when mixed.
      '@typescript-eslint/consistent-type-imports': ['error', { prefer: 'type-imports', fixStyle: 'inline-type-imports' }],
      // All-type imports are written `import type { A, B }`, not `import { type A, type B }`: the first word says
      // whether the line loads a module at run time.
      '@typescript-eslint/no-import-type-side-effects': 'error',
      // A promise nobody awaits loses its error and may outlive the reply. `void p` says "on purpose".
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_', destructuredArrayIgnorePattern: '^_' },
      ],
      // Deliberate require()s: the configuration's schema, loaded on first use (config.ts: zod costs more than the rest
      // of a driver call); the backend and the host system, made on first use (context.ts: the control plane's calls
      // use neither); and node:sea, which Node versions before 20.12 do not have (config.ts).
      '@typescript-eslint/no-require-imports': [
        'error',
        { allow: ['^\\./config-schema\\.js$', '^\\./backend/index\\.js$', '^\\./sys/system\\.js$', '^node:sea$'] },
      ],
      // Off: an `async` function without `await` is how an op, a store or a test double implements an async
      // interface, so that a throw becomes a rejection like everywhere else (ops' run, EtcdStore.close, fakes).
      '@typescript-eslint/require-await': 'off',
    },
  },

  {
    // The house rule "stdout carries exactly one JSON object per driver call, nothing on stderr": only
    // protocol/driver.ts (the driver call's reply) and cli/ (admin commands, which print for people) write there.
    files: ['src/**/*.ts'],
    ignores: ['src/protocol/driver.ts', 'src/cli/**'],
    rules: {
      'no-console': 'error',
      'no-restricted-properties': [
        'error',
        { object: 'process', property: 'stdout', message: 'Only protocol/driver.ts and cli/ write to stdout.' },
        { object: 'process', property: 'stderr', message: 'A driver call prints nothing on stderr; only cli/ writes there.' },
      ],
    },
  },

  {
    files: ['test/**/*.ts'],
    rules: {
      // node:test's describe/it/test return promises the runner itself awaits; everything else must be awaited.
      '@typescript-eslint/no-floating-promises': [
        'error',
        { allowForKnownSafeCalls: [{ from: 'package', package: 'node:test', name: ['describe', 'it', 'test', 'suite'] }] },
      ],
      // `x!.y` on test data is allowed: if x is missing, the test fails right there with a TypeError on that line.
      // A `!` whose value is passed on (an argument, a spread, a Map key) is not: undefined would flow silently into
      // the code under test, so those are checked (assert.ok(x), `?.` inside an assertion).
      '@typescript-eslint/no-non-null-assertion': 'off',
      'no-restricted-syntax': [
        'error',
        {
          selector: 'TSNonNullExpression:not(MemberExpression > TSNonNullExpression.object)',
          message: 'A `!` that is not dereferenced at once lets undefined into the code under test: check the value (assert.ok).',
        },
      ],
      // Tests read parsed JSON and YAML (manifests, log lines, etcd replies) by path and assert on what they find; a
      // wrong path fails the assertion, so typing that data would add ceremony, not checks.
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
    },
  },

  // The build script and the lint configurations: plain JavaScript. The Node globals they use are listed here rather
  // than taken from the `globals` package, which is not a dependency of ours.
  {
    files: ['build.mjs', 'eslint.config.mjs'],
    extends: [js.configs.recommended],
    languageOptions: { globals: { process: 'readonly', URL: 'readonly' } },
  },
  {
    files: ['.dependency-cruiser.cjs'],
    extends: [js.configs.recommended],
    languageOptions: { sourceType: 'commonjs', globals: { require: 'readonly', module: 'writable', __dirname: 'readonly' } },
  },
);
