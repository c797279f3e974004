// Tenancy (docs/operations.md, "Tenancy"): what a pod author can reach through the options of a driver call. An alias
// (PV name -> volume) is never redirected; a volume is used only through the PV it was created for, unless an admin
// allowed another PV name or namespace; lazy creation can be switched off and has a per-namespace quota. Run as the
// protocol layer does, on fake nodes sharing an in-memory ledger (test/fixtures/op-harness.ts).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { accessRefusal, changeAllowed, namespaceUsage } from '../../src/ledger/access.js';
import { newVolume } from '../../src/ledger/arbitrate.js';
import { ticketId } from '../../src/ledger/ids.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { Cluster, GiB, podOptions, pvOptions, succeeded, type TestNode } from '../fixtures/op-harness.js';

const idOf = (pv: string, node: string) => ticketId('workload', pv, 'latch/loop', node);

function refused(result: { reply: { status: string; message?: string } }, pattern: RegExp): void {
  assert.equal(result.reply.status, 'Failure', JSON.stringify(result.reply));
  assert.match(result.reply.message ?? '', pattern);
}

/** kubelet's mount in non-attach mode for pod `uid` of `namespace`. */
function mountPod(node: TestNode, uid: string, pv: string, namespace: string, user: Record<string, string> = {}) {
  return node.call('mount', [node.podDir(uid, pv), podOptions(pv, { uid, namespace }, user)]);
}

describe('an alias is never redirected', () => {
  it("refuses an inline volume named like a PV with an alias, whose volume option names another volume: the PV's alias stays", async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    succeeded(await cp.call('attach', [pvOptions('pv-db', { volume: 'db-data' }), 'node-a']));
    assert.deepEqual(cluster.store.peek('pvs/pv-db'), { volume: 'db-data' });

    // The attacker's pod: an inline flexVolume named pv-db, with volume: attacker-vol.
    const attack = pvOptions('pv-db', { volume: 'attacker-vol' });
    refused(
      await cp.call('attach', [attack, 'node-b']),
      /PV name pv-db already stands for volume db-data; latch never points it at volume attacker-vol/,
    );
    assert.deepEqual(cluster.store.peek('pvs/pv-db'), { volume: 'db-data' }, 'the alias is unchanged');
    assert.equal(await cluster.doc('attacker-vol'), undefined, 'no volume was made for the attacker');

    // The PV's next calls still reach its own volume.
    assert.equal(await cluster.ledger.volumeOfPv('pv-db'), 'db-data');
    const { log } = succeededWithLog(await cp.call('detach', ['pv-db', 'node-a']));
    assert.equal(log.volume, 'db-data');
  });

  it('refuses to make a PV name that names a volume of its own stand for another volume', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    succeeded(await cp.call('attach', [pvOptions('pv-web'), 'node-a'])); // volume pv-web, no alias
    refused(
      await cp.call('attach', [pvOptions('pv-web', { volume: 'attacker-vol' }), 'node-b']),
      /PV name pv-web is the name of volume pv-web/,
    );
    assert.equal(cluster.store.peek('pvs/pv-web'), undefined, 'no alias was written');
    assert.equal(await cluster.ledger.volumeOfPv('pv-web'), 'pv-web');
  });

  it('an admin removes an alias (latch volume unlink) once no ticket was asked for through it; then the PV may name another volume', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    succeeded(await cp.call('attach', [pvOptions('pv-db', { volume: 'db-data' }), 'node-a']));
    await assert.rejects(cluster.ledger.unlinkPv('pv-db'), /leads to volume db-data, which has 1 ticket\(s\) asked for through it/);
    assert.deepEqual(cluster.store.peek('pvs/pv-db'), { volume: 'db-data' });
    succeeded(await cp.call('detach', ['pv-db', 'node-a']));
    assert.equal(await cluster.ledger.unlinkPv('pv-db'), 'db-data');
    assert.equal(await cluster.ledger.unlinkPv('pv-db'), undefined, 'again: nothing to do');
    succeeded(await cp.call('attach', [pvOptions('pv-db', { volume: 'db-restored' }), 'node-a']));
    assert.deepEqual(cluster.store.peek('pvs/pv-db'), { volume: 'db-restored' });
  });

  it('Ledger.linkPv: the same alias again is fine; another target is refused with the ledger unchanged', async () => {
    const cluster = new Cluster();
    await cluster.ledger.linkPv('pv-1', 'data');
    await cluster.ledger.linkPv('pv-1', 'data');
    const writes = cluster.store.writes.length;
    await assert.rejects(cluster.ledger.linkPv('pv-1', 'other'), /already stands for volume data/);
    assert.equal(cluster.store.writes.length, writes);
    assert.deepEqual(cluster.store.peek('pvs/pv-1'), { volume: 'data' });
  });
});

describe('a volume is used through its own PV only, unless an admin allows more', () => {
  it('records the PV a call created it for', async () => {
    const cluster = new Cluster();
    succeeded(await cluster.node('cp').call('attach', [pvOptions('pv-1', { volume: 'data' }), 'node-a']));
    assert.deepEqual((await cluster.mustDoc('data')).spec.pv, { name: 'pv-1' }, 'attach carries no namespace');
  });

  it('refuses a volume named through another PV (or inline volume) until the admin allows that PV name', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    succeeded(await cp.call('attach', [pvOptions('pv-1', { volume: 'data' }), 'node-a']));
    const before = await cluster.mustDoc('data');

    const other = pvOptions('pv-other', { volume: 'data' });
    refused(
      await cp.call('attach', [other, 'node-b']),
      /volume data was created for PV pv-1; PV or inline volume pv-other may not use it .*latch volume allow data --pv pv-other/,
    );
    assert.deepEqual(await cluster.mustDoc('data'), before, 'no ticket was added');
    assert.equal(cluster.store.peek('pvs/pv-other'), undefined, 'no alias was written');

    await cluster.ledger.allowVolume('data', { pvs: ['pv-other'] });
    succeeded(await cp.call('detach', ['pv-1', 'node-a']));
    succeeded(await cp.call('attach', [other, 'node-b']));
    assert.deepEqual(cluster.store.peek('pvs/pv-other'), { volume: 'data' });
    assert.ok((await cluster.mustDoc('data')).spec.tickets[idOf('pv-other', 'node-b')]);

    // Taken back: refused again.
    await cluster.ledger.allowVolume('data', { pvs: ['pv-other'] }, true);
    assert.equal((await cluster.mustDoc('data')).spec.allowed, undefined);
    refused(await cp.call('attach', [other, 'node-c']), /may not use it/);
  });

  it('refuses the forged node calls too: waitforattach and mountdevice through another PV name', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    const nodeA = cluster.node('node-a');
    const json = pvOptions('pv-1', { volume: 'data' });
    succeeded(await cp.call('attach', [json, 'node-a']));
    const { device } = succeeded(await nodeA.call('waitforattach', ['', json]));
    const forged = pvOptions('pv-evil', { volume: 'data' });
    refused(await nodeA.call('waitforattach', ['', forged]), /PV or inline volume pv-evil may not use it/);
    refused(await nodeA.call('mountdevice', [nodeA.globalPath('pv-evil'), device ?? '', forged]), /pv-evil may not use it/);
    assert.equal(nodeA.fake.topAt(nodeA.globalPath('pv-evil')), undefined, 'nothing was mounted');
    succeeded(await nodeA.call('mountdevice', [nodeA.globalPath('pv-1'), device ?? '', json]));
    const pod = nodeA.podDir('uid-1', 'pv-evil');
    refused(await nodeA.call('expandfs', [forged, device ?? '', pod, String(2 * GiB), String(GiB)]), /pv-evil may not use it/);
    assert.equal((await cluster.mustDoc('data')).spec.sizeBytes, GiB, 'nothing was grown');
  });

  it("refuses an inline volume named like another namespace's PV (non-attach mount), until the admin allows the namespace", async () => {
    const cluster = new Cluster({ config: { attach: false } });
    const nodeA = cluster.node('node-a');
    succeeded(await mountPod(nodeA, 'uid-1', 'pv-shop', 'shop'));
    assert.deepEqual((await cluster.mustDoc('pv-shop')).spec.pv, { name: 'pv-shop', namespace: 'shop' });
    const before = await cluster.mustDoc('pv-shop');

    // A pod in namespace evil with an inline volume named pv-shop.
    refused(
      await mountPod(nodeA, 'uid-2', 'pv-shop', 'evil'),
      /volume pv-shop was created for a pod in namespace shop; a pod in namespace evil may not use it .*--namespace evil/,
    );
    assert.deepEqual(await cluster.mustDoc('pv-shop'), before, 'no ticket was added');
    assert.equal(nodeA.fake.topAt(nodeA.podDir('uid-2', 'pv-shop')), undefined, 'nothing was mounted in its pod dir');

    // Another pod of the same namespace is fine; so is namespace evil once allowed (through any PV name).
    succeeded(await mountPod(nodeA, 'uid-3', 'pv-shop', 'shop'));
    await cluster.ledger.allowVolume('pv-shop', { namespaces: ['evil'] });
    succeeded(await mountPod(nodeA, 'uid-2', 'pv-shop', 'evil'));
    succeeded(await mountPod(nodeA, 'uid-4', 'inline-x', 'evil', { volume: 'pv-shop' }));
  });

  it("attach ignores a namespace in its options: kubelet never sends one there, so it is the pod author's", async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    succeeded(await cp.call('attach', [pvOptions('pv-1', { volume: 'data' }), 'node-a']));
    await cluster.ledger.allowVolume('data', { namespaces: ['shop'] });
    const forged = pvOptions('pv-evil', { volume: 'data', 'kubernetes.io/pod.namespace': 'shop' });
    refused(await cp.call('attach', [forged, 'node-a']), /PV or inline volume pv-evil may not use it/);
    assert.deepEqual((await cluster.mustDoc('data')).spec.pv, { name: 'pv-1' }, 'nor is it recorded');
  });

  it('expandfs in non-attach mode works through a PV a namespace entry allowed: its mount left a ticket on the node', async () => {
    const cluster = new Cluster({ config: { attach: false } });
    const nodeA = cluster.node('node-a');
    succeeded(await mountPod(nodeA, 'uid-1', 'pv-shop', 'shop'));
    await cluster.ledger.allowVolume('pv-shop', { namespaces: ['blog'] });
    succeeded(await mountPod(nodeA, 'uid-2', 'inline-b', 'blog', { volume: 'pv-shop' }));
    const pod = nodeA.podDir('uid-2', 'inline-b');
    const grow = (pv: string) => nodeA.call('expandfs', [pvOptions(pv, { volume: 'pv-shop' }), '', pod, String(2 * GiB), String(GiB)]);
    refused(await grow('inline-c'), /inline-c may not use it/);
    const { reply } = await grow('inline-b');
    assert.equal(reply.status, 'Success', JSON.stringify(reply));
  });
});

describe('volumes without a recorded PV (older documents, admin-made volumes)', () => {
  const legacy = (): VolumeDoc => newVolume('data', GiB, 'ext4', '2026-01-01T00:00:00.000Z');

  it('belong to the PV named like them and to PVs whose alias already leads to them', () => {
    assert.equal(accessRefusal(legacy(), { pvName: 'data' }), undefined);
    assert.equal(accessRefusal(legacy(), { pvName: 'pv-1', aliasLeadsHere: true }), undefined);
    assert.match(accessRefusal(legacy(), { pvName: 'pv-1' }) ?? '', /has no PV of its own \(only a PV named data may use it\)/);
    assert.equal(accessRefusal(legacy(), { pvName: 'pv-1', namespace: 'any' }) === undefined, false, 'no namespace of its own: refused');
  });

  it('an older alias keeps working through the driver; a new PV name needs an allow entry', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    await cluster.store.put('volumes/data', legacy(), 0);
    await cluster.store.put('pvs/pv-1', { volume: 'data' }, 0);
    // A restarted kubelet's call carries no user options: the alias leads to data.
    succeeded(await cp.call('attach', [pvOptions('pv-1'), 'node-a']));
    refused(await cp.call('attach', [pvOptions('pv-2', { volume: 'data' }), 'node-b']), /has no PV of its own/);
    assert.equal((await cluster.mustDoc('data')).spec.pv, undefined, 'the document is not rewritten to claim an owner');
  });

  it('an allow list that is not a list of names (a document another writer got wrong) allows nothing', () => {
    const odd = { ...legacy(), spec: { ...legacy().spec, allowed: { pvs: 'pv-1,pv-2', namespaces: [7] } } } as unknown as VolumeDoc;
    assert.match(accessRefusal(odd, { pvName: 'pv-1' }) ?? '', /may not use it/);
    assert.match(accessRefusal(odd, { pvName: 'pv-1', namespace: '7' }) ?? '', /may not use it/);
  });

  it('changeAllowed keeps its lists sorted and unique, and namespaceUsage counts what was created for a namespace', () => {
    let doc = changeAllowed(legacy(), { pvs: ['b', 'a', 'b'], namespaces: ['n'] }, false);
    assert.deepEqual(doc.spec.allowed, { pvs: ['a', 'b'], namespaces: ['n'] });
    doc = changeAllowed(doc, { namespaces: ['n'] }, true);
    assert.deepEqual(doc.spec.allowed, { pvs: ['a', 'b'] });
    const mine = { ...legacy(), spec: { ...legacy().spec, pv: { name: 'p', namespace: 'n' } } };
    assert.deepEqual(namespaceUsage([mine, legacy(), mine], 'n'), { volumes: 2, bytes: 2 * GiB });
  });
});

describe('lazy creation', () => {
  it('lazyCreate: false refuses to create a volume on attach; one an admin made is used', async () => {
    const cluster = new Cluster({ config: { lazyCreate: false } });
    const cp = cluster.node('cp');
    refused(
      await cp.call('attach', [pvOptions('pv-1'), 'node-a']),
      /volume pv-1 does not exist, and volumes are not created on first use here \(lazyCreate: false\).*latch volume create pv-1/,
    );
    assert.equal(await cluster.doc('pv-1'), undefined);
    assert.deepEqual(cluster.store.writes, []);

    await cluster.ledger.createVolume('pv-1', { sizeBytes: GiB, fsType: 'ext4' });
    succeeded(await cp.call('attach', [pvOptions('pv-1'), 'node-a']));
  });

  it('lazyCreate: false refuses a non-attach mount of a missing volume too, leaving nothing', async () => {
    const cluster = new Cluster({ config: { attach: false, lazyCreate: false } });
    const node = cluster.node('node-a');
    refused(await mountPod(node, 'uid-1', 'pv-1', 'shop'), /lazyCreate: false/);
    assert.deepEqual(cluster.store.writes, []);
    assert.deepEqual(node.fake.calls, []);
  });

  it("namespaceQuota.volumes: a namespace's pods create at most that many volumes; other namespaces count their own", async () => {
    const cluster = new Cluster({ config: { attach: false, namespaceQuota: { volumes: 1 } } });
    const node = cluster.node('node-a');
    succeeded(await mountPod(node, 'uid-1', 'pv-1', 'shop'));
    refused(
      await mountPod(node, 'uid-2', 'pv-2', 'shop'),
      /volume pv-2 is not created: namespace shop has 1 volume\(s\) created for its pods, and its quota \(namespaceQuota.volumes\) is 1/,
    );
    assert.equal(await cluster.doc('pv-2'), undefined);
    succeeded(await mountPod(node, 'uid-3', 'pv-3', 'blog'));
    succeeded(await mountPod(node, 'uid-4', 'pv-1', 'shop')); // an existing volume is not counted again
  });

  it('namespaceQuota.bytes: the sizes of the volumes created for the namespace, plus the new one', async () => {
    const cluster = new Cluster({ config: { attach: false, namespaceQuota: { bytes: '3Gi' } } });
    const node = cluster.node('node-a');
    succeeded(await mountPod(node, 'uid-1', 'pv-1', 'shop', { size: '2Gi' }));
    refused(
      await mountPod(node, 'uid-2', 'pv-2', 'shop', { size: '2Gi' }),
      /namespace shop has 2Gi in volumes .*namespaceQuota.bytes\) is 3Gi/,
    );
    succeeded(await mountPod(node, 'uid-3', 'pv-3', 'shop', { size: '1Gi' }));
  });

  it('the configuration refuses a malformed quota, and a namespace that is not a namespace name is refused', async () => {
    assert.throws(() => new Cluster({ config: { namespaceQuota: { volumes: -1 } } }).node('n'), /namespaceQuota.volumes/);
    assert.throws(() => new Cluster({ config: { namespaceQuota: { pods: 1 } } }).node('n'), /namespaceQuota.*unknown field/);
    const node = new Cluster({ config: { attach: false } }).node('node-a');
    refused(await mountPod(node, 'uid-1', 'pv-1', 'Bad_NS'), /option "kubernetes.io\/pod.namespace" "Bad_NS" is not a namespace name/);
  });
});

function succeededWithLog<T extends { reply: { status: string } }>(result: T): T {
  assert.equal(result.reply.status, 'Success', JSON.stringify(result.reply));
  return result;
}
