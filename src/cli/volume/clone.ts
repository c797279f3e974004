// latch volume clone SOURCE NEW [--from-snapshot S]: a new volume with SOURCE's bytes (or snapshot S's), copied by the
// node agent (docs/jobs.md, "Clone"). As the seeds' cloning controller: one clone ticket on each volume, for the same
// node, keyed by NEW's name. NEW is created together with its ticket in one ledger write; SOURCE's ticket (read-only)
// is added right after, and the target's job waits for it.
import { isDeepStrictEqual } from 'node:util';
import { LatchError } from '../../errors.js';
import { FS_TYPES, type FsType } from '../../filesystems.js';
import { hasSnapshots, type SnapshotInfo } from '../../backend/types.js';
import type { Context } from '../../context.js';
import { finishedJob } from '../../ledger/arbitrate.js';
import { checkVolumeName } from '../../names.js';
import { cloneTicketIds } from '../../node/jobs/clone.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { jobNode, jobRequest, requestAndWait } from '../../jobs/request.js';
import { getVolume } from '../volume-doc.js';
import { takeBackUnstarted } from '../../jobs/request.js';
import { FILL_WAIT_MS, createWithTicket, runJob } from './job.js';

export interface VolumeCloneOptions {
  source: string;
  name: string;
  fromSnapshot?: string;
  node?: string;
  wait: boolean;
  /** Seconds to wait for the agent's outcome (the job goes on after). */
  timeout?: number;
}

export async function volumeClone(options: VolumeCloneOptions, io: CommandIO): Promise<void> {
  const config = configOf(io);
  const source = checkVolumeName(options.source);
  const name = checkVolumeName(options.name);
  if (source === name) throw new LatchError('a clone needs a new name, not the source volume');
  const ctx = io.context(config);
  const sourceDoc = await getVolume(ctx.ledger, source);
  let sizeBytes = sourceDoc.spec.sizeBytes;
  const shared = sourceDoc.spec.shared === true;
  // A shared volume is cloned by the manager from one of its snapshots (node/jobs/clone.ts): a new shared volume.
  if (shared && options.fromSnapshot === undefined) {
    throw new LatchError(
      `volume ${source} is a shared volume: clone one of its snapshots (latch snapshot create ${source} S, then --from-snapshot S)`,
    );
  }
  if (options.fromSnapshot !== undefined) {
    const snapshot = checkVolumeName(options.fromSnapshot, 'snapshot name', 200);
    const found = (await snapshotsOf(ctx, source, shared)).find((s) => s.name === snapshot);
    if (!found) throw new LatchError(`volume ${source} has no snapshot named ${snapshot} (latch snapshot list ${source})`);
    sizeBytes = found.sizeBytes;
  }
  const filesystem = sourceDoc.status.filesystem;
  const fsType = (
    filesystem !== undefined && (FS_TYPES as readonly string[]).includes(filesystem) ? filesystem : sourceDoc.spec.fsType
  ) as FsType;

  const job = { source, target: name, ...(options.fromSnapshot !== undefined && { fromSnapshot: options.fromSnapshot }) };
  const ids = cloneTicketIds(job);
  const existing = await ctx.ledger.get(name);
  const repeat = existing?.spec.tickets[ids.target];
  if (existing && !repeat) {
    // The target's ticket ID names only NEW: the same clone is the same job (source and snapshot too).
    const done = finishedJob(existing, ids.target);
    if (done?.status.state === 'succeeded' && isDeepStrictEqual(done.job, { kind: 'clone', role: 'target', ...job })) {
      io.out(`volume ${name} was cloned from ${source} already\n`);
      return;
    }
    throw new LatchError(`volume ${name} already exists; a clone makes a new volume: choose another name (or delete ${name} first)`);
  }
  // Where SOURCE is in use (a pod holds it), there; a repeat where it was first asked for; else --node, else here.
  const node = repeat?.nodeID ?? jobNode(ctx, source, sourceDoc, options.node);
  if (repeat && options.node !== undefined && options.node !== node) {
    throw new LatchError(`the clone into ${name} was asked for on node ${node}; repeat it without --node, or delete ${name} first`);
  }
  const target = jobRequest(ctx, name, { kind: 'clone', role: 'target', ...job }, node);
  const holder = jobRequest(ctx, source, { kind: 'clone', role: 'source', ...job }, node);
  const from = options.fromSnapshot === undefined ? source : `snapshot ${options.fromSnapshot} of ${source}`;
  io.out(`cloning ${from} (${formatSize(sizeBytes)}) into new volume ${name} on node ${node}\n`);
  // The target first (it creates NEW, and its job waits for the source's ticket), then the source's: a command
  // interrupted in between leaves a target job that waits, and repeating the command adds what is missing.
  if (existing) await requestAndWait(ctx, name, target, { wait: false, timeoutMs: 0 });
  else await createWithTicket(ctx, name, target, { sizeBytes, fsType, ...(shared && { shared: true }) });
  await requestAndWait(ctx, source, holder, { wait: false, timeoutMs: 0 });
  try {
    await runJob(ctx, io, name, target, {
      wait: options.wait,
      timeoutMs: options.timeout === undefined ? FILL_WAIT_MS : options.timeout * 1000,
      keepUnstarted: existing !== undefined,
      undoCreate: existing === undefined,
    });
  } catch (err) {
    // No agent took the target up (its ticket was taken back): the source's must not stay behind either.
    if (!(await ctx.ledger.get(name))?.spec.tickets[ids.target]) await takeBackUnstarted(ctx, source, ids.source);
    throw err;
  }
}

/** The snapshots of SOURCE: its subvolume's when it is shared, else the backend's. */
async function snapshotsOf(ctx: Context, source: string, shared: boolean): Promise<SnapshotInfo[]> {
  if (shared) return (await (await import('../../node/shared.js')).sharedVolumesOf(ctx)).listSnapshots(source);
  if (!hasSnapshots(ctx.backend)) throw new LatchError(`${ctx.backend.storage} cannot take snapshots`);
  return ctx.backend.listSnapshots(source);
}
