// The layering of src/ (issue 12), checked by `npm run lint` (depcruise --config .dependency-cruiser.cjs src).
// Top to bottom; a layer imports its own folder and what its line names, never anything above it:
//
//   bin.ts, sea/        main.ts (sea/, the single executable's loader: also protocol/, and cli/'s command names)
//   main.ts             protocol/ (a FlexVolume call) or cli/ (an admin command)
//   protocol/           ops/ and below
//   ops/                node/ and below
//   cli/                beside ops/: agent/, doctor/, jobs/, demo/, host/, node/ and below; never ops/ or protocol/
//   demo/               the quick start's story, played against this executable: host/, sys/ and base
//   agent/              the node's daemon: jobs/, doctor/, node/ and below
//   doctor/             the checks: host/, node/ and below
//   jobs/               the job protocol: node/, backup/ and below
//   node/               context.ts and below
//   context.ts, host/   ledger/, backend/, store/, sys/
//   ledger/, backend/   store/, sys/ (siblings: not each other)
//   backup/             sys/ (the backup engine: chunks, manifests, the target's lock; used by node/, jobs/ and cli/)
//   store/              contract/, base
//   sys/                base only
//   contract/           base only
//   base modules        each other (config, errors, hash, names, size, time, log, version, filesystems, atomic-file)
//
// Every layer may use contract/ and the base modules except where said. Type-only imports count like any other
// (tsPreCompilationDeps), and so do lazy import()s.
const { existsSync } = require('node:fs');
const { join } = require('node:path');

const BASE = '^src/(config|config-schema|errors|hash|names|size|time|log|version|filesystems|atomic-file)[.]ts$';
const CONTRACT = '^src/contract/';
const CONTEXT = '^src/context[.]ts$';
const PROTOCOL = '^src/protocol/';
const OPS = '^src/ops/';
const DEMO = '^src/demo/';
const NODE = '^src/node/';
const LEDGER = '^src/ledger/';
const BACKEND = '^src/backend/';
const STORE = '^src/store/';
const SYS = '^src/sys/';
const HOST = '^src/host/';
const BACKUP = '^src/backup/';
const CLI = '^src/cli/';
const AGENT = '^src/agent/';
const JOBS = '^src/jobs/';
const DOCTOR = '^src/doctor/';
const MAIN = '^src/main[.]ts$';
const ENTRY = '^src/(bin[.]ts$|sea/)';

/** A rule: modules matching `from` may import, inside src/, only their own folder and `allowed`. */
function layer(name, from, allowed, comment) {
  return {
    name: `layer-${name}`,
    comment,
    severity: 'error',
    from: { path: from },
    to: { path: '^src/', pathNot: [from, ...allowed] },
  };
}

const BELOW_NODE = [LEDGER, BACKEND, STORE, SYS, CONTRACT, BASE];

// commander belongs to the one file that declares every admin command (issue 12, item 4). Until that file
// exists, to cli/ as a whole; the rule tightens by itself when src/cli/surface.ts appears.
const COMMANDER_HOME = existsSync(join(__dirname, 'src/cli/surface.ts')) ? '^src/cli/surface[.]ts$' : CLI;

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    layer(
      'base',
      BASE,
      [],
      'Base modules (config, errors, hash, names, size, time, log, version, filesystems, atomic-file) import only each other.',
    ),
    layer('contract', CONTRACT, [BASE], 'contract/ (the FlexVolume call contract) imports only base modules.'),
    layer('sys', SYS, [BASE], 'sys/ wraps the kernel and tools; it imports nothing of latch but base modules.'),
    layer('store', STORE, [CONTRACT, BASE], 'store/ is the bottom layer beside sys/: only contract/ and base modules.'),
    layer(
      'ledger',
      LEDGER,
      [STORE, SYS, CONTRACT, BASE],
      'ledger/ sits on store/ and sys/; not on backend/ (its sibling) or anything above.',
    ),
    layer(
      'backend',
      BACKEND,
      [STORE, SYS, CONTRACT, BASE],
      'backend/ sits on store/ and sys/; not on ledger/ (its sibling) or anything above.',
    ),
    layer(
      'backup',
      BACKUP,
      [SYS, BASE],
      'backup/ (the backup engine) works on files and devices by path: sys/ and base modules only; node/, jobs/ and cli/ use it.',
    ),
    layer('context', CONTEXT, BELOW_NODE, 'context.ts, the composition root, builds the context from ledger, backend, store and sys.'),
    layer(
      'host',
      HOST,
      BELOW_NODE,
      'host/ (what install, doctor and uninstall share) uses ledger, backend, store, sys; only cli/ and doctor/ use it.',
    ),
    layer('node', NODE, [CONTEXT, BACKUP, ...BELOW_NODE], 'node/ services work on a context; they never import ops, protocol or cli.'),
    layer('ops', OPS, [NODE, CONTEXT, ...BELOW_NODE], 'ops/ use node services and the layers below; never protocol/ or cli/.'),
    layer('protocol', PROTOCOL, [OPS, NODE, CONTEXT, ...BELOW_NODE], 'protocol/ runs one FlexVolume call: ops and below, never cli/.'),
    layer(
      'jobs',
      JOBS,
      [NODE, CONTEXT, BACKUP, ...BELOW_NODE],
      'jobs/ is the job protocol both sides share (the requester in cli/, the runner in agent/): node services and below, never cli/.',
    ),
    layer(
      'doctor',
      DOCTOR,
      [HOST, NODE, CONTEXT, ...BELOW_NODE],
      'doctor/ holds the checks that the doctor command prints and the agent repeats: host, node and below; it never prints, never cli/.',
    ),
    layer(
      'agent',
      AGENT,
      [JOBS, DOCTOR, NODE, CONTEXT, ...BELOW_NODE],
      "agent/ is the node's daemon: it runs jobs/ and doctor/'s cheap checks over node services; `latch agent` starts it, it never imports cli/.",
    ),
    layer(
      'demo',
      DEMO,
      [HOST, SYS, BASE],
      "demo/ plays kubelet's and an admin's calls against this executable as child processes (latch demo): it needs host/ (which file this is) and sys/, nothing of the driver's inside.",
    ),
    layer(
      'cli',
      CLI,
      [AGENT, JOBS, DOCTOR, DEMO, HOST, NODE, CONTEXT, BACKUP, ...BELOW_NODE],
      'cli/ sits beside ops/: thin commands over agent/, jobs/, doctor/, node, host and below, never ops/ or protocol/.',
    ),
    layer('main', MAIN, [PROTOCOL, CLI, CONTRACT, BASE], 'main.ts picks protocol (a FlexVolume call) or cli (an admin command).'),
    layer(
      'entry',
      ENTRY,
      [MAIN, PROTOCOL, CLI, CONTRACT, BASE],
      "bin.ts starts main; sea/ loads the single executable's bundles (the driver calls' directly, and warms them).",
    ),
    {
      name: 'layer-unplaced',
      comment: 'A module outside every layer: put it in one (and name it in .dependency-cruiser.cjs if it is a new one).',
      severity: 'error',
      from: {
        path: '^src/',
        pathNot: [
          BASE,
          CONTRACT,
          CONTEXT,
          PROTOCOL,
          OPS,
          NODE,
          LEDGER,
          BACKEND,
          STORE,
          SYS,
          HOST,
          BACKUP,
          JOBS,
          DOCTOR,
          AGENT,
          DEMO,
          CLI,
          MAIN,
          ENTRY,
        ],
      },
      to: {},
    },
    {
      name: 'cli-groups-apart',
      comment:
        'A command group (cli/volume/, cli/node/, ...) never imports another: what two groups share sits in cli/ itself (cli/fencing.ts, cli/volume-doc.ts).',
      severity: 'error',
      from: { path: '^src/cli/([^/]+)/' },
      to: { path: '^src/cli/[^/]+/', pathNot: '^src/cli/$1/' },
    },
    {
      name: 'no-circular',
      comment: 'Modules that import each other (type-only imports included) cannot be understood or tested one at a time.',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    {
      name: 'src-not-to-dev-dep',
      comment: 'bin/latch carries only dependencies; a devDependency in src/ (even for a type) is missing at run time or in review.',
      severity: 'error',
      from: { path: '^src/' },
      to: { dependencyTypes: ['npm-dev'] },
    },
    {
      name: 'children-only-from-sys-run',
      comment: 'sys/run/ is the one place that spawns children (deadline, no shell, killed with the call).',
      severity: 'error',
      from: { pathNot: '^src/sys/run/(spawn|daemon|streaming)[.]ts$' },
      to: { path: ['^(node:)?child_process$', '(^|/)node_modules/execa/'] },
    },
    {
      name: 'commander-only-at-the-surface',
      comment: 'Admin commands and options are declared in one place; the commands themselves are plain typed functions.',
      severity: 'error',
      from: { pathNot: COMMANDER_HOME },
      to: { path: '(^|/)node_modules/commander/' },
    },
    {
      name: 'zod-mini-only',
      comment: 'Classic zod costs every driver call a node start-up to evaluate: the schemas use zod/mini (config.ts).',
      severity: 'error',
      from: {},
      to: { path: '(^|/)node_modules/zod/', pathNot: '(^|/)node_modules/zod/(v4/)?mini/' },
    },
    {
      name: 'not-to-unresolvable',
      comment: 'An import that resolves to nothing on disk.',
      severity: 'error',
      from: {},
      to: { couldNotResolve: true },
    },
    {
      name: 'no-non-package-json',
      comment: 'An npm package that is not in package.json.',
      severity: 'error',
      from: {},
      to: { dependencyTypes: ['npm-no-pkg', 'npm-unknown'] },
    },
    {
      name: 'no-deprecated-core',
      comment: 'A deprecated node core module.',
      severity: 'error',
      from: {},
      to: { dependencyTypes: ['core'], path: '^(punycode|domain|constants|sys|_linklist|_stream_wrap)$' },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    // Type-only imports are dependencies too: the layering holds for them as for values.
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    // `require('zod')` in config.ts and `import('...')` for lazy loading are found like static imports.
    moduleSystems: ['es6', 'cjs'],
    reporterOptions: { text: { highlightFocused: true } },
  },
};
