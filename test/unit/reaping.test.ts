// Issue 15: tickets with an owner and a time to live, the "still wanted" touch, and the reaper (src/ledger/automatic.ts,
// the Ledger's named operations, the agent's task). Reaping never ends a node's hold: a node that had the device
// goes detaching, and only its own release (or an admin's fence) lets another node in.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { runAgentTasks } from '../../src/agent/tasks.js';
import { LatchMetrics } from '../../src/agent/metrics.js';
import { addTicket, newVolume } from '../../src/ledger/arbitrate.js';
import { MAX_AUTOMATIC_ACTIONS, reapTickets, touchTicket } from '../../src/ledger/automatic.js';
import { ticketId } from '../../src/ledger/ids.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { Cluster, pvOptions, succeeded } from '../fixtures/op-harness.js';

const T0 = Date.parse('2026-01-01T00:00:00Z');
const at = (seconds: number) => new Date(T0 + seconds * 1000).toISOString();
const MINUTE = 60_000;

/** A clock the test moves by hand; each read also moves it 100 ms, so that a waiting call meets its deadline. */
function manualClock() {
  let now = T0;
  const clock = () => (now += 100);
  clock.advance = (seconds: number) => (now += seconds * 1000);
  return clock;
}

function volumeWith(...tickets: Array<Parameters<typeof addTicket>[1] & { at?: number }>): VolumeDoc {
  let doc = newVolume('v', 1024, 'ext4', at(0));
  for (const { at: when = 0, ...t } of tickets) doc = addTicket(doc, t, at(when));
  return doc;
}

const admin = (node: string, extra: { expiresAt?: string; owner?: string } = {}) => ({
  id: `admin-${node}`,
  type: 'admin' as const,
  nodeID: node,
  parameters: { readOnly: false },
  requestedBy: { admin: true },
  owner: 'alice',
  ...extra,
});
const workload = (node: string) => ({
  id: `workload-${node}`,
  type: 'workload' as const,
  nodeID: node,
  parameters: { readOnly: false },
  requestedBy: { pvName: 'v' },
});

describe('the reaping rules', () => {
  it('removes an expired ticket (and only once it expired), records it, and grants the next ticket', () => {
    const doc = volumeWith(admin('node-b', { expiresAt: at(3600) }), workload('node-a'));
    assert.equal(doc.status.nodes['node-b']?.phase, 'granted');
    assert.equal(reapTickets(doc, at(3599)).doc, doc, 'not yet expired: the same document');

    const { doc: after, reaped } = reapTickets(doc, at(3600));
    assert.deepEqual(Object.keys(after.spec.tickets), ['workload-node-a']);
    assert.equal(after.status.nodes['node-a']?.phase, 'granted', 'the workload it blocked is granted');
    assert.deepEqual(
      reaped.map((a) => [a.kind, a.node, a.ticket]),
      [['expired', 'node-b', 'admin-node-b']],
    );
    assert.match(reaped[0]?.message ?? '', /admin ticket of alice expired at 2026-01-01T01:00:00/);
    assert.deepEqual(after.status.automatic, reaped);
  });

  it('reaps an abandoned waiting workload ticket only after abandonedAfter, and never a satisfied one', () => {
    const doc = volumeWith(workload('node-a'), { ...workload('node-b'), at: 10 });
    assert.equal(doc.status.tickets['workload-node-b']?.satisfied, false);
    const after = 15 * MINUTE;
    assert.equal(reapTickets(doc, at(10 + 15 * 60), after).doc, doc, 'exactly at the horizon: kept');
    assert.equal(reapTickets(doc, at(10 + 15 * 60 + 1)).doc, doc, 'without a horizon only expired tickets go');

    const { doc: reaped, reaped: actions } = reapTickets(doc, at(10 + 15 * 60 + 1), after);
    assert.deepEqual(Object.keys(reaped.spec.tickets), ['workload-node-a'], 'the satisfied ticket stays, however old');
    assert.deepEqual(
      actions.map((a) => [a.kind, a.node]),
      [['abandoned', 'node-b']],
    );
  });

  it('reaping a ticket whose node had the device leaves the node detaching: the hold is not ended', () => {
    let doc = volumeWith(admin('node-b', { expiresAt: at(60) }));
    doc.status.nodes['node-b'] = { phase: 'attached', readOnly: false, since: at(1), device: '/dev/loop3' };
    doc = reapTickets(doc, at(61)).doc;
    assert.deepEqual(Object.keys(doc.spec.tickets), []);
    assert.equal(doc.status.nodes['node-b']?.phase, 'detaching');
    assert.equal(doc.status.state, 'detaching');
  });

  it('a touch refreshes a waiting ticket at most once per interval, and never touches a satisfied one', () => {
    const doc = volumeWith(workload('node-a'), workload('node-b'));
    assert.equal(touchTicket(doc, 'workload-node-b', at(59), MINUTE), doc, 'fresh: nothing written');
    const touched = touchTicket(doc, 'workload-node-b', at(61), MINUTE);
    assert.equal(touched.spec.tickets['workload-node-b']?.lastSeen, at(61));
    assert.equal(touchTicket(touched, 'workload-node-b', at(100), MINUTE), touched);
    assert.equal(touchTicket(doc, 'workload-node-a', at(3600), MINUTE), doc, 'satisfied: never touched');
    // A touched ticket is measured from its touch.
    assert.equal(reapTickets(touched, at(61 + 15 * 60), 15 * MINUTE).doc, touched);
  });

  it('keeps only the latest automatic actions', () => {
    let doc = volumeWith(workload('node-a'));
    for (let i = 0; i < MAX_AUTOMATIC_ACTIONS + 5; i++) {
      doc = addTicket(doc, { ...admin(`n${i}`, { expiresAt: at(i + 1) }), id: `admin-${i}` }, at(i));
      doc = reapTickets(doc, at(i + 1)).doc;
    }
    assert.equal(doc.status.automatic?.length, MAX_AUTOMATIC_ACTIONS);
    assert.equal(doc.status.automatic?.at(-1)?.ticket, `admin-${MAX_AUTOMATIC_ACTIONS + 4}`);
  });
});

describe('reaping through the ops and the agent', () => {
  const PV = 'pv-1';
  const JSON1 = pvOptions(PV);

  it("attach drops an expired admin ticket that blocks the workload, in the same write, and logs it in the call's line", async () => {
    const clock = manualClock();
    const cluster = new Cluster({ clock });
    const cp = cluster.node('cp');
    const ledger = cp.context().ledger;
    await ledger.createVolume(PV, { sizeBytes: 1024 ** 3, fsType: 'ext4' });
    await ledger.addTicket(PV, { ...admin('node-b', { expiresAt: at(600) }), id: 'admin-b' });
    assert.equal((await cp.call('attach', [JSON1, 'node-a'])).reply.status, 'Failure', 'the admin ticket holds it for node-b');

    clock.advance(600);
    const { reply, log } = await cp.call('attach', [JSON1, 'node-a']);
    assert.equal(reply.status, 'Success');
    assert.deepEqual(
      (log.automatic as Array<{ kind: string; ticket: string }>).map((a) => [a.kind, a.ticket]),
      [['expired', 'admin-b']],
    );
    const doc = await cluster.mustDoc(PV);
    assert.deepEqual(Object.keys(doc.spec.tickets), [ticketId('workload', PV, 'latch/loop', 'node-a')]);
  });

  it('attach, isattached and waitforattach keep a waiting ticket alive; the agent reaps it once they stop', async () => {
    const clock = manualClock();
    const cluster = new Cluster({ clock, config: { waitForAttachTimeout: 1 } });
    const [cp, nodeA, nodeB] = [cluster.node('cp'), cluster.node('node-a'), cluster.node('node-b')];
    succeeded(await cp.call('attach', [JSON1, 'node-a']));
    assert.equal((await cp.call('attach', [JSON1, 'node-b'])).reply.status, 'Failure');
    const waitingId = ticketId('workload', PV, 'latch/loop', 'node-b');
    const agentRound = () => runAgentTasks(nodeA.config, () => nodeA.context(), metrics);
    const metrics = await LatchMetrics.create();

    // 14 minutes of retries by each kind of call, 14 minutes apart at most: the ticket stays.
    for (const call of [
      () => cp.call('attach', [JSON1, 'node-b']),
      () => cp.call('isattached', [JSON1, 'node-b']),
      () => nodeB.call('waitforattach', ['', JSON1]),
    ]) {
      clock.advance(14 * 60);
      const writes = cluster.store.writes.length;
      await call();
      assert.ok(cluster.store.writes.length > writes, 'the call recorded the touch');
      await agentRound();
      assert.ok((await cluster.mustDoc(PV)).spec.tickets[waitingId], 'a ticket still asked for is kept');
    }
    // A second isattached within the touch interval writes nothing.
    const writes = cluster.store.writes.length;
    await cp.call('isattached', [JSON1, 'node-b']);
    assert.equal(cluster.store.writes.length, writes);

    clock.advance(15 * 60 + 1);
    await agentRound();
    const doc = await cluster.mustDoc(PV);
    assert.equal(doc.spec.tickets[waitingId], undefined, 'nobody asked for 15 minutes: reaped');
    assert.ok(doc.spec.tickets[ticketId('workload', PV, 'latch/loop', 'node-a')], "the holder's satisfied ticket is never reaped");
    assert.equal(doc.status.nodes['node-a']?.phase, 'granted');
    const logged = readFileSync(nodeA.config.logFile, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { agent?: string; automatic?: Array<{ kind: string; ticket: string }> });
    assert.ok(
      logged.some((l) => l.agent === 'reap-tickets' && l.automatic?.[0]?.kind === 'abandoned' && l.automatic[0].ticket === waitingId),
      'the reaping is in the log file',
    );
  });

  it('abandonedTicketSeconds 0 turns reaping of waiting tickets off (expired ones still go)', async () => {
    const clock = manualClock();
    const cluster = new Cluster({ clock, config: { abandonedTicketSeconds: 0 } });
    const [cp, nodeA] = [cluster.node('cp'), cluster.node('node-a')];
    succeeded(await cp.call('attach', [JSON1, 'node-a']));
    await cp.call('attach', [JSON1, 'node-b']);
    clock.advance(86_400);
    await runAgentTasks(nodeA.config, () => nodeA.context(), await LatchMetrics.create());
    assert.equal(Object.keys((await cluster.mustDoc(PV)).spec.tickets).length, 2);
  });
});
