// latch install's pieces, called directly: kubelet flag and config parsing, plugin-dir detection from a fake /proc,
// the atomic copy and its idempotence, uninstall's cleanup. (The built executable is tested in install.bats.)
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { installDriver } from '../../src/cli/install.js';
import { uninstallDriver } from '../../src/cli/uninstall.js';
import { CHUNK, driverPath, isLatchDriver } from '../../src/host/driver-file.js';
import { detectPluginDir, choosePluginDir, flagValue, kubeletConfigPluginDir, type DetectionPaths } from '../../src/host/plugin-dir.js';

let base: string;
let n = 0;
function fresh(name: string): string {
  const dir = join(base, `${name}-${++n}`);
  mkdirSync(dir, { recursive: true });
  return dir;
}

before(() => {
  base = mkdtempSync(join(tmpdir(), 'latch-install-'));
});
after(() => {
  rmSync(base, { recursive: true, force: true });
});

/** A fake /proc with the given processes (argv lists), and fallback dirs that do not exist unless asked. */
function fakeHost(processes: Record<number, string[]>, options: { openshift?: boolean } = {}): DetectionPaths {
  const root = fresh('host');
  const procRoot = join(root, 'proc');
  mkdirSync(procRoot);
  for (const [pid, argv] of Object.entries(processes)) {
    mkdirSync(join(procRoot, pid));
    writeFileSync(join(procRoot, pid, 'cmdline'), `${argv.join('\0')}\0`);
    writeFileSync(join(procRoot, pid, 'comm'), `${(argv[0] ?? '').split('/').pop()}\n`);
  }
  mkdirSync(join(procRoot, 'self')); // not a pid: ignored
  const openshiftDir = join(root, 'openshift/volume/exec');
  if (options.openshift) mkdirSync(openshiftDir, { recursive: true });
  return { procRoot, openshiftDir, defaultDir: join(root, 'default/volume/exec') };
}

describe('kubelet command line and config file', () => {
  test('flagValue reads Go flags in every spelling; the last one wins', () => {
    assert.equal(flagValue(['kubelet', '--volume-plugin-dir=/a'], 'volume-plugin-dir'), '/a');
    assert.equal(flagValue(['kubelet', '--volume-plugin-dir', '/b'], 'volume-plugin-dir'), '/b');
    assert.equal(flagValue(['kubelet', '-volume-plugin-dir=/c'], 'volume-plugin-dir'), '/c');
    assert.equal(flagValue(['kubelet', '--volume-plugin-dir=/a', '--volume-plugin-dir=/d'], 'volume-plugin-dir'), '/d');
    assert.equal(flagValue(['kubelet', '--volume-plugin-dir-x=/a'], 'volume-plugin-dir'), undefined);
    assert.equal(flagValue(['kubelet', '--volume-plugin-dir='], 'volume-plugin-dir'), undefined);
    assert.equal(flagValue(['--config=/x'], 'config'), undefined, 'argv[0] is the program, not a flag');
  });

  test('kubeletConfigPluginDir reads volumePluginDir from YAML and JSON', () => {
    assert.equal(kubeletConfigPluginDir('kind: KubeletConfiguration\nvolumePluginDir: /plain/dir\n'), '/plain/dir');
    assert.equal(kubeletConfigPluginDir('volumePluginDir: "/quoted dir" # comment\n'), '/quoted dir');
    assert.equal(kubeletConfigPluginDir("volumePluginDir: '/it''s'\n"), "/it's");
    assert.equal(kubeletConfigPluginDir('volumePluginDir: /x # trailing comment\r\n'), '/x');
    assert.equal(kubeletConfigPluginDir('# volumePluginDir: /commented\nother: 1\n'), undefined);
    assert.equal(kubeletConfigPluginDir('nested:\n  volumePluginDir: /not/top/level\n'), undefined);
    assert.equal(kubeletConfigPluginDir('{"kind":"KubeletConfiguration","volumePluginDir":"/json"}'), '/json');
    assert.equal(kubeletConfigPluginDir('{"kind":"KubeletConfiguration"}'), undefined);
    assert.equal(kubeletConfigPluginDir('volumePluginDir: ""\n'), undefined);
  });
});

describe('plugin dir detection', () => {
  test('the flag wins over the config file, as in kubelet', async () => {
    const config = join(fresh('etc'), 'kubelet.yaml');
    writeFileSync(config, 'volumePluginDir: /from/config\n');
    const paths = fakeHost({ 1: ['/sbin/init'], 77: ['/usr/bin/kubelet', `--config=${config}`, '--volume-plugin-dir=/from/flag'] });
    const choice = await detectPluginDir(paths);
    assert.deepEqual(choice, {
      dir: '/from/flag',
      source: 'kubelet-flag',
      reason: 'kubelet (pid 77) runs with --volume-plugin-dir=/from/flag',
    });
  });

  test('a relative --config is relative to kubelet working directory', async () => {
    const cwd = fresh('kubelet-cwd');
    writeFileSync(join(cwd, 'config.yaml'), 'volumePluginDir: /from/relative/config/\n');
    const paths = fakeHost({ 99: ['kubelet', '--config', 'config.yaml'] });
    symlinkSync(cwd, join(paths.procRoot, '99', 'cwd'));
    const choice = await detectPluginDir(paths);
    assert.equal(choice.dir, '/from/relative/config');
    assert.equal(choice.source, 'kubelet-config');
    assert.match(choice.reason, new RegExp(`volumePluginDir in ${join(cwd, 'config.yaml')}, the config file of kubelet \\(pid 99\\)`));
  });

  test('an unreadable config file is named in the reason, and the fallbacks apply', async () => {
    const paths = fakeHost({ 5: ['kubelet', '--config=/no/such/kubelet.yaml'] }, { openshift: true });
    const choice = await detectPluginDir(paths);
    assert.equal(choice.source, 'openshift');
    assert.equal(choice.dir, paths.openshiftDir);
    assert.match(choice.reason, /config file \/no\/such\/kubelet.yaml cannot be read \(ENOENT/);
    assert.match(choice.reason, /exists \(OpenShift 4\)$/);
  });

  test('processes not named kubelet are ignored; with no kubelet: the default', async () => {
    const paths = fakeHost({
      1: ['/sbin/init', '--volume-plugin-dir=/nope'],
      2: ['/usr/bin/kubelet-wrapper', '--volume-plugin-dir=/nope'],
    });
    const choice = await detectPluginDir(paths);
    assert.deepEqual(choice, {
      dir: paths.defaultDir,
      source: 'default',
      reason: `no kubelet process found in ${paths.procRoot}; using kubelet's default`,
    });
  });

  test('--plugin-dir, then $LATCH_VOLUME_PLUGIN_DIR, then detection; relative paths are refused', async () => {
    const paths = fakeHost({});
    const env = {
      LATCH_PROC_ROOT: paths.procRoot,
      LATCH_OPENSHIFT_PLUGIN_DIR: paths.openshiftDir,
      LATCH_DEFAULT_PLUGIN_DIR: paths.defaultDir,
    };
    assert.equal((await choosePluginDir('/opt/x/', env)).dir, '/opt/x');
    assert.equal((await choosePluginDir(undefined, { ...env, LATCH_VOLUME_PLUGIN_DIR: '/env/dir' })).source, 'env');
    assert.equal((await choosePluginDir(undefined, env)).dir, paths.defaultDir);
    await assert.rejects(choosePluginDir('relative/dir', env), /--plugin-dir "relative\/dir" must be an absolute path/);
  });
});

describe('install and uninstall', () => {
  /** A stand-in for a latch build: it carries the signature every latch build has (the ledger's apiVersion). */
  function build(content: string): string {
    const file = join(fresh('build'), 'latch');
    writeFileSync(file, `${content}# latch/v1\n`);
    chmodSync(file, 0o644); // the installed copy is 0755 whatever the source is
    return file;
  }

  test("another vendor's driver of the same name is never replaced; a latch build of any age is", async () => {
    const pluginDir = join(fresh('plugins'), 'exec');
    const { dir, file } = driverPath(pluginDir, 'latch/loop');
    mkdirSync(dir, { recursive: true });
    writeFileSync(file, '#!/bin/sh\necho \'{"status":"Success"}\'\n', { mode: 0o755 });
    await assert.rejects(
      installDriver({ pluginDir, driverName: 'latch/loop', source: build('x') }),
      /is not a latch driver \(another vendor's driver named latch\/loop\?\); refusing to replace it/,
    );
    assert.match(readFileSync(file, 'utf8'), /echo/, 'the other driver is untouched');
    assert.deepEqual(readdirSync(dir), ['loop'], 'nothing else was written');
    // The signature split across two read chunks is still found.
    const big = join(fresh('big'), 'latch');
    writeFileSync(big, Buffer.concat([Buffer.alloc(CHUNK - 3, 0x61), Buffer.from('latch/v1'), Buffer.alloc(10, 0x61)]));
    assert.equal(await isLatchDriver(big), true);
    writeFileSync(big, Buffer.alloc(CHUNK * 2 + 5, 0x61));
    assert.equal(await isLatchDriver(big), false);
  });

  test('driverPath: <dir>/<vendor~driver>/<driver>; bad names refused', () => {
    assert.deepEqual(driverPath('/p', 'latch/loop'), { dir: '/p/latch~loop', file: '/p/latch~loop/loop' });
    assert.throws(() => driverPath('/p', 'latch'), /must look like vendor\/driver/);
    assert.throws(() => driverPath('/p', 'a/../b'), /must look like vendor\/driver/);
    assert.throws(() => driverPath('/p', 'A/b'), /must look like vendor\/driver/);
  });

  test('installs, leaves an identical driver alone, replaces a different one, fixes a wrong mode', async () => {
    const pluginDir = join(fresh('plugins'), 'exec');
    const a = build('#!/bin/sh\necho a\n');
    const b = build('#!/bin/sh\necho b\n');
    const first = await installDriver({ pluginDir, driverName: 'latch/loop', source: a });
    assert.equal(first.action, 'installed');
    const file = join(pluginDir, 'latch~loop/loop');
    assert.equal(readFileSync(file, 'utf8'), '#!/bin/sh\necho a\n# latch/v1\n');
    assert.equal(statSync(file).mode & 0o7777, 0o755);
    const inode = statSync(file).ino;

    assert.equal((await installDriver({ pluginDir, driverName: 'latch/loop', source: a })).action, 'unchanged');
    assert.equal(statSync(file).ino, inode);

    const upgrade = await installDriver({ pluginDir, driverName: 'latch/loop', source: b });
    assert.equal(upgrade.action, 'upgraded');
    assert.equal(upgrade.previousSha256, first.sha256);
    assert.equal(readFileSync(file, 'utf8'), '#!/bin/sh\necho b\n# latch/v1\n');

    chmodSync(file, 0o644);
    assert.equal((await installDriver({ pluginDir, driverName: 'latch/loop', source: b })).action, 'upgraded');
    assert.equal(statSync(file).mode & 0o7777, 0o755);
    assert.deepEqual(readdirSync(join(pluginDir, 'latch~loop')), ['loop']);
  });

  test('removes the temp files of killed installs, once old, and nothing that is not one of its temp files', async () => {
    const pluginDir = join(fresh('plugins'), 'exec');
    const dir = join(pluginDir, 'latch~loop');
    const beside = join(dir, '.latch');
    mkdirSync(beside, { recursive: true });
    const old = new Date(Date.now() - 11 * 60 * 1000);
    const plant = (path: string, age = old) => {
      writeFileSync(path, 'half');
      utimesSync(path, age, age);
    };
    plant(join(dir, '.loop.4242.0a1b2c3d.tmp')); // a killed install's driver copy: removed
    plant(join(dir, '.loop.4243.0a1b2c3d.tmp'), new Date()); // an install still writing: kept
    plant(join(dir, '.other.4242.0a1b2c3d.tmp')); // not the driver's: kept
    plant(join(beside, '.config.json.4242.0a1b2c3d.tmp')); // removed
    mkdirSync(join(beside, '.runtime-0123456789ab.4242.0a1b2c3d.tmp.old')); // an older install's runtime put aside: removed
    utimesSync(join(beside, '.runtime-0123456789ab.4242.0a1b2c3d.tmp.old'), old, old);
    plant(join(beside, '.keep-me')); // nobody's temp file: kept
    await installDriver({ pluginDir, driverName: 'latch/loop', source: build('#!/bin/sh\n') });
    assert.deepEqual(readdirSync(dir).sort(), ['.latch', '.loop.4243.0a1b2c3d.tmp', '.other.4242.0a1b2c3d.tmp', 'loop']);
    assert.deepEqual(readdirSync(beside), ['.keep-me']);
  });

  test('refuses to replace a directory where the driver belongs', async () => {
    const pluginDir = fresh('plugins');
    mkdirSync(join(pluginDir, 'latch~loop/loop'), { recursive: true });
    await assert.rejects(installDriver({ pluginDir, driverName: 'latch/loop', source: build('x') }), /is a directory; remove it by hand/);
  });

  test('uninstall removes the driver and its directory, but keeps a directory holding other files', async () => {
    const pluginDir = fresh('plugins');
    await installDriver({ pluginDir, driverName: 'latch/loop', source: build('x') });
    assert.deepEqual(await uninstallDriver({ pluginDir, driverName: 'latch/loop' }), {
      action: 'removed',
      path: join(pluginDir, 'latch~loop/loop'),
    });
    assert.equal(existsSync(join(pluginDir, 'latch~loop')), false);
    assert.equal((await uninstallDriver({ pluginDir, driverName: 'latch/loop' })).action, 'absent');

    await installDriver({ pluginDir, driverName: 'latch/loop', source: build('x') });
    writeFileSync(join(pluginDir, 'latch~loop/README'), 'someone else\n');
    const result = await uninstallDriver({ pluginDir, driverName: 'latch/loop' });
    assert.deepEqual(result.leftInDir, ['README']);
  });
});
