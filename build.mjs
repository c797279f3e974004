// Bundles src/bin.ts into bin/latch: one CommonJS file with a node shebang and no run-time node_modules.
// CommonJS because Node starts it noticeably faster than an ESM bundle, and every driver call pays start-up.
//
// `node build.mjs --sea` (npm run build:sea) also makes bin/latch-sea, a Node single-executable application: the
// same bundle injected into a copy of the running node binary, so a host needs nothing installed. It takes a few
// seconds (the node binary is ~100 MB), which is why plain `npm run build` does not do it.
import { build } from 'esbuild';
import { spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const pkg = JSON.parse(readFileSync(new URL('./package.json', import.meta.url), 'utf8'));

// zod re-exports all of its ~40 locales (about half of its size) as z.locales; latch only ever uses English,
// which zod registers by itself. Every call parses the bundle, so the others are left out.
const englishOnlyZodLocales = {
  name: 'english-only-zod-locales',
  setup(b) {
    b.onResolve({ filter: /\/locales\/index\.c?js$/ }, (args) =>
      args.importer.includes(`${join('node_modules', 'zod')}`)
        ? { path: join(dirname(args.importer), args.path), namespace: 'zod-locales' }
        : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: 'zod-locales' }, (args) => ({
      contents: args.path.endsWith('.cjs')
        ? `exports.en = require(${JSON.stringify(join(dirname(args.path), 'en.cjs'))}).default;`
        : `export { default as en } from ${JSON.stringify(join(dirname(args.path), 'en.js'))};`,
      resolveDir: dirname(args.path),
      loader: 'js',
    }));
  },
};

// prom-client (and its dependencies, ~120 KB) is only ever loaded by `latch agent` and `latch metrics`, yet every
// driver call would parse it as part of the bundle (about 2% of a call's CPU time). It is bundled on its own and
// embedded as a string, which V8 only scans, and evaluated on the first import.
const promClientAsString = {
  name: 'prom-client-as-string',
  setup(b) {
    b.onResolve({ filter: /^prom-client$/ }, () => ({ path: 'prom-client', namespace: 'prom-client-as-string' }));
    b.onLoad({ filter: /.*/, namespace: 'prom-client-as-string' }, async () => {
      const inner = await build({
        entryPoints: ['prom-client'],
        bundle: true,
        platform: 'node',
        target: 'node20',
        format: 'cjs',
        minify: true,
        legalComments: 'none',
        write: false,
        logLevel: 'warning',
      });
      const code = inner.outputFiles[0].text;
      return {
        contents:
          `const m = { exports: {} };\n` +
          `new Function('module', 'exports', 'require', ${JSON.stringify(code)})(m, m.exports, require);\n` +
          `module.exports = m.exports;\n`,
        loader: 'js',
      };
    });
  },
};

const bundleOptions = {
  plugins: [englishOnlyZodLocales, promClientAsString],
  entryPoints: ['src/bin.ts'],
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'cjs',
  // Less for V8 to parse on every call; identifiers stay readable for the stack traces in the log.
  minifyWhitespace: true,
  minifySyntax: true,
  sourcemap: false,
  legalComments: 'none',
  define: { LATCH_VERSION: JSON.stringify(pkg.version) },
  logLevel: 'warning',
};

await build({ ...bundleOptions, outfile: 'bin/latch', banner: { js: '#!/usr/bin/env node' } });
chmodSync('bin/latch', 0o755);

if (process.argv.includes('--sea')) await buildSea('bin/latch-sea');

/**
 * Node 20 single-executable application (https://nodejs.org/docs/latest-v20.x/api/single-executable-applications.html):
 * bundle → blob (node --experimental-sea-config) → copy of node with the blob injected (postject). Bundles from
 * src/ again into a private directory rather than reading bin/latch, which someone may be rebuilding meanwhile,
 * and renames the result into place, so nobody ever runs a half-written bin/latch-sea.
 */
async function buildSea(outfile) {
  const work = mkdtempSync(join(tmpdir(), 'latch-sea-'));
  try {
    const main = join(work, 'latch.cjs');
    const blob = join(work, 'latch.blob');
    const exe = join(work, 'latch-sea');
    // The SEA starts from a V8 startup snapshot made by src/sea.ts: modules evaluated, zod loaded, schemas built.
    await build({ ...bundleOptions, entryPoints: ['src/sea.ts'], outfile: main });
    const seaConfig = join(work, 'sea-config.json');
    writeFileSync(
      seaConfig,
      JSON.stringify({
        main,
        output: blob,
        // The driver must print nothing but its JSON reply, on stderr too: kubelet parses both streams.
        disableExperimentalSEAWarning: true,
        // The heap after src/sea.ts ran: every call starts with its modules evaluated (zod alone costs a third of
        // a node start-up to evaluate).
        useSnapshot: true,
      }),
    );
    quietly(process.execPath, ['--experimental-sea-config', seaConfig]);
    copyFileSync(process.execPath, exe);
    chmodSync(exe, 0o755);
    // postject's ELF writer prints harmless warnings about .note sections; its output is shown only on failure.
    const postject = join(dirname(fileURLToPath(import.meta.resolve('postject'))), 'cli.js');
    quietly(process.execPath, [postject, exe, 'NODE_SEA_BLOB', blob, '--sentinel-fuse', 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2']);
    renameSync(exe, outfile);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

function quietly(command, args) {
  const result = spawnSync(command, args, { stdio: ['ignore', 'pipe', 'pipe'], encoding: 'utf8' });
  if (result.status !== 0) {
    process.stderr.write(`${result.stdout ?? ''}${result.stderr ?? ''}`);
    throw new Error(`${args.slice(0, 2).join(' ')} failed (${result.error?.message ?? `exit ${result.status}`})`);
  }
}
