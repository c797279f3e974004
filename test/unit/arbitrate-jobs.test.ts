// Job tickets in the pure rules (docs/ledger.md, "Jobs", "Conditions", "Preemption"): requests, the job's life,
// the seeds' conditions and their times, preemption of maintenance by more important requests, lastAttachedBy.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, it } from 'node:test';
import {
  addTicket,
  endJob,
  finishJob,
  finishedJob,
  isPreempted,
  isSatisfied,
  jobTicketsOfNode,
  markAttached,
  markAttaching,
  markReleased,
  MAX_FINISHED_JOBS,
  newVolume,
  reconcile,
  recordDirectJob,
  recordJob,
  removeTicket,
  requestJob,
  startJob,
  type JobRequest,
  type TicketRequest,
} from '../../src/ledger/arbitrate.js';
import { reapTickets } from '../../src/ledger/automatic.js';
import { jobTicketId } from '../../src/ledger/ids.js';
import { TICKET_PRIORITY, type JobSpec, type TicketType, type VolumeDoc } from '../../src/ledger/types.js';
import { checkInvariants } from '../fixtures/ledger-invariants.js';

const T0 = '2026-11-23T10:00:00.000Z';
const T1 = '2026-11-23T10:00:01.000Z';
const T2 = '2026-11-23T10:00:02.000Z';
const T3 = '2026-11-23T10:00:03.000Z';
const vol = (): VolumeDoc => newVolume('v1', 1 << 30, 'ext4', T0);

const job = (id: string, nodeID: string, spec: JobSpec, readOnly = true): JobRequest => {
  const type: TicketType = spec.kind === 'attach' ? 'manual' : spec.kind;
  return { id, type, nodeID, parameters: { readOnly, disableFrontend: true }, job: spec, requestedBy: { admin: true } };
};
const snap = (id: string, nodeID: string, name = 's1'): JobRequest => job(id, nodeID, { kind: 'snapshot', snapshot: name });
const ticket = (id: string, nodeID: string, type: TicketType = 'workload', readOnly = false): TicketRequest => ({
  id,
  type,
  nodeID,
  parameters: { readOnly },
  requestedBy: {},
});

/** The node sets the device up (granted -> attaching -> attached). */
const settle = (doc: VolumeDoc, node: string, now = T0): VolumeDoc => {
  const attaching = markAttaching(doc, node, now);
  assert.ok(attaching, `${node} may attach`);
  const attached = markAttached(attaching, node, '/dev/loop9', now);
  assert.ok(attached, `${node} has the device`);
  return attached;
};
const condition = (doc: VolumeDoc, id: string, type: 'Satisfied' | 'Job') =>
  doc.status.tickets[id]?.conditions?.find((c) => c.type === type);

describe('job tickets: ids and requests', () => {
  it('jobTicketId is <type>-<sha256(volume \\0 key)>, the same on every node', () => {
    const id = jobTicketId('snapshot', 'v1', 's1');
    assert.equal(id, 'snapshot-' + createHash('sha256').update('v1\0s1').digest('hex'));
    assert.notEqual(jobTicketId('snapshot', 'v1', 's2'), id);
    assert.notEqual(jobTicketId('backup', 'v1', 's1'), id);
    // The separator keeps ("v1", "2x") and ("v12", "x") apart.
    assert.notEqual(jobTicketId('snapshot', 'v1', '2x'), jobTicketId('snapshot', 'v12', 'x'));
  });

  it('requestJob adds the ticket with its job; the same request again changes nothing, job status included', () => {
    let doc = requestJob(vol(), snap('snap-1', 'node-a'), T0);
    assert.deepEqual(doc.spec.tickets['snap-1']?.job, { kind: 'snapshot', snapshot: 's1' });
    assert.equal(doc.spec.tickets['snap-1']?.parameters.disableFrontend, true);
    assert.equal(isSatisfied(doc, 'snap-1'), true);
    doc = startJob(doc, 'snap-1', 'node-a', T1);
    const again = requestJob(doc, snap('snap-1', 'node-a'), T2);
    assert.equal(again, doc, 'the same object: nothing to write');
    assert.equal(again.status.tickets['snap-1']?.job?.state, 'running');
  });

  it('requestJob refuses the same ID for another job or another node, and a job that does not fit the type', () => {
    const doc = requestJob(vol(), snap('snap-1', 'node-a'), T0);
    assert.throws(() => requestJob(doc, snap('snap-1', 'node-a', 'other'), T1), /a job named snap-1.* is already asked for on volume v1/);
    assert.throws(() => requestJob(doc, snap('snap-1', 'node-b'), T1), /already asked for.*for node node-a/);
    assert.throws(() => requestJob(vol(), { ...snap('x', 'node-a'), type: 'backup' }, T0), /a backup ticket cannot carry a snapshot job/);
    assert.throws(() => requestJob(vol(), { ...snap('x', 'node-a'), type: 'workload' }, T0), /cannot carry/);
  });

  it('a failed job that kept its ticket (restore) is asked for afresh by the same request', () => {
    const restore = job('restore-1', 'node-a', { kind: 'restore', backup: 'b1' }, false);
    let doc = startJob(requestJob(vol(), restore, T0), 'restore-1', 'node-a', T0);
    doc = recordJob(doc, 'restore-1', { state: 'failed', message: 'target full' }, T1);
    assert.equal(doc.status.tickets['restore-1']?.job?.state, 'failed');
    doc = requestJob(doc, restore, T2);
    assert.equal(doc.status.tickets['restore-1']?.job, undefined, 'an agent starts it again');
    assert.equal(condition(doc, 'restore-1', 'Job'), undefined);
  });

  it('jobTicketsOfNode lists only job tickets of that node', () => {
    let doc = addTicket(vol(), ticket('admin-1', 'node-a', 'admin'), T0);
    doc = requestJob(doc, snap('snap-1', 'node-a'), T0);
    doc = requestJob(doc, snap('snap-2', 'node-b', 's2'), T0);
    assert.deepEqual(
      jobTicketsOfNode(doc, 'node-a').map((t) => t.id),
      ['snap-1'],
    );
  });
});

describe("job tickets: the job's life", () => {
  it('startJob refuses an unknown ticket, another node, a waiting ticket and a job that is done', () => {
    let doc = addTicket(vol(), ticket('workload-a', 'node-a'), T0);
    doc = settle(doc, 'node-a');
    doc = requestJob(doc, snap('snap-b', 'node-b'), T0); // waits: node-a holds it read-write for a pod
    assert.throws(() => startJob(doc, 'nope', 'node-b', T1), /has no job ticket/);
    assert.throws(() => startJob(doc, 'workload-a', 'node-a', T1), /has no job ticket/);
    assert.throws(() => startJob(doc, 'snap-b', 'node-a', T1), /is for node node-b, not node-a/);
    assert.throws(() => startJob(doc, 'snap-b', 'node-b', T1), /is not granted on node node-b: attached to node node-a/);
    let mine = startJob(requestJob(vol(), snap('snap-1', 'node-a'), T0), 'snap-1', 'node-a', T1);
    mine = recordJob(mine, 'snap-1', { state: 'succeeded', message: 'snapshot s1 taken' }, T2);
    assert.throws(() => startJob(mine, 'snap-1', 'node-a', T3), /is succeeded: it is not started again/);
  });

  it('startJob again after a kill counts another attempt', () => {
    let doc = startJob(requestJob(vol(), snap('snap-1', 'node-a'), T0), 'snap-1', 'node-a', T1);
    assert.deepEqual(doc.status.tickets['snap-1']?.job, {
      state: 'running',
      node: 'node-a',
      startedAt: T1,
      attempts: 1,
      message: 'started',
    });
    doc = startJob(doc, 'snap-1', 'node-a', T2);
    assert.equal(doc.status.tickets['snap-1']?.job?.attempts, 2);
    assert.equal(doc.status.tickets['snap-1']?.job?.startedAt, T2);
  });

  it('recordJob sets state, message, result and finishedAt; the same record again is a no-op; no ticket: no change', () => {
    let doc = startJob(requestJob(vol(), snap('snap-1', 'node-a'), T0), 'snap-1', 'node-a', T1);
    doc = recordJob(doc, 'snap-1', { state: 'succeeded', message: 'snapshot s1 taken', result: { bytes: 4096 } }, T2);
    assert.deepEqual(doc.status.tickets['snap-1']?.job, {
      state: 'succeeded',
      node: 'node-a',
      startedAt: T1,
      finishedAt: T2,
      attempts: 1,
      message: 'snapshot s1 taken',
      result: { bytes: 4096 },
    });
    assert.equal(recordJob(doc, 'snap-1', { state: 'succeeded', message: 'snapshot s1 taken', result: { bytes: 4096 } }, T3), doc);
    assert.equal(recordJob(doc, 'nope', { state: 'failed', message: 'x' }, T3), doc);
  });

  it("recordJob records the filesystem a job left with the job's state, in the same change", () => {
    let doc = startJob(
      requestJob(vol(), job('restore-1', 'node-b', { kind: 'restore', backup: 'b1' }, false), T0),
      'restore-1',
      'node-b',
      T1,
    );
    assert.equal(doc.status.filesystem, undefined);
    const running = recordJob(doc, 'restore-1', { state: 'running', message: 'restoring' }, T2);
    assert.equal(running.status.filesystem, undefined, 'no filesystem while the job runs');
    doc = recordJob(running, 'restore-1', { state: 'succeeded', message: 'restored', filesystem: 'xfs' }, T3);
    assert.equal(doc.status.tickets['restore-1']?.job?.state, 'succeeded');
    assert.equal(doc.status.filesystem, 'xfs');
    assert.equal(recordJob(doc, 'restore-1', { state: 'succeeded', message: 'restored', filesystem: 'xfs' }, T3), doc, 'no change');
  });

  it('job status survives reconciles while the generation stays, and goes with a changed ticket', () => {
    let doc = startJob(requestJob(vol(), snap('snap-1', 'node-a'), T0), 'snap-1', 'node-a', T1);
    doc = addTicket(doc, ticket('admin-x', 'node-a', 'admin', true), T2); // another ticket: reconcile runs
    assert.equal(doc.status.tickets['snap-1']?.job?.state, 'running');
    doc = reconcile(structuredClone(doc), T3);
    assert.equal(doc.status.tickets['snap-1']?.job?.state, 'running');
    doc = removeTicket(doc, 'snap-1', T3);
    doc = addTicket(doc, snap('snap-1', 'node-a'), T3); // a new generation under the same ID
    assert.equal(doc.status.tickets['snap-1']?.job, undefined);
  });

  it('finishJob removes the ticket and keeps the outcome, in one change; no ticket: no change', () => {
    let doc = settle(startJob(requestJob(vol(), snap('snap-1', 'node-a'), T0), 'snap-1', 'node-a', T0), 'node-a');
    doc = recordJob(doc, 'snap-1', { state: 'succeeded', message: 'snapshot s1 taken' }, T1);
    doc = markReleased(doc, 'node-a', T1); // the agent let the device go: the node is granted again
    const finished = finishJob(doc, 'snap-1', T2);
    assert.equal(finished.spec.tickets['snap-1'], undefined);
    assert.equal(finished.status.tickets['snap-1'], undefined);
    assert.equal(finished.status.state, 'detached');
    assert.deepEqual(finishedJob(finished, 'snap-1'), {
      ticket: 'snap-1',
      type: 'snapshot',
      node: 'node-a',
      job: { kind: 'snapshot', snapshot: 's1' },
      status: { state: 'succeeded', node: 'node-a', startedAt: T0, finishedAt: T1, attempts: 1, message: 'snapshot s1 taken' },
    });
    assert.equal(finishJob(finished, 'snap-1', T3), finished);
    assert.equal(finishedJob(finished, 'nope'), undefined);
  });

  it(`finished jobs are bounded: the newest ${MAX_FINISHED_JOBS} stay`, () => {
    let doc = vol();
    for (let i = 0; i < MAX_FINISHED_JOBS + 5; i++) {
      const id = `snap-${String(i).padStart(2, '0')}`;
      doc = startJob(requestJob(doc, snap(id, 'node-a', `s${i}`), T0), id, 'node-a', T0);
      doc = finishJob(recordJob(doc, id, { state: 'succeeded', message: `s${i}` }, T1), id, T1);
    }
    assert.equal(doc.status.jobs?.length, MAX_FINISHED_JOBS);
    assert.equal(doc.status.jobs?.[0]?.ticket, 'snap-05');
    assert.equal(doc.status.jobs?.at(-1)?.ticket, `snap-${MAX_FINISHED_JOBS + 4}`);
    assert.equal(finishedJob(doc, 'snap-00'), undefined);
  });

  it('a job run beside a pod without a ticket is kept like a finished one: tickets untouched, the same bound, a repeat changes nothing', () => {
    let doc = settle(addTicket(vol(), ticket('pod', 'node-a'), T0), 'node-a');
    const direct = (i: number, state: 'succeeded' | 'failed' = 'succeeded') => ({
      ticket: `backup-${i}`,
      type: 'backup' as const,
      node: 'node-a',
      job: { kind: 'backup' as const, backup: `b${i}` },
      status: { state, node: 'node-a', startedAt: T1, finishedAt: T2, attempts: 1, message: `b${i} ${state}` },
      direct: true as const,
    });
    const once = recordDirectJob(doc, direct(0, 'failed'));
    assert.notEqual(once, doc, 'a new document: the input is not changed');
    assert.equal(doc.status.jobs, undefined);
    assert.deepEqual(once.status.jobs, [direct(0, 'failed')]);
    assert.deepEqual({ ...once, status: { ...once.status, jobs: undefined } }, { ...doc, status: { ...doc.status, jobs: undefined } });
    assert.equal(recordDirectJob(once, direct(0, 'failed')), once, 'the same record again (a retried write): no change');
    assert.equal(finishedJob(once, 'backup-0')?.status.message, 'b0 failed');
    // Interleaved with finished tickets, the newest MAX_FINISHED_JOBS stay, whichever way they came.
    doc = once;
    for (let i = 1; i <= MAX_FINISHED_JOBS + 3; i++) {
      if (i % 2 === 0) doc = recordDirectJob(doc, direct(i));
      else {
        const id = `snap-${i}`;
        doc = startJob(requestJob(doc, snap(id, 'node-a', `s${i}`), T0), id, 'node-a', T0);
        doc = finishJob(recordJob(doc, id, { state: 'succeeded', message: `s${i}` }, T1), id, T1);
      }
    }
    assert.equal(doc.status.jobs?.length, MAX_FINISHED_JOBS);
    // 24 kept in all: the first 4 (backup-0, snap-1, backup-2, snap-3) went.
    assert.equal(doc.status.jobs?.[0]?.ticket, 'backup-4');
    assert.equal(doc.status.jobs?.at(-1)?.ticket, `snap-${MAX_FINISHED_JOBS + 3}`);
    assert.equal(doc.status.jobs?.at(-2)?.direct, true);
    assert.ok(isSatisfied(doc, 'pod'), "the pod's ticket is as it was");
    assert.deepEqual(checkInvariants(doc), []);
  });

  it('endJob of a job no agent started finishes it at once', () => {
    const doc = requestJob(vol(), job('manual-1', 'node-a', { kind: 'attach' }, false), T0);
    assert.equal(doc.status.nodes['node-a']?.phase, 'granted');
    const ended = endJob(doc, 'manual-1', T1);
    assert.equal(ended.spec.tickets['manual-1'], undefined);
    assert.equal(ended.status.state, 'detached');
    assert.equal(finishedJob(ended, 'manual-1')?.status.state, 'ending');
    assert.equal(finishedJob(ended, 'manual-1')?.status.attempts, 0);
    assert.match(finishedJob(ended, 'manual-1')?.status.message ?? '', /before any agent started it/);
  });

  it('endJob of a set-up manual attach asks its agent to end; a late success does not undo that', () => {
    let doc = settle(
      startJob(requestJob(vol(), job('manual-1', 'node-a', { kind: 'attach' }, false), T0), 'manual-1', 'node-a', T0),
      'node-a',
    );
    doc = recordJob(doc, 'manual-1', { state: 'succeeded', message: 'attached at /dev/loop9' }, T1);
    doc = endJob(doc, 'manual-1', T2);
    assert.equal(doc.status.tickets['manual-1']?.job?.state, 'ending');
    assert.equal(doc.spec.tickets['manual-1']?.id, 'manual-1', 'the ticket stays until the agent let go');
    assert.equal(endJob(doc, 'manual-1', T3), doc, 'ending again changes nothing');
    assert.equal(recordJob(doc, 'manual-1', { state: 'succeeded', message: 'ended' }, T3).status.tickets['manual-1']?.job?.state, 'ending');
    // A done snapshot is left alone: its agent finishes it anyway.
    let s = startJob(requestJob(vol(), snap('snap-1', 'node-a'), T0), 'snap-1', 'node-a', T0);
    s = recordJob(s, 'snap-1', { state: 'succeeded', message: 'ok' }, T1);
    assert.equal(endJob(s, 'snap-1', T2), s);
  });
  it('an expired job ticket is reaped the way a finished one goes: its requester finds the outcome', () => {
    let doc = requestJob(vol(), { ...snap('snap-1', 'node-a'), expiresAt: T1 }, T0);
    doc = startJob(doc, 'snap-1', 'node-a', T0);
    doc = requestJob(doc, { ...snap('snap-2', 'node-a', 's2'), expiresAt: T1 }, T0);
    doc = recordJob(startJob(doc, 'snap-2', 'node-a', T0), 'snap-2', { state: 'succeeded', message: 'taken' }, T0);
    const { doc: reaped } = reapTickets(doc, T2);
    assert.deepEqual(Object.keys(reaped.spec.tickets), []);
    assert.equal(finishedJob(reaped, 'snap-1')?.status.state, 'failed');
    assert.match(finishedJob(reaped, 'snap-1')?.status.message ?? '', /snapshot ticket expired at/);
    assert.equal(finishedJob(reaped, 'snap-2')?.status.state, 'succeeded', 'a job done before it expired keeps its outcome');
    assert.equal(reaped.status.automatic?.length, 2);
  });
});

describe("job tickets: the seeds' conditions", () => {
  it('Satisfied and Job carry status, reason and message; Job appears once an agent started', () => {
    let doc = requestJob(vol(), snap('snap-1', 'node-a'), T0);
    assert.deepEqual(doc.status.tickets['snap-1']?.conditions, [
      {
        type: 'Satisfied',
        status: 'True',
        reason: 'Attached',
        message: 'attached to node node-a',
        lastProbeTime: T0,
        lastTransitionTime: T0,
      },
    ]);
    doc = startJob(doc, 'snap-1', 'node-a', T1);
    assert.deepEqual(condition(doc, 'snap-1', 'Job'), {
      type: 'Job',
      status: 'Unknown',
      reason: 'Running',
      message: 'started',
      lastProbeTime: T1,
      lastTransitionTime: T1,
    });
    doc = recordJob(doc, 'snap-1', { state: 'running', message: 'copying' }, T2);
    const running = condition(doc, 'snap-1', 'Job');
    assert.equal(running?.lastProbeTime, T2, 'the message changed');
    assert.equal(running?.lastTransitionTime, T1, 'the status did not');
    doc = recordJob(doc, 'snap-1', { state: 'succeeded', message: 'done' }, T3);
    assert.deepEqual(
      [
        condition(doc, 'snap-1', 'Job')?.status,
        condition(doc, 'snap-1', 'Job')?.reason,
        condition(doc, 'snap-1', 'Job')?.lastTransitionTime,
      ],
      ['True', 'Succeeded', T3],
    );
    assert.equal(condition(doc, 'snap-1', 'Satisfied')?.lastTransitionTime, T0, 'still satisfied since T0');
    const failed = recordJob(
      startJob(requestJob(vol(), snap('snap-2', 'node-a'), T0), 'snap-2', 'node-a', T0),
      'snap-2',
      { state: 'failed', message: 'no space' },
      T1,
    );
    assert.deepEqual([condition(failed, 'snap-2', 'Job')?.status, condition(failed, 'snap-2', 'Job')?.reason], ['False', 'Failed']);
  });

  it('a write that changes nothing stays a no-op: no time moves', () => {
    let doc = addTicket(vol(), ticket('workload-a', 'node-a'), T0);
    doc = settle(doc, 'node-a');
    doc = addTicket(doc, ticket('workload-b', 'node-b'), T0);
    doc = requestJob(doc, snap('snap-a', 'node-a'), T0);
    doc = startJob(doc, 'snap-a', 'node-a', T0);
    assert.deepEqual(reconcile(structuredClone(doc), T3), doc);
    assert.deepEqual(reconcile(reconcile(structuredClone(doc), T2), T3), doc);
    assert.deepEqual(addTicket(doc, ticket('workload-a', 'node-a'), T3), doc, 'a repeated attach');
    assert.equal(markAttached(doc, 'node-a', '/dev/loop9', T3), doc, 'a repeated isattached/attach record');
  });

  it('lastTransitionTime moves only when the status changes', () => {
    let doc = settle(addTicket(vol(), ticket('workload-a', 'node-a'), T0), 'node-a');
    doc = addTicket(doc, ticket('workload-b', 'node-b'), T1);
    assert.deepEqual(
      [condition(doc, 'workload-b', 'Satisfied')?.status, condition(doc, 'workload-b', 'Satisfied')?.lastTransitionTime],
      ['False', T1],
    );
    doc = removeTicket(doc, 'workload-a', T2); // node-a detaching: reason and message change, status stays False
    const waiting = condition(doc, 'workload-b', 'Satisfied');
    assert.equal(waiting?.reason, 'Detaching');
    assert.equal(waiting?.lastProbeTime, T2);
    assert.equal(waiting?.lastTransitionTime, T1);
    doc = markReleased(doc, 'node-a', T3);
    assert.deepEqual(
      [condition(doc, 'workload-b', 'Satisfied')?.status, condition(doc, 'workload-b', 'Satisfied')?.lastTransitionTime],
      ['True', T3],
    );
  });

  it('documents written before conditions existed read and reconcile fine', () => {
    const doc = settle(addTicket(vol(), ticket('workload-a', 'node-a'), T0), 'node-a');
    const old = structuredClone(doc);
    for (const s of Object.values(old.status.tickets)) delete s.conditions;
    assert.equal(isSatisfied(old, 'workload-a'), true);
    const next = reconcile(structuredClone(old), T1);
    assert.equal(condition(next, 'workload-a', 'Satisfied')?.lastTransitionTime, T1);
  });
});

describe('job tickets: preemption', () => {
  it('a snapshot holding an idle volume yields to a workload elsewhere: granted -> withdrawn at once', () => {
    let doc = startJob(requestJob(vol(), snap('snap-a', 'node-a'), T0), 'snap-a', 'node-a', T0);
    doc = addTicket(doc, ticket('workload-b', 'node-b'), T1);
    assert.equal(doc.status.nodes['node-a'], undefined, "node-a's grant went");
    assert.equal(isSatisfied(doc, 'workload-b'), true);
    assert.equal(isSatisfied(doc, 'snap-a'), false);
    assert.equal(isPreempted(doc, 'snap-a'), true, 'its job had started');
    assert.equal(condition(doc, 'snap-a', 'Job')?.reason, 'Preempted');
    assert.throws(() => startJob(doc, 'snap-a', 'node-a', T2), /not granted/);
    assert.equal(markAttaching(doc, 'node-a', T2), undefined, 'a late claim is refused');
  });

  it('attached -> detaching (Preempted) -> released -> the workload is granted; the job comes back afterwards', () => {
    let doc = settle(startJob(requestJob(vol(), snap('snap-a', 'node-a'), T0), 'snap-a', 'node-a', T0), 'node-a');
    doc = addTicket(doc, ticket('workload-b', 'node-b'), T1);
    assert.equal(doc.status.nodes['node-a']?.phase, 'detaching');
    assert.equal(doc.status.tickets['snap-a']?.reason, 'Preempted');
    assert.match(doc.status.tickets['snap-a']?.message ?? '', /^preempted: node node-a is letting the volume go/);
    assert.equal(condition(doc, 'snap-a', 'Job')?.reason, 'Preempted');
    assert.equal(isPreempted(doc, 'snap-a'), true);
    assert.equal(doc.status.tickets['workload-b']?.reason, 'Detaching');
    assert.equal(isSatisfied(doc, 'workload-b'), false, 'never two nodes');
    assert.deepEqual(reconcile(structuredClone(doc), T2), doc, 'stable while node-a lets go');
    doc = markReleased(doc, 'node-a', T2);
    assert.equal(doc.status.nodes['node-a'], undefined);
    assert.equal(isSatisfied(doc, 'workload-b'), true);
    assert.equal(doc.spec.tickets['snap-a']?.id, 'snap-a', 'the job ticket waits');
    assert.equal(doc.status.tickets['snap-a']?.job?.state, 'running', 'kept for the next agent run');
    doc = settle(doc, 'node-b', T2);
    doc = removeTicket(doc, 'workload-b', T3);
    doc = markReleased(doc, 'node-b', T3);
    assert.equal(isSatisfied(doc, 'snap-a'), true);
    assert.equal(startJob(doc, 'snap-a', 'node-a', T3).status.tickets['snap-a']?.job?.attempts, 2);
  });

  it('a maintenance reservation, a backup and a clone source yield too; several holders read-only all let go', () => {
    let doc = addTicket(vol(), ticket('maint-a', 'node-a', 'maintenance', true), T0);
    doc = settle(doc, 'node-a');
    doc = requestJob(doc, job('backup-c', 'node-c', { kind: 'backup', backup: 'b1' }), T0);
    doc = settle(doc, 'node-c');
    doc = requestJob(doc, job('clone-a', 'node-a', { kind: 'clone', role: 'source', source: 'v1', target: 'v2' }), T0);
    assert.deepEqual(Object.keys(doc.status.nodes).sort(), ['node-a', 'node-c']);
    doc = addTicket(doc, ticket('workload-b', 'node-b'), T1);
    assert.equal(doc.status.nodes['node-a']?.phase, 'detaching');
    assert.equal(doc.status.nodes['node-c']?.phase, 'detaching');
    doc = markReleased(markReleased(doc, 'node-a', T2), 'node-c', T2);
    assert.deepEqual(Object.keys(doc.status.nodes), ['node-b']);
    assert.equal(isSatisfied(doc, 'workload-b'), true);
  });

  it('a read-only workload joins read-only jobs instead of preempting them', () => {
    let doc = settle(requestJob(vol(), snap('snap-a', 'node-a'), T0), 'node-a');
    doc = addTicket(doc, ticket('workload-b', 'node-b', 'workload', true), T1);
    assert.equal(doc.status.nodes['node-a']?.phase, 'attached');
    assert.equal(isSatisfied(doc, 'workload-b'), true);
    assert.equal(isSatisfied(doc, 'snap-a'), true);
  });

  it('never preempts a workload, a manual attach, an admin reservation, a restore or a clone target', () => {
    const holders: [string, (d: VolumeDoc) => VolumeDoc][] = [
      ['workload', (d) => addTicket(d, ticket('h', 'node-a'), T0)],
      ['manual', (d) => requestJob(d, job('h', 'node-a', { kind: 'attach' }, false), T0)],
      ['admin', (d) => addTicket(d, ticket('h', 'node-a', 'admin'), T0)],
      ['restore', (d) => requestJob(d, job('h', 'node-a', { kind: 'restore', backup: 'b' }, false), T0)],
      ['clone target', (d) => requestJob(d, job('h', 'node-a', { kind: 'clone', role: 'target', source: 'v0', target: 'v1' }, false), T0)],
    ];
    for (const [what, hold] of holders) {
      for (const attached of [false, true]) {
        let doc = hold(vol());
        if (attached) doc = settle(doc, 'node-a');
        // A ticket of higher priority on another node: a restore (2000) outranks all of them.
        doc = addTicket(doc, ticket('restore-b', 'node-b', 'restore'), T1);
        assert.deepEqual(Object.keys(doc.status.nodes), ['node-a'], `${what} (${attached ? 'attached' : 'granted'}) keeps the volume`);
        assert.equal(isSatisfied(doc, 'h'), true, what);
        assert.equal(isSatisfied(doc, 'restore-b'), false, what);
      }
    }
  });

  it('a restore blocks a workload on the new volume until it is done', () => {
    let doc = requestJob(vol(), job('restore-a', 'node-a', { kind: 'restore', backup: 'b1' }, false), T0);
    doc = settle(startJob(doc, 'restore-a', 'node-a', T0), 'node-a');
    doc = addTicket(doc, ticket('workload-b', 'node-b'), T1);
    assert.equal(isSatisfied(doc, 'workload-b'), false);
    assert.equal(doc.status.tickets['workload-b']?.reason, 'AttachedElsewhere');
    doc = recordJob(doc, 'restore-a', { state: 'succeeded', message: 'restored' }, T2);
    doc = finishJob(markReleased(doc, 'node-a', T2), 'restore-a', T2);
    assert.equal(isSatisfied(doc, 'workload-b'), true);
  });

  it('equal priority does not preempt: a snapshot waits for a maintenance reservation and the other way round', () => {
    let doc = settle(addTicket(vol(), ticket('maint-a', 'node-a', 'maintenance'), T0), 'node-a');
    doc = requestJob(doc, snap('snap-b', 'node-b'), T1);
    assert.equal(doc.status.nodes['node-a']?.phase, 'attached');
    assert.equal(isSatisfied(doc, 'snap-b'), false);
  });

  it('a job ticket on the node that holds the volume for a pod is satisfied at once and never cuts the pod', () => {
    let doc = settle(addTicket(vol(), ticket('workload-a', 'node-a'), T0), 'node-a');
    doc = requestJob(doc, snap('snap-a', 'node-a'), T1);
    assert.equal(isSatisfied(doc, 'snap-a'), true);
    doc = addTicket(doc, ticket('admin-b', 'node-b', 'admin'), T2); // 1000 > 900 but the workload is not preemptible
    assert.equal(doc.status.nodes['node-a']?.phase, 'attached');
  });
});

describe('lastAttachedBy', () => {
  it('names the most important ticket of the node that reached attached, and not a later device change', () => {
    let doc = addTicket(vol(), ticket('workload-a', 'node-a'), T0);
    doc = requestJob(doc, snap('snap-a', 'node-a'), T0);
    assert.equal(doc.status.lastAttachedBy, undefined);
    doc = settle(doc, 'node-a', T1);
    assert.deepEqual(doc.status.lastAttachedBy, { ticket: 'workload-a', type: 'workload', node: 'node-a', at: T1 });
    const moved = markAttached(doc, 'node-a', '/dev/loop7', T2);
    assert.deepEqual(moved?.status.lastAttachedBy, doc.status.lastAttachedBy);
    doc = markReleased(removeTicket(removeTicket(doc, 'workload-a', T3), 'snap-a', T3), 'node-a', T3);
    assert.equal(doc.status.lastAttachedBy?.ticket, 'workload-a', 'kept after detach');
  });
});

describe('job tickets: random walks', () => {
  /** A small deterministic generator (mulberry32), so a failing walk can be replayed from its seed. */
  const random = (seed: number) => () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const NODES = ['node-a', 'node-b', 'node-c'];
  const SPECS: JobSpec[] = [
    { kind: 'snapshot', snapshot: 's' },
    { kind: 'backup', backup: 'b' },
    { kind: 'clone', role: 'source', source: 'v1', target: 'v2' },
    { kind: 'clone', role: 'target', source: 'v0', target: 'v1' },
    { kind: 'restore', backup: 'b' },
    { kind: 'attach' },
  ];
  const NOT_PREEMPTIBLE = new Set(['workload', 'manual', 'admin', 'restore']);

  it('every step keeps the ledger sound, reconciling again changes nothing, and no pod or person is preempted', () => {
    for (const seed of [1, 2, 3, 4, 5, 6, 7, 8]) {
      const rand = random(seed);
      const pick = <T>(items: readonly T[]): T => items[Math.floor(rand() * items.length)] as T;
      let doc = vol();
      let clock = Date.parse(T0);
      for (let step = 0; step < 600; step++) {
        const now = new Date((clock += 1000)).toISOString();
        const node = pick(NODES);
        const ids = Object.keys(doc.spec.tickets);
        const id = ids.length > 0 ? pick(ids) : 'none';
        const before = doc;
        const op = Math.floor(rand() * 12);
        try {
          if (op === 0) doc = addTicket(doc, ticket(`workload-${node}`, node, 'workload', rand() < 0.3), now);
          else if (op === 1)
            doc = addTicket(
              doc,
              ticket(`${pick(['admin', 'maintenance'] as const)}-${node}`, node, pick(['admin', 'maintenance'] as const), rand() < 0.5),
              now,
            );
          else if (op === 2) {
            const spec = pick(SPECS);
            doc = requestJob(
              doc,
              job(
                `${spec.kind}-${'role' in spec ? spec.role : ''}-${node}`,
                node,
                spec,
                spec.kind === 'snapshot' || spec.kind === 'backup' || (spec.kind === 'clone' && spec.role === 'source'),
              ),
              now,
            );
          } else if (op === 3) doc = removeTicket(doc, id, now);
          else if (op === 4) doc = markAttaching(doc, node, now) ?? doc;
          else if (op === 5) doc = markAttached(doc, node, `/dev/loop${NODES.indexOf(node)}`, now) ?? doc;
          else if (op === 6) doc = markReleased(doc, node, now);
          else if (op === 7) doc = startJob(doc, id, doc.spec.tickets[id]?.nodeID ?? node, now);
          else if (op === 8)
            doc = recordJob(doc, id, { state: pick(['running', 'succeeded', 'failed'] as const), message: pick(['a', 'b']) }, now);
          else if (op === 9) doc = finishJob(doc, id, now);
          else if (op === 10) doc = endJob(doc, id, now);
          else doc = reconcile(structuredClone(doc), now);
        } catch (err) {
          // Refusals are fine (startJob of a waiting job, finishJob of a non-job ticket): they change nothing.
          assert.match(String(err), /LatchError/);
          doc = before;
        }
        const where = `seed ${seed} step ${step} op ${op}`;
        assert.deepEqual(checkInvariants(doc), [], where);
        assert.deepEqual(
          reconcile(structuredClone(doc), new Date(clock + 500).toISOString()),
          doc,
          `${where}: a second reconcile is a no-op`,
        );
        for (const [n, entry] of Object.entries(doc.status.nodes)) {
          const wasInUse = before.status.nodes[n]?.phase === 'attaching' || before.status.nodes[n]?.phase === 'attached';
          if (!wasInUse || entry.phase !== 'detaching') continue;
          // A node that lets go while tickets still want it there: only preemptible ones, for a more important ticket.
          const kept = Object.values(doc.spec.tickets).filter((t) => t.nodeID === n);
          for (const t of kept) {
            assert.ok(!NOT_PREEMPTIBLE.has(t.type) && !(t.job?.kind === 'clone' && t.job.role === 'target'), `${where}: ${t.id} preempted`);
          }
          if (kept.length > 0) {
            const top = Math.max(...kept.map((t) => TICKET_PRIORITY[t.type]));
            assert.ok(
              Object.values(doc.spec.tickets).some((t) => t.nodeID !== n && TICKET_PRIORITY[t.type] > top),
              `${where}: ${n} preempted for nothing`,
            );
          }
        }
        for (const [key, st] of Object.entries(doc.status.tickets)) {
          const conditions = st.conditions ?? [];
          assert.equal(conditions[0]?.type, 'Satisfied', `${where}: ${key}`);
          assert.equal(conditions.length, st.job ? 2 : 1, `${where}: ${key} Job condition iff job status`);
        }
      }
    }
  });
});
