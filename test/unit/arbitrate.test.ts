import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, it } from 'node:test';
import {
  addTicket,
  isSatisfied,
  markAttached,
  markAttaching,
  markReleased,
  newVolume,
  reconcile,
  releaseDeadNode,
  removeTicket,
  type TicketRequest,
} from '../../src/ledger/arbitrate.js';
import { ticketId } from '../../src/ledger/ids.js';
import type { TicketType, VolumeDoc } from '../../src/ledger/types.js';

const T = '2026-11-22T00:00:00.000Z';
const vol = () => newVolume('v1', 1 << 30, 'ext4', T);
const req = (id: string, nodeID: string, type: TicketType = 'workload', readOnly = false): TicketRequest => ({
  id,
  type,
  nodeID,
  parameters: { readOnly },
  requestedBy: {},
});
/** Takes a node all the way to "has the device". */
const settle = (doc: VolumeDoc, node: string): VolumeDoc => {
  const attaching = markAttaching(doc, node, T);
  assert.ok(attaching, `${node} may attach`);
  const attached = markAttached(attaching, node, '/dev/loop9', T);
  assert.ok(attached, `${node} has the device`);
  return attached;
};

describe('arbitration', () => {
  it('a single ticket attaches', () => {
    const doc = addTicket(vol(), req('workload-a', 'node-a'), T);
    assert.equal(isSatisfied(doc, 'workload-a'), true);
    assert.equal(doc.status.nodes['node-a']?.phase, 'granted');
    assert.equal(doc.status.state, 'attaching');
    const attached = settle(doc, 'node-a');
    assert.equal(attached.status.state, 'attached');
    assert.deepEqual(attached.status.currentNodes, ['node-a']);
  });

  it('on a detached volume the higher priority wins', () => {
    // Both tickets land before reconcile picks (as after a release with both waiting).
    let doc = settle(addTicket(vol(), req('workload-x', 'node-x'), T), 'node-x');
    doc = addTicket(doc, req('workload-b', 'node-b'), T);
    doc = addTicket(doc, req('admin-c', 'node-c', 'admin'), T);
    doc = removeTicket(doc, 'workload-x', T);
    doc = markReleased(doc, 'node-x', T);
    assert.equal(isSatisfied(doc, 'admin-c'), true);
    assert.equal(isSatisfied(doc, 'workload-b'), false);
    assert.equal(doc.status.tickets['workload-b']?.reason, 'AttachedElsewhere');
  });

  it('equal priority picks the smallest ID, every run, whatever the order of arrival', () => {
    for (const order of [
      ['workload-b', 'workload-a', 'workload-c'],
      ['workload-c', 'workload-b', 'workload-a'],
    ]) {
      let doc = settle(addTicket(vol(), req('workload-z', 'node-z'), T), 'node-z');
      for (const id of order) doc = addTicket(doc, req(id, `node-${id.slice(-1)}`), T);
      doc = markReleased(removeTicket(doc, 'workload-z', T), 'node-z', T);
      assert.deepEqual(Object.keys(doc.status.nodes), ['node-a'], `order ${order.join(',')}`);
    }
  });

  it('a read-write-once ticket for B while A holds the volume stays unsatisfied, naming A', () => {
    let doc = settle(addTicket(vol(), req('workload-a', 'node-a'), T), 'node-a');
    doc = addTicket(doc, req('workload-b', 'node-b'), T);
    assert.equal(isSatisfied(doc, 'workload-b'), false);
    assert.equal(doc.status.tickets['workload-b']?.reason, 'AttachedElsewhere');
    assert.match(doc.status.tickets['workload-b'].message, /attached to node node-a \(ticket workload-a\)/);
    assert.equal(doc.status.nodes['node-b'], undefined);
  });

  it('a higher-priority maintenance or admin ticket never preempts a workload', () => {
    let doc = addTicket(vol(), req('workload-a', 'node-a'), T); // granted, not yet set up
    doc = addTicket(doc, req('admin-b', 'node-b', 'admin'), T);
    doc = addTicket(doc, req('restore-c', 'node-c', 'restore'), T);
    assert.equal(isSatisfied(doc, 'workload-a'), true);
    assert.equal(isSatisfied(doc, 'admin-b'), false);
    assert.equal(isSatisfied(doc, 'restore-c'), false);
  });

  it('the same ticket again is a no-op: same generation, still satisfied', () => {
    const once = settle(addTicket(vol(), req('workload-a', 'node-a'), T), 'node-a');
    const twice = addTicket(once, req('workload-a', 'node-a'), T);
    assert.deepEqual(twice, once);
  });

  it('the same ID for a new node bumps the generation and clears satisfied', () => {
    let doc = settle(addTicket(vol(), req('admin-1', 'node-a', 'admin'), T), 'node-a');
    const before = doc.spec.tickets['admin-1']!.generation;
    doc = addTicket(doc, req('admin-1', 'node-b', 'admin'), T);
    assert.ok(doc.spec.tickets['admin-1']!.generation > before);
    assert.equal(isSatisfied(doc, 'admin-1'), false);
    assert.equal(doc.status.nodes['node-a']?.phase, 'detaching', 'node-a still has the device');
  });

  it('a deleted and re-created ticket does not inherit satisfied', () => {
    let doc = settle(addTicket(vol(), req('workload-a', 'node-a'), T), 'node-a');
    const oldStatus = doc.status.tickets['workload-a'];
    assert.ok(oldStatus);
    doc = removeTicket(doc, 'workload-a', T);
    doc = addTicket(doc, req('workload-b', 'node-b'), T);
    doc = addTicket(doc, req('workload-a', 'node-a'), T);
    // Forge the stale status back in: it must not count for the new generation.
    const forged = structuredClone(doc);
    forged.status.tickets['workload-a'] = oldStatus;
    assert.equal(isSatisfied(forged, 'workload-a'), false);
    assert.ok(doc.spec.tickets['workload-a']!.generation > oldStatus.generation);
  });

  it('removing an unknown ticket changes nothing', () => {
    const doc = settle(addTicket(vol(), req('workload-a', 'node-a'), T), 'node-a');
    assert.equal(removeTicket(doc, 'workload-nope', T), doc);
  });

  it("removing a node's last ticket leaves the volume detaching until that node confirms release", () => {
    let doc = settle(addTicket(vol(), req('workload-a', 'node-a'), T), 'node-a');
    doc = addTicket(doc, req('workload-b', 'node-b'), T);
    doc = removeTicket(doc, 'workload-a', T); // the controller's (force-)detach
    assert.equal(doc.status.state, 'detaching');
    assert.equal(isSatisfied(doc, 'workload-b'), false);
    assert.equal(doc.status.tickets['workload-b']?.reason, 'Detaching');
    assert.match(doc.status.tickets['workload-b'].message, /--node node-a --node-is-down/);
    doc = markReleased(doc, 'node-a', T);
    assert.equal(isSatisfied(doc, 'workload-b'), true);
    assert.deepEqual(Object.keys(doc.status.nodes), ['node-b']);
  });

  it('a granted node that never touched the device gives it up at once when its ticket goes', () => {
    let doc = addTicket(vol(), req('workload-a', 'node-a'), T);
    doc = addTicket(doc, req('workload-b', 'node-b'), T);
    doc = removeTicket(doc, 'workload-a', T);
    assert.equal(isSatisfied(doc, 'workload-b'), true);
  });

  it('a node refused when it was not granted: markAttaching and markAttached say no', () => {
    let doc = settle(addTicket(vol(), req('workload-a', 'node-a'), T), 'node-a');
    doc = addTicket(doc, req('workload-b', 'node-b'), T);
    assert.equal(markAttaching(doc, 'node-b', T), undefined);
    assert.equal(markAttached(doc, 'node-b', '/dev/loop1', T), undefined);
  });

  it('the admin fence drops a dead node and its tickets, and the next ticket is granted', () => {
    let doc = settle(addTicket(vol(), req('workload-a', 'node-a'), T), 'node-a');
    doc = addTicket(doc, req('workload-b', 'node-b'), T);
    doc = releaseDeadNode(doc, 'node-a', T);
    assert.equal(doc.spec.tickets['workload-a'], undefined);
    assert.equal(isSatisfied(doc, 'workload-b'), true);
  });

  it('read-only-many: every ticket read-only attaches on several nodes; a read-write one waits', () => {
    let doc = addTicket(vol(), req('workload-a', 'node-a', 'workload', true), T);
    doc = settle(doc, 'node-a');
    doc = addTicket(doc, req('workload-b', 'node-b', 'workload', true), T);
    assert.equal(isSatisfied(doc, 'workload-a'), true);
    assert.equal(isSatisfied(doc, 'workload-b'), true);
    doc = addTicket(doc, req('workload-c', 'node-c'), T);
    assert.equal(isSatisfied(doc, 'workload-c'), false);
    assert.equal(doc.status.tickets['workload-c']?.reason, 'AttachedElsewhere');
  });

  it('read-write wanted where the node holds the volume read-only: unsatisfied with a reason', () => {
    let doc = settle(addTicket(vol(), req('workload-a', 'node-a', 'workload', true), T), 'node-a');
    doc = addTicket(doc, req('admin-a', 'node-a', 'admin', false), T);
    assert.equal(isSatisfied(doc, 'admin-a'), false);
    assert.equal(doc.status.tickets['admin-a']?.reason, 'ReadOnlyAttachment');
  });

  it('release keeps the grant while the node still has tickets (pod restart on the same node)', () => {
    let doc = settle(addTicket(vol(), req('workload-a', 'node-a'), T), 'node-a');
    doc = markReleased(doc, 'node-a', T);
    assert.equal(doc.status.nodes['node-a']?.phase, 'granted');
    assert.equal(isSatisfied(doc, 'workload-a'), true);
  });

  it('reconcile is idempotent', () => {
    let doc = settle(addTicket(vol(), req('workload-a', 'node-a'), T), 'node-a');
    doc = addTicket(doc, req('workload-b', 'node-b'), T);
    assert.deepEqual(reconcile(structuredClone(doc), T), doc);
  });

  it('ticket IDs are deterministic and follow <type>-<sha256(pv + driver + node)>', () => {
    const id = ticketId('workload', 'pv1', 'latch/loop', 'node-a');
    assert.equal(id, ticketId('workload', 'pv1', 'latch/loop', 'node-a'));
    assert.match(id, /^workload-[0-9a-f]{64}$/);
    assert.notEqual(id, ticketId('workload', 'pv1', 'latch/loop', 'node-b'));
    // sha256("pv1latch/loopnode-a")
    assert.equal(id, 'workload-' + createHash('sha256').update('pv1latch/loopnode-a').digest('hex'));
  });
});
