// Fences (docs/ledger.md, "Fences"): the storage refuses a node's clients before a volume moves away from it, the
// node's hold goes only after that, the node is never granted the volume again until it has cleared its old mapping
// from its own kernel state, and only a cleared fence is lifted. The ledger rules run pure; the flows run the real
// ops on fake nodes (test/fixtures) with a fencer that records what the storage was told. The rbd fencer on fake
// rbd and ceph tools is in test/integration/fence-rbd-tools.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Fencer } from '../../src/backend/types.js';
import {
  addTicket,
  beginFence,
  completeFence,
  isFencedOff,
  markAttaching,
  markFenceCleared,
  newVolume,
  removeFence,
} from '../../src/ledger/arbitrate.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { requireFencer } from '../../src/cli/fencing.js';
import { isClientInstance } from '../../src/sys/rbd.js';
import { parseConfig } from '../../src/config.js';
import { clearOwnFence, fenceNodeOffVolume, liftClearedFence } from '../../src/node/fence.js';
import { Cluster, GiB, stageVolume, steppingClock, succeeded } from '../fixtures/op-harness.js';

const NOW = '2026-01-01T00:00:00.000Z';

function workload(node: string, readOnly = false) {
  return { id: `t-${node}`, type: 'workload' as const, nodeID: node, parameters: { readOnly }, requestedBy: { pvName: 'pv' } };
}

/** node-a holds the volume (attached), node-b waits for it. */
function heldByA(): VolumeDoc {
  let doc = addTicket(newVolume('vol', GiB, 'ext4', NOW), workload('node-a'), NOW);
  doc = markAttaching(doc, 'node-a', NOW) ?? assert.fail('node-a could not claim its grant');
  doc.status.nodes['node-a'] = { phase: 'attached', readOnly: false, since: NOW, device: '/dev/loop1', client: '10.0.0.1:0/111' };
  return addTicket(doc, workload('node-b'), NOW);
}

describe('fence rules (pure)', () => {
  it('beginFence keeps the hold; completeFence releases it with its tickets and grants the waiting node', () => {
    const begun = beginFence(heldByA(), 'node-a', 'test', ['10.0.0.1:0/111'], NOW);
    assert.equal(begun.status.nodes['node-a']?.phase, 'attached', 'the hold stays until the storage refuses the node');
    assert.equal(begun.status.nodes['node-b'], undefined);
    assert.equal(begun.status.fences?.['node-a']?.state, 'fencing');
    const done = completeFence(begun, 'node-a', ['10.0.0.1:0/222'], NOW) ?? assert.fail('completeFence refused');
    assert.equal(done.status.nodes['node-a'], undefined);
    assert.equal(done.spec.tickets['t-node-a'], undefined);
    assert.equal(done.status.nodes['node-b']?.phase, 'granted');
    assert.deepEqual(done.status.fences?.['node-a'], {
      state: 'fenced',
      since: NOW,
      reason: 'test',
      clients: ['10.0.0.1:0/111', '10.0.0.1:0/222'],
    });
  });

  it('completeFence without a fence begun changes nothing', () => {
    assert.equal(completeFence(heldByA(), 'node-a', [], NOW), undefined);
  });

  it('a fenced node is not granted the volume, nor can it take up a grant it had, until it clears; then it can', () => {
    // node-a only has a grant (not taken up) when the fence begins.
    const granted = addTicket(newVolume('vol', GiB, 'ext4', NOW), workload('node-a'), NOW);
    const begun = beginFence(granted, 'node-a', 'test', [], NOW);
    assert.equal(markAttaching(begun, 'node-a', NOW), undefined, 'a grant is not taken up while a fence is begun');
    const fenced = completeFence(begun, 'node-a', [], NOW) ?? assert.fail();
    const asksAgain = addTicket(fenced, workload('node-a'), NOW);
    assert.equal(asksAgain.status.nodes['node-a'], undefined, 'not granted while fenced off');
    assert.equal(asksAgain.status.tickets['t-node-a']?.reason, 'Fenced');
    assert.ok(isFencedOff(asksAgain, 'node-a'));
    const cleared = markFenceCleared(asksAgain, 'node-a', NOW);
    assert.equal(cleared.status.nodes['node-a']?.phase, 'granted', 'granted again once cleared');
    assert.equal(isFencedOff(cleared, 'node-a'), false);
  });

  it('only a cleared fence is removed', () => {
    const fenced = completeFence(beginFence(heldByA(), 'node-a', 'test', [], NOW), 'node-a', [], NOW) ?? assert.fail();
    assert.equal(removeFence(fenced, 'node-a', NOW), fenced);
    const lifted = removeFence(markFenceCleared(fenced, 'node-a', NOW), 'node-a', NOW);
    assert.equal(lifted.status.fences, undefined);
  });

  it('a read-write ticket of an unfenced node still wins while another node is fenced off', () => {
    const fenced = completeFence(beginFence(heldByA(), 'node-a', 'test', [], NOW), 'node-a', [], NOW) ?? assert.fail();
    const both = addTicket(fenced, workload('node-a'), NOW);
    assert.equal(both.status.nodes['node-b']?.phase, 'granted');
    assert.equal(both.status.nodes['node-a'], undefined);
  });
});

/** A storage fence that remembers whom it refuses; `openers` are the clients that have the image open or locked. */
class RecordingFencer implements Fencer {
  readonly kind = 'the test blocklist';
  readonly refused = new Set<string>();
  readonly calls: { known: string[]; spare: string[]; holdAtCall: string | undefined }[] = [];
  openers: string[] = [];
  failNext = false;
  /** The storage cannot list who has the image open (rbd status fails). */
  listingFails = false;
  constructor(private readonly cluster: Cluster) {}

  async find(_volume: string, known: string[], spare: string[]): Promise<string[]> {
    if (this.listingFails) throw new Error('rbd status: (110) Connection timed out');
    return [...new Set([...known, ...this.openers.filter((c) => !spare.includes(c))])].sort();
  }

  async fence(volume: string, known: string[], spare: string[]): Promise<string[]> {
    const doc = await this.cluster.doc(volume);
    this.calls.push({ known, spare, holdAtCall: doc?.status.nodes['node-a']?.phase });
    if (this.failNext) {
      this.failNext = false;
      throw new Error('the cluster did not answer');
    }
    const targets = [...new Set([...known, ...this.openers.filter((c) => !spare.includes(c))])];
    for (const c of targets) this.refused.add(c);
    return targets;
  }

  async lift(clients: string[]): Promise<void> {
    for (const c of clients) this.refused.delete(c);
  }
}

/** node-a has the volume staged (device mounted at kubelet's global path, client recorded), node-b asks for it. */
async function movingVolume(recordClient = true) {
  const cluster = new Cluster({ config: { waitForAttachTimeout: 1 }, clock: steppingClock(100) });
  const a = cluster.node('node-a');
  const b = cluster.node('node-b');
  if (recordClient) a.fake.clients.set('pv-1', '10.0.0.1:0/111');
  const staged = await stageVolume(a, a, 'pv-1');
  const json = staged.json;
  assert.equal((await a.call('attach', [json, 'node-b'])).reply.status, 'Failure', 'node-b waits while node-a holds it');
  const fencer = new RecordingFencer(cluster);
  return { cluster, a, b, fencer, ...staged, json };
}

describe('fencing a node off a volume (node services on fake nodes)', () => {
  it('records the node client at attach, fences it before the hold goes, and lets the other node attach', async () => {
    const { cluster, a, b, json, fencer } = await movingVolume();
    assert.equal((await cluster.mustDoc('pv-1')).status.nodes['node-a']?.client, '10.0.0.1:0/111', 'recorded at waitforattach');
    fencer.openers = ['10.0.0.1:0/111', '10.0.0.9:0/999'];

    const { clients } = await fenceNodeOffVolume(a.context(), fencer, 'pv-1', 'node-a', 'test');
    assert.deepEqual(clients, ['10.0.0.1:0/111', '10.0.0.9:0/999']);
    assert.equal(fencer.calls[0]?.holdAtCall, 'attached', 'the storage was told while node-a still held the volume');
    // The recorded client and what the storage showed before anything was recorded: a watcher that goes meanwhile is
    // fenced all the same.
    assert.deepEqual(fencer.calls[0]?.known, ['10.0.0.1:0/111', '10.0.0.9:0/999']);
    const doc = await cluster.mustDoc('pv-1');
    assert.equal(doc.status.nodes['node-a'], undefined);
    assert.equal(doc.status.fences?.['node-a']?.state, 'fenced');
    assert.deepEqual(doc.status.fences?.['node-a']?.clients, ['10.0.0.1:0/111', '10.0.0.9:0/999']);
    const { device } = succeeded(await b.call('waitforattach', ['', json]));
    assert.match(device ?? '', /^\/dev\//);
  });

  it('when the storage cannot be told, the hold stays and the other node waits; a repeat finishes the job', async () => {
    const { cluster, a, b, json, fencer } = await movingVolume();
    fencer.failNext = true;
    await assert.rejects(fenceNodeOffVolume(a.context(), fencer, 'pv-1', 'node-a', 'test'), /did not answer/);
    let doc = await cluster.mustDoc('pv-1');
    assert.equal(doc.status.nodes['node-a']?.phase, 'attached');
    assert.equal(doc.status.fences?.['node-a']?.state, 'fencing');
    assert.equal((await b.call('waitforattach', ['', json])).reply.status, 'Failure', 'node-b is not granted an unfenced volume');

    await fenceNodeOffVolume(a.context(), fencer, 'pv-1', 'node-a', 'test');
    doc = await cluster.mustDoc('pv-1');
    assert.equal(doc.status.fences?.['node-a']?.state, 'fenced');
    assert.ok(fencer.refused.has('10.0.0.1:0/111'));
    succeeded(await b.call('waitforattach', ['', json]));
  });

  it('a fence that finds no client of an attached node refuses and leaves the ledger as it was', async () => {
    // No client recorded (a ledger written before attaches recorded one) and none left on the image (its watch expired).
    const { cluster, a, b, json, fencer } = await movingVolume(false);
    assert.equal((await cluster.mustDoc('pv-1')).status.nodes['node-a']?.phase, 'attached');
    const unchanged = await cluster.mustDoc('pv-1');
    await assert.rejects(
      fenceNodeOffVolume(a.context(), fencer, 'pv-1', 'node-a', 'test'),
      /volume pv-1: node node-a holds it \(attached\), but the test blocklist has nothing of it to refuse: .*Its hold stays\. .*latch volume release pv-1 --node node-a --node-is-down --powered-off/,
    );
    assert.deepEqual(await cluster.mustDoc('pv-1'), unchanged, 'no fence begun, the hold kept');
    assert.equal(fencer.calls.length, 0, 'the storage was told nothing');
    assert.equal((await b.call('waitforattach', ['', json])).reply.status, 'Failure', 'node-b is not granted the volume');

    // The admin's word that node-a is powered off lets the hold go, and records the fence (with no client).
    const { clients, doc } = await fenceNodeOffVolume(a.context(), fencer, 'pv-1', 'node-a', 'test', { poweredOff: true });
    assert.deepEqual(clients, []);
    assert.equal(doc?.status.nodes['node-a'], undefined);
    assert.equal(doc?.status.fences?.['node-a']?.state, 'fenced');
    succeeded(await b.call('waitforattach', ['', json]));
  });

  it('a listing the storage cannot give fails the fence before anything is recorded', async () => {
    const { cluster, a, fencer } = await movingVolume();
    const unchanged = await cluster.mustDoc('pv-1');
    fencer.listingFails = true;
    await assert.rejects(fenceNodeOffVolume(a.context(), fencer, 'pv-1', 'node-a', 'test', { poweredOff: true }), /Connection timed out/);
    assert.deepEqual(await cluster.mustDoc('pv-1'), unchanged);
  });

  it('spares the recorded clients of the other holders of a read-only-many volume', async () => {
    const cluster = new Cluster();
    const [a, b] = [cluster.node('node-a'), cluster.node('node-b')];
    a.fake.clients.set('pv-ro', '10.0.0.1:0/1');
    b.fake.clients.set('pv-ro', '10.0.0.2:0/2');
    cluster.pool.set('pv-ro', { size: GiB, fsType: 'ext4', fsBytes: GiB }); // formatted earlier
    await stageVolume(a, a, 'pv-ro', {}, { readwrite: 'ro' });
    await stageVolume(a, b, 'pv-ro', {}, { readwrite: 'ro' });
    const fencer = new RecordingFencer(cluster);
    fencer.openers = ['10.0.0.1:0/1', '10.0.0.2:0/2'];
    const { clients } = await fenceNodeOffVolume(a.context(), fencer, 'pv-ro', 'node-a', 'test');
    assert.deepEqual(clients, ['10.0.0.1:0/1']);
    assert.deepEqual(fencer.calls[0]?.spare, ['10.0.0.2:0/2']);
    assert.equal((await cluster.mustDoc('pv-ro')).status.nodes['node-b']?.phase, 'attached');
  });

  it('the node that comes back clears its fence in unmountdevice, and only once nothing of the volume is left', async () => {
    const { cluster, a, fencer, globalPath } = await movingVolume();
    await fenceNodeOffVolume(a.context(), fencer, 'pv-1', 'node-a', 'test');
    // Its device is still mounted: a node call that finds it so must not clear the fence.
    const doc = await cluster.mustDoc('pv-1');
    await clearOwnFence(a.context(), 'pv-1', doc);
    assert.equal((await cluster.mustDoc('pv-1')).status.fences?.['node-a']?.clearedAt, undefined);
    assert.equal((await liftClearedFence(a.context(), fencer, 'pv-1', 'node-a')) !== undefined, true);
    assert.ok(fencer.refused.has('10.0.0.1:0/111'), 'an uncleared fence is not lifted');

    a.fake.calls.length = 0;
    succeeded(await a.call('unmountdevice', [globalPath]));
    const order = a.fake.calls.map((c) => c.method).filter((m) => m === 'cutOff' || m === 'umount');
    assert.deepEqual(order, ['cutOff', 'umount'], "the fenced client is cut off before the filesystem's unmount could wait on it");
    assert.equal(await a.fake.backend.findDevice('pv-1'), undefined);
    assert.ok((await cluster.mustDoc('pv-1')).status.fences?.['node-a']?.clearedAt, 'cleared after the release');
    assert.deepEqual(await liftClearedFence(a.context(), fencer, 'pv-1', 'node-a'), { lifted: ['10.0.0.1:0/111'] });
    assert.equal(fencer.refused.size, 0);
    assert.equal((await cluster.mustDoc('pv-1')).status.fences, undefined);
  });

  it('a fenced node asked for the volume again clears its stale unmounted device in waitforattach, then waits its turn', async () => {
    const { cluster, a, json, fencer, globalPath } = await movingVolume();
    await fenceNodeOffVolume(a.context(), fencer, 'pv-1', 'node-a', 'test');
    await a.fake.system.umount(globalPath); // kubelet's mount went (e.g. a reboot), the device did not
    const attach = (await a.call('attach', [json, 'node-a'])).reply;
    assert.equal(attach.status, 'Failure');
    assert.match(attach.message ?? '', /fenced off the volume/);
    const { reply } = await a.call('waitforattach', ['', json]);
    assert.equal(reply.status, 'Failure');
    assert.match(reply.message ?? '', /attached to node node-b|AttachedElsewhere|node-b/);
    assert.equal(await a.fake.backend.findDevice('pv-1'), undefined, 'the stale device went');
    assert.ok((await cluster.mustDoc('pv-1')).status.fences?.['node-a']?.clearedAt);
  });

  it('nothing is cleared while the fence is not yet in place', async () => {
    const { cluster, a, fencer, globalPath } = await movingVolume();
    fencer.failNext = true;
    await assert.rejects(fenceNodeOffVolume(a.context(), fencer, 'pv-1', 'node-a', 'test'));
    await a.fake.system.umount(globalPath);
    await clearOwnFence(a.context(), 'pv-1', await cluster.mustDoc('pv-1'));
    const doc = await cluster.mustDoc('pv-1');
    assert.equal(doc.status.fences?.['node-a']?.clearedAt, undefined);
    assert.equal(doc.status.nodes['node-a']?.phase, 'attached');
  });
});

describe('who may fence', () => {
  const base = { nodeName: 'admin', stateDir: '/tmp/x', poolDir: '/tmp/y', logFile: '/tmp/z.log' };

  it('refuses on the loop backend, which has no shared storage to fence', async () => {
    await assert.rejects(requireFencer(parseConfig(base, 'test')), /no shared storage to fence/);
  });

  it('refuses a configuration without a fencer identity, saying which field is missing', async () => {
    const config = parseConfig({ ...base, backend: { type: 'rbd', pool: 'latch' } }, 'node.json');
    await assert.rejects(requireFencer(config), /node\.json has no fencer identity \(backend\.fencer/);
  });

  it('builds the fencer from backend.fencer', async () => {
    const config = parseConfig(
      { ...base, backend: { type: 'rbd', pool: 'latch', fencer: { clientId: 'latch-fencer', keyring: '/etc/ceph/f.keyring' } } },
      'admin.json',
    );
    assert.equal((await requireFencer(config)).kind, "the Ceph cluster's OSD blocklist");
  });
});

describe('what the rbd fencer accepts as a client instance', () => {
  it('only single instances with a non-zero nonce: never a whole host or a range', () => {
    for (const ok of ['127.0.0.1:0/1523556124', '10.1.2.3:6800/42', '[fd00::1]:0/7']) assert.ok(isClientInstance(ok), ok);
    for (const bad of ['127.0.0.1:0/0', '127.0.0.1', '127.0.0.1:0', 'cidr:127.0.0.0/30', '127.0.0.1:0/1 --yes', '-h', '']) {
      assert.equal(isClientInstance(bad), false, bad);
    }
  });
});
