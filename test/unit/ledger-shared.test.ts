// The arbitration of shared (ReadWriteMany) volumes (src/ledger/shared.ts, through reconcile in arbitrate.ts): every
// node that asks gets the volume read-write at once, one node entry per node; admin, restore and clone-target tickets
// wait for every holder to leave and then keep it alone; fenced nodes are never granted; block volumes are unchanged.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  addTicket,
  beginFence,
  completeFence,
  isSatisfied,
  markAttached,
  markAttaching,
  markReleased,
  newVolume,
  removeTicket,
  type TicketRequest,
} from '../../src/ledger/arbitrate.js';
import type { TicketType, VolumeDoc } from '../../src/ledger/types.js';

const T = '2026-11-27T00:00:00.000Z';
const shared = (): VolumeDoc => {
  const doc = newVolume('s1', 1 << 30, 'ext4', T);
  return { ...doc, spec: { ...doc.spec, shared: true } };
};
const req = (id: string, nodeID: string, type: TicketType = 'workload', readOnly = false): TicketRequest => ({
  id,
  type,
  nodeID,
  parameters: { readOnly },
  requestedBy: {},
});
const settle = (doc: VolumeDoc, node: string): VolumeDoc => {
  const attaching = markAttaching(doc, node, T);
  assert.ok(attaching, `${node} may attach`);
  const attached = markAttached(attaching, node, '/latch/shared/s1', T);
  assert.ok(attached, `${node} has it`);
  return attached;
};

describe('shared volumes: arbitration', () => {
  it("records the node's entity at its claim, where no client is yet, and the instance after its mount", () => {
    let doc = addTicket(shared(), req('w-a', 'node-a'), T);
    const claimed = markAttaching(doc, 'node-a', T, 'entity:latch-node-a');
    assert.ok(claimed);
    assert.equal(claimed.status.nodes['node-a']?.phase, 'attaching');
    assert.equal(claimed.status.nodes['node-a']?.client, 'entity:latch-node-a');
    // A repeat of the claim (a call killed and repeated) changes nothing; one with another name keeps the first.
    assert.equal(markAttaching(claimed, 'node-a', T, 'entity:latch-node-a'), claimed);
    assert.equal(markAttaching(claimed, 'node-a', T, 'entity:other'), claimed);
    doc = markAttached(claimed, 'node-a', '/latch/shared/s1', T, 'entity:latch-node-a@10.0.0.1:0/42') as VolumeDoc;
    assert.equal(doc.status.nodes['node-a']?.client, 'entity:latch-node-a@10.0.0.1:0/42');
    // A later claim (mountdevice after waitforattach) never overwrites the instance with the bare entity.
    assert.equal(markAttaching(doc, 'node-a', T, 'entity:latch-node-a'), doc);
    // An attaching entry without a client (a call of an older latch, killed) gets the entity.
    const bare = markAttaching(addTicket(shared(), req('w-b', 'node-b'), T), 'node-b', T) as VolumeDoc;
    assert.equal(bare.status.nodes['node-b']?.client, undefined);
    assert.equal(markAttaching(bare, 'node-b', T, 'entity:latch-node-b')?.status.nodes['node-b']?.client, 'entity:latch-node-b');
  });

  it('grants three nodes read-write at once, one entry per node whatever its number of pods', () => {
    let doc = shared();
    for (const [id, node] of [
      ['w-a', 'node-a'],
      ['w-b', 'node-b'],
      ['w-c', 'node-c'],
      ['w-c2', 'node-c'],
    ] as const) {
      doc = addTicket(doc, req(id, node), T);
    }
    for (const id of ['w-a', 'w-b', 'w-c', 'w-c2']) assert.equal(isSatisfied(doc, id), true, id);
    assert.deepEqual(Object.keys(doc.status.nodes).sort(), ['node-a', 'node-b', 'node-c']);
    assert.ok(Object.values(doc.status.nodes).every((n) => !n.readOnly));
    doc = settle(settle(settle(doc, 'node-a'), 'node-b'), 'node-c');
    assert.equal(doc.status.state, 'attached');
    assert.deepEqual(doc.status.currentNodes, ['node-a', 'node-b', 'node-c']);
    // One node leaving does not disturb the others.
    doc = markReleased(removeTicket(doc, 'w-b', T), 'node-b', T);
    assert.deepEqual(doc.status.currentNodes, ['node-a', 'node-c']);
    assert.equal(isSatisfied(doc, 'w-a'), true);
  });

  it('the same tickets on a block volume still grant one node only', () => {
    let doc = newVolume('b1', 1 << 30, 'ext4', T);
    doc = addTicket(addTicket(doc, req('w-a', 'node-a'), T), req('w-b', 'node-b'), T);
    assert.equal(isSatisfied(doc, 'w-a'), true);
    assert.equal(isSatisfied(doc, 'w-b'), false);
    assert.equal(doc.status.tickets['w-b']?.reason, 'AttachedElsewhere');
  });

  for (const type of ['admin', 'restore'] as const) {
    it(`an ${type} ticket waits for every holder to leave, blocks new joins meanwhile, then has the volume alone`, () => {
      let doc = shared();
      doc = settle(addTicket(doc, req('w-a', 'node-a'), T), 'node-a');
      doc = settle(addTicket(doc, req('w-b', 'node-b'), T), 'node-b');
      doc = addTicket(doc, req('x', 'node-x', type), T);
      assert.equal(isSatisfied(doc, 'x'), false);
      // A new workload while it waits is not granted (the exclusive ticket is not starved).
      doc = addTicket(doc, req('w-c', 'node-c'), T);
      assert.equal(isSatisfied(doc, 'w-c'), false);
      doc = markReleased(removeTicket(doc, 'w-a', T), 'node-a', T);
      assert.equal(isSatisfied(doc, 'x'), false, 'node-b still holds it');
      doc = markReleased(removeTicket(doc, 'w-b', T), 'node-b', T);
      assert.equal(isSatisfied(doc, 'x'), true);
      assert.equal(isSatisfied(doc, 'w-c'), false, 'nobody joins while it holds the volume alone');
      doc = settle(doc, 'node-x');
      doc = markReleased(removeTicket(doc, 'x', T), 'node-x', T);
      assert.equal(isSatisfied(doc, 'w-c'), true);
    });
  }

  for (const kind of ['shared', 'block'] as const) {
    it(`a pod's ticket on the node that runs a restore or fills a clone target waits until that ticket is gone (${kind} volume)`, () => {
      const fillers: TicketRequest[] = [
        { ...req('r', 'node-a', 'restore'), job: { kind: 'restore', backup: 'b1' } },
        { ...req('ct', 'node-a', 'clone'), job: { kind: 'clone', role: 'target', source: 's0', target: 's1' } },
      ];
      for (const filler of fillers) {
        const fresh = kind === 'shared' ? shared() : newVolume('s1', 1 << 30, 'ext4', T);
        let doc = settle(addTicket(fresh, filler, T), 'node-a');
        doc = addTicket(doc, req('w-a', 'node-a'), T);
        assert.equal(isSatisfied(doc, filler.id), true, filler.type);
        assert.equal(isSatisfied(doc, 'w-a'), false, `${filler.type}: the half-made volume is nobody's through its grant`);
        assert.match(
          doc.status.tickets['w-a']?.message ?? '',
          new RegExp(`being filled by a ${filler.type} job \\(ticket ${filler.id}\\)`),
        );
        doc = removeTicket(doc, filler.id, T);
        assert.equal(isSatisfied(doc, 'w-a'), true, `${filler.type}: granted once it is done`);
      }
      // A pod's ticket that had the volume keeps it when such a ticket of its node comes later (a person's reservation).
      let doc = settle(addTicket(kind === 'shared' ? shared() : newVolume('s1', 1 << 30, 'ext4', T), req('w-a', 'node-a'), T), 'node-a');
      doc = addTicket(doc, req('r', 'node-a', 'restore'), T);
      assert.equal(isSatisfied(doc, 'w-a'), true);
    });
  }

  it('a clone target waits too; a clone source, a snapshot and a backup share', () => {
    let doc = settle(addTicket(shared(), req('w-a', 'node-a'), T), 'node-a');
    const source = {
      ...req('cs', 'node-b', 'clone'),
      job: { kind: 'clone' as const, role: 'source' as const, source: 's1', target: 's2' },
    };
    doc = addTicket(doc, source, T);
    doc = addTicket(doc, req('snap', 'node-c', 'snapshot'), T);
    assert.equal(isSatisfied(doc, 'cs'), true);
    assert.equal(isSatisfied(doc, 'snap'), true);
    const target = {
      ...req('ct', 'node-d', 'clone'),
      job: { kind: 'clone' as const, role: 'target' as const, source: 's0', target: 's1' },
    };
    doc = addTicket(doc, target, T);
    assert.equal(isSatisfied(doc, 'ct'), false);
  });

  it('a read-only ticket gets a read-only entry, beside read-write ones', () => {
    let doc = addTicket(shared(), req('w-a', 'node-a'), T);
    doc = addTicket(doc, req('r-b', 'node-b', 'workload', true), T);
    assert.equal(doc.status.nodes['node-b']?.readOnly, true);
    assert.equal(doc.status.nodes['node-a']?.readOnly, false);
    assert.equal(isSatisfied(doc, 'r-b'), true);
  });

  it('a fenced node is not granted it again until it cleared its old mount; the others keep it', () => {
    let doc = settle(addTicket(shared(), req('w-a', 'node-a'), T), 'node-a');
    doc = settle(addTicket(doc, req('w-b', 'node-b'), T), 'node-b');
    doc = beginFence(doc, 'node-a', 'test', ['127.0.0.1:0/1'], T);
    const fenced = completeFence(doc, 'node-a', ['127.0.0.1:0/1'], T);
    assert.ok(fenced);
    assert.equal(fenced.status.nodes['node-a'], undefined);
    assert.equal(isSatisfied(fenced, 'w-b'), true);
    const again = addTicket(fenced, req('w-a', 'node-a'), T);
    assert.equal(isSatisfied(again, 'w-a'), false);
    assert.equal(again.status.tickets['w-a']?.reason, 'Fenced');
  });

  it('an admin ticket on a node that already shares the volume waits until the other nodes have left', () => {
    let doc = settle(addTicket(shared(), req('w-a', 'node-a'), T), 'node-a');
    doc = settle(addTicket(doc, req('w-b', 'node-b'), T), 'node-b');
    doc = addTicket(doc, req('adm', 'node-a', 'admin'), T);
    assert.equal(isSatisfied(doc, 'adm'), false);
    assert.match(doc.status.tickets['adm']?.message ?? '', /needs shared volume s1 alone: waiting for node node-b to leave it/);
    doc = markReleased(removeTicket(doc, 'w-b', T), 'node-b', T);
    assert.equal(isSatisfied(doc, 'adm'), true);
  });
});
