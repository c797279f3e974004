// The node that fencing exists for, on a real one-host Ceph cluster (test/ceph/cluster.ts): node-a maps an image
// that has `layering` only (no exclusive lock, so no lock holder to find) through the rbd backend (rbd-fuse + loop),
// then is cut off (its rbd-fuse SIGSTOPped) until the OSD drops its watch. The fencer then finds nothing of node-a on
// the image:
//  1. a fence of node-a without its client recorded refuses and leaves the ledger as it was (the hold stays);
//  2. with the client recorded (as every attach now records it), the fence blocklists it and releases the hold;
//  3. node-a's client resumes: a write it had queued while paused and one it makes afterwards both fail, and neither
//     is in the image that node-b then maps read-write.
// The OSD's watch timeout is shortened for this (osd_client_watch_timeout, 30 s by default). Node-a's fenced FUSE mount
// is cleared through fusectl (the backend's cutOff and release), also after a failure (the cluster's stop).
// Needs root and Debian's ceph packages (scripts/setup.sh); skips with a message otherwise.
import assert from 'node:assert/strict';
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

      // 3. node-a's client resumes and writes again. What its writes return is librbd's affair (its cache may take a
      // write the OSDs then refuse); that none of them lands is checked in the image below.
      process.kill(pid, 'SIGCONT');
      const after = await ceph
        .guardFuse(mountPoint, 15_000, () => writeBlock(device, 2, 'a after the fence'))
        .then(
          () => 'returned success',
          (err: unknown) => `failed: ${String(err).slice(0, 160)}`,
        );
      const queued = await Promise.race([pausedWrite, sleep(15_000).then(() => 'still waiting after 15 s')]);
      t.diagnostic(`node-a's write queued while it was cut off: ${queued}; its write after the fence: ${after}`);
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
});
