// The rbd backend (src/backend/rbd.ts) on a real one-host Ceph cluster (test/ceph/cluster.ts), one cluster for the
// whole file: images are created, sized, grown and deleted with `rbd` as a node's own least-privilege identity, and
// mapped on "this node" with one rbd-fuse -r IMAGE per volume plus a loop device (direct I/O) over its file.
// Checked against the kernel's own tables (mountinfo, /sys/block/loopN, /proc/PID/cmdline), never through the FUSE
// mount. Two backends with their own identity and mount dir play two nodes on this host.
// Needs root and Debian's ceph packages (scripts/setup.sh); skips with a message otherwise.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { KernelRbdClient } from '../../src/backend/krbd.js';
import { RbdBackend, type RbdBackendOptions } from '../../src/backend/rbd.js';
import { rbdFusePids } from '../../src/sys/fuse.js';
import { listLoopDevices } from '../../src/sys/loop.js';
import { readMountInfo } from '../../src/sys/mounts.js';
import { isClientInstance, rbdLocks, rbdWatchers, redactKeys } from '../../src/sys/rbd.js';
import { run } from '../../src/sys/run.js';
import { BLOCK, block, readBlock, writeBlock } from '../fixtures/blocks.js';
import { cephSkipReason, startCephCluster, type CephClient, type CephCluster } from '../ceph/cluster.js';

const REPO = resolve(__dirname, '../..');
const MiB = 1024 * 1024;
const skip = cephSkipReason();

/** Everything of a volume's mapping the kernel shows: loop devices over its file, FUSE mounts, rbd-fuse processes. */
async function mappingOf(mountDir: string, volume: string): Promise<{ loops: string[]; mounts: number; pids: number[] }> {
  const mountPoint = join(mountDir, volume);
  const loops = (await listLoopDevices()).filter((l) => l.backingFile === join(mountPoint, volume)).map((l) => l.device);
  const mounts = (await readMountInfo()).filter((m) => m.mountPoint === mountPoint).length;
  return { loops, mounts, pids: await rbdFusePids(mountPoint) };
}

function memoryKiB(pid: number): number {
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? NaN);
}

describe('RbdBackend on a one-host Ceph cluster', { skip }, () => {
  let ceph: CephCluster;
  let nodeA: CephClient;
  let nodeB: CephClient;
  let optionsA: RbdBackendOptions;
  let optionsB: RbdBackendOptions;
  let a: RbdBackend;
  let b: RbdBackend;

  function optionsFor(client: CephClient, node: string, timeoutMs = 30_000): RbdBackendOptions {
    return {
      pool: ceph.pool,
      cephConf: client.confPath,
      clientId: client.id,
      keyring: client.keyringPath,
      // Under the cluster's dir, so that its teardown sweeps whatever a failed test leaves mapped.
      mountDir: join(ceph.dir, 'mnt', node),
      maxSize: 1024 * MiB,
      timeoutMs,
    };
  }

  before(
    async () => {
      ceph = await startCephCluster();
      nodeA = await ceph.createClient('node-a');
      nodeB = await ceph.createClient('node-b');
      optionsA = optionsFor(nodeA, 'node-a');
      optionsB = optionsFor(nodeB, 'node-b');
      a = new RbdBackend(optionsA);
      b = new RbdBackend(optionsB);
    },
    { timeout: 120_000 },
  );

  after(async () => {
    await ceph?.stop();
  });

  it('creates an image of exactly the size in bytes, idempotently, and refuses what it cannot honour', async () => {
    assert.equal(await a.size('vol-size'), undefined);
    await a.create('vol-size', 64 * MiB + 512);
    assert.equal(await a.size('vol-size'), 64 * MiB + 512, 'bytes, not MiB (rbd reads a bare --size as MiB)');
    await a.create('vol-size', 64 * MiB + 512);
    await a.create('vol-size', 32 * MiB); // exists with at least that size
    await assert.rejects(a.create('vol-size', 128 * MiB), /already exists with 64.0Mi, less than the requested 128Mi.*expand it instead/);
    await assert.rejects(a.create('vol-big', 2048 * MiB), /above the limit of 1Gi \(maxSize\)/);
    assert.equal(await a.size('vol-big'), undefined);
    await assert.rejects(a.create('../etc', MiB), /not allowed/);
    assert.equal(await b.size('vol-size'), 64 * MiB + 512, 'the other node sees the same image');
  });

  it('attaches one rbd-fuse -r IMAGE and one direct-I/O loop device per volume; finds them from the kernel; releases them', async (t) => {
    await a.create('vol-map', 64 * MiB);
    const started = performance.now();
    const device = await a.attach('vol-map');
    const attachMs = Math.round(performance.now() - started);
    assert.match(device, /^\/dev\/loop[0-9]+$/);
    assert.equal(await a.attach('vol-map'), device, 'a second attach finds the first mapping');
    assert.equal(await a.findDevice('vol-map'), device);
    assert.equal(await a.volumeOfDevice(device), 'vol-map');
    assert.equal(await b.volumeOfDevice(device), undefined, "not one of node-b's");
    assert.equal(await b.findDevice('vol-map'), undefined);
    assert.equal(await a.volumeOfDevice('/dev/loop999'), undefined);

    const mapping = await mappingOf(optionsA.mountDir, 'vol-map');
    assert.deepEqual(mapping.loops, [device]);
    assert.equal(mapping.mounts, 1);
    assert.equal(mapping.pids.length, 1);
    const [pid] = mapping.pids;
    assert.ok(pid !== undefined);
    const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    assert.deepEqual(argv.slice(argv.indexOf('-r'), argv.indexOf('-r') + 2), ['-r', 'vol-map'], 'serves that image only');
    const key = /key = (\S+)/.exec(readFileSync(nodeA.keyringPath, 'utf8'))?.[1];
    assert.ok(key && !argv.join(' ').includes(key), 'the key is not on the command line');
    assert.equal(readFileSync(`/sys/block/${device.slice(5)}/loop/dio`, 'utf8').trim(), '1', 'direct I/O on the FUSE file');
    t.diagnostic(`attach: ${attachMs} ms; rbd-fuse memory (VmRSS) idle: ${memoryKiB(pid)} KiB`);
    const identityA = { cephConf: nodeA.confPath, clientId: nodeA.id, keyring: nodeA.keyringPath };
    const recorded = await a.clientOf('vol-map');
    assert.deepEqual(await rbdWatchers(identityA, ceph.pool, 'vol-map'), [recorded], "the recorded client is the daemon's own watcher");

    await writeBlock(device, 0, 'hello from node-a');
    assert.equal(await readBlock(device, 0), block('hello from node-a'));
    await run('dd', ['if=/dev/urandom', `of=${device}`, 'bs=1M', 'count=32', 'oflag=direct', 'status=none'], { timeoutMs: 60_000 });
    t.diagnostic(`rbd-fuse memory (VmRSS) after 32 MiB written: ${memoryKiB(pid)} KiB`);

    const releasing = performance.now();
    await a.release('vol-map');
    t.diagnostic(`release: ${Math.round(performance.now() - releasing)} ms`);
    assert.deepEqual(await mappingOf(optionsA.mountDir, 'vol-map'), { loops: [], mounts: 0, pids: [] });
    assert.equal(await a.findDevice('vol-map'), undefined);
    await a.release('vol-map'); // twice is fine
    await a.release('vol-never-attached');
  });

  it('grows the image and the attached device with it; never shrinks', async () => {
    await a.create('vol-grow', 32 * MiB);
    const device = await a.attach('vol-grow');
    await writeBlock(device, 1, 'before growing');
    await a.grow('vol-grow', 96 * MiB);
    assert.equal(await a.size('vol-grow'), 96 * MiB);
    assert.equal(Number(readFileSync(`/sys/block/${device.slice(5)}/size`, 'utf8')) * 512, 96 * MiB, 'the loop device follows');
    await writeBlock(device, (96 * MiB) / BLOCK - 1, 'last block');
    assert.equal(await readBlock(device, 1), block('before growing'));
    await a.grow('vol-grow', 96 * MiB); // repeated: nothing to do
    await assert.rejects(a.grow('vol-grow', 64 * MiB), /cannot shrink/);
    await assert.rejects(a.grow('vol-grow', 2048 * MiB), /maxSize/);
    await assert.rejects(a.grow('vol-none', 64 * MiB), /has no image/);
    await a.release('vol-grow');
  });

  it('deletes an image only when it is not attached here and has no snapshots or clones, and says which', async () => {
    await a.create('vol-del', 16 * MiB);
    await a.attach('vol-del');
    await assert.rejects(a.delete('vol-del'), /still attached on this node \(\/dev\/loop[0-9]+\)/);
    await a.release('vol-del');
    await ceph.rbd(['snap', 'create', `${ceph.pool}/vol-del@before-upgrade`]);
    await assert.rejects(a.delete('vol-del'), /snapshot\(s\) before-upgrade; refusing/);
    await ceph.rbd(['snap', 'protect', `${ceph.pool}/vol-del@before-upgrade`]);
    await ceph.rbd(['clone', `${ceph.pool}/vol-del@before-upgrade`, `${ceph.pool}/vol-del-clone`]);
    await assert.rejects(a.delete('vol-del'), /snapshot\(s\) before-upgrade and clone\(s\) latch\/vol-del-clone that depend on it/);
    assert.equal(await a.size('vol-del'), 16 * MiB, 'still there');
    await a.delete('vol-del-clone');
    await ceph.rbd(['snap', 'unprotect', `${ceph.pool}/vol-del@before-upgrade`]);
    await ceph.rbd(['snap', 'rm', `${ceph.pool}/vol-del@before-upgrade`]);
    await a.delete('vol-del');
    assert.equal(await a.size('vol-del'), undefined);
    await a.delete('vol-del'); // missing: no-op
  });

  it('converges on one mapping after driver-like processes are SIGKILLed at any point of an attach', async (t) => {
    await a.create('vol-kill', 16 * MiB);
    type Mapping = Awaited<ReturnType<typeof mappingOf>>;
    // Kill points, from the kernel's view of the child's progress: as soon as its rbd-fuse runs (not mounted yet,
    // or just), as soon as the mount is there (no loop device yet), as soon as the loop device is there.
    const points: [string, (m: Mapping) => boolean][] = [
      ['rbd-fuse started', (m) => m.pids.length > 0],
      ['mounted', (m) => m.mounts > 0],
      ['loop device set up', (m) => m.loops.length > 0],
    ];
    // Between the mount and the loop device the child runs only losetup, for a few milliseconds: less than a poll takes
    // on a busy machine. For the first two points the child runs a losetup that waits a second first (first on its
    // PATH), so that the poll sees rbd-fuse, or the mount with no loop device yet, before the child is done (CI once
    // saw a whole attach end before the poll saw its rbd-fuse).
    const slowBin = join(ceph.dir, 'slow-losetup');
    mkdirSync(slowBin, { recursive: true });
    const realLosetup = (await run('sh', ['-c', 'PATH="$PATH:/usr/sbin:/sbin" command -v losetup'])).stdout.trim();
    writeFileSync(join(slowBin, 'losetup'), `#!/bin/sh\nsleep 1\nexec ${realLosetup} "$@"\n`, { mode: 0o755 });
    const seen: string[] = [];
    for (const [what, reached] of points) {
      await a.release('vol-kill');
      const child = spawn(
        process.execPath,
        ['--import', 'tsx', join(REPO, 'test/fixtures/rbd-attach.ts'), JSON.stringify(optionsA), 'vol-kill'],
        {
          cwd: REPO,
          stdio: ['ignore', 'pipe', 'pipe'],
          ...(what !== 'loop device set up' && { env: { ...process.env, PATH: `${slowBin}:${process.env.PATH ?? ''}` } }),
        },
      );
      let stderr = '';
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      const exited = new Promise<void>((r) => child.on('exit', () => r()));
      let done = false;
      void exited.then(() => (done = true));
      while (!done && !reached(await mappingOf(optionsA.mountDir, 'vol-kill'))) await new Promise((r) => setTimeout(r, 2));
      // The last point is a few ms before the child's exit: it may win the race (then it is a plain attach).
      if (what !== 'loop device set up') assert.ok(!done, `the child finished before "${what}" was seen: ${child.exitCode} ${stderr}`);
      const killed = !done;
      child.kill('SIGKILL');
      await exited;
      const left = await mappingOf(optionsA.mountDir, 'vol-kill');
      const how = killed ? 'killed' : 'finished first';
      seen.push(`${what} (${how}): ${left.mounts} mount(s), ${left.loops.length} loop(s), ${left.pids.length} rbd-fuse`);
      const device = await a.attach('vol-kill');
      const after = await mappingOf(optionsA.mountDir, 'vol-kill');
      assert.deepEqual([after.loops, after.mounts, after.pids.length], [[device], 1, 1], `after a kill at "${what}"`);
      assert.equal(await a.attach('vol-kill'), device);
      await writeBlock(device, 0, `after a kill at ${what}`);
      assert.equal(await readBlock(device, 0), block(`after a kill at ${what}`));
    }
    t.diagnostic(`left behind by the killed attach: ${seen.join('; ')}`);
    await a.release('vol-kill');
    assert.deepEqual(await mappingOf(optionsA.mountDir, 'vol-kill'), { loops: [], mounts: 0, pids: [] });
  });

  it('serialises concurrent attaches of one volume on one node: one mount, one device', async () => {
    await a.create('vol-race', 16 * MiB);
    const devices = await Promise.all([1, 2, 3].map(() => new RbdBackend(optionsA).attach('vol-race')));
    assert.equal(new Set(devices).size, 1);
    const mapping = await mappingOf(optionsA.mountDir, 'vol-race');
    assert.equal(mapping.mounts, 1);
    assert.equal(mapping.pids.length, 1);
    assert.equal(mapping.loops.length, 1);
    await a.release('vol-race');
  });

  it("moves a volume between two node identities: what node-a wrote is read through node-b's device", async () => {
    await a.create('vol-move', 32 * MiB);
    // Another client has the image open while node-a maps it: node-a still records its own instance, not that one
    // (read-only: the guard against unknown watchers is for read-write maps).
    const other = await ceph.startRbdFuse(nodeB, join(ceph.dir, 'mnt', 'other-vol-move'), { image: 'vol-move' });
    const [otherWatcher] = await rbdWatchers(
      { cephConf: nodeB.confPath, clientId: nodeB.id, keyring: nodeB.keyringPath },
      ceph.pool,
      'vol-move',
    );
    await a.attach('vol-move', { readOnly: true, knownClients: [] });
    const recorded = await a.clientOf('vol-move');
    assert.ok(recorded !== undefined && otherWatcher !== undefined && recorded !== otherWatcher, `${recorded} is not ${otherWatcher}`);
    assert.deepEqual(
      (await rbdWatchers({ cephConf: nodeA.confPath, clientId: nodeA.id, keyring: nodeA.keyringPath }, ceph.pool, 'vol-move')).sort(),
      [recorded, otherWatcher].sort(),
    );
    await a.release('vol-move');
    // Read-write, the other client's watch makes node-a refuse, naming it.
    await assert.rejects(
      a.attach('vol-move', { readOnly: false, knownClients: [] }),
      new RegExp(
        `refusing to map latch/vol-move read-write on this node: the image is open or locked by ${otherWatcher?.replace(/[.]/g, '\\.')} \\(watcher\\)`,
      ),
    );
    assert.deepEqual(await mappingOf(optionsA.mountDir, 'vol-move'), { loops: [], mounts: 0, pids: [] }, 'nothing mapped');
    await other.stop();
    const onA = await a.attach('vol-move', { readOnly: false, knownClients: [] });
    for (const i of [0, 1023, 8191]) await writeBlock(onA, i, `written on node-a, block ${i}`);
    await a.release('vol-move');
    const onB = await b.attach('vol-move');
    for (const i of [0, 1023, 8191]) assert.equal(await readBlock(onB, i), block(`written on node-a, block ${i}`));
    await writeBlock(onB, 2, 'written on node-b');
    await b.release('vol-move');
    const again = await a.attach('vol-move');
    assert.equal(await readBlock(again, 2), block('written on node-b'));
    await a.release('vol-move');
  });

  it('releases a mapping whose rbd-fuse died, or hangs, within its deadline (fusectl abort, kill by PID)', async (t) => {
    await a.create('vol-dead', 16 * MiB);
    // Dead: the daemon is gone, the mount answers ENOTCONN; findDevice still answers from sysfs.
    const device = await a.attach('vol-dead');
    const [dead] = (await mappingOf(optionsA.mountDir, 'vol-dead')).pids;
    assert.ok(dead !== undefined);
    process.kill(dead, 'SIGKILL');
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(await a.findDevice('vol-dead'), device);
    assert.equal(await a.volumeOfDevice(device), 'vol-dead');
    let started = performance.now();
    await a.release('vol-dead');
    t.diagnostic(`release with a dead rbd-fuse: ${Math.round(performance.now() - started)} ms`);
    assert.deepEqual(await mappingOf(optionsA.mountDir, 'vol-dead'), { loops: [], mounts: 0, pids: [] });

    // Hung: the daemon is stopped, so every request on its mount waits (as on a fenced one). A short deadline, but not
    // shorter than the cluster's own answers take on a loaded machine (a `rbd lock rm` took over 3 s beside npm test's
    // other parts).
    const hasty = new RbdBackend(optionsFor(nodeA, 'node-a', 8_000));
    // The killed daemon holds the image's exclusive lock until the OSD drops its watch (30 s, rbd-backend.md h), and
    // the new daemon's first I/O waits for it: a deadline past that.
    const patient = new RbdBackend(optionsFor(nodeA, 'node-a', 45_000));
    const again = await patient.attach('vol-dead');
    const [hung] = (await mappingOf(optionsA.mountDir, 'vol-dead')).pids;
    assert.ok(hung !== undefined);
    process.kill(hung, 'SIGSTOP');
    try {
      started = performance.now();
      assert.equal(await hasty.findDevice('vol-dead'), again, 'answers from sysfs while the mount hangs');
      assert.equal(await hasty.volumeOfDevice(again), 'vol-dead');
      assert.ok(performance.now() - started < 1_000);
      started = performance.now();
      await hasty.release('vol-dead');
      const releaseMs = Math.round(performance.now() - started);
      t.diagnostic(`release with a stopped (hung) rbd-fuse: ${releaseMs} ms`);
      assert.ok(releaseMs < 20_000, `released within its deadlines (${releaseMs} ms)`);
      assert.deepEqual(await mappingOf(optionsA.mountDir, 'vol-dead'), { loops: [], mounts: 0, pids: [] });
    } finally {
      try {
        process.kill(hung, 'SIGKILL');
      } catch {
        // released: gone
      }
    }
    // And the volume maps again (after the killed daemon's lock, as above).
    assert.match(await patient.attach('vol-dead'), /^\/dev\/loop/);
    await a.release('vol-dead');
  });

  it("krbd: takes a lock over from a fenced holder as the node's own identity, never from a live one", async () => {
    // The kernel client breaks a dead holder's lock itself only after blocklisting it, which a node may not do; so
    // the client breaks it first (src/backend/krbd.ts). This kernel has no rbd module: a planted, empty
    // /sys/bus/rbd lets the client go as far as `rbd device map`, which then fails here.
    await a.create('vol-krbd', 8 * MiB);
    const device = await a.attach('vol-krbd');
    await writeBlock(device, 0, 'node-a holds the lock');
    const identityA = { cephConf: nodeA.confPath, clientId: nodeA.id, keyring: nodeA.keyringPath };
    const [lock, ...others] = await rbdLocks(identityA, ceph.pool, 'vol-krbd');
    assert.deepEqual(others, []);
    assert.match(lock?.id ?? '', /^auto [0-9]+$/, 'the exclusive lock, as `rbd lock ls` shows it');
    assert.ok(lock && isClientInstance(lock.address));

    const sysRoot = join(ceph.dir, 'krbd-sys');
    mkdirSync(join(sysRoot, 'bus/rbd/devices'), { recursive: true });
    const identityB = { cephConf: nodeB.confPath, clientId: nodeB.id, keyring: nodeB.keyringPath };
    const krbdB = new KernelRbdClient({ identity: identityB, pool: ceph.pool, timeoutMs: 30_000, sysRoot });
    await assert.rejects(krbdB.map('vol-krbd', { readOnly: false }), /device map --device-type krbd --options noshare,exclusive .* failed/);
    assert.deepEqual(await rbdLocks(identityB, ceph.pool, 'vol-krbd'), [lock], 'a live holder keeps its lock');

    await ceph.ceph(['osd', 'blocklist', 'add', lock.address, '600']);
    try {
      // The OSDs drop a blocklisted client's watch with the next OSD map (0.5 s here).
      const deadline = Date.now() + 30_000;
      while ((await rbdWatchers(identityB, ceph.pool, 'vol-krbd')).includes(lock.address)) {
        assert.ok(Date.now() < deadline, "the fenced holder's watch is still there after 30 s");
        await sleep(100);
      }
      await assert.rejects(krbdB.map('vol-krbd', { readOnly: false }), /map failed/);
      assert.deepEqual(await rbdLocks(identityB, ceph.pool, 'vol-krbd'), [], "broken by node-b's identity, which cannot blocklist");
      await a.cutOff('vol-krbd');
      await a.release('vol-krbd');
    } finally {
      await ceph.ceph(['osd', 'blocklist', 'rm', lock.address]);
    }
  });

  it('keeps keys out of messages: a malformed keyring fails the attach without echoing it', async () => {
    const bad = join(ceph.dir, 'clients', 'bad.keyring');
    const secret = 'AQBfakefakefakefakefakefakefakefakefake==';
    await run('install', ['-m', '600', '/dev/null', bad]);
    await run('tee', [bad], { input: `[client.node-a]\n\tkey = ${secret}x\n` });
    await a.create('vol-key', 8 * MiB);
    const badBackend = new RbdBackend({ ...optionsA, keyring: bad, mountDir: join(ceph.dir, 'mnt', 'node-bad') });
    await assert.rejects(badBackend.attach('vol-key'), (err: Error) => {
      assert.doesNotMatch(err.message, /AQBfake/);
      return true;
    });
    assert.deepEqual(await mappingOf(join(ceph.dir, 'mnt', 'node-bad'), 'vol-key'), { loops: [], mounts: 0, pids: [] });
    assert.equal(redactKeys(`type=key val=${secret}: Malformed`), 'type=key val=[redacted] Malformed');
    assert.equal(redactKeys(`key = ${secret}`), 'key = [redacted]');
  });
});
