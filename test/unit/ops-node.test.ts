// The decisions of the node-side ops in attach mode: waitforattach, mountdevice, unmountdevice and expandfs. Each
// test runs the op as the protocol layer does, with argv as kubelet passes it, on a fake node (test/fixtures/fake-node.ts)
// sharing an in-memory ledger with the controller, and checks the reply, the ledger and the fake kernel's state.
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { LatchError } from '../../src/errors.js';
import { ticketId } from '../../src/ledger/ids.js';
import { CommandError } from '../../src/sys/run.js';
import { WITHOUT_SYS_RESOURCE } from '../fixtures/fake-node.js';
import { Cluster, GiB, MiB, attachAndWait, pvOptions, stageVolume, steppingClock, succeeded } from '../fixtures/op-harness.js';

const idOf = (pv: string, node: string) => ticketId('workload', pv, 'latch/loop', node);
const PV1 = '{"kubernetes.io/fsType":"ext4","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw"}';

function setup(config: Record<string, unknown> = {}, clock?: () => number) {
  const cluster = new Cluster({ config, ...(clock && { clock }) });
  return { cluster, cp: cluster.node('cp'), nodeA: cluster.node('node-a'), nodeB: cluster.node('node-b') };
}

describe('waitforattach', () => {
  it('sets up the device of a granted volume (creating its storage at the ledger size), records it and replies it', async () => {
    const { cluster, cp, nodeA } = setup();
    succeeded(await cp.call('attach', [pvOptions('pv-1', { size: '2Gi' }), 'node-a']));
    const { reply, log } = await nodeA.call('waitforattach', ['', pvOptions('pv-1', { size: '2Gi' })]);
    assert.deepEqual(reply, { status: 'Success', device: '/dev/fake0' });
    assert.equal(log.device, '/dev/fake0');
    assert.deepEqual(nodeA.fake.volumes.get('pv-1'), { size: 2 * GiB });
    assert.equal(nodeA.fake.devices.get('/dev/fake0')?.volume, 'pv-1');
    const doc = await cluster.mustDoc('pv-1');
    assert.equal(doc.status.nodes['node-a']?.phase, 'attached');
    assert.equal(doc.status.nodes['node-a']?.device, '/dev/fake0');
    assert.deepEqual([doc.status.state, doc.status.currentNodes], ['attached', ['node-a']]);
  });

  it('is idempotent: a repeated call finds the same device and creates nothing again', async () => {
    const { cp, nodeA } = setup();
    const device = await attachAndWait(cp, nodeA, PV1);
    assert.deepEqual((await nodeA.call('waitforattach', [device, PV1])).reply, { status: 'Success', device });
    assert.equal(nodeA.fake.devices.size, 1);
    assert.equal(nodeA.fake.callsOf('create').length, 1);
  });

  it('refuses after the timeout with the reason, and sets nothing up', async () => {
    const { cp, nodeB } = setup({ waitForAttachTimeout: 1 }, steppingClock(1000));
    succeeded(await cp.call('attach', [PV1, 'node-a']));
    await cp.call('attach', [PV1, 'node-b']);
    const started = Date.now();
    const { reply } = await nodeB.call('waitforattach', ['', PV1]);
    assert.deepEqual(reply, {
      status: 'Failure',
      message: `volume pv-1 is not attached to node node-b after 1 s: attached to node node-a (ticket ${idOf('pv-1', 'node-a')})`,
    });
    assert.ok(Date.now() - started < 400, 'the injected clock ends the wait without sleeping');
    assert.deepEqual(
      nodeB.fake.calls.map((c) => c.method),
      [],
      'nothing touched on the node',
    );
  });

  it('says why when the node has no ticket or the volume does not exist', async () => {
    const { cp, nodeB } = setup({ waitForAttachTimeout: 1 }, steppingClock(1000));
    assert.match((await nodeB.call('waitforattach', ['', PV1])).reply.message ?? '', /after 1 s: the volume does not exist$/);
    succeeded(await cp.call('attach', [PV1, 'node-a']));
    assert.match((await nodeB.call('waitforattach', ['', PV1])).reply.message ?? '', /after 1 s: no ticket for this node$/);
  });

  it('waits for the grant and takes it as soon as the other node lets go', async () => {
    const { cluster, cp, nodeB } = setup({ waitForAttachTimeout: 5 });
    succeeded(await cp.call('attach', [PV1, 'node-a'])); // granted only: detach takes it away at once
    await cp.call('attach', [PV1, 'node-b']);
    const waiting = nodeB.call('waitforattach', ['', PV1]);
    await new Promise((r) => setTimeout(r, 50));
    succeeded(await cp.call('detach', ['pv-1', 'node-a']));
    assert.deepEqual((await waiting).reply, { status: 'Success', device: '/dev/fake0' });
    assert.equal((await cluster.mustDoc('pv-1')).status.nodes['node-b']?.phase, 'attached');
  });

  it('refuses to create an empty image for a volume that held a filesystem', async () => {
    const { cluster, cp, nodeA } = setup();
    const { globalPath } = await stageVolume(cp, nodeA, 'pv-1');
    succeeded(await nodeA.call('unmountdevice', [globalPath]));
    nodeA.fake.volumes.delete('pv-1'); // the image is lost (a wiped pool, another host's pool)

    const { reply } = await nodeA.call('waitforattach', ['', PV1]);
    assert.deepEqual(reply, {
      status: 'Failure',
      message:
        `the image of volume pv-1 is missing from the pool (${nodeA.config.poolDir}) although it held a ext4 filesystem; ` +
        'refusing to create an empty one in its place',
    });
    assert.equal(nodeA.fake.volumes.size, 0);
    assert.equal(nodeA.fake.callsOf('create').length, 1, 'only the first life created storage');
    assert.equal((await cluster.mustDoc('pv-1')).status.nodes['node-a']?.device, undefined);
  });

  it('undoes the device when the grant was withdrawn while it was being set up', async () => {
    const { cluster, cp, nodeA } = setup();
    succeeded(await cp.call('attach', [PV1, 'node-a']));
    let detached: unknown;
    // The controller force-detaches just while losetup runs.
    nodeA.fake.intercept(
      'attach',
      async () => {
        detached = (await cp.call('detach', ['pv-1', 'node-a'])).reply;
      },
      1,
    );
    const { reply } = await nodeA.call('waitforattach', ['', PV1]);
    assert.deepEqual(detached, { status: 'Success', message: 'volume pv-1 stays fenced to node node-a until it releases the device' });
    assert.deepEqual(reply, { status: 'Failure', message: 'volume pv-1 was detached from node node-a while its device was being set up' });
    assert.equal(nodeA.fake.devices.size, 0, 'the device is released');
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(doc.status.nodes, {}, 'and the release confirmed');
    assert.equal(doc.status.state, 'detached');
  });

  it('leaves no hold behind when it fails before any device exists, so that detach frees the volume', async () => {
    const { cluster, cp, nodeA } = setup();
    succeeded(await cp.call('attach', [PV1, 'node-a']));
    nodeA.fake.poolFreeBytes = MiB; // the pool is full: no storage can be made
    const { reply } = await nodeA.call('waitforattach', ['', PV1]);
    assert.equal(reply.status, 'Failure');
    assert.match(reply.message ?? '', /not enough space in the pool/);
    assert.equal(nodeA.fake.devices.size, 0);
    // The pod is deleted; kubelet has nothing mounted, so it sends no unmountdevice; the controller detaches.
    assert.deepEqual((await cp.call('detach', ['pv-1', 'node-a'])).reply, { status: 'Success' });
    assert.deepEqual((await cluster.mustDoc('pv-1')).status.nodes, {});
    succeeded(await cp.call('attach', [PV1, 'node-b']));
  });

  it('answers Not supported in non-attach mode', async () => {
    const { reply } = await new Cluster({ config: { attach: false } }).node('node-a').call('waitforattach', ['', PV1]);
    assert.equal(reply.status, 'Not supported');
  });
});

describe('mountdevice', () => {
  it('refuses a volume that is not attached to the node, and mounts nothing', async () => {
    const { cp, nodeA } = setup();
    const path = nodeA.globalPath('pv-1');
    assert.deepEqual((await nodeA.call('mountdevice', [path, '/dev/fake0', PV1])).reply, {
      status: 'Failure',
      message: 'volume pv-1 is not attached to node node-a (unknown volume); waitforattach comes first',
    });
    succeeded(await cp.call('attach', [PV1, 'node-a'])); // granted, but waitforattach has not run
    assert.deepEqual((await nodeA.call('mountdevice', [path, '/dev/fake0', PV1])).reply, {
      status: 'Failure',
      message: 'volume pv-1 is not attached to node node-a (attaching); waitforattach comes first',
    });
    assert.equal(nodeA.fake.topAt(path), undefined);
    assert.deepEqual(nodeA.fake.callsOf('makeFs'), []);
  });

  it("refuses a device path that is another volume's, or not a latch volume", async () => {
    const { cp, nodeA } = setup();
    const device1 = await attachAndWait(cp, nodeA, PV1);
    const device2 = await attachAndWait(cp, nodeA, pvOptions('pv-2'));
    const path = nodeA.globalPath('pv-1');
    assert.deepEqual((await nodeA.call('mountdevice', [path, device2, PV1])).reply, {
      status: 'Failure',
      message: `device ${device2} is not the device of volume pv-1 (${device1}): it belongs to volume pv-2`,
    });
    assert.deepEqual((await nodeA.call('mountdevice', [path, '/dev/sdb', PV1])).reply, {
      status: 'Failure',
      message: `device /dev/sdb is not the device of volume pv-1 (${device1}): it is not a latch volume`,
    });
    assert.equal(nodeA.fake.topAt(path), undefined);
    assert.deepEqual(nodeA.fake.callsOf('makeFs'), []);
  });

  it('formats a blank device with the fsType asked for, mounts it, records the filesystem; a repeat changes nothing', async () => {
    const { cluster, cp, nodeA } = setup();
    const json = pvOptions('pv-1', { mountOptions: 'noatime' }, { fsType: 'xfs' });
    const device = await attachAndWait(cp, nodeA, json);
    const path = nodeA.globalPath('pv-1');
    assert.deepEqual((await nodeA.call('mountdevice', [path, device, json])).reply, { status: 'Success' });
    assert.deepEqual(nodeA.fake.callsOf('makeFs'), [[device, 'xfs']]);
    const top = nodeA.fake.topAt(path);
    assert.deepEqual([top?.source, top?.fsType, top?.options], [device, 'xfs', ['rw', 'noatime']]);
    assert.equal((await cluster.mustDoc('pv-1')).status.filesystem, 'xfs');

    assert.deepEqual((await nodeA.call('mountdevice', [path, device, json])).reply, { status: 'Success' });
    assert.equal(nodeA.fake.callsOf('mount').length, 1);
    assert.equal(nodeA.fake.callsOf('makeFs').length, 1);
    assert.equal(nodeA.fake.mountsOf(device).length, 1);
  });

  it('formats a blank device once when two mountdevice calls race (one probe decides, under the volume lock)', async () => {
    const { cluster, cp, nodeA } = setup();
    const device = await attachAndWait(cp, nodeA, PV1);
    const paths = [nodeA.globalPath('pv-1'), `${nodeA.globalPath('pv-1')}-again`];
    // Each mkfs takes a while, so that unlocked calls would both find the device blank before either has formatted.
    nodeA.fake.intercept('makeFs', async () => {
      await new Promise((resolve) => setTimeout(resolve, 20));
    });
    const replies = await Promise.all(paths.map(async (path) => (await nodeA.call('mountdevice', [path, device, PV1])).reply));
    assert.deepEqual(replies, [{ status: 'Success' }, { status: 'Success' }]);
    assert.deepEqual(nodeA.fake.callsOf('makeFs'), [[device, 'ext4']]);
    assert.deepEqual(
      paths.map((path) => nodeA.fake.topAt(path)?.source),
      [device, device],
    );
    assert.equal((await cluster.mustDoc('pv-1')).status.filesystem, 'ext4');
  });

  it('uses the filesystem a device already holds and never formats it', async () => {
    const { cluster, cp, nodeA } = setup();
    nodeA.fake.addVolume('pv-1', GiB, 'btrfs'); // made before latch managed it
    const json = pvOptions('pv-1', {}, { fsType: '' }); // after a kubelet restart: no fsType
    const device = await attachAndWait(cp, nodeA, json);
    succeeded(await nodeA.call('mountdevice', [nodeA.globalPath('pv-1'), device, json]));
    assert.deepEqual(nodeA.fake.callsOf('makeFs'), []);
    assert.equal(nodeA.fake.topAt(nodeA.globalPath('pv-1'))?.fsType, 'btrfs');
    assert.equal((await cluster.mustDoc('pv-1')).status.filesystem, 'btrfs');
  });

  it('never formats a device of a volume that held a filesystem, even when it shows none now', async () => {
    const { cp, nodeA } = setup();
    const { device, globalPath, json } = await stageVolume(cp, nodeA, 'pv-1');
    succeeded(await nodeA.call('unmountdevice', [globalPath]));
    nodeA.fake.volumes.set('pv-1', { size: GiB }); // the signature is gone (overwritten by hand)
    const again = await attachAndWait(cp, nodeA, json);
    assert.equal(again, device);
    assert.deepEqual((await nodeA.call('mountdevice', [globalPath, device, json])).reply, {
      status: 'Failure',
      message:
        'volume pv-1 held a ext4 filesystem but its device shows none now; refusing to format it (inspect the image before anything else)',
    });
    assert.equal(nodeA.fake.callsOf('makeFs').length, 1, 'only the first, blank, life was formatted');
    assert.equal(nodeA.fake.topAt(globalPath), undefined);
  });

  it('refuses an fsType other than the one on the device, and mounts nothing', async () => {
    const { cp, nodeA } = setup();
    nodeA.fake.addVolume('pv-1', GiB, 'xfs');
    const device = await attachAndWait(cp, nodeA, PV1);
    const path = nodeA.globalPath('pv-1');
    assert.deepEqual((await nodeA.call('mountdevice', [path, device, PV1])).reply, {
      status: 'Failure',
      message: 'volume pv-1 holds a xfs filesystem, but ext4 was asked for; latch never reformats a volume',
    });
    assert.deepEqual(nodeA.fake.callsOf('makeFs'), []);
    assert.deepEqual(nodeA.fake.callsOf('mount'), []);
  });

  it('mounts read-only when the options ask for it, and when the node holds the volume read-only', async () => {
    const { cp, nodeA } = setup();
    nodeA.fake.addVolume('pv-1', GiB, 'ext4');
    nodeA.fake.addVolume('pv-2', GiB, 'ext4');
    // pv-1: attached read-write, mounted with a read-only request.
    const device1 = await attachAndWait(cp, nodeA, PV1);
    const ro1 = pvOptions('pv-1', {}, { readwrite: 'ro' });
    succeeded(await nodeA.call('mountdevice', [nodeA.globalPath('pv-1'), device1, ro1]));
    assert.equal(nodeA.fake.topAt(nodeA.globalPath('pv-1'))?.options[0], 'ro');
    // pv-2: the node holds it read-only; a read-write mount request still gets a read-only mount.
    const device2 = await attachAndWait(cp, nodeA, pvOptions('pv-2', {}, { readwrite: 'ro' }));
    succeeded(await nodeA.call('mountdevice', [nodeA.globalPath('pv-2'), device2, pvOptions('pv-2')]));
    assert.equal(nodeA.fake.topAt(nodeA.globalPath('pv-2'))?.options[0], 'ro');
    assert.deepEqual(
      nodeA.fake.callsOf('mount').map(([, , options]) => (options as { readOnly: boolean }).readOnly),
      [true, true],
    );
  });

  it('refuses to format a blank device for a read-only request', async () => {
    const { cp, nodeA } = setup();
    const ro = pvOptions('pv-1', {}, { readwrite: 'ro' });
    const device = await attachAndWait(cp, nodeA, ro);
    const { reply } = await nodeA.call('mountdevice', [nodeA.globalPath('pv-1'), device, ro]);
    assert.equal(reply.status, 'Failure');
    assert.match(reply.message ?? '', /volume pv-1 is blank and was asked for read-only/);
    assert.deepEqual(nodeA.fake.callsOf('makeFs'), []);
  });

  it('undoes a mount that the mount table does not confirm', async () => {
    const { cp, nodeA } = setup();
    const device = await attachAndWait(cp, nodeA, PV1);
    const path = nodeA.globalPath('pv-1');
    // Once something is mounted at the path, the table shows another device there.
    nodeA.fake.intercept('mountsAt', (p) => {
      const top = nodeA.fake.topAt(p);
      return top ? { result: [{ ...top, source: '/dev/sdz' }] } : undefined;
    });
    assert.deepEqual((await nodeA.call('mountdevice', [path, device, PV1])).reply, {
      status: 'Failure',
      message: `after mounting, the mount table shows /dev/sdz at ${path} instead of ${device}; undone`,
    });
    assert.equal(nodeA.fake.topAt(path), undefined);
    assert.deepEqual(nodeA.fake.callsOf('umount'), [[path]]);
  });

  it('reports a failed mount, and leaves nothing mounted', async () => {
    const { cp, nodeA } = setup();
    const device = await attachAndWait(cp, nodeA, PV1);
    const path = nodeA.globalPath('pv-1');
    nodeA.fake.failNext('mount', new LatchError('mount: /dev/fake0: can not read superblock'));
    assert.deepEqual((await nodeA.call('mountdevice', [path, device, PV1])).reply, {
      status: 'Failure',
      message: 'mount: /dev/fake0: can not read superblock',
    });
    assert.equal(nodeA.fake.topAt(path), undefined);
  });

  it('refuses to mount over something already mounted at the path', async () => {
    const { cp, nodeA } = setup();
    const device = await attachAndWait(cp, nodeA, PV1);
    const path = nodeA.globalPath('pv-1');
    nodeA.fake.mountForeign('/dev/sdb', path);
    assert.deepEqual((await nodeA.call('mountdevice', [path, device, PV1])).reply, {
      status: 'Failure',
      message: `${path} already has /dev/sdb mounted; not mounting volume pv-1 over it`,
    });
    assert.deepEqual(nodeA.fake.callsOf('mount'), []);
  });
});

describe('unmountdevice', () => {
  it('is Success on a path with nothing of ours, and touches nothing', async () => {
    const { cluster, nodeA } = setup();
    const notAName = join(nodeA.kubeletRoot, 'Not_A_PV');
    mkdirSync(notAName, { recursive: true });
    assert.deepEqual((await nodeA.call('unmountdevice', [notAName])).reply, { status: 'Success' });
    assert.deepEqual((await nodeA.call('unmountdevice', [nodeA.globalPath('pv-unknown')])).reply, { status: 'Success' });
    assert.deepEqual(nodeA.fake.callsOf('release'), []);
    assert.deepEqual(nodeA.fake.callsOf('umount'), []);
    assert.deepEqual(cluster.store.writes, []);
  });

  it('refuses to touch a mount that is not a latch volume', async () => {
    const { nodeA } = setup();
    const path = nodeA.globalPath('pv-1');
    nodeA.fake.mountForeign('/dev/sdb', path);
    assert.deepEqual((await nodeA.call('unmountdevice', [path])).reply, {
      status: 'Failure',
      message: `${path} has /dev/sdb mounted, which is not a latch volume; not touching it`,
    });
    assert.equal(nodeA.fake.topAt(path)?.source, '/dev/sdb');
  });

  it('unmounts, releases the device and confirms the release; detach then frees the volume', async () => {
    const { cluster, cp, nodeA } = setup();
    const { globalPath } = await stageVolume(cp, nodeA, 'pv-1');
    assert.deepEqual((await nodeA.call('unmountdevice', [globalPath])).reply, { status: 'Success' });
    assert.equal(nodeA.fake.topAt(globalPath), undefined);
    assert.equal(nodeA.fake.devices.size, 0);
    let doc = await cluster.mustDoc('pv-1');
    // The ticket still wants the volume here (detach comes later): granted again, without a device.
    assert.equal(doc.status.nodes['node-a']?.phase, 'granted');
    assert.equal(doc.status.nodes['node-a']?.device, undefined);
    assert.equal(doc.status.filesystem, 'ext4');
    assert.deepEqual((await cp.call('detach', ['pv-1', 'node-a'])).reply, { status: 'Success' });
    doc = await cluster.mustDoc('pv-1');
    assert.deepEqual([doc.status.state, doc.status.nodes], ['detached', {}]);
  });

  it('frees a loop device with its last unmount: one umount -d, and the release finds nothing left', async () => {
    const cluster = new Cluster({ freedByUnmount: true });
    const [cp, nodeA] = [cluster.node('cp'), cluster.node('node-a')];
    const { globalPath } = await stageVolume(cp, nodeA, 'pv-1');
    assert.deepEqual((await nodeA.call('unmountdevice', [globalPath])).reply, { status: 'Success' });
    assert.deepEqual(nodeA.fake.callsOf('umount'), [[globalPath, { freeLoopDevice: true }]]);
    assert.equal(nodeA.fake.devices.size, 0);
    assert.equal((await cluster.mustDoc('pv-1')).status.nodes['node-a']?.phase, 'granted');
  });

  it('does not free a loop device that is still mounted elsewhere, nor a device of another kind', async () => {
    const loop = new Cluster({ freedByUnmount: true });
    const [cp, nodeA] = [loop.node('cp'), loop.node('node-a')];
    const { device, globalPath } = await stageVolume(cp, nodeA, 'pv-1');
    await nodeA.fake.system.bindMount(globalPath, nodeA.podDir('uid-1', 'pv-1'), false);
    succeeded(await nodeA.call('unmountdevice', [globalPath]));
    assert.deepEqual(nodeA.fake.callsOf('umount'), [[globalPath, { freeLoopDevice: false }]]);
    assert.equal(nodeA.fake.devices.get(device)?.volume, 'pv-1');
    assert.equal((await loop.mustDoc('pv-1')).status.nodes['node-a']?.phase, 'attached');

    const other = setup();
    const staged = await stageVolume(other.cp, other.nodeA, 'pv-1');
    succeeded(await other.nodeA.call('unmountdevice', [staged.globalPath]));
    assert.deepEqual(other.nodeA.fake.callsOf('umount'), [[staged.globalPath, { freeLoopDevice: false }]]);
    assert.deepEqual(other.nodeA.fake.callsOf('release'), [['pv-1']]);
    assert.equal(other.nodeA.fake.devices.size, 0);
  });

  it('after a force-detach, confirming the release hands the volume to the waiting node', async () => {
    const { cluster, cp, nodeA } = setup();
    const { globalPath } = await stageVolume(cp, nodeA, 'pv-1');
    await cp.call('attach', [PV1, 'node-b']);
    succeeded(await cp.call('detach', ['pv-1', 'node-a'])); // the 6-minute force-detach
    assert.equal((await cluster.mustDoc('pv-1')).status.nodes['node-a']?.phase, 'detaching');
    succeeded(await nodeA.call('unmountdevice', [globalPath]));
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(Object.keys(doc.status.nodes), ['node-b']);
    assert.equal(doc.status.tickets[idOf('pv-1', 'node-b')]?.satisfied, true);
  });

  it('keeps the device and the hold while the device is still mounted elsewhere', async () => {
    const { cluster, cp, nodeA } = setup();
    const { device, globalPath } = await stageVolume(cp, nodeA, 'pv-1');
    const podDir = nodeA.podDir('uid-1', 'pv-1');
    await nodeA.fake.system.bindMount(globalPath, podDir, false); // kubelet's own bind mount, not yet removed
    assert.deepEqual((await nodeA.call('unmountdevice', [globalPath])).reply, {
      status: 'Success',
      message: `${globalPath} unmounted; ${device} is still mounted elsewhere, so it stays attached`,
    });
    assert.equal(nodeA.fake.topAt(globalPath), undefined);
    assert.equal(nodeA.fake.devices.get(device)?.volume, 'pv-1');
    assert.deepEqual(nodeA.fake.callsOf('release'), []);
    assert.equal((await cluster.mustDoc('pv-1')).status.nodes['node-a']?.phase, 'attached');
  });

  it('finishes a release a crashed call left: nothing mounted, the device still set up', async () => {
    const { cluster, cp, nodeA } = setup();
    const { globalPath } = await stageVolume(cp, nodeA, 'pv-1', { volume: 'data' });
    await nodeA.fake.system.umount(globalPath); // the previous unmountdevice died right after umount
    assert.deepEqual((await nodeA.call('unmountdevice', [globalPath])).reply, { status: 'Success' });
    assert.equal(nodeA.fake.devices.size, 0);
    assert.equal((await cluster.mustDoc('data')).status.nodes['node-a']?.phase, 'granted');
  });

  it('finishes a release a crashed call left: the device gone, the release not confirmed', async () => {
    const { cluster, cp, nodeA } = setup();
    const { globalPath } = await stageVolume(cp, nodeA, 'pv-1');
    succeeded(await cp.call('detach', ['pv-1', 'node-a']));
    await nodeA.fake.system.umount(globalPath);
    await nodeA.fake.backend.release('pv-1'); // ... and died before confirming
    assert.deepEqual((await nodeA.call('unmountdevice', [globalPath])).reply, { status: 'Success' });
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual([doc.status.state, doc.status.nodes], ['detached', {}]);
  });

  it('answers Not supported in non-attach mode', async () => {
    const { reply } = await new Cluster({ config: { attach: false } }).node('node-a').call('unmountdevice', ['/tmp/x/pv-1']);
    assert.equal(reply.status, 'Not supported');
  });
});

describe('expandfs (attach mode)', () => {
  /** A volume staged on node-a, with kubelet's bind mount into the pod dir: what expandfs finds in a running pod. */
  async function running(user: Record<string, string> = {}, keys: { fsType?: string } = {}) {
    const env = setup();
    const staged = await stageVolume(env.cp, env.nodeA, 'pv-1', user, keys);
    const podDir = env.nodeA.podDir('uid-1', 'pv-1');
    await env.nodeA.fake.system.bindMount(staged.globalPath, podDir, false);
    const expand = (newBytes: number, oldBytes = GiB) =>
      env.nodeA.call('expandfs', [staged.json, staged.device, podDir, String(newBytes), String(oldBytes)]);
    return { ...env, ...staged, podDir, expand };
  }

  it('grows the storage and the device, records the size and grows the filesystem online', async () => {
    const { cluster, nodeA, device, podDir, expand } = await running();
    const { reply, log } = await expand(2 * GiB);
    assert.deepEqual(reply, {
      status: 'Success',
      message: `volume pv-1 is 2Gi; its ext4 filesystem fills it (grown online at ${podDir})`,
    });
    assert.equal(log.mountPoint, podDir);
    assert.deepEqual(nodeA.fake.volumes.get('pv-1'), { size: 2 * GiB, fsType: 'ext4', fsBytes: 2 * GiB });
    assert.equal(nodeA.fake.devices.get(device)?.capacity, 2 * GiB);
    assert.deepEqual(nodeA.fake.callsOf('growFs'), [[device, podDir, 'ext4']]);
    assert.equal((await cluster.mustDoc('pv-1')).spec.sizeBytes, 2 * GiB);
  });

  it('is idempotent: the same size again is Success and records nothing new', async () => {
    const { cluster, nodeA, expand } = await running();
    succeeded(await expand(2 * GiB));
    const writes = cluster.store.writes.length;
    succeeded(await expand(2 * GiB, 2 * GiB));
    assert.equal(cluster.store.writes.length, writes);
    assert.deepEqual(nodeA.fake.volumes.get('pv-1'), { size: 2 * GiB, fsType: 'ext4', fsBytes: 2 * GiB });
  });

  it('refuses to shrink, and to pass maxSize, changing nothing', async () => {
    const { cluster, nodeA, expand } = await running();
    assert.deepEqual((await expand(512 * MiB)).reply, {
      status: 'Failure',
      message: 'volume pv-1: cannot shrink from 1Gi to 512Mi; volumes only grow (nothing was changed)',
    });
    assert.deepEqual((await expand(11 * GiB)).reply, {
      status: 'Failure',
      message: 'volume pv-1: the new size 11Gi is above the limit of 10Gi (maxSize); nothing was changed',
    });
    assert.equal(nodeA.fake.volumes.get('pv-1')?.size, GiB);
    assert.equal((await cluster.mustDoc('pv-1')).spec.sizeBytes, GiB);
    assert.deepEqual(nodeA.fake.callsOf('grow'), []);
    assert.deepEqual(nodeA.fake.callsOf('growFs'), []);
  });

  it('refuses beyond the pool free space before recording the size', async () => {
    const { cluster, nodeA, expand } = await running();
    nodeA.fake.poolFreeBytes = 100 * MiB;
    const { reply } = await expand(2 * GiB);
    assert.equal(reply.status, 'Failure');
    assert.match(reply.message ?? '', /not enough space in the pool/);
    assert.equal((await cluster.mustDoc('pv-1')).spec.sizeBytes, GiB);
    assert.deepEqual(nodeA.fake.callsOf('growFs'), []);
  });

  it('refuses a volume that does not exist, has no storage here, or is not attached to the node', async () => {
    const { cp, nodeA } = setup();
    const podDir = nodeA.podDir('uid-1', 'pv-1');
    const expand = () => nodeA.call('expandfs', [PV1, '/dev/fake0', podDir, String(2 * GiB), String(GiB)]);
    assert.deepEqual((await expand()).reply, { status: 'Failure', message: 'volume pv-1 does not exist; there is nothing to expand' });
    succeeded(await cp.call('attach', [PV1, 'node-a']));
    assert.deepEqual((await expand()).reply, {
      status: 'Failure',
      message: `volume pv-1 has no image in the pool (${nodeA.config.poolDir}); there is nothing to expand`,
    });
    nodeA.fake.addVolume('pv-1', GiB, 'ext4'); // storage here, but the node never took the grant up
    assert.deepEqual((await expand()).reply, {
      status: 'Failure',
      message: 'volume pv-1 is not attached to node node-a (attaching); expandfs grows a volume on the node that has it mounted',
    });
    assert.equal(nodeA.fake.volumes.get('pv-1')?.size, GiB);
  });

  it('refuses a volume the node holds read-only', async () => {
    const { cp, nodeA } = setup();
    nodeA.fake.addVolume('pv-1', GiB, 'ext4');
    const { device, json } = await stageVolume(cp, nodeA, 'pv-1', {}, { readwrite: 'ro' });
    const { reply } = await nodeA.call('expandfs', [json, device, nodeA.podDir('uid-1', 'pv-1'), String(2 * GiB), String(GiB)]);
    assert.deepEqual(reply, {
      status: 'Failure',
      message: 'volume pv-1 is attached read-only on node node-a; a read-only filesystem cannot grow',
    });
    assert.equal(nodeA.fake.volumes.get('pv-1')?.size, GiB);
  });

  it('refuses a filesystem that is not mounted read-write on the node (mounted read-only, or not at all)', async () => {
    const { cp, nodeA } = setup();
    nodeA.fake.addVolume('pv-1', GiB, 'ext4');
    nodeA.fake.addVolume('pv-2', GiB, 'ext4');
    // pv-1: the node holds it read-write, but it is mounted read-only.
    const device1 = await attachAndWait(cp, nodeA, PV1);
    succeeded(await nodeA.call('mountdevice', [nodeA.globalPath('pv-1'), device1, pvOptions('pv-1', {}, { readwrite: 'ro' })]));
    // pv-2: set up, never mounted.
    const device2 = await attachAndWait(cp, nodeA, pvOptions('pv-2'));
    for (const [pv, device] of [
      ['pv-1', device1],
      ['pv-2', device2],
    ] as const) {
      const { reply } = await nodeA.call('expandfs', [pvOptions(pv), device, nodeA.podDir('uid-1', pv), String(2 * GiB), String(GiB)]);
      assert.deepEqual(reply, {
        status: 'Failure',
        message: `the filesystem of volume ${pv} is not mounted read-write on node node-a; latch grows filesystems online only (nothing was changed)`,
      });
      assert.equal(nodeA.fake.volumes.get(pv)?.size, GiB);
    }
  });

  it('refuses, changing nothing, to grow ext4 without CAP_SYS_RESOURCE; xfs needs no capability', async () => {
    const ext4 = await running();
    ext4.nodeA.fake.capabilities = WITHOUT_SYS_RESOURCE;
    const { reply } = await ext4.expand(2 * GiB);
    assert.equal(reply.status, 'Failure');
    assert.match(reply.message ?? '', /^growing the ext4 filesystem of volume pv-1 online needs the capability CAP_SYS_RESOURCE/);
    assert.match(reply.message ?? '', /; nothing was changed$/);
    assert.equal(ext4.nodeA.fake.volumes.get('pv-1')?.size, GiB);
    assert.equal((await ext4.cluster.mustDoc('pv-1')).spec.sizeBytes, GiB);
    assert.deepEqual(ext4.nodeA.fake.callsOf('grow'), []);

    const xfs = await running({}, { fsType: 'xfs' });
    xfs.nodeA.fake.capabilities = WITHOUT_SYS_RESOURCE;
    succeeded(await xfs.expand(2 * GiB));
    assert.equal(xfs.nodeA.fake.volumes.get('pv-1')?.fsBytes, 2 * GiB);
  });

  it('says how to finish when the kernel refuses the grow itself; the repeated call finishes it', async () => {
    const { cluster, nodeA, expand } = await running();
    nodeA.fake.capabilities = undefined; // CapEff unreadable: only the grow itself can tell
    nodeA.fake.intercept(
      'growFs',
      () => {
        throw new CommandError('resize2fs exited with code 1', {
          command: 'resize2fs',
          args: ['/dev/fake0'],
          exitCode: 1,
          stderrTail: 'resize2fs: Permission denied to resize filesystem',
          timedOut: false,
          durationMs: 3,
        });
      },
      1,
    );
    const { reply } = await expand(2 * GiB);
    assert.equal(reply.status, 'Failure');
    assert.match(reply.message ?? '', /needs the capability CAP_SYS_RESOURCE/);
    assert.match(
      reply.message ?? '',
      /The image and the device already have the new size; repeating the call with the capability finishes/,
    );
    assert.deepEqual(nodeA.fake.volumes.get('pv-1'), { size: 2 * GiB, fsType: 'ext4', fsBytes: GiB });
    assert.equal((await cluster.mustDoc('pv-1')).spec.sizeBytes, 2 * GiB);

    succeeded(await expand(2 * GiB));
    assert.equal(nodeA.fake.volumes.get('pv-1')?.fsBytes, 2 * GiB);
  });
});
