// The node that fencing exists for, on a real one-host Ceph cluster (test/ceph/cluster.ts): node-a maps an image
// that has `layering` only (no exclusive lock, so no lock holder to find) through the rbd backend (rbd-fuse + loop),
// then is cut off (its rbd-fuse SIGSTOPped) until the OSD drops its watch. The fencer then finds nothing of node-a on
// the image:
//  1. a fence of node-a without its client recorded refuses and leaves the ledger as it was (the hold stays);
//  2. with the client recorded (as every attach now records it), the fence blocklists it and releases the hold;
//  3. node-a's client resumes: a write it had queued while paused and one it makes afterwards both fail, and neither
//     is in the image that node-b then maps read-write.
// A second scenario does what a pod does: node-a has ext4 mounted on the volume; after the fence, a write + fsync of a
// file there fails (rbd-fuse runs without librbd's cache: with it, the fsync returned success), and node-b finds the
// file fsynced before the partition in the image and not one byte of the one written after the fence. A third checks
// that the node refuses an image whose pool or own config would turn the cache back on (it beats the command line).
// The OSD's watch timeout is shortened for this (osd_client_watch_timeout, 30 s by default). Node-a's fenced FUSE mount
// is cleared through fusectl (the backend's cutOff and release), also after a failure (the cluster's stop).
// Needs root and Debian's ceph packages (scripts/setup.sh); skips with a message otherwise.
import assert from 'node:assert/strict';
import { mkdir, open } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { RbdBackend } from '../../src/backend/rbd.js';
import { RbdFencer } from '../../src/backend/rbd-fencer.js';
import { parseConfig } from '../../src/config.js';
import { createContext } from '../../src/context.js';
import { fenceNodeOffVolume } from '../../src/node/fence.js';
import { rbdFusePids } from '../../src/sys/fuse.js';
import { rbdLocks, rbdWatchers, type CephIdentity } from '../../src/sys/rbd.js';
import { run } from '../../src/sys/run.js';
import { BLOCK, block, readBlock, writeBlock } from '../fixtures/blocks.js';
import { MemoryStore } from '../fixtures/memory-store.js';
import { cephSkipReason, startCephCluster, type CephClient, type CephCluster } from '../ceph/cluster.js';

const skip = cephSkipReason();
const MiB = 1024 * 1024;
const WATCH_TIMEOUT_S = 5;

function workload(node: string) {
  return { id: `t-${node}`, type: 'workload' as const, nodeID: node, parameters: { readOnly: false }, requestedBy: { pvName: 'pv' } };
}

describe('fencing a partitioned rbd-fuse node on a one-host Ceph cluster', { skip }, () => {
  let ceph: CephCluster;
  const identityOf = (client: CephClient): CephIdentity => ({
    cephConf: client.confPath,
    clientId: client.id,
    keyring: client.keyringPath,
  });
  const backendOf = (client: CephClient, node: string) =>
    new RbdBackend({
      ...identityOf(client),
      pool: ceph.pool,
      mountDir: join(ceph.dir, 'mnt', node),
      maxSize: 1024 * MiB,
      timeoutMs: 30_000,
    });

  before(
    async () => {
      ceph = await startCephCluster();
    },
    { timeout: 120_000 },
  );
  after(async () => {
    await ceph?.stop();
  });

  /** Waits until osd.0 has the OSD map the monitor has now (the one listing a new blocklist entry). */
  const osdHasNewestMap = async (): Promise<void> => {
    const epoch = (JSON.parse((await ceph.ceph(['osd', 'dump', '--format', 'json'])).stdout) as { epoch: number }).epoch;
    for (let look = 0; look < 100; look++) {
      const newest = (JSON.parse((await ceph.ceph(['tell', 'osd.0', 'status'])).stdout) as { newest_map: number }).newest_map;
      if (newest >= epoch) return;
      await sleep(100);
    }
    assert.fail(`osd.0 does not have OSD map ${epoch}`);
  };

  it('refuses to fence a node it finds nothing of; with its client recorded, fences it, and none of its later writes land', async (t) => {
    const started = performance.now();
    await ceph.ceph(['config', 'set', 'osd', 'osd_client_watch_timeout', String(WATCH_TIMEOUT_S)]);
    const [nodeA, nodeB, fencerId] = [
      await ceph.createClient('node-a'),
      await ceph.createClient('node-b'),
      await ceph.createClient('fencer', { role: 'fencer' }),
    ];
    const a = backendOf(nodeA, 'node-a');
    const b = backendOf(nodeB, 'node-b');
    const fencer = new RbdFencer({ pool: ceph.pool, identity: identityOf(fencerId) });
    const config = parseConfig({ nodeName: 'admin', stateDir: '/nonexistent', poolDir: '/nonexistent', logFile: '/dev/null' }, 'test');
    const ctx = createContext(config, { store: new MemoryStore() });
    const { ledger } = ctx;
    await ceph.rbd(['create', '--size', '64M', '--image-feature', 'layering', `${ceph.pool}/part`]);

    // node-a holds the volume read-write; its device was recorded without a client (as before attaches recorded one).
    await ledger.addTicket('part', workload('node-a'), { sizeBytes: 64 * MiB, fsType: 'ext4' });
    await ledger.claimGrant('part', 'node-a');
    const device = await a.attach('part', { readOnly: false, knownClients: [] });
    await ledger.recordDevice('part', 'node-a', device);
    await ledger.addTicket('part', workload('node-b'));
    const client = await a.clientOf('part');
    assert.ok(client !== undefined, 'the attach recorded the client instance on the node');
    await writeBlock(device, 0, 'a before the partition');

    const mountPoint = join(ceph.dir, 'mnt', 'node-a', 'part');
    const [pid] = await rbdFusePids(mountPoint);
    assert.ok(pid !== undefined);
    let pausedWrite: Promise<string> | undefined;
    try {
      // Cut off: the daemon stops answering anyone. A write queued now waits in the kernel for it.
      process.kill(pid, 'SIGSTOP');
      const paused = performance.now();
      pausedWrite = run('dd', [`of=${device}`, `bs=${BLOCK}`, 'seek=1', 'count=1', 'oflag=direct', 'conv=notrunc', 'status=none'], {
        input: block('a queued while cut off'),
        timeoutMs: 120_000,
      }).then(
        () => 'succeeded',
        (err: unknown) => `failed: ${String(err).slice(0, 160)}`,
      );
      const fencerIdentity = identityOf(fencerId);
      while ((await rbdWatchers(fencerIdentity, ceph.pool, 'part')).includes(client)) {
        assert.ok(performance.now() - paused < 60_000, "node-a's watch did not expire within 60 s");
        await sleep(250);
      }
      t.diagnostic(`node-a's watch expired ${Math.round(performance.now() - paused)} ms after its rbd-fuse stopped`);
      assert.deepEqual(await rbdLocks(fencerIdentity, ceph.pool, 'part'), [], 'layering only: no lock holder to find either');

      // 1. Nothing of node-a is left to find: the fence refuses, and the ledger stays as it was.
      const unchanged = await ledger.get('part');
      await assert.rejects(
        fenceNodeOffVolume(ctx, fencer, 'part', 'node-a', 'test'),
        /node node-a holds it \(attached\), but the Ceph cluster's OSD blocklist has nothing of it to refuse/,
      );
      assert.deepEqual(await ledger.get('part'), unchanged);
      assert.equal(unchanged?.status.nodes['node-a']?.phase, 'attached');

      // 2. The client recorded (what every attach now does before recordDevice): it is blocklisted, then the hold goes.
      await ledger.recordDevice('part', 'node-a', device, client);
      const fencing = performance.now();
      const { clients, doc } = await fenceNodeOffVolume(ctx, fencer, 'part', 'node-a', 'test');
      t.diagnostic(`fence with the recorded client: ${Math.round(performance.now() - fencing)} ms`);
      assert.deepEqual(clients, [client]);
      assert.equal(doc?.status.nodes['node-a'], undefined);
      assert.equal(doc?.status.fences?.['node-a']?.state, 'fenced');
      assert.equal(doc?.status.nodes['node-b']?.phase, 'granted');
      await osdHasNewestMap();

      // 3. node-a's client resumes and writes again. Its rbd-fuse runs without librbd's cache, so each write waits for
      // the OSDs and fails with their refusal (with the cache on, the write after the fence returned success); that
      // none of them lands is checked in the image below.
      process.kill(pid, 'SIGCONT');
      const after = await ceph
        .guardFuse(mountPoint, 15_000, () => writeBlock(device, 2, 'a after the fence'))
        .then(
          () => 'returned success',
          (err: unknown) => `failed: ${String(err).slice(0, 160)}`,
        );
      const queued = await Promise.race([pausedWrite, sleep(15_000).then(() => 'still waiting after 15 s')]);
      t.diagnostic(`node-a's write queued while it was cut off: ${queued}; its write after the fence: ${after}`);
      assert.match(after, /^failed/, "node-a's write after the fence returned an error");
      // Give a write that librbd took into its cache the time to reach the OSDs (and be refused) before node-b looks.
      await ceph.guardFuse(mountPoint, 15_000, () => run('sync', [device], { timeoutMs: 20_000 })).catch(() => undefined);
    } finally {
      process.kill(pid, 'SIGCONT');
      // The fenced client's FUSE connection is aborted (any waiting writer fails), then the mapping goes.
      await a.cutOff('part').catch(() => undefined);
      await pausedWrite;
      await a.release('part').catch((err: unknown) => t.diagnostic(`node-a's release: ${String(err)}`));
    }
    assert.equal(await a.hasMapping('part'), false);

    // node-b maps it read-write (node-a's fenced client is known to the ledger) and finds only what node-a wrote before.
    await ledger.claimGrant('part', 'node-b');
    const fenced = (await ledger.get('part'))?.status.fences?.['node-a']?.clients ?? [];
    const onB = await b.attach('part', { readOnly: false, knownClients: fenced });
    assert.equal(await readBlock(onB, 0), block('a before the partition'));
    assert.equal((await readBlock(onB, 1)).replace(/\0/g, ''), '', 'the write queued while cut off did not land');
    assert.equal((await readBlock(onB, 2)).replace(/\0/g, ''), '', 'the write after the fence did not land');
    await b.release('part');
    t.diagnostic(`the whole scenario: ${Math.round(performance.now() - started)} ms`);
  });
  it("a fenced node's write and fsync through the filesystem on its volume fail, and the data is not in the image", async (t) => {
    await ceph.ceph(['config', 'set', 'osd', 'osd_client_watch_timeout', String(WATCH_TIMEOUT_S)]);
    const [nodeA, nodeB, fencerId] = [
      await ceph.createClient('pod-node-a'),
      await ceph.createClient('pod-node-b'),
      await ceph.createClient('pod-fencer', { role: 'fencer' }),
    ];
    const a = backendOf(nodeA, 'pod-node-a');
    const b = backendOf(nodeB, 'pod-node-b');
    const fencer = new RbdFencer({ pool: ceph.pool, identity: identityOf(fencerId) });
    const config = parseConfig({ nodeName: 'admin', stateDir: '/nonexistent', poolDir: '/nonexistent', logFile: '/dev/null' }, 'test');
    const ctx = createContext(config, { store: new MemoryStore() });
    const { ledger } = ctx;
    await ceph.rbd(['create', '--size', '64M', '--image-feature', 'layering', `${ceph.pool}/pod`]);

    // node-a holds the volume read-write with an ext4 filesystem mounted on it, as a pod would.
    await ledger.addTicket('pod', workload('pod-node-a'), { sizeBytes: 64 * MiB, fsType: 'ext4' });
    await ledger.claimGrant('pod', 'pod-node-a');
    const device = await a.attach('pod', { readOnly: false, knownClients: [] });
    const client = await a.clientOf('pod');
    assert.ok(client !== undefined);
    await ledger.recordDevice('pod', 'pod-node-a', device, client);
    await ledger.addTicket('pod', workload('pod-node-b'));
    await run('mkfs.ext4', ['-q', '-F', device], { timeoutMs: 30_000 });
    const fsDir = join(ceph.dir, 'fs', 'pod-node-a');
    await mkdir(fsDir, { recursive: true });
    await run('mount', [device, fsDir], { timeoutMs: 20_000 });
    const marker = (what: string) => `${what}-${process.pid}-${Date.now()}`;
    const before = marker('durable-before-the-partition');
    const afterFence = marker('written-by-the-fenced-node');
    // A file written and fsynced (dd conv=fsync fails when fsync does), 64 KiB of its marker.
    const writeAndFsync = (name: string, text: string, timeoutMs: number) =>
      run('dd', [`of=${join(fsDir, name)}`, 'bs=64k', 'count=1', 'iflag=fullblock', 'conv=fsync', 'status=none'], {
        input: text.repeat(Math.ceil(65536 / text.length)).slice(0, 65536),
        timeoutMs,
      });
    await writeAndFsync('before', before, 20_000);

    const mountPoint = join(ceph.dir, 'mnt', 'pod-node-a', 'pod');
    const [pid] = await rbdFusePids(mountPoint);
    assert.ok(pid !== undefined);
    let fsyncAfterFence = 'not tried';
    try {
      process.kill(pid, 'SIGSTOP');
      const paused = performance.now();
      while ((await rbdWatchers(identityOf(fencerId), ceph.pool, 'pod')).includes(client)) {
        assert.ok(performance.now() - paused < 60_000, "node-a's watch did not expire within 60 s");
        await sleep(250);
      }
      const { clients } = await fenceNodeOffVolume(ctx, fencer, 'pod', 'pod-node-a', 'test');
      assert.deepEqual(clients, [client]);
      await osdHasNewestMap();
      process.kill(pid, 'SIGCONT');

      // What a pod on the fenced node does next: it writes a file and fsyncs it. That must not report success.
      fsyncAfterFence = await ceph
        .guardFuse(mountPoint, 20_000, () => writeAndFsync('after', afterFence, 25_000))
        .then(
          () => 'returned success',
          (err: unknown) => `failed: ${String(err).slice(0, 200)}`,
        );
      t.diagnostic(`node-a's write + fsync after the fence: ${fsyncAfterFence}`);
    } finally {
      process.kill(pid, 'SIGCONT');
      await run('umount', [fsDir], { timeoutMs: 20_000 }).catch(() =>
        run('umount', ['-l', fsDir], { timeoutMs: 10_000 }).catch(() => undefined),
      );
      await a.cutOff('pod').catch(() => undefined);
      await a.release('pod').catch((err: unknown) => t.diagnostic(`node-a's release: ${String(err)}`));
    }
    assert.match(fsyncAfterFence, /^failed/, "the fenced node's fsync returned an error");
    assert.equal(await a.hasMapping('pod'), false);

    // node-b maps the image and finds the fsynced file from before the partition, and nothing of the write after it.
    await ledger.claimGrant('pod', 'pod-node-b');
    const fenced = (await ledger.get('pod'))?.status.fences?.['pod-node-a']?.clients ?? [];
    const onB = await b.attach('pod', { readOnly: false, knownClients: fenced });
    try {
      const bytes = await readWholeDevice(onB);
      assert.ok(bytes.includes(before), 'the data fsynced before the partition is on the image');
      assert.ok(!bytes.includes(afterFence), 'the data the fenced node wrote is not on the image');
    } finally {
      await b.release('pod');
    }
  });
  it("refuses to map an image whose pool's or own config turns librbd's cache back on", async () => {
    const nodeC = await ceph.createClient('cache-node');
    const c = backendOf(nodeC, 'cache-node');
    await ceph.rbd(['create', '--size', '16M', '--image-feature', 'layering', `${ceph.pool}/cached`]);
    try {
      // Set on the image or on its pool, rbd_cache beats rbd-fuse's own --rbd-cache false (measured with the pool's: the writearound
      // cache comes up); each refusal leaves no daemon behind.
      await ceph.rbd(['config', 'image', 'set', `${ceph.pool}/cached`, 'rbd_cache', 'true']);
      await assert.rejects(c.attach('cached', { readOnly: false, knownClients: [] }), /rbd_cache="true" in its image's config/);
      await ceph.rbd(['config', 'image', 'rm', `${ceph.pool}/cached`, 'rbd_cache']);
      await ceph.rbd(['config', 'pool', 'set', ceph.pool, 'rbd_cache', 'true']);
      await assert.rejects(c.attach('cached', { readOnly: false, knownClients: [] }), /rbd_cache="true" in its pool's config/);
      assert.deepEqual(await rbdFusePids(join(ceph.dir, 'mnt', 'cache-node', 'cached')), []);
      // Turned off there, or not set at all, it maps.
      await ceph.rbd(['config', 'pool', 'set', ceph.pool, 'rbd_cache', 'false']);
      const device = await c.attach('cached', { readOnly: false, knownClients: [] });
      await writeBlock(device, 0, 'cache off');
      await c.release('cached');
      await ceph.rbd(['config', 'pool', 'rm', ceph.pool, 'rbd_cache']);
      await c.attach('cached', { readOnly: false, knownClients: [] });
      await c.release('cached');
    } finally {
      await ceph.rbd(['config', 'pool', 'rm', ceph.pool, 'rbd_cache']).catch(() => undefined);
    }
  });
});

/** A whole block device's bytes (through the page cache: a device just mapped has nothing stale in it). */
async function readWholeDevice(device: string): Promise<Buffer> {
  const handle = await open(device, 'r');
  try {
    return await handle.readFile();
  } finally {
    await handle.close();
  }
}
