// The decisions of non-attach mode (config attach: false), where kubelet calls only mount, unmount and expandfs on the
// node and each of them does the whole job: one workload ticket per pod, a node-private staging mount every pod shares,
// a bind mount into the pod dir. Run as the protocol layer does, on fake nodes sharing an in-memory ledger.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { describe, it } from 'node:test';
import { LatchError } from '../../src/errors.js';
import { podTicketId, ticketId } from '../../src/ledger/ids.js';
import { stagingPath } from '../../src/node/staging.js';
import { Cluster, GiB, podOptions, succeeded, type TestNode } from '../fixtures/op-harness.js';

const podTicket = (pv: string, node: string, uid: string) => podTicketId(pv, 'latch/loop', node, uid);

function setup(config: Record<string, unknown> = {}) {
  const cluster = new Cluster({ config: { attach: false, ...config } });
  return { cluster, nodeA: cluster.node('node-a'), nodeB: cluster.node('node-b') };
}

/** kubelet's mount for the pod `uid` on `node`: the pod dir and its options. */
async function mountPod(node: TestNode, uid: string, pv = 'pv-1', keys: { readwrite?: 'ro' | 'rw'; fsType?: string } = {}, user = {}) {
  const podDir = node.podDir(uid, pv);
  const result = await node.call('mount', [podDir, podOptions(pv, { uid, ...keys }, user)]);
  return { podDir, ...result };
}

describe('mount (non-attach mode)', () => {
  it('is Not supported in attach mode, and so is unmount', async () => {
    const cluster = new Cluster();
    const node = cluster.node('node-a');
    const podDir = node.podDir('uid-1', 'pv-1');
    assert.deepEqual((await node.call('mount', [podDir, podOptions('pv-1', { uid: 'uid-1' })])).reply, {
      status: 'Not supported',
      message: 'in attach mode kubelet bind-mounts the device mount itself',
    });
    assert.deepEqual((await node.call('unmount', [podDir])).reply, {
      status: 'Not supported',
      message: 'in attach mode kubelet removes its own bind mount',
    });
    assert.deepEqual(cluster.store.writes, []);
    assert.deepEqual(node.fake.calls, []);
  });

  it("takes the pod's ticket, sets up the device, formats it once, mounts it at the staging path and binds it into the pod dir", async () => {
    const { cluster, nodeA } = setup();
    const podDir = nodeA.podDir('uid-1', 'pv-1');
    const json =
      '{"kubernetes.io/fsType":"ext4","kubernetes.io/pod.name":"web-0","kubernetes.io/pod.namespace":"shop",' +
      '"kubernetes.io/pod.uid":"uid-1","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw",' +
      '"kubernetes.io/serviceAccount.name":"default"}';
    const { reply, log } = await nodeA.call('mount', [podDir, json]);
    assert.deepEqual(reply, { status: 'Success' });

    const staging = stagingPath(nodeA.config, 'pv-1');
    assert.equal(log.staging, staging);
    const device = '/dev/fake0';
    assert.deepEqual(nodeA.fake.callsOf('makeFs'), [[device, 'ext4']]);
    const staged = nodeA.fake.topAt(staging);
    const bound = nodeA.fake.topAt(podDir);
    assert.deepEqual([staged?.source, staged?.fsType, staged?.options[0]], [device, 'ext4', 'rw']);
    assert.deepEqual([bound?.source, bound?.root, bound?.options[0]], [device, '/', 'rw']);

    const doc = await cluster.mustDoc('pv-1');
    const id = podTicket('pv-1', 'node-a', 'uid-1');
    assert.deepEqual(Object.keys(doc.spec.tickets), [id]);
    assert.deepEqual(doc.spec.tickets[id]?.requestedBy, {
      pvName: 'pv-1',
      pod: { name: 'web-0', namespace: 'shop', uid: 'uid-1', serviceAccount: 'default' },
    });
    assert.notEqual(id, ticketId('workload', 'pv-1', 'latch/loop', 'node-a'), "never attach mode's node ticket");
    assert.deepEqual(doc.status.nodes['node-a'], { ...doc.status.nodes['node-a'], phase: 'attached', device, readOnly: false });
    assert.equal(doc.status.filesystem, 'ext4');
  });

  it('gives each pod its own ticket and shares one device and one staging mount between them', async () => {
    const { cluster, nodeA } = setup();
    succeeded(await mountPod(nodeA, 'uid-1'));
    succeeded(await mountPod(nodeA, 'uid-2'));
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(
      Object.keys(doc.spec.tickets).sort(),
      [podTicket('pv-1', 'node-a', 'uid-1'), podTicket('pv-1', 'node-a', 'uid-2')].sort(),
    );
    assert.equal(nodeA.fake.devices.size, 1);
    assert.equal(nodeA.fake.callsOf('mount').length, 1, 'one staging mount');
    assert.equal(nodeA.fake.callsOf('bindMount').length, 2);
    assert.equal(nodeA.fake.callsOf('makeFs').length, 1);
  });

  it('is idempotent for one pod: a repeated mount keeps its one ticket and binds nothing again', async () => {
    const { cluster, nodeA } = setup();
    succeeded(await mountPod(nodeA, 'uid-1'));
    const before = await cluster.mustDoc('pv-1');
    succeeded(await mountPod(nodeA, 'uid-1'));
    assert.deepEqual(await cluster.mustDoc('pv-1'), before);
    assert.equal(nodeA.fake.callsOf('bindMount').length, 1);
  });

  it('refuses another node while one holds the volume read-write, and leaves the ledger as it was', async () => {
    const { cluster, nodeA, nodeB } = setup();
    succeeded(await mountPod(nodeA, 'uid-1'));
    const before = await cluster.mustDoc('pv-1');
    const writes = cluster.store.writes.length;
    const { reply, podDir } = await mountPod(nodeB, 'uid-2');
    assert.deepEqual(reply, {
      status: 'Failure',
      message: `volume pv-1 cannot be mounted on node node-b: attached to node node-a (ticket ${podTicket('pv-1', 'node-a', 'uid-1')})`,
    });
    assert.deepEqual(await cluster.mustDoc('pv-1'), before);
    assert.equal(cluster.store.writes.length, writes, 'not even a waiting ticket was written');
    assert.equal(nodeB.fake.topAt(podDir), undefined);
    assert.equal(nodeB.fake.devices.size, 0);
  });

  it('lets read-only pods on two nodes share the volume, each mounted read-only', async () => {
    const { nodeA, nodeB } = setup();
    nodeA.fake.addVolume('pv-1', GiB, 'ext4'); // in the pool the nodes share
    const a = await mountPod(nodeA, 'uid-1', 'pv-1', { readwrite: 'ro' });
    const b = await mountPod(nodeB, 'uid-2', 'pv-1', { readwrite: 'ro' });
    succeeded(a);
    succeeded(b);
    assert.equal(nodeA.fake.topAt(a.podDir)?.options[0], 'ro');
    assert.equal(nodeB.fake.topAt(b.podDir)?.options[0], 'ro');
    assert.equal(nodeA.fake.topAt(stagingPath(nodeA.config, 'pv-1'))?.options[0], 'ro');
  });

  it('binds read-only for a read-only pod while the staging mount of a read-write holder stays read-write', async () => {
    const { nodeA } = setup();
    succeeded(await mountPod(nodeA, 'uid-1'));
    const ro = await mountPod(nodeA, 'uid-2', 'pv-1', { readwrite: 'ro' });
    succeeded(ro);
    assert.equal(nodeA.fake.topAt(ro.podDir)?.options[0], 'ro');
    assert.equal(nodeA.fake.topAt(stagingPath(nodeA.config, 'pv-1'))?.options[0], 'rw');
  });

  it('refuses a repeated mount whose ticket is no longer granted without leaving a waiting ticket behind', async () => {
    const { cluster, nodeA, nodeB } = setup();
    const first = await mountPod(nodeA, 'uid-1');
    succeeded(first);
    await cluster.ledger.releaseDeadNode('pv-1', 'node-a'); // an admin fences node-a, which was not down after all
    const other = await mountPod(nodeB, 'uid-2');
    succeeded(other);
    const before = await cluster.mustDoc('pv-1');
    const { reply } = await nodeA.call('mount', [first.podDir, podOptions('pv-1', { uid: 'uid-1' })]);
    assert.equal(reply.status, 'Failure');
    assert.deepEqual(await cluster.mustDoc('pv-1'), before);
    // Otherwise: once node-b lets go, the leftover ticket grants the volume to node-a, whose pod holds a stale mount.
    succeeded(await nodeB.call('unmount', [other.podDir]));
    assert.deepEqual((await cluster.mustDoc('pv-1')).status.nodes, {});
  });

  it('refuses an fsType other than the one staged, leaving the ledger as it was', async () => {
    const { cluster, nodeA } = setup();
    succeeded(await mountPod(nodeA, 'uid-1'));
    const before = await cluster.mustDoc('pv-1');
    const { reply } = await mountPod(nodeA, 'uid-2', 'pv-1', { fsType: 'xfs' });
    assert.deepEqual(reply, {
      status: 'Failure',
      message: 'volume pv-1 holds a ext4 filesystem, but xfs was asked for; latch never reformats a volume',
    });
    assert.deepEqual(await cluster.mustDoc('pv-1'), before);
  });

  it('refuses to format a blank volume for a read-only pod, and undoes its ticket and device', async () => {
    const { cluster, nodeA } = setup();
    const { reply, podDir } = await mountPod(nodeA, 'uid-1', 'pv-1', { readwrite: 'ro' });
    assert.equal(reply.status, 'Failure');
    assert.match(reply.message ?? '', /^volume pv-1 is blank and was asked for read-only/);
    assert.deepEqual(nodeA.fake.callsOf('makeFs'), []);
    assert.equal(nodeA.fake.topAt(podDir), undefined);
    assert.equal(nodeA.fake.devices.size, 0);
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual([doc.spec.tickets, doc.status.nodes], [{}, {}]);
  });

  it('refuses a pod dir where something else is mounted', async () => {
    const { cluster, nodeA } = setup();
    const podDir = nodeA.podDir('uid-1', 'pv-1');
    nodeA.fake.mountForeign('/dev/sdb', podDir);
    const { reply } = await nodeA.call('mount', [podDir, podOptions('pv-1', { uid: 'uid-1' })]);
    assert.deepEqual(reply, { status: 'Failure', message: `${podDir} already has /dev/sdb mounted; not mounting volume pv-1 over it` });
    assert.equal(await cluster.doc('pv-1'), undefined);
  });

  it('undoes its ticket and the device when the mount fails', async () => {
    const { cluster, nodeA } = setup();
    nodeA.fake.failNext('mount', new LatchError('mount: /dev/fake0: can not read superblock'));
    const { reply, podDir } = await mountPod(nodeA, 'uid-1');
    assert.deepEqual(reply, { status: 'Failure', message: 'mount: /dev/fake0: can not read superblock' });
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(doc.spec.tickets, {});
    assert.deepEqual([doc.status.state, doc.status.nodes], ['detached', {}]);
    assert.equal(nodeA.fake.devices.size, 0);
    assert.equal(nodeA.fake.topAt(podDir), undefined);
    assert.equal(nodeA.fake.topAt(stagingPath(nodeA.config, 'pv-1')), undefined);
  });

  it("undoes only its own ticket when another pod's mount keeps the device (a bind the mount table does not confirm)", async () => {
    const { cluster, nodeA } = setup();
    const first = await mountPod(nodeA, 'uid-1');
    succeeded(first);
    const podDir2 = nodeA.podDir('uid-2', 'pv-1');
    // Once the bind is there, the table shows a subdirectory of the device at the pod dir, not its root.
    nodeA.fake.intercept('mountsAt', (p) => {
      const top = p === podDir2 ? nodeA.fake.topAt(p) : undefined;
      return top ? { result: [{ ...top, root: '/lost+found' }] } : undefined;
    });
    const { reply } = await nodeA.call('mount', [podDir2, podOptions('pv-1', { uid: 'uid-2' })]);
    assert.deepEqual(reply, {
      status: 'Failure',
      message: `after the bind mount, the mount table shows /dev/fake0[/lost+found] at ${podDir2} instead of /dev/fake0; undone`,
    });
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(Object.keys(doc.spec.tickets), [podTicket('pv-1', 'node-a', 'uid-1')]);
    assert.equal(doc.status.nodes['node-a']?.phase, 'attached');
    assert.equal(nodeA.fake.topAt(podDir2), undefined);
    assert.equal(nodeA.fake.topAt(first.podDir)?.source, '/dev/fake0');
    assert.equal(nodeA.fake.devices.size, 1);
  });
});

describe('unmount (non-attach mode)', () => {
  it("removes only that pod's bind mount and ticket while another pod of the node still uses the volume", async () => {
    const { cluster, nodeA } = setup();
    const first = await mountPod(nodeA, 'uid-1');
    const second = await mountPod(nodeA, 'uid-2');
    const { reply } = await nodeA.call('unmount', [first.podDir]);
    assert.deepEqual(reply, {
      status: 'Success',
      message: `${first.podDir} unmounted; volume pv-1 stays set up on node node-a for 1 other ticket(s)`,
    });
    assert.equal(nodeA.fake.topAt(first.podDir), undefined);
    assert.equal(nodeA.fake.topAt(second.podDir)?.source, '/dev/fake0');
    assert.equal(nodeA.fake.topAt(stagingPath(nodeA.config, 'pv-1'))?.source, '/dev/fake0');
    assert.equal(nodeA.fake.devices.size, 1);
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(Object.keys(doc.spec.tickets), [podTicket('pv-1', 'node-a', 'uid-2')]);
    assert.equal(doc.status.nodes['node-a']?.phase, 'attached');
  });

  it("releases the device, the staging mount and the node's hold with the node's last ticket", async () => {
    const { cluster, nodeA, nodeB } = setup();
    const first = await mountPod(nodeA, 'uid-1');
    const second = await mountPod(nodeA, 'uid-2');
    succeeded(await nodeA.call('unmount', [first.podDir]));
    assert.deepEqual((await nodeA.call('unmount', [second.podDir])).reply, { status: 'Success' });
    const staging = stagingPath(nodeA.config, 'pv-1');
    assert.equal(nodeA.fake.topAt(staging), undefined);
    assert.equal(existsSync(staging), false, 'the staging dir is removed');
    assert.equal(nodeA.fake.devices.size, 0);
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual([doc.spec.tickets, doc.status.nodes, doc.status.state], [{}, {}, 'detached']);
    succeeded(await mountPod(nodeB, 'uid-3'));
  });

  it('frees a loop device with its staging mount: one umount -d, and the release finds nothing left', async () => {
    const cluster = new Cluster({ config: { attach: false }, freedByUnmount: true });
    const nodeA = cluster.node('node-a');
    const { podDir } = await mountPod(nodeA, 'uid-1');
    succeeded(await nodeA.call('unmount', [podDir]));
    const staging = stagingPath(nodeA.config, 'pv-1');
    assert.deepEqual(nodeA.fake.callsOf('umount'), [[podDir], [staging, { freeLoopDevice: true }]]);
    assert.deepEqual(nodeA.fake.callsOf('release'), [['pv-1']]);
    assert.equal(nodeA.fake.devices.size, 0);
    assert.deepEqual((await cluster.mustDoc('pv-1')).status.nodes, {});
  });

  it('does not free a loop device that is still mounted elsewhere, nor a device of another kind', async () => {
    const loop = new Cluster({ config: { attach: false }, freedByUnmount: true });
    const nodeA = loop.node('node-a');
    const { podDir } = await mountPod(nodeA, 'uid-1');
    const staging = stagingPath(nodeA.config, 'pv-1');
    await nodeA.fake.system.bindMount(staging, nodeA.podDir('debug', 'copy'), false); // someone's own bind mount
    succeeded(await nodeA.call('unmount', [podDir]));
    assert.deepEqual(nodeA.fake.callsOf('umount'), [[podDir], [staging, { freeLoopDevice: false }]]);
    assert.equal(nodeA.fake.devices.size, 1);

    const { nodeA: other } = setup();
    const mounted = await mountPod(other, 'uid-1');
    succeeded(await other.call('unmount', [mounted.podDir]));
    assert.deepEqual(other.fake.callsOf('umount'), [[mounted.podDir], [stagingPath(other.config, 'pv-1'), { freeLoopDevice: false }]]);
    assert.equal(other.fake.devices.size, 0);
  });

  it('is Success when the pod dir has nothing mounted and no ticket, and changes nothing', async () => {
    const { cluster, nodeA } = setup();
    const mounts = structuredClone(nodeA.fake.mounts);
    assert.deepEqual((await nodeA.call('unmount', [nodeA.podDir('uid-9', 'pv-1')])).reply, { status: 'Success' });
    assert.deepEqual(nodeA.fake.mounts, mounts);
    assert.deepEqual(cluster.store.writes, []);
  });

  it("is Success for a pod whose mount was refused, and leaves the other pods' volume alone", async () => {
    const { cluster, nodeA } = setup();
    const first = await mountPod(nodeA, 'uid-1');
    const refused = await mountPod(nodeA, 'uid-2', 'pv-1', { fsType: 'xfs' });
    assert.equal(refused.reply.status, 'Failure');
    const before = await cluster.mustDoc('pv-1');
    assert.deepEqual((await nodeA.call('unmount', [refused.podDir])).reply, {
      status: 'Success',
      message: `${refused.podDir} unmounted; volume pv-1 stays set up on node node-a for 1 other ticket(s)`,
    });
    assert.deepEqual(await cluster.mustDoc('pv-1'), before);
    assert.equal(nodeA.fake.topAt(first.podDir)?.source, '/dev/fake0');
  });

  it('refuses to touch a mount that is not a latch volume', async () => {
    const { nodeA } = setup();
    const podDir = nodeA.podDir('uid-1', 'pv-1');
    nodeA.fake.mountForeign('/dev/sdb', podDir);
    assert.deepEqual((await nodeA.call('unmount', [podDir])).reply, {
      status: 'Failure',
      message: `${podDir} has /dev/sdb mounted, which is not a latch volume; not touching it`,
    });
    assert.equal(nodeA.fake.topAt(podDir)?.source, '/dev/sdb');
  });

  it("finds the pod's ticket from the path alone after a reboot (nothing mounted, no device) and lets go", async () => {
    const { cluster, nodeA } = setup();
    const { podDir } = await mountPod(nodeA, 'uid-1', 'pv-1', {}, { volume: 'data' });
    // A reboot: the kernel forgot every mount and device; the ledger remembers the ticket.
    nodeA.fake.mounts.splice(1);
    nodeA.fake.devices.clear();
    assert.deepEqual((await nodeA.call('unmount', [podDir])).reply, { status: 'Success' });
    const doc = await cluster.mustDoc('data');
    assert.deepEqual([doc.spec.tickets, doc.status.nodes], [{}, {}]);
  });

  it('keeps the hold when the device is still mounted elsewhere on the host', async () => {
    const { cluster, nodeA } = setup();
    const { podDir } = await mountPod(nodeA, 'uid-1');
    const elsewhere = nodeA.podDir('debug', 'copy');
    await nodeA.fake.system.bindMount(stagingPath(nodeA.config, 'pv-1'), elsewhere, false); // someone's own bind mount
    const { reply } = await nodeA.call('unmount', [podDir]);
    assert.deepEqual(reply, {
      status: 'Success',
      message: `${podDir} unmounted; /dev/fake0 is still mounted elsewhere on this host, so node node-a keeps its hold until a later unmount finds it free`,
    });
    assert.equal(nodeA.fake.devices.size, 1);
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(doc.spec.tickets, {});
    assert.equal(doc.status.nodes['node-a']?.phase, 'detaching');
  });
});

describe('expandfs (non-attach mode)', () => {
  it('grows the volume mounted in the pod, with an empty devicePath', async () => {
    const { cluster, nodeA } = setup();
    const { podDir } = await mountPod(nodeA, 'uid-1');
    const json = podOptions('pv-1', { uid: 'uid-1' });
    const { reply } = await nodeA.call('expandfs', [json, '', podDir, String(3 * GiB), String(GiB)]);
    assert.deepEqual(reply, { status: 'Success', message: `volume pv-1 is 3Gi; its ext4 filesystem fills it (grown online at ${podDir})` });
    assert.deepEqual(nodeA.fake.volumes.get('pv-1'), { size: 3 * GiB, fsType: 'ext4', fsBytes: 3 * GiB });
    assert.equal((await cluster.mustDoc('pv-1')).spec.sizeBytes, 3 * GiB);
  });

  it('grows through the read-write staging mount when the pod itself mounts it read-only', async () => {
    const { nodeA } = setup();
    succeeded(await mountPod(nodeA, 'uid-1'));
    const ro = await mountPod(nodeA, 'uid-2', 'pv-1', { readwrite: 'ro' });
    const { reply } = await nodeA.call('expandfs', [podOptions('pv-1', { uid: 'uid-2' }), '', ro.podDir, String(2 * GiB), String(GiB)]);
    const staging = stagingPath(nodeA.config, 'pv-1');
    assert.deepEqual(reply, {
      status: 'Success',
      message: `volume pv-1 is 2Gi; its ext4 filesystem fills it (grown online at ${staging})`,
    });
    assert.deepEqual(nodeA.fake.callsOf('growFs'), [['/dev/fake0', staging, 'ext4']]);
  });
});
