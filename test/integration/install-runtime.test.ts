// latch install of the self-contained build with its runtime beside it (src/host/beside-driver.ts): the driver is
// pointed at the runtime it is installed with, a runtime is kept while the previous driver may still start and
// removed after, concurrent installs never leave a driver naming an incomplete runtime, uninstall removes it all,
// and --config-beside-driver refuses a certificate that does not match its key before writing anything.
// Needs bin/latch-sea and its runtime (npm run build:sea; LATCH_REQUIRE_SEA=1 makes their absence a failure).
import assert from 'node:assert/strict';
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  statfsSync,
  writeFileSync,
  appendFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { spawnSync } from 'node:child_process';
import { runDoctor } from '../../src/doctor/run.js';
import { installDriver } from '../../src/cli/install.js';
import { uninstallDriver } from '../../src/cli/uninstall.js';
import { parseConfig } from '../../src/config.js';
import { missingRuntime, sameBuild } from '../../src/host/beside-driver.js';
import { readRuntimeSlots } from '../../src/host/elf.js';
import { makeTestCertificates } from '../etcd/etcd.js';

const SEA = resolve(__dirname, '..', '..', 'bin/latch-sea');
const TMPFS_MAGIC = 0x01021994;
const RUNTIME = `${SEA}.runtime`;
const skip = existsSync(RUNTIME) || process.env.LATCH_REQUIRE_SEA === '1' ? undefined : `${RUNTIME} is missing: run 'npm run build:sea'`;

describe('install with the runtime beside the driver', { skip, timeout: 300_000 }, () => {
  let work: string;
  /** Three runtimes that differ in one library: three runtime directories. */
  const runtimes: string[] = [];

  before(() => {
    assert.ok(existsSync(RUNTIME), `${RUNTIME} is missing (LATCH_REQUIRE_SEA=1): run 'npm run build:sea'`);
    work = mkdtempSync(join(tmpdir(), 'latch-install-runtime-'));
    for (const name of ['a', 'b', 'c']) {
      const dir = join(work, `runtime-${name}`);
      cpSync(RUNTIME, dir, { recursive: true });
      appendFileSync(join(dir, 'libdl.so.2'), name); // trailing bytes: the loader does not care, the digest does
      runtimes.push(dir);
    }
  });
  after(() => rmSync(work, { recursive: true, force: true }));

  const install = (pluginDir: string, runtime: string) => installDriver({ pluginDir, driverName: 'latch/loop', source: SEA, runtime });
  const runtimeDirs = (pluginDir: string) => readdirSync(join(pluginDir, 'latch~loop/.latch')).filter((n) => n.startsWith('runtime-'));
  async function named(pluginDir: string): Promise<string> {
    const slots = await readRuntimeSlots(join(pluginDir, 'latch~loop/loop'));
    assert.ok(slots);
    assert.equal(slots.rpath.value, dirname(slots.interpreter.value));
    return dirname(slots.interpreter.value);
  }

  test('the driver names its runtime by absolute path; the previous one stays one install, then goes; uninstall removes all', async () => {
    const plugins = join(work, 'plugins-1');
    const [a, b, c] = runtimes as [string, string, string];
    const first = await install(plugins, a);
    assert.equal(first.action, 'installed');
    assert.equal(await named(plugins), first.runtime);
    assert.equal(readFileSync(join(first.runtime ?? '', 'libdl.so.2')).at(-1), 'a'.charCodeAt(0));
    // The native helper comes with the runtime, where the driver's RPATH names it (src/sys/native.ts loads it by name).
    assert.ok(existsSync(join(first.runtime ?? '', 'latch-helper.node')), 'the installed runtime has the native helper');
    // The installed driver runs with it (and says so: version is printed by the SEA's own main).
    assert.equal(spawnSync(join(plugins, 'latch~loop/loop'), ['version'], { encoding: 'utf8' }).stdout.trim().length > 0, true);

    assert.equal((await install(plugins, a)).action, 'unchanged');
    const second = await install(plugins, b);
    assert.equal(second.action, 'upgraded');
    assert.deepEqual(runtimeDirs(plugins).sort(), [first.runtime, second.runtime].map((r) => r?.split('/').pop()).sort());
    const third = await install(plugins, c);
    assert.deepEqual(runtimeDirs(plugins).sort(), [second.runtime, third.runtime].map((r) => r?.split('/').pop()).sort());
    assert.equal(await named(plugins), third.runtime);

    // A damaged runtime of the installed driver is repaired by the next install, which changes nothing else.
    writeFileSync(join(third.runtime ?? '', 'libm.so.6'), 'damaged');
    assert.equal((await install(plugins, c)).action, 'unchanged');
    assert.deepEqual(readFileSync(join(third.runtime ?? '', 'libm.so.6')), readFileSync(join(c, 'libm.so.6')));

    // doctor takes the installed driver for the same build as bin/latch-sea, and a missing runtime for what it is.
    const driver = join(plugins, 'latch~loop/loop');
    assert.equal(await sameBuild(SEA, driver), true);
    assert.equal(await sameBuild(join(a, 'libc.so.6'), driver), false);
    assert.equal(await missingRuntime(driver, join(plugins, 'latch~loop')), undefined);
    rmSync(third.runtime ?? '', { recursive: true });
    assert.equal(await missingRuntime(driver, join(plugins, 'latch~loop')), join(third.runtime ?? '', 'ld-linux-x86-64.so.2'));
    const config = join(work, 'doctor-config.json');
    writeFileSync(
      config,
      JSON.stringify({ nodeName: 'node-a', stateDir: join(work, 'state'), poolDir: join(work, 'pool'), logFile: join(work, 'log') }),
    );
    const report = await runDoctor({
      env: { LATCH_CONFIG: config, LATCH_VOLUME_PLUGIN_DIR: plugins, LATCH_PROC_ROOT: join(work, 'no-proc'), PATH: process.env.PATH ?? '' },
      self: SEA,
    });
    const problem = report.findings.find((f) => f.check === 'driver' && f.severity === 'error');
    assert.match(
      problem?.message ?? '',
      /names the loader .*ld-linux-x86-64\.so\.2 beside it, which is not there: the driver cannot start/,
    );
    assert.equal(problem?.fix, `latch install --plugin-dir ${plugins}`);

    assert.equal((await uninstallDriver({ pluginDir: plugins, driverName: 'latch/loop' })).action, 'removed');
    assert.deepEqual(readdirSync(plugins), []);
  });

  test('the page cache of the driver and its runtime is reloaded by every install, also one that changes nothing', async () => {
    const plugins = join(work, 'plugins-reload');
    const reinstall = () =>
      installDriver({ pluginDir: plugins, driverName: 'latch/loop', source: SEA, runtime: RUNTIME, reloadPageCache: true });
    const first = await reinstall();
    assert.deepEqual(first.pageCache, { reloaded: true });
    assert.equal((await install(plugins, RUNTIME)).pageCache, undefined, 'only when asked (the Node.js bundle is not mapped)');

    // Unchanged: everything kubelet's calls map is dropped and read back from the disk (not on tmpfs, which keeps it).
    const readBytes = () => Number(/^read_bytes: (\d+)$/m.exec(readFileSync('/proc/self/io', 'utf8'))?.[1]);
    const mapped = [join(plugins, 'latch~loop/loop'), ...readdirSync(first.runtime ?? '').map((n) => join(first.runtime ?? '', n))];
    const total = mapped.reduce((sum, file) => sum + statSync(file).size, 0);
    const before = readBytes();
    const again = await reinstall();
    assert.equal(again.action, 'unchanged');
    assert.deepEqual(again.pageCache, { reloaded: true });
    if (statfsSync(plugins).type !== TMPFS_MAGIC && !Number.isNaN(before)) {
      assert.ok(
        readBytes() - before >= total,
        `read ${readBytes() - before} bytes from the disk, less than the ${total} of the driver and its runtime`,
      );
    }
  });

  test('concurrent installs of three runtimes: every driver a watcher sees names a complete runtime', async () => {
    const plugins = join(work, 'plugins-2');
    await install(plugins, runtimes[0] ?? '');
    const expected = new Map(readdirSync(RUNTIME).map((n) => [n, statSync(join(RUNTIME, n)).size]));
    let done = false;
    let looks = 0;
    const watcher = (async () => {
      while (!done) {
        const dir = await named(plugins).catch(() => undefined);
        if (dir === undefined) continue; // between reads of a file being renamed over: read again
        for (const [name, size] of expected) {
          const actual: number | undefined = statSync(join(dir, name), { throwIfNoEntry: false })?.size;
          // libdl carries one byte of the runtime's name
          assert.equal(actual, name === 'libdl.so.2' ? size + 1 : size, `${dir}/${name} while the driver names it`);
        }
        looks++;
        await new Promise((r) => setImmediate(r));
      }
    })();
    const order = [1, 2, 0, 1, 2, 0].map((i) => runtimes[i] ?? '');
    await Promise.all(order.map((r) => install(plugins, r)));
    done = true;
    await watcher;
    assert.ok(looks > 0);
    assert.ok(runtimeDirs(plugins).length <= 3);
    assert.deepEqual(
      readdirSync(join(plugins, 'latch~loop')).filter((n) => n.endsWith('.tmp')),
      [],
    );
  });

  test('--config-beside-driver: a certificate that does not match its key is refused before anything is written', async (t) => {
    const certs = makeTestCertificates(join(work, 'certs'));
    if (!certs) return t.skip('openssl is not installed');
    const configFile = join(work, 'mismatch.json');
    const doc = {
      store: { type: 'etcd', endpoints: ['https://127.0.0.1:2379'], tls: { ca: certs.ca, cert: certs.client.cert, key: certs.server.key } },
    };
    writeFileSync(configFile, JSON.stringify(doc));
    const plugins = join(work, 'plugins-3');
    await assert.rejects(
      installDriver({
        pluginDir: plugins,
        driverName: 'latch/loop',
        source: SEA,
        runtime: RUNTIME,
        configBeside: parseConfig(doc, configFile),
      }),
      /certificate .* does not match the key .*; nothing was installed/,
    );
    assert.equal(existsSync(plugins), false);

    // The matching pair: every file 0600, whatever the source files' modes.
    const good = { store: { ...doc.store, tls: certs.client && { ca: certs.ca, cert: certs.client.cert, key: certs.client.key } } };
    writeFileSync(configFile, JSON.stringify(good));
    const result = await installDriver({
      pluginDir: plugins,
      driverName: 'latch/loop',
      source: SEA,
      runtime: RUNTIME,
      configBeside: parseConfig(good, configFile),
    });
    for (const file of [result.config ?? '', ...(result.configFiles ?? [])]) assert.equal(statSync(file).mode & 0o777, 0o600, file);
  });
});

describe(
  'install into a read-only plugin dir',
  { skip: process.getuid?.() !== 0 ? 'needs root (a read-only bind mount)' : undefined },
  () => {
    test('is refused naming the read-only file system and what to do, with nothing written', async () => {
      const dir = mkdtempSync(join(tmpdir(), 'latch-install-ro-'));
      const ro = join(dir, 'ro');
      const driver = join(dir, 'driver');
      writeFileSync(driver, '#!/bin/sh\n', { mode: 0o755 });
      mkdirSync(ro);
      const mount = (...args: string[]) => assert.equal(spawnSync('mount', args).status, 0, `mount ${args.join(' ')}`);
      mount('--bind', ro, ro);
      try {
        mount('-o', 'remount,bind,ro', ro);
        await assert.rejects(
          installDriver({ pluginDir: join(ro, 'volume/exec'), driverName: 'latch/loop', source: driver }),
          new RegExp(
            `cannot install into the plugin dir ${ro}/volume/exec: ${ro} is not writable \\(a read-only file system.*EROFS\\. Nothing was installed.*--volume-plugin-dir`,
          ),
        );
      } finally {
        spawnSync('umount', [ro]);
      }
      assert.deepEqual(readdirSync(ro), []);
      rmSync(dir, { recursive: true, force: true });
    });
  },
);
