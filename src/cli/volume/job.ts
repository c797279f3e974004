// What `latch volume restore|clone|attach` share: ask for the job, print how it goes, and take back a volume the
// request created when no agent ever started on it.
import type { Context } from '../../context.js';
import type { JobRequest } from '../../ledger/arbitrate.js';
import type { NewVolumeSpec } from '../../ledger/ledger.js';
import type { VolumeDoc } from '../../ledger/types.js';
import { LatchError } from '../../errors.js';
import type { CommandIO } from '../io.js';
import { describeOutcome, requestAndWait, takeBackUnstarted, type JobResult } from '../../jobs/request.js';

/**
 * How long `volume restore` and `volume clone` wait by default. Filling a volume goes on however long it takes; the
 * command stops waiting after this (and says how to follow it).
 */
export const FILL_WAIT_MS = 6 * 3600 * 1000;

export interface RunJobOptions {
  wait: boolean;
  timeoutMs: number;
  /**
   * Never take the ticket back when no agent starts it (a repeated restore or clone whose earlier run failed: the
   * volume is half-made, and its ticket is what keeps workloads off it).
   */
  keepUnstarted?: boolean;
  /** The request creates the volume: if it ends with the volume an unused shell (no agent started), delete it. */
  undoCreate?: boolean;
}

/** Requests the job, prints progress and the outcome; a failed job is thrown (LatchError with its message). */
export async function runJob(ctx: Context, io: CommandIO, volume: string, request: JobRequest, options: RunJobOptions): Promise<JobResult> {
  let result: JobResult;
  try {
    result = await requestAndWait(ctx, volume, request, {
      wait: options.wait,
      timeoutMs: options.timeoutMs,
      ...(options.keepUnstarted && { pickupMs: Number.POSITIVE_INFINITY }),
      onProgress: (message) => io.out(`  ${message}\n`),
    });
  } catch (err) {
    if (options.undoCreate) await removeUnusedShell(ctx, volume);
    throw err;
  }
  io.out(`${describeOutcome(result)}\n`);
  return result;
}

/**
 * Creates NEW with its job ticket (restore, clone target) in one write and checks that the volume is the one this
 * request made: when another restore or clone created NEW first (between our look and our write), its ticket is there
 * too; then ours is taken back (still unstarted) and the command refused, rather than two jobs filling one volume.
 */
export async function createWithTicket(ctx: Context, volume: string, request: JobRequest, create: NewVolumeSpec): Promise<void> {
  await requestAndWait(ctx, volume, request, { wait: false, timeoutMs: 0, create });
  const doc = await ctx.ledger.get(volume);
  // Another filler of the volume (a workload that asks meanwhile is fine: it waits for ours), or data already there.
  const fillers = Object.values(doc?.spec.tickets ?? {}).filter(
    (t) => t.id !== request.id && (t.job?.kind === 'restore' || (t.job?.kind === 'clone' && t.job.role === 'target')),
  );
  if (doc && fillers.length === 0 && doc.status.filesystem === undefined) return;
  await takeBackUnstarted(ctx, volume, request.id);
  throw new LatchError(`volume ${volume} was created by another request meanwhile; choose another name`);
}

/**
 * Deletes the volume's document if nothing ever used it: the ticket that created it was taken back before any agent
 * started (so no image was made either), and nothing else asked for it meanwhile. Anything else is left as it is.
 */
async function removeUnusedShell(ctx: Context, volume: string): Promise<void> {
  await ctx.ledger
    .deleteVolume(volume, (doc) => {
      if (!isUnusedShell(doc)) throw new Error('not an unused shell');
    })
    .catch(() => undefined);
}

/** No tickets, no holder, no filesystem, no job history: a document nothing ever used. */
function isUnusedShell(doc: VolumeDoc): boolean {
  return (
    Object.keys(doc.spec.tickets).length === 0 &&
    Object.keys(doc.status.nodes).length === 0 &&
    doc.status.filesystem === undefined &&
    (doc.status.jobs ?? []).length === 0
  );
}
