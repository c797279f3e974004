// Issue 15: a node releases by itself a hold its own kernel proves it no longer has (src/node/self-release.ts), and
// never otherwise. Each test tries to make the release happen wrongly: a device still set up or mounted, a mount the
// backend's device lookup misses, a backend or kernel that cannot answer, a slow node still setting the device up,
// a device that comes back during the release, another node's agent, an `attached` hold.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { runAgentTasks } from '../../src/agent/tasks.js';
import { LatchMetrics } from '../../src/agent/metrics.js';
import { LatchError } from '../../src/errors.js';
import { ticketId } from '../../src/ledger/ids.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { markHoldToCheck, releaseHoldWithoutDevice, releaseMarkedHolds } from '../../src/node/self-release.js';
import { Cluster, attachAndWait, pvOptions, stageVolume, succeeded, type TestNode } from '../fixtures/op-harness.js';

const PV = 'pv-1';
const JSON1 = pvOptions(PV);

function setup() {
  const cluster = new Cluster();
  return { cluster, cp: cluster.node('cp'), nodeA: cluster.node('node-a'), nodeB: cluster.node('node-b') };
}

/** node-a had the device, lost it (a reboot, a killed call), and the controller detached it; node-b waits. */
async function staleDetaching(cp: TestNode, nodeA: TestNode): Promise<void> {
  const device = await attachAndWait(cp, nodeA, JSON1);
  nodeA.fake.devices.delete(device);
  assert.equal((await cp.call('attach', [JSON1, 'node-b'])).reply.status, 'Failure');
  succeeded(await cp.call('detach', [PV, 'node-a']));
}

function phaseOf(doc: VolumeDoc | undefined, node: string): string | undefined {
  return doc?.status.nodes[node]?.phase;
}

const markerOf = (node: TestNode) => join(node.config.stateDir, 'holds-to-check', node.name, PV);

describe('releasing a hold on kernel evidence', () => {
  it('releases a detaching hold without a device, records it, and the waiting node gets the volume', async () => {
    const { cluster, cp, nodeA, nodeB } = setup();
    await staleDetaching(cp, nodeA);
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'detaching');

    const result = await releaseHoldWithoutDevice(nodeA.context(), PV);
    assert.equal(result.released, true);
    const doc = await cluster.mustDoc(PV);
    assert.equal(doc.status.nodes['node-a'], undefined);
    assert.equal(phaseOf(doc, 'node-b'), 'granted', 'the waiting ticket is granted at once');
    assert.deepEqual(
      doc.status.automatic?.map((a) => [a.kind, a.node]),
      [['released', 'node-a']],
    );
    assert.deepEqual(nodeA.fake.callsOf('release'), [[PV]], 'the backend released leftovers before the ledger was told');
    succeeded(await nodeB.call('waitforattach', ['', JSON1]));
  });

  it('keeps the hold while the device is set up and mounted', async () => {
    const { cluster, cp, nodeA } = setup();
    await stageVolume(cp, nodeA, PV);
    succeeded(await cp.call('detach', [PV, 'node-a']));
    const before = await cluster.mustDoc(PV);

    const result = await releaseHoldWithoutDevice(nodeA.context(), PV);
    assert.deepEqual([result.released, !result.released && result.reason], [false, 'device']);
    assert.deepEqual(await cluster.mustDoc(PV), before, 'the ledger is unchanged');
    assert.deepEqual(nodeA.fake.callsOf('release'), [], 'nothing was released');
  });

  it('keeps the hold when the backend finds no device but one of the volume is still mounted', async () => {
    const { cluster, cp, nodeA } = setup();
    await stageVolume(cp, nodeA, PV);
    succeeded(await cp.call('detach', [PV, 'node-a']));
    // The image was replaced under the device, say: the lookup by image misses the mounted device.
    nodeA.fake.intercept('findDevice', () => ({ result: undefined }));

    const result = await releaseHoldWithoutDevice(nodeA.context(), PV);
    assert.deepEqual([result.released, !result.released && result.reason], [false, 'mounted']);
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'detaching');
    assert.deepEqual(nodeA.fake.callsOf('release'), []);
  });

  it('releases nothing when the backend or the kernel cannot answer', async () => {
    for (const method of ['findDevice', 'readMountInfo', 'release'] as const) {
      const { cluster, cp, nodeA } = setup();
      await staleDetaching(cp, nodeA);
      nodeA.fake.failNext(method, new LatchError(`${method} failed`));
      await assert.rejects(releaseHoldWithoutDevice(nodeA.context(), PV), new RegExp(`${method} failed`));
      assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'detaching', `${method} failing releases nothing`);
    }
  });

  it('does not release a slow node that is still setting the device up (attaching, device not there yet)', async () => {
    const { cluster, cp, nodeA } = setup();
    succeeded(await cp.call('attach', [JSON1, 'node-a']));
    let reached!: () => void;
    const atAttach = new Promise<void>((resolve) => (reached = resolve));
    let proceed!: () => void;
    const gate = new Promise<void>((resolve) => (proceed = resolve));
    nodeA.fake.intercept(
      'attach',
      async () => {
        reached();
        await gate;
      },
      1,
    );
    const waiting = nodeA.call('waitforattach', ['', JSON1]);
    await atAttach;
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'attaching');
    assert.equal(nodeA.fake.devices.size, 0, 'no device yet');

    const result = await releaseHoldWithoutDevice(nodeA.context(), PV);
    assert.deepEqual([result.released, !result.released && result.reason], [false, 'busy']);
    // The same from the next call's marker check: the marker stays for later.
    const log: Record<string, unknown> = {};
    await releaseMarkedHolds(nodeA.context(log));
    assert.ok(existsSync(markerOf(nodeA)), 'the marker of the running waitforattach stays');
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'attaching');

    proceed();
    const { reply } = await waiting;
    assert.equal(reply.status, 'Success');
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'attached');
    assert.ok(!existsSync(markerOf(nodeA)), 'a recorded device clears the marker');
  });

  it('does not release when the device comes back while leftovers are released', async () => {
    const { cluster, cp, nodeA } = setup();
    await staleDetaching(cp, nodeA);
    nodeA.fake.intercept('release', (volume) => {
      nodeA.fake.setUpDeviceDirectly(volume);
      return { result: undefined };
    });
    const result = await releaseHoldWithoutDevice(nodeA.context(), PV);
    assert.deepEqual([result.released, !result.released && result.reason], [false, 'device']);
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'detaching');
  });

  it('leaves an attached hold alone even without a device (a device gone under a running pod needs a person)', async () => {
    const { cluster, cp, nodeA } = setup();
    const device = await attachAndWait(cp, nodeA, JSON1);
    nodeA.fake.devices.delete(device);
    const result = await releaseHoldWithoutDevice(nodeA.context(), PV);
    assert.deepEqual([result.released, !result.released && result.reason], [false, 'no-hold']);
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'attached');
  });

  it("another node's agent never releases a node's hold; the node that comes back with its device keeps it", async () => {
    const { cluster, cp, nodeA, nodeB } = setup();
    await stageVolume(cp, nodeA, PV);
    succeeded(await cp.call('detach', [PV, 'node-a']));
    // node-b sees no device of the volume in its own kernel: that proves nothing about node-a.
    await runAgentTasks(nodeB.config, () => nodeB.context(), await LatchMetrics.create());
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'detaching');
    // node-a comes back with the device still mounted: its own agent keeps the hold too.
    await runAgentTasks(nodeA.config, () => nodeA.context(), await LatchMetrics.create());
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'detaching');
    assert.equal((await cluster.mustDoc(PV)).status.automatic, undefined);
  });
  it('a node fenced by an admin that comes back with its device changes nothing of the new holder', async () => {
    const { cluster, cp, nodeA, nodeB } = setup();
    const { device } = await stageVolume(cp, nodeA, PV);
    await cluster.ledger.releaseDeadNode(PV, 'node-a'); // the admin declared node-a down
    await attachAndWait(cp, nodeB, JSON1);
    const before = await cluster.mustDoc(PV);
    await runAgentTasks(nodeA.config, () => nodeA.context(), await LatchMetrics.create());
    assert.deepEqual(await cluster.mustDoc(PV), before, 'node-b keeps the volume; nothing is recorded');
    assert.equal(nodeA.fake.devices.get(device)?.volume, PV, "node-a's leftover device is doctor's to report, not the agent's to touch");
  });
});

describe('where the release runs', () => {
  it('the next node call releases a hold a killed waitforattach left marked (claimed, no device), then clears the marker', async () => {
    const { cluster, cp, nodeA } = setup();
    succeeded(await cp.call('attach', [JSON1, 'node-a']));
    // What a waitforattach killed right after its claim leaves behind.
    await markHoldToCheck(nodeA.config, PV);
    await cluster.ledger.claimGrant(PV, 'node-a');
    succeeded(await cp.call('detach', [PV, 'node-a']));
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'detaching');

    // Any node call on node-a: here a mountdevice of another volume, which fails by itself.
    const { reply, log } = await nodeA.call('mountdevice', [nodeA.globalPath('pv-2'), '/dev/fake9', pvOptions('pv-2')]);
    assert.equal(reply.status, 'Failure');
    assert.equal((await cluster.mustDoc(PV)).status.nodes['node-a'], undefined, 'the hold is released');
    assert.deepEqual(
      (log.automatic as Array<{ kind: string }>).map((a) => a.kind),
      ['released'],
      "the release is in the call's log line",
    );
    assert.ok(!existsSync(markerOf(nodeA)));
  });

  it('a node call without markers touches nothing of the ledger (one readdir)', async () => {
    const { cluster, cp, nodeA } = setup();
    await staleDetaching(cp, nodeA);
    const writes = cluster.store.writes.length;
    await nodeA.call('unmountdevice', [nodeA.globalPath('pv-2')]);
    assert.equal(cluster.store.writes.length, writes);
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'detaching', 'left to the agent');
  });

  it('a failing marker check keeps the marker and never fails the call', async () => {
    const { cluster, cp, nodeA } = setup();
    await staleDetaching(cp, nodeA);
    await markHoldToCheck(nodeA.config, PV);
    nodeA.fake.failNext('findDevice', new LatchError('the kernel did not answer'));
    const { reply, log } = await nodeA.call('unmountdevice', [nodeA.globalPath('pv-2')]);
    assert.equal(reply.status, 'Success');
    assert.match(String(log.selfReleaseError), /the kernel did not answer/);
    assert.ok(existsSync(markerOf(nodeA)));
    assert.equal(phaseOf(await cluster.doc(PV), 'node-a'), 'detaching');
    // The next call succeeds in checking it.
    await nodeA.call('unmountdevice', [nodeA.globalPath('pv-2')]);
    assert.equal((await cluster.mustDoc(PV)).status.nodes['node-a'], undefined);
  });

  it('the failing waitforattach gives its claim back only after the backend released what it had set up', async () => {
    const { cluster, cp, nodeA } = setup();
    succeeded(await cp.call('attach', [JSON1, 'node-a']));
    nodeA.fake.failNext('attach', new LatchError('rbd-fuse did not come up'));
    const { reply } = await nodeA.call('waitforattach', ['', JSON1]);
    assert.equal(reply.status, 'Failure');
    const doc = await cluster.mustDoc(PV);
    assert.equal(phaseOf(doc, 'node-a'), 'granted', 'the claim went back; the ticket still wants it here');
    assert.deepEqual(nodeA.fake.callsOf('release'), [[PV]]);
    assert.equal(doc.status.automatic?.[0]?.kind, 'released');
    assert.equal(doc.spec.tickets[ticketId('workload', PV, 'latch/loop', 'node-a')]?.nodeID, 'node-a');
  });
});
