// The decisions of the ops the controller (and every probe) calls: init, getvolumename, attach, isattached, detach
// and expandvolume. Each test runs the op as the protocol layer does, with argv as kube-controller-manager passes it,
// against an in-memory ledger and a fake node (test/fixtures), and checks the reply and the ledger it leaves.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ticketId } from '../../src/ledger/ids.js';
import { Cluster, GiB, attachAndWait, pvOptions, succeeded } from '../fixtures/op-harness.js';

const DRIVER = 'latch/loop';
const idOf = (pv: string, node: string) => ticketId('workload', pv, DRIVER, node);
/** What KCM passes to attach for a PV with no user options, exactly as Go marshals it. */
const PV1 = '{"kubernetes.io/fsType":"ext4","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw"}';

describe('init', () => {
  it('states every capability explicitly, attach as the config says, and touches nothing', async () => {
    const cluster = new Cluster();
    const node = cluster.node('node-a');
    const { reply } = await node.call('init', []);
    assert.deepEqual(reply, {
      status: 'Success',
      capabilities: { attach: true, selinuxRelabel: true, fsGroup: true, requiresFSResize: true, supportsMetrics: true },
    });
    assert.deepEqual(cluster.store.writes, []);
    assert.deepEqual(node.fake.calls, []);
  });

  it('says attach: false in non-attach mode', async () => {
    const { reply } = await new Cluster({ config: { attach: false } }).node('node-a').call('init', []);
    assert.deepEqual(reply.capabilities, {
      attach: false,
      selinuxRelabel: true,
      fsGroup: true,
      requiresFSResize: true,
      supportsMetrics: true,
    });
  });
});

describe('getvolumename', () => {
  it('answers the PV name, and the volume option when given (it wins over the PV name)', async () => {
    const cluster = new Cluster();
    const node = cluster.node('node-a');
    assert.deepEqual((await node.call('getvolumename', [PV1])).reply, { status: 'Success', volumeName: 'pv-1' });
    assert.deepEqual((await node.call('getvolumename', [pvOptions('pv-1', { volume: 'data' })])).reply, {
      status: 'Success',
      volumeName: 'data',
    });
    assert.deepEqual(cluster.store.writes, [], 'getvolumename records nothing');
  });

  it('refuses options that name no volume', async () => {
    const { reply } = await new Cluster().node('node-a').call('getvolumename', ['{"kubernetes.io/fsType":"ext4"}']);
    assert.equal(reply.status, 'Failure');
    assert.match(reply.message ?? '', /name no volume/);
  });
});

describe('attach', () => {
  it('creates the volume lazily with the config defaults and grants it to the node', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    const { reply, log } = await cp.call('attach', [
      '{"kubernetes.io/fsType":"","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw"}',
      'node-a',
    ]);
    assert.deepEqual(reply, { status: 'Success' });
    const doc = await cluster.mustDoc('pv-1');
    assert.equal(doc.spec.sizeBytes, GiB);
    assert.equal(doc.spec.fsType, 'ext4');
    const id = idOf('pv-1', 'node-a');
    assert.deepEqual(Object.keys(doc.spec.tickets), [id]);
    const ticket = doc.spec.tickets[id];
    assert.equal(ticket?.type, 'workload');
    assert.equal(ticket?.nodeID, 'node-a');
    assert.deepEqual(ticket?.parameters, { readOnly: false });
    assert.equal(ticket?.requestedBy.pvName, 'pv-1');
    assert.equal(doc.status.nodes['node-a']?.phase, 'granted');
    assert.equal(doc.status.tickets[id]?.satisfied, true);
    assert.deepEqual([log.volume, log.ticket, log.node], ['pv-1', id, 'node-a']);
    assert.equal(cp.fake.volumes.size, 0, 'the controller makes no storage: waitforattach does, on the node');
  });

  it('creates the volume with the size and fsType the options ask for', async () => {
    const cluster = new Cluster({ config: { defaultFsType: 'ext4' } });
    succeeded(await cluster.node('cp').call('attach', [pvOptions('pv-1', { size: '3Gi' }, { fsType: 'xfs' }), 'node-a']));
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual([doc.spec.sizeBytes, doc.spec.fsType], [3 * GiB, 'xfs']);
  });

  it('refuses a size above maxSize before anything is recorded', async () => {
    const cluster = new Cluster();
    const { reply } = await cluster.node('cp').call('attach', [pvOptions('pv-1', { size: '20Gi' }), 'node-a']);
    assert.equal(reply.status, 'Failure');
    assert.match(reply.message ?? '', /option "size" \(20Gi\) is above the configured maxSize/);
    assert.deepEqual(cluster.store.writes, []);
  });

  it('refuses a second node while the first holds a read-write volume, naming the holder', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    succeeded(await cp.call('attach', [PV1, 'node-a']));
    const { reply } = await cp.call('attach', [PV1, 'node-b']);
    assert.deepEqual(reply, {
      status: 'Failure',
      message: `volume pv-1 cannot be attached to node node-b yet: attached to node node-a (ticket ${idOf('pv-1', 'node-a')})`,
    });
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(Object.keys(doc.status.nodes), ['node-a']);
    // The controller retries; its ticket waits in the ledger, unsatisfied.
    assert.equal(doc.status.tickets[idOf('pv-1', 'node-b')]?.reason, 'AttachedElsewhere');
  });

  it('lets a second node in while every ticket is read-only (read-only-many)', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    const ro = pvOptions('pv-1', {}, { readwrite: 'ro' });
    succeeded(await cp.call('attach', [ro, 'node-a']));
    succeeded(await cp.call('attach', [ro, 'node-b']));
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(doc.status.nodes['node-a']?.readOnly, true);
    assert.deepEqual(doc.status.nodes['node-b']?.readOnly, true);
    // A read-write request now is refused: it would write under the readers' feet.
    const { reply } = await cp.call('attach', [PV1, 'node-c']);
    assert.equal(reply.status, 'Failure');
  });

  it('is idempotent: the same attach again keeps the ticket and its generation, and writes nothing', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    succeeded(await cp.call('attach', [PV1, 'node-a']));
    const before = await cluster.mustDoc('pv-1');
    const writes = cluster.store.writes.length;
    succeeded(await cp.call('attach', [PV1, 'node-a']));
    const after = await cluster.mustDoc('pv-1');
    assert.deepEqual(after, before);
    assert.equal(after.spec.tickets[idOf('pv-1', 'node-a')]?.generation, 1);
    assert.equal(cluster.store.writes.length, writes);
  });

  it('records the PV name of a volume option as an alias, so that detach (which only gets the PV name) finds it', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    succeeded(await cp.call('attach', [pvOptions('pv-1', { volume: 'data' }), 'node-a']));
    assert.equal(await cluster.doc('pv-1'), undefined, 'no volume under the PV name');
    assert.deepEqual(cluster.store.peek('pvs/pv-1'), { volume: 'data' });
    const doc = await cluster.mustDoc('data');
    // The ticket is named after the PV name: all that detach knows.
    assert.deepEqual(Object.keys(doc.spec.tickets), [idOf('pv-1', 'node-a')]);

    const { reply, log } = await cp.call('detach', ['pv-1', 'node-a']);
    assert.deepEqual(reply, { status: 'Success' });
    assert.equal(log.volume, 'data');
    assert.deepEqual((await cluster.mustDoc('data')).spec.tickets, {});
  });

  it('answers Not supported in non-attach mode', async () => {
    const cluster = new Cluster({ config: { attach: false } });
    const { reply } = await cluster.node('node-a').call('attach', [PV1, 'node-a']);
    assert.equal(reply.status, 'Not supported');
    assert.deepEqual(cluster.store.writes, []);
  });
});

describe('isattached', () => {
  it('is true only for the satisfied ticket of that node, and always sends the boolean', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    assert.deepEqual((await cp.call('isattached', [PV1, 'node-a'])).reply, { status: 'Success', attached: false }, 'unknown volume');

    succeeded(await cp.call('attach', [PV1, 'node-a']));
    await cp.call('attach', [PV1, 'node-b']); // refused: waits
    assert.deepEqual((await cp.call('isattached', [PV1, 'node-a'])).reply, { status: 'Success', attached: true });
    assert.deepEqual((await cp.call('isattached', [PV1, 'node-b'])).reply, { status: 'Success', attached: false }, 'waiting ticket');
    assert.deepEqual((await cp.call('isattached', [PV1, 'node-c'])).reply, { status: 'Success', attached: false }, 'no ticket');

    succeeded(await cp.call('detach', ['pv-1', 'node-a']));
    assert.deepEqual((await cp.call('isattached', [PV1, 'node-a'])).reply, { status: 'Success', attached: false });
    // node-a only had its grant: the waiting node-b got the volume.
    assert.deepEqual((await cp.call('isattached', [PV1, 'node-b'])).reply, { status: 'Success', attached: true });
  });

  it('finds a volume named by the volume option, and writes nothing', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    const json = pvOptions('pv-1', { volume: 'data' });
    succeeded(await cp.call('attach', [json, 'node-a']));
    const writes = cluster.store.writes.length;
    assert.deepEqual((await cp.call('isattached', [json, 'node-a'])).reply, { status: 'Success', attached: true });
    assert.equal(cluster.store.writes.length, writes);
  });
});

describe('detach', () => {
  it('is Success for a ticket the ledger does not know, and records nothing', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    assert.deepEqual((await cp.call('detach', ['pv-x', 'node-a'])).reply, { status: 'Success' });
    succeeded(await cp.call('attach', [PV1, 'node-a']));
    const before = await cluster.mustDoc('pv-1');
    assert.deepEqual((await cp.call('detach', ['pv-1', 'node-b'])).reply, { status: 'Success' });
    assert.deepEqual(await cluster.mustDoc('pv-1'), before);
  });

  it('takes the grant away from a node that never set up the device', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    succeeded(await cp.call('attach', [PV1, 'node-a']));
    assert.deepEqual((await cp.call('detach', ['pv-1', 'node-a'])).reply, { status: 'Success' });
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(doc.spec.tickets, {});
    assert.deepEqual(doc.status.nodes, {});
    assert.equal(doc.status.state, 'detached');
    succeeded(await cp.call('attach', [PV1, 'node-b']));
  });

  it('keeps a node that set up the device fenced (detaching) until it releases it, and says so', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    const nodeA = cluster.node('node-a');
    const device = await attachAndWait(cp, nodeA, PV1);

    const { reply } = await cp.call('detach', ['pv-1', 'node-a']);
    assert.deepEqual(reply, { status: 'Success', message: 'volume pv-1 stays fenced to node node-a until it releases the device' });
    const doc = await cluster.mustDoc('pv-1');
    assert.deepEqual(doc.spec.tickets, {});
    assert.equal(doc.status.nodes['node-a']?.phase, 'detaching');
    assert.equal(doc.status.nodes['node-a']?.device, device);
    assert.equal(doc.status.state, 'detaching');

    const refused = await cp.call('attach', [PV1, 'node-b']);
    assert.equal(refused.reply.status, 'Failure');
    assert.match(refused.reply.message ?? '', /still detaching from node node-a: waiting for node node-a to release the device/);
    assert.equal(nodeA.fake.devices.size, 1, 'detach never touches the node');
  });

  it('lets the fenced node have the volume back when it is attached there again, with the same device', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    const nodeA = cluster.node('node-a');
    const device = await attachAndWait(cp, nodeA, PV1);
    succeeded(await cp.call('detach', ['pv-1', 'node-a']));
    assert.deepEqual((await cp.call('attach', [PV1, 'node-a'])).reply, { status: 'Success' });
    assert.equal((await cluster.mustDoc('pv-1')).status.nodes['node-a']?.phase, 'attaching', 'it never let go of the device');
    assert.deepEqual((await nodeA.call('waitforattach', ['', PV1])).reply, { status: 'Success', device });
    assert.equal(nodeA.fake.callsOf('create').length, 1);
  });

  it('answers Not supported in non-attach mode', async () => {
    const { reply } = await new Cluster({ config: { attach: false } }).node('node-a').call('detach', ['pv-1', 'node-a']);
    assert.equal(reply.status, 'Not supported');
  });
});

describe('expandvolume', () => {
  it('is Not supported, with the reason, in both modes, and changes nothing', async () => {
    for (const attach of [true, false]) {
      const cluster = new Cluster({ config: { attach } });
      const node = cluster.node('node-a');
      const { reply } = await node.call('expandvolume', [PV1, node.globalPath('pv-1'), String(2 * GiB), String(GiB)]);
      assert.equal(reply.status, 'Not supported');
      assert.match(reply.message ?? '', /nothing in Kubernetes calls expandvolume; latch grows volumes in expandfs/);
      assert.deepEqual(cluster.store.writes, []);
      assert.deepEqual(node.fake.calls, []);
    }
  });
});
