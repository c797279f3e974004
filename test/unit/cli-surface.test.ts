// The admin command surface: it declares exactly the commands main.ts hands to the CLI, no command shadows a
// FlexVolume op, commander stays in the surface, and a user's mistake is a usage error (exit 1), never an
// "internal error". Runs the CLI in-process through runCli with captured output.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ADMIN_COMMANDS, isAdminCall } from '../../src/cli/command-names.js';
import type { CliIO } from '../../src/cli/io.js';
import { runCli } from '../../src/cli/main.js';
import { buildProgram } from '../../src/cli/surface.js';
import type { Config } from '../../src/config.js';
import { createContext, type Context } from '../../src/context.js';
import { OPS } from '../../src/protocol/ops.js';

const SRC = resolve(__dirname, '../../src');
let work: string;

before(() => {
  work = mkdtempSync(join(tmpdir(), 'latch-cli-surface-'));
});
after(() => {
  rmSync(work, { recursive: true, force: true });
});

interface Captured extends CliIO {
  stdout: string;
  stderr: string;
  closed: number;
  close(): Promise<void>;
}

/** An IO that records what the CLI prints, with a configuration of its own in a fresh directory. */
function captured(context: (config: Config) => Context = createContext): Captured {
  const dir = mkdtempSync(join(work, 'env-'));
  const config = join(dir, 'config.json');
  writeFileSync(config, JSON.stringify({ nodeName: 'node-a', stateDir: join(dir, 'state'), poolDir: join(dir, 'pool') }));
  const io: Captured = {
    stdout: '',
    stderr: '',
    closed: 0,
    env: { LATCH_CONFIG: config },
    // Like process.stdout.write, the sinks return true: a command that returns what out() returned would then
    // hand its caller `true` for an exit code.
    out: (text) => {
      io.stdout += text;
      return true;
    },
    err: (text) => {
      io.stderr += text;
      return true;
    },
    context,
    close: async () => {
      io.closed++;
    },
  };
  return io;
}

async function cli(argv: string[], io = captured()): Promise<{ code: number; stdout: string; stderr: string; io: Captured }> {
  const code = await runCli(argv, io);
  return { code, stdout: io.stdout, stderr: io.stderr, io };
}

describe('the command surface', () => {
  test('declares exactly the admin commands main.ts hands to the CLI, in their order', () => {
    const program = buildProgram(captured(), () => undefined);
    assert.deepEqual(
      program.commands.map((c) => c.name()),
      [...ADMIN_COMMANDS],
    );
  });

  test('no admin command shadows a FlexVolume op, and main.ts sends every op to the driver', () => {
    for (const op of Object.keys(OPS)) {
      assert.equal(isAdminCall(op), false, `${op} would run as an admin command`);
      assert.equal((ADMIN_COMMANDS as readonly string[]).includes(op), false, op);
    }
    for (const name of [...ADMIN_COMMANDS, 'help', '--help', '-h', '-V', '--version']) assert.equal(isAdminCall(name), true, name);
    assert.equal(isAdminCall('getvolumename'), false);
    assert.equal(isAdminCall('unknownop'), false, 'an unknown op is the driver\'s "Not supported", not a usage error');
  });

  test('main.ts loads nothing of the CLI for a driver call but the list of names, which imports nothing', () => {
    const imports = (file: string) =>
      [...readFileSync(join(SRC, file), 'utf8').matchAll(/^import\s[^;]*?from '([^']+)'/gms)].map((m) => m[1]);
    assert.deepEqual(imports('main.ts'), ['./cli/command-names.js', './protocol/driver.js', './protocol/ops.js']);
    assert.deepEqual(imports('cli/command-names.ts'), []);
    // bin/latch-sea's loader reads the control plane's op names as well (src/sea/main.ts).
    assert.deepEqual(imports('protocol/control-plane-ops.ts'), []);
    assert.match(readFileSync(join(SRC, 'main.ts'), 'utf8'), /import\('\.\/cli\/main\.js'\)/, 'the CLI is loaded lazily');
  });

  test('commander is imported only by the surface', () => {
    const users: string[] = [];
    const walk = (dir: string) => {
      for (const entry of readdirSync(dir, { withFileTypes: true })) {
        const path = join(dir, entry.name);
        if (entry.isDirectory()) walk(path);
        else if (entry.name.endsWith('.ts') && /from '(commander|@commander-js\/extra-typings)'/.test(readFileSync(path, 'utf8')))
          users.push(relative(SRC, path));
      }
    };
    walk(SRC);
    assert.deepEqual(users.sort(), ['cli/surface.ts']);
  });

  test('a command that prints JSON exits 0 with exactly its JSON', async () => {
    for (const argv of [
      ['volume', 'list', '-o', 'json'],
      ['ticket', 'list', '--output', 'json'],
    ]) {
      const r = await cli(argv);
      assert.deepEqual([r.code, JSON.parse(r.stdout), r.stderr], [0, [], ''], argv.join(' '));
    }
    const free = await cli(['node', 'check', 'node-z', '-o', 'json']);
    assert.deepEqual([free.code, JSON.parse(free.stdout), free.stderr], [0, { node: 'node-z', mayGo: true, volumes: [], damaged: [] }, '']);
  });

  test('--help lists every command; version prints the version', async () => {
    const help = await cli(['--help']);
    assert.equal(help.code, 0);
    for (const name of ADMIN_COMMANDS) assert.match(help.stdout, new RegExp(`^  ${name}\\b`, 'm'), name);
    const version = await cli(['version']);
    assert.deepEqual([version.code, version.stdout, version.stderr], [0, 'dev\n', '']);
  });
});

describe("a user's mistake is a usage error, never an internal error", () => {
  const badValues: [string[], RegExp][] = [
    [['volume', 'list', '-o', 'xml'], /argument 'xml' is invalid\. output format must be "table" or "json", not "xml"/],
    [['volume', 'inspect', 'v', '--output', 'yaml'], /output format must be "table" or "json", not "yaml"/],
    [['ticket', 'list', '-o', 'csv'], /output format must be "table" or "json"/],
    [['install', '-o', 'text'], /output format must be "table" or "json"/],
    [['doctor', '-o', 'text'], /output format must be "table" or "json"/],
    [['doctor', '--stuck-after', '-5'], /--stuck-after must be a whole number of seconds, not "-5"/],
    [['doctor', '--stuck-after', 'soon'], /--stuck-after must be a whole number of seconds, not "soon"/],
    [['ticket', 'add', 'v', '--node', 'n', '--type', 'urgent'], /--type urgent is not a ticket type; use one of restore, admin, workload/],
    [['ledger', 'migrate', '--from', 'disk', '--to', 'etcd'], /--from must be "file" or "etcd", not "disk"/],
    [['ledger', 'migrate', '--from', 'file', '--to', 'nfs'], /--to must be "file" or "etcd", not "nfs"/],
    [['node', 'check', 'Node_B'], /^latch: node name "Node_B" is not allowed/],
    [['node', 'check', 'n', '-o', 'xml'], /output format must be "table" or "json"/],
    [['ticket', 'list', '--node', '../x'], /^latch: node name "\.\.\/x" is not allowed/],
    [['volume', 'list', '--node', ''], /^latch: node name is empty/],
    [['volume', 'allow', 'v'], /^latch: name what to allow: --pv NAME and\/or --namespace NAMESPACE/],
    [
      ['volume', 'allow', 'v', '--pv', 'pv-1', '--namespace', 'shop', '--namespace', 'Bad'],
      /^latch: --namespace "Bad" is not a namespace name/,
    ],
    [['volume', 'allow', 'nope', '--pv', 'pv-1', '--pv', 'pv-2'], /^latch: volume nope does not exist/],
    [['volume', 'unlink', 'Bad'], /^latch: PV name "Bad" is not allowed/],
  ];
  for (const [argv, message] of badValues) {
    test(`latch ${argv.join(' ')}`, async () => {
      const r = await cli(argv);
      assert.equal(r.code, 1);
      assert.match(r.stderr, message);
      assert.doesNotMatch(r.stderr, /internal error/);
      assert.equal(r.stdout, '', 'nothing ran');
    });
  }

  test('missing arguments and options, and unknown commands, are usage errors too', async () => {
    const noSize = await cli(['volume', 'create', 'v']);
    assert.equal(noSize.code, 1);
    assert.match(noSize.stderr, /required option '--size <size>' not specified/);
    const unknown = await cli(['volume', 'frobnicate']);
    assert.equal(unknown.code, 1);
    assert.match(unknown.stderr, /unknown command 'frobnicate'/);
  });

  test("a command's LatchError is said plainly; anything else is an internal error; stores are closed either way", async () => {
    const missing = await cli(['volume', 'inspect', 'nope']);
    assert.deepEqual([missing.code, missing.stderr], [1, 'latch: volume nope does not exist (latch volume list shows the volumes)\n']);
    const badSize = await cli(['volume', 'create', 'v', '--size', '1Gx']);
    assert.equal(badSize.code, 1);
    assert.match(badSize.stderr, /^latch: --size "1Gx" is not a size/);
    assert.equal(badSize.io.closed, 1);

    const broken = await cli(
      ['volume', 'list'],
      captured(() => {
        throw new Error('the store fell over');
      }),
    );
    assert.deepEqual([broken.code, broken.stderr], [1, 'latch: internal error: the store fell over\n']);
    assert.equal(broken.io.closed, 1);
  });
});
