// The clone job (`latch volume clone SOURCE NEW [--from-snapshot S]`, docs/jobs.md, "Clone"), as the seeds' cloning
// controller: one clone ticket on each volume, same node, same key (the new volume's name).
//
// Role target (on NEW, read-write, never preempted) does the work: it waits until the source's ticket holds SOURCE
// here, reads a consistent image of it (snapshot S; else a snapshot cut with the filesystem frozen when SOURCE is
// mounted here, removed afterwards, or the loop backend's idle image checked unchanged afterwards, ...), copies it onto
// NEW's device sparsely (zero blocks become holes, never written), reads the device back to check every byte, and
// records the filesystem it holds so that kubelet never formats NEW. How the source is read (rbd: its allocated
// extents streamed from the cluster, nothing on the node's disk), written and checked: clone-copy.ts.
//
// Role source (on SOURCE, read-only) only holds SOURCE: its run() waits, reading the ledger, until the target's job is
// over (succeeded: it succeeds; failed: it fails with the target's message; NEW or its ticket gone: it ends), and
// then the runner lets SOURCE go as for any job. Everything it waits on is in the ledger, so an agent killed and
// restarted simply waits again (or finds the target done and ends at once); the target's handler never writes the
// source's ticket, so no two processes finish the same ticket.
//
// A shared volume (a CephFS subvolume) is cloned from one of its snapshots by the manager itself (`ceph fs subvolume
// snapshot clone`, a server-side copy of the files into a new subvolume of the group), which no block device and no
// node mount could do better: the target's job starts it, waits for `ceph fs clone status` to say complete (or failed)
// within CLONE_DEADLINE_MS, and sets NEW's quota. The tickets are the same, so that the ledger keeps the new volume
// from every pod until the copy is whole, and SOURCE is held (shared, read-only) meanwhile.
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError } from '../../errors.js';
import { finishedJob, isPreempted, isSatisfied } from '../../ledger/arbitrate.js';
import { jobTicketId } from '../../ledger/ids.js';
import { copyOnto, openCloneSource, verifyCopy, type CopyReport } from './clone-copy.js';
import { flushDevice, halfMade } from './restore.js';
import type { JobHandler, JobOf, JobRun } from './types.js';

/** How often a clone's two sides look at each other's ticket in the ledger. */
const POLL_MS = 500;
/** How long a shared volume's clone may take before it is canceled and the job fails (the manager copies file by file). */
const CLONE_DEADLINE_MS = 6 * 3600 * 1000;

export const cloneJob: JobHandler<'clone'> = {
  kind: 'clone',
  run: (job, run) =>
    job.role === 'source'
      ? holdSource(job, run)
      : cloneInto(job, run).catch((err: unknown) => {
          const repeat = `latch volume clone ${job.source} ${job.target}${job.fromSnapshot === undefined ? '' : ` --from-snapshot ${job.fromSnapshot}`}`;
          throw run.signal.aborted ? err : halfMade(job.target, repeat, err);
        }),
};

type CloneJob = JobOf<'clone'>;

/** The clone tickets' IDs: on each volume, keyed by the new volume's name. */
export function cloneTicketIds(job: Pick<CloneJob, 'source' | 'target'>): { source: string; target: string } {
  return { source: jobTicketId('clone', job.source, job.target), target: jobTicketId('clone', job.target, job.target) };
}

async function holdSource(job: CloneJob, { ctx, signal }: JobRun) {
  const id = cloneTicketIds(job).target;
  for (;;) {
    const doc = await ctx.ledger.get(job.target);
    if (!doc) return { message: `volume ${job.target} is gone; stopped holding ${job.source} for its clone` };
    const status = doc.status.tickets[id]?.job;
    const finished = doc.spec.tickets[id] ? undefined : finishedJob(doc, id);
    const state = status?.state ?? finished?.status.state;
    if (state === 'failed') {
      throw new LatchError(`the clone of ${job.source} into ${job.target} failed: ${status?.message ?? finished?.status.message ?? ''}`);
    }
    if (state === 'succeeded') return { message: `held ${job.source} while it was cloned into ${job.target}` };
    if (!doc.spec.tickets[id]) return { message: `the clone ticket of ${job.target} was removed; stopped holding ${job.source}` };
    await sleep(POLL_MS, undefined, { signal });
  }
}

async function cloneInto(job: CloneJob, run: JobRun) {
  const { ctx, volume, device, signal } = run;
  if (run.doc.spec.shared) return cloneShared(job, run);
  if (job.fromSnapshot === undefined) await waitForSource(job, run);
  else if (!(await ctx.ledger.get(job.source))) throw new LatchError(`volume ${job.source} does not exist`);
  const source = await openCloneSource(ctx, job.source, job.fromSnapshot);
  let copied: CopyReport;
  try {
    // A volume nothing was ever written to reads zeros: its holes need no zeroing (the storage stays thin). Its
    // device's dirty pages (an attempt killed on this node) are flushed first, so that the storage says all that was.
    await flushDevice(device);
    const fresh = (await ctx.backend.isUnwritten?.(volume)) === true;
    copied = await copyOnto(source, device, { fresh, allocated: ctx.backend.allocatedExtents?.(volume), signal });
    // An idle image read directly: refused if SOURCE was asked for or written meanwhile (the job fails; run it again).
    await source.beforeUse?.();
  } finally {
    await source.release();
  }
  // NEW's extents as the storage lists them once the copy is synced: the check reads only those.
  const verifiedBytes = await verifyCopy(device, copied, signal, ctx.backend.allocatedExtents?.(volume));
  const filesystem = await ctx.system.probeFsType(device);
  const from = job.fromSnapshot === undefined ? `${job.source} (${source.consistency})` : `snapshot ${job.fromSnapshot} of ${job.source}`;
  return {
    message:
      `cloned ${from} into ${volume}: ${copied.dataBytes} bytes of data, ${copied.sizeBytes - copied.dataBytes} as holes, verified` +
      (filesystem === undefined ? ', no filesystem on it' : `, ${filesystem} filesystem`),
    result: {
      source: job.source,
      ...(job.fromSnapshot !== undefined && { fromSnapshot: job.fromSnapshot }),
      consistency: source.consistency,
      read: source.reading,
      sizeBytes: copied.sizeBytes,
      dataBytes: copied.dataBytes,
      contentSha256: copied.contentSha256,
      verifiedBytes,
      ...(filesystem !== undefined && { filesystem }),
    },
    ...(filesystem !== undefined && { filesystem }),
  };
}

/**
 * The clone of a shared volume's snapshot into NEW (also shared), by the manager. Idempotent: a NEW subvolume that is
 * the clone of the same snapshot is waited for (a repeat after a kill), anything else under NEW's name is refused.
 */
async function cloneShared(job: CloneJob, run: JobRun) {
  const { ctx, volume, signal } = run;
  const snapshot = job.fromSnapshot;
  const sourceDoc = await ctx.ledger.get(job.source);
  if (!sourceDoc) throw new LatchError(`volume ${job.source} does not exist`);
  if (!sourceDoc.spec.shared) throw new LatchError(`volume ${job.source} is a block volume; ${volume} is a shared volume`);
  if (snapshot === undefined) throw new LatchError(`a shared volume is cloned from one of its snapshots: give --from-snapshot`);
  const shared = await (await import('../shared.js')).sharedVolumesOf(ctx);
  const deadline = Date.now() + CLONE_DEADLINE_MS;
  let status = await shared.cloneStatus(volume);
  if (status === undefined) {
    if (!(await shared.listSnapshots(job.source)).some((s) => s.name === snapshot)) {
      throw new LatchError(`volume ${job.source} has no snapshot named ${snapshot}`);
    }
    await shared.startClone(job.source, snapshot, volume);
    status = await shared.cloneStatus(volume);
    if (status === undefined) throw new LatchError(`the clone ${volume} is not found right after it was started`);
  }
  if (status.source !== undefined && (status.source.volume !== job.source || status.source.snapshot !== snapshot)) {
    throw new LatchError(
      `subvolume ${volume} is a clone of snapshot ${status.source.snapshot} of ${status.source.volume}, not of ${snapshot} of ${job.source}`,
    );
  }
  let said = '';
  while (status.state === 'pending' || status.state === 'in-progress') {
    if (Date.now() >= deadline) {
      await shared.cancelClone(volume);
      throw new LatchError(`the clone into ${volume} did not complete within ${CLONE_DEADLINE_MS / 3600_000} h; it was canceled`);
    }
    const message = `the manager is cloning snapshot ${snapshot} of ${job.source} into ${volume} (${status.state})`;
    if (message !== said) await ctx.ledger.recordJob(volume, run.ticket.id, { state: 'running', message });
    said = message;
    // Aborted (preempted, the agent stopping): the manager goes on, and the next attempt waits for the same clone.
    await sleep(POLL_MS, undefined, { signal });
    status = await shared.cloneStatus(volume);
    if (status === undefined) throw new LatchError(`the clone ${volume} vanished while it was being made`);
  }
  if (status.state !== 'complete') {
    // A failed or canceled clone is removed, so that the command repeated starts it afresh.
    await shared.removeFailedClone(volume);
    throw new LatchError(`the manager's clone into ${volume} ${status.state}${status.failure ? `: ${status.failure}` : ''}`);
  }
  // The size of NEW is its quota, whatever the clone carried over.
  await shared.grow(volume, run.doc.spec.sizeBytes);
  return {
    message: `cloned snapshot ${snapshot} of shared volume ${job.source} into shared volume ${volume} (the manager copied its files)`,
    result: { source: job.source, fromSnapshot: snapshot, consistency: 'crash-consistent', sizeBytes: run.doc.spec.sizeBytes },
  };
}

/**
 * Waits until the source's clone ticket holds SOURCE on this node with its device set up (by this agent's run of the
 * source ticket, or a pod's): openCloneSource then reads a snapshot of it here, and nothing that sets the device up
 * meanwhile can make the read inconsistent. A missing source ticket is waited for too (the command adds it right after
 * the target's, and a repeat of the command adds it if it was interrupted in between).
 */
async function waitForSource(job: CloneJob, run: JobRun): Promise<void> {
  const { ctx, volume, ticket, signal } = run;
  const id = cloneTicketIds(job).source;
  const node = ctx.config.nodeName;
  let said = '';
  for (;;) {
    const doc = await ctx.ledger.get(job.source);
    if (!doc) throw new LatchError(`volume ${job.source} does not exist`);
    const theirs = doc.spec.tickets[id];
    if (theirs && theirs.nodeID !== node)
      throw new LatchError(`the clone ticket on ${job.source} is for node ${theirs.nodeID}, not ${node}`);
    if (theirs && isSatisfied(doc, id) && !isPreempted(doc, id) && doc.status.nodes[node]?.phase === 'attached') return;
    const waiting = theirs ? `waiting for ${job.source} to be set up on ${node}` : `waiting for the clone ticket on ${job.source}`;
    if (waiting !== said) await ctx.ledger.recordJob(volume, ticket.id, { state: 'running', message: waiting });
    said = waiting;
    await sleep(POLL_MS, undefined, { signal });
  }
}
