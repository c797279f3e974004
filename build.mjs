// Bundles src/bin.ts into bin/latch: one CommonJS file with a node shebang and no run-time node_modules.
// CommonJS because Node starts it noticeably faster than an ESM bundle, and every driver call pays start-up.
//
// `node build.mjs --sea` (npm run build:sea) also makes bin/latch-sea, a Node single-executable application: the
// same bundle injected into a copy of the running node binary, so a host needs nothing installed. It takes a few
// seconds (the node binary is ~100 MB), which is why plain `npm run build` does not do it.
//
// The single executable is dynamically linked (glibc, libstdc++): a control plane's kube-controller-manager runs in a
// distroless container that has neither, and sees only the plugin dir. So the build also copies the loader and the
// libraries the executable needs into bin/latch-sea.runtime/, and gives the executable room to be pointed at them:
// its interpreter path and its RPATH are padded to RUNTIME_SLOT bytes with leading slashes (the same path to the
// kernel and to the loader), here still the build host's own loader and library directory, so bin/latch-sea runs
// as it is on any glibc host. `latch install` rewrites both slots in the copy it installs, to the absolute path of
// the runtime it installs beside the driver (src/host/runtime.ts); the driver then needs nothing outside the plugin
// dir, not even /proc (an $ORIGIN RPATH would need /proc/self/exe).
//
// The runtime also holds the native helper (src/native/*.c, compiled here with the host's C compiler), which a
// driver call starts its children and takes its locks with (src/sys/native.ts). The build's RPATH names the build's
// runtime directory after the host's library directory, so that bin/latch-sea finds the helper where it is built.
import { build } from 'esbuild';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { brotliCompressSync } from 'node:zlib';

const pkg = JSON.parse(readFileSync(new URL('./package.json', import.meta.url), 'utf8'));

/**
 * A digest of what the bundles are made of (src/, the locked dependencies, the node that builds), which names this
 * build: a driver call reuses a configuration validated by the same build only (src/config.ts, loadDriverConfig).
 */
function buildDigest() {
  const hash = createHash('sha256').update(process.version).update(readFileSync('package-lock.json'));
  const src = fileURLToPath(new URL('./src', import.meta.url));
  for (const file of readdirSync(src, { recursive: true }).sort()) {
    const path = join(src, file);
    if (statSync(path).isFile()) hash.update(`\0${file}\0`).update(readFileSync(path));
  }
  return hash.digest('hex').slice(0, 16);
}

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

// Libraries that only admin commands load (yaml for `latch install --print-manifests`, prom-client for `latch agent`
// and `latch metrics`, croner for the agent's recurring jobs) would still cost every driver call the parsing of their
// ~30-170 KB as part of the bundle (measured for the two big ones: 2-12% of a call). Each is bundled on its own, embedded as a string (which V8 only scans) and evaluated
// on its first import.
/** Bytes of source above which an embedded library is stored compressed. */
const LARGE_EMBEDDED_MODULE = 256 * 1024;

function asStringUntilImported(name) {
  const namespace = `${name}-as-string`;
  return {
    name: namespace,
    setup(b) {
      b.onResolve({ filter: new RegExp(`^${name}$`) }, () => ({ path: name, namespace }));
      b.onLoad({ filter: /.*/, namespace }, async () => {
        const { outputFiles } = await build({
          entryPoints: [fileURLToPath(import.meta.resolve(name))],
          bundle: true,
          platform: 'node',
          target: 'node20',
          format: 'cjs',
          minify: true,
          legalComments: 'none',
          write: false,
          logLevel: 'warning',
        });
        const source = `(function (module, exports, require) {${outputFiles[0].text}\n})`;
        // A large library is kept brotli-compressed (base64): every call reads and scans the whole bundle, and the S3
        // client's 1.3 MB as a plain string cost each driver call about 4 ms (docs/performance.md); decompressing it
        // when it is first imported costs a few ms, once, in the process that uses it.
        const text =
          source.length > LARGE_EMBEDDED_MODULE
            ? `require('node:zlib').brotliDecompressSync(Buffer.from(${JSON.stringify(brotliCompressSync(source).toString('base64'))}, 'base64')).toString('utf8')`
            : JSON.stringify(source);
        return {
          contents:
            `const loaded = { exports: {} };\n` +
            `require('node:vm').runInThisContext(${text}, { filename: ${JSON.stringify(name)} })(loaded, loaded.exports, require);\n` +
            `module.exports = loaded.exports;\n`,
          loader: 'js',
        };
      });
    },
  };
}

// Node's built-in modules beyond the few its start-up loads anyway cost each process their own evaluation (measured:
// node:crypto 2.6 ms, node:fs/promises 2 ms, node:stream 1 ms, node:timers/promises 1 ms of CPU), and the modules
// that import them at their top are evaluated by calls that never use them. So in latch's own code every built-in is
// loaded on first use: a module's import of one gets an object with a getter for each name that module imports, which
// loads the built-in when first read. Per importing module and with its names only, because esbuild copies every
// property of an imported CommonJS object into each importer (measured: 1 ms a call when each got all the names).
const STARTUP_BUILTINS = new Set(['node:fs', 'node:path']);
const SRC = join(dirname(fileURLToPath(import.meta.url)), 'src');
const builtinsOnFirstUse = {
  name: 'builtins-on-first-use',
  setup(b) {
    b.onResolve({ filter: /^node:/ }, (args) => {
      if (STARTUP_BUILTINS.has(args.path) || !args.importer.startsWith(`${SRC}/`)) return undefined;
      const names = importedNames(readFileSync(args.importer, 'utf8'), args.path);
      return (
        names && { path: `${args.path} in ${args.importer}`, namespace: 'builtin-on-first-use', pluginData: { builtin: args.path, names } }
      );
    });
    b.onLoad({ filter: /.*/, namespace: 'builtin-on-first-use' }, ({ pluginData: { builtin, names } }) => {
      const getters = names.map((name) => `  get ${name}() { return load().${name}; },`).join('\n');
      return { contents: `const load = () => require(${JSON.stringify(builtin)});\nmodule.exports = {\n${getters}\n};\n`, loader: 'js' };
    });
  },
};

/**
 * The names `source` imports from `builtin` (`import { a, b as c } from 'node:x'`), or undefined when it imports it in
 * any other way (a namespace, a default, a require()): that import is left as it is.
 */
function importedNames(source, builtin) {
  const names = [];
  const quoted = builtin.replace(/[/]/g, '\\/');
  const imports = new RegExp(`^import\\s+(type\\s+)?([^;]*?)\\s+from\\s+'${quoted}';`, 'gm');
  for (const [, typeOnly, clause] of source.matchAll(imports)) {
    if (typeOnly) continue;
    const named = /^\{([^}]*)\}$/.exec(clause.trim());
    if (!named) return undefined;
    for (const part of named[1].split(',')) {
      const [name, ...rest] = part.trim().split(/\s+/);
      if (name === 'type' && rest.length > 0) continue; // import { type X }
      if (name) names.push(name);
    }
  }
  return names.length > 0 ? [...new Set(names)] : undefined;
}

/**
 * bin/latch-sea's driver bundles leave the configuration schema (src/config-schema.ts, and zod: a quarter of the
 * bundle) to an asset of its own: config.ts requires it only when no validated copy of the configuration is there, and
 * the bundle's loader provides it by this name (src/sea/load.ts).
 */
const schemaFromLoader = {
  name: 'schema-from-loader',
  setup(b) {
    b.onResolve({ filter: /^\.\/config-schema\.js$/ }, (args) =>
      args.importer === join(SRC, 'config.ts') ? { path: 'latch:config-schema', external: true } : undefined,
    );
  },
};

/**
 * The control plane's bundle (src/sea/control.ts) leaves out what src/context.ts loads on first use and its ops never
 * use: a call that reached for it would fail with this message rather than load it.
 */
const withoutNodeSide = {
  name: 'without-node-side',
  setup(b) {
    b.onResolve({ filter: /^\.\/(backend\/index|sys\/system)\.js$/ }, (args) =>
      args.importer === join(SRC, 'context.ts') ? { path: args.path, namespace: 'without-node-side' } : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: 'without-node-side' }, ({ path }) => ({
      contents: `throw new Error(${JSON.stringify(`${path} is not in the control plane's bundle (src/sea/control.ts): an op that needs it is not a control-plane op`)});`,
      loader: 'js',
    }));
  },
};

const bundleOptions = {
  plugins: [
    builtinsOnFirstUse,
    englishOnlyZodLocales,
    asStringUntilImported('yaml'),
    asStringUntilImported('prom-client'),
    asStringUntilImported('croner'),
    asStringUntilImported('node-forge'),
    // The S3 client (an S3 backup target only): ~1.3 MB of code that no driver call may parse.
    asStringUntilImported('@aws-sdk/client-s3'),
    // tar-stream (a shared volume's backup and restore, in the agent only).
    asStringUntilImported('tar-stream'),
  ],
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
  define: { LATCH_VERSION: JSON.stringify(pkg.version), LATCH_BUILD: JSON.stringify(buildDigest()) },
  logLevel: 'warning',
};

/**
 * `--spawn-module FILE --out FILE`: a single executable whose children are started by FILE in place of
 * src/sys/run/spawn.ts (npm run bench's execa section builds bin/latch-sea-execa so, from test/bench/execa-spawn.ts).
 * bin/latch is left as it is.
 */
const spawnModule = process.argv.includes('--spawn-module') ? resolve(process.argv[process.argv.indexOf('--spawn-module') + 1]) : undefined;
const seaOut = process.argv.includes('--out') ? process.argv[process.argv.indexOf('--out') + 1] : 'bin/latch-sea';
if (spawnModule !== undefined) {
  bundleOptions.plugins.unshift({
    name: 'spawn-stand-in',
    setup(b) {
      b.onResolve({ filter: /^[.]\/spawn[.]js$/ }, (args) =>
        args.importer === join(SRC, 'sys/run/run.ts') ? { path: spawnModule } : undefined,
      );
    },
  });
} else {
  await build({ ...bundleOptions, outfile: 'bin/latch', banner: { js: '#!/usr/bin/env node' } });
  chmodSync('bin/latch', 0o755);
}

/** Bytes of the interpreter and RPATH slots (with their NUL); the longest path `latch install` can write there. */
const RUNTIME_SLOT = 1024;
/** The file name src/sys/native.ts loads the native helper by, from the runtime directory. */
const NATIVE_HELPER = 'latch-helper.node';

if (process.argv.includes('--sea')) await buildSea(seaOut);

/**
 * Node 20 single-executable application (https://nodejs.org/docs/latest-v20.x/api/single-executable-applications.html):
 * bundle → blob (node --experimental-sea-config) → copy of node with the blob injected (postject). Bundles from
 * src/ again into a private directory rather than reading bin/latch, which someone may be rebuilding meanwhile,
 * and renames the result into place, so nobody ever runs a half-written bin/latch-sea.
 *
 * The blob's main script is a small loader (src/sea/main.ts); latch's code is an asset beside it with a V8 code cache
 * taken after the control plane's calls ran (src/sea/warm.ts), so a call starts with their bytecode. Measured against
 * the V8 startup snapshot this replaces (docs/performance.md, "Where a driver call's time goes"): a user-land snapshot
 * costs more to deserialize than a call spends in latch's code.
 */
async function buildSea(outfile) {
  const work = mkdtempSync(join(tmpdir(), 'latch-sea-'));
  try {
    const [main, admin, schema, warm, blob, exe] = ['main.cjs', 'latch.js', 'config-schema.js', 'warm.cjs', 'latch.blob', 'latch-sea'].map(
      (name) => join(work, name),
    );
    await build({ ...bundleOptions, entryPoints: ['src/sea/main.ts'], outfile: main });
    // Wrapped as a CommonJS module body here rather than at run time (src/sea/load.ts calls what it evaluates to), so
    // that a call compiles the asset's text as it is, without making a copy of it to wrap.
    const asModuleBody = { banner: { js: '(function (exports, require, module) {' }, footer: { js: '\n})' } };
    await build({ ...bundleOptions, ...asModuleBody, outfile: admin });
    await build({ ...bundleOptions, ...asModuleBody, entryPoints: ['src/config-schema.ts'], outfile: schema });
    await build({ ...bundleOptions, entryPoints: ['src/sea/warm.ts'], outfile: warm });
    // The driver bundles (src/sea/load.ts names their assets), each with the code cache of its warm-up.
    const driverBundles = [
      { entry: 'src/sea/control.ts', asset: 'control.js', cache: 'control.codecache', plugins: [withoutNodeSide] },
      { entry: 'src/sea/driver.ts', asset: 'driver.js', cache: 'driver.codecache', plugins: [] },
    ];
    for (const { entry, asset, cache, plugins } of driverBundles) {
      const [source, codeCache, scratch] = [asset, cache, `${asset}.warm`].map((name) => join(work, name));
      await build({
        ...bundleOptions,
        ...asModuleBody,
        plugins: [schemaFromLoader, ...plugins, ...bundleOptions.plugins],
        entryPoints: [entry],
        outfile: source,
      });
      // The node that the executable is a copy of, without the options a user's environment may give node: V8 takes a
      // code cache only from the same version with the same flags.
      // Twice, on one scratch directory: the second run's calls find what the first left (the configuration's
      // validated copy, the attachment), as a steady call does, and its cache holds just what those run
      // (src/sea/bundle.ts).
      mkdirSync(scratch);
      for (const cacheArg of [[], [codeCache]]) {
        quietly(process.execPath, [warm, asset, source, scratch, ...cacheArg], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin' } });
      }
    }
    const seaConfig = join(work, 'sea-config.json');
    writeFileSync(
      seaConfig,
      JSON.stringify({
        main,
        output: blob,
        // The driver must print nothing but its JSON reply, on stderr too: kubelet parses both streams.
        disableExperimentalSEAWarning: true,
        useCodeCache: true,
        // The names src/sea/load.ts reads them by.
        assets: Object.fromEntries(
          ['control.js', 'control.codecache', 'driver.js', 'driver.codecache', 'config-schema.js', 'latch.js'].map((name) => [
            name,
            join(work, name),
          ]),
        ),
      }),
    );
    quietly(process.execPath, ['--experimental-sea-config', seaConfig]);
    copyFileSync(process.execPath, exe);
    chmodSync(exe, 0o755);
    // postject's ELF writer prints harmless warnings about .note sections; its output is shown only on failure.
    const postject = join(dirname(fileURLToPath(import.meta.resolve('postject'))), 'cli.js');
    quietly(process.execPath, [postject, exe, 'NODE_SEA_BLOB', blob, '--sentinel-fuse', 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2']);
    // patchelf after postject: it rewrites the headers and keeps the injected note (bin/latch-sea's own tests run it).
    const runtime = join(work, 'runtime');
    const { loader, libraries } = collectRuntime(runtime);
    buildNativeHelper(join(runtime, NATIVE_HELPER));
    const padded = (path) => `${'/'.repeat(RUNTIME_SLOT - 1 - path.length)}${path}`;
    // --page-size 2 MiB: patchelf shifts the file's contents by a page to make room for the slots, and a shift of
    // 4 KiB would put node's code segment off the 2 MiB alignment it has between file and memory in the node it is a
    // copy of. Where the page cache holds the file in 2 MiB folios (a file just written, on a filesystem that makes
    // them), the kernel can then map the code in 2 MiB pages; read back from disk, it is mapped in 4 KiB pages either
    // way (docs/performance.md, "The executable's page cache").
    // The helper as a library the executable needs: its constructor takes the call's turn before Node starts
    // (src/native/turns.c). A patchelf of its own: given with --set-rpath, patchelf 0.14 wrote its name as the RPATH.
    quietly(patchelf(), ['--page-size', String(2 * 1024 * 1024), '--add-needed', NATIVE_HELPER, exe]);
    quietly(patchelf(), [
      '--page-size',
      String(2 * 1024 * 1024),
      '--set-interpreter',
      padded(loader),
      '--set-rpath',
      // The host's libraries, then this build's runtime directory, for the native helper only: src/sys/native.ts loads it
      // by name, which the loader looks up on the RPATH (an installed driver's names its installed runtime alone).
      padded(`${libraries}:${resolve(`${outfile}.runtime`)}`),
      '--force-rpath',
      exe,
    ]);
    // The runtime first: a bin/latch-sea never names libraries that are not beside it yet.
    rmSync(`${outfile}.runtime`, { recursive: true, force: true });
    renameSync(runtime, `${outfile}.runtime`);
    renameSync(exe, outfile);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/**
 * Copies the loader and the shared libraries of the running node (the executable the SEA is a copy of), as ldd
 * resolves them on this host, into `dir`. Returns the host's loader path and its library directory.
 */
function collectRuntime(dir) {
  const ldd = spawnSync('ldd', [process.execPath], { encoding: 'utf8' });
  if (ldd.status !== 0) throw new Error(`ldd ${process.execPath} failed: ${ldd.stderr}`);
  let loader;
  const libraries = [];
  for (const line of ldd.stdout.split('\n')) {
    const linked = /^\s*(\S+) => (\/\S+) \(/.exec(line);
    const interpreter = /^\s*(\/\S+) \(/.exec(line);
    if (linked) libraries.push(linked[2]);
    else if (interpreter) loader = interpreter[1];
  }
  if (!loader || libraries.length === 0)
    throw new Error(`cannot read the loader and libraries of ${process.execPath} from ldd:\n${ldd.stdout}`);
  mkdirSync(dir);
  // Copied by content (the host's are often symlinks), under the names the executable asks for.
  for (const path of [loader, ...libraries]) copyFileSync(path, join(dir, basename(path)));
  const libc = libraries.find((p) => basename(p).startsWith('libc.so')) ?? libraries[0];
  return { loader, libraries: dirname(libc) };
}

/**
 * Compiles the native helper (src/native/*.c, a Node-API addon: src/sys/native.ts) to `output`. Node-API's headers
 * come from the node-api-headers package, so the build needs a C compiler and nothing of Node's. Only the module's
 * entry points are exported (-fvisibility=hidden): what its files share stays inside the library, where no symbol of
 * the executable that loads it can be taken for one of them.
 */
function buildNativeHelper(output) {
  const compiler = process.env.CC || 'cc';
  const found = spawnSync(compiler, ['--version'], { encoding: 'utf8' });
  if (found.status !== 0)
    throw new Error(
      `a C compiler (${compiler}) is needed to build bin/latch-sea (Debian: apt-get install gcc libc6-dev; scripts/setup.sh does it)`,
    );
  const headers = join(dirname(fileURLToPath(import.meta.resolve('node-api-headers/package.json'))), 'include');
  quietly(compiler, [
    '-O2',
    '-Wall',
    '-Wextra',
    '-Werror',
    '-shared',
    '-fPIC',
    '-DNAPI_VERSION=8',
    '-I',
    headers,
    '-fvisibility=hidden',
    '-I',
    'src/native',
    '-o',
    output,
    ...readdirSync('src/native')
      .filter((name) => name.endsWith('.c'))
      .sort()
      .map((name) => join('src/native', name)),
  ]);
}

function patchelf() {
  const found = spawnSync('patchelf', ['--version'], { encoding: 'utf8' });
  if (found.status !== 0)
    throw new Error('patchelf is needed to build bin/latch-sea (Debian: apt-get install patchelf; scripts/setup.sh does it)');
  return 'patchelf';
}

function quietly(command, args, options = {}) {
  const result = spawnSync(command, args, { stdio: ['ignore', 'pipe', 'pipe'], encoding: 'utf8', ...options });
  if (result.status !== 0) {
    process.stderr.write(`${result.stdout ?? ''}${result.stderr ?? ''}`);
    throw new Error(`${args.slice(0, 2).join(' ')} failed (${result.error?.message ?? `exit ${result.status}`})`);
  }
}
