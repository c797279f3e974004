// Bundles src/main.ts into bin/latch: one CommonJS file with a node shebang and no run-time node_modules.
// CommonJS because Node starts it noticeably faster than an ESM bundle, and every driver call pays start-up.
import { build } from 'esbuild';
import { chmodSync, readFileSync } from 'node:fs';

const pkg = JSON.parse(readFileSync(new URL('./package.json', import.meta.url), 'utf8'));

await build({
  entryPoints: ['src/main.ts'],
  outfile: 'bin/latch',
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'cjs',
  minify: false,
  sourcemap: false,
  legalComments: 'none',
  banner: { js: '#!/usr/bin/env node' },
  define: { LATCH_VERSION: JSON.stringify(pkg.version) },
  logLevel: 'warning',
});
chmodSync('bin/latch', 0o755);
