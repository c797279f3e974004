// The requester's side of a job (docs/jobs.md, "Requesting"): which node does it, the job ticket, and waiting for
// the outcome the node's agent records. Every command that asks an agent for work (snapshot, backup, restore, clone,
// attach) goes through here; the commands print what it returns.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Context } from '../context.js';
import { LatchError } from '../errors.js';
import { finishedJob, isInUse, isSatisfied, nodeHoldsDevice, type JobRequest } from '../ledger/arbitrate.js';
import { jobTicketId } from '../ledger/ids.js';
import type { NewVolumeSpec } from '../ledger/ledger.js';
import type { FinishedJob, JobSpec, JobStatus, JobTicketType, Ticket, VolumeDoc } from '../ledger/types.js';
import { checkNodeName } from '../names.js';
import { reachesHome } from '../node/home.js';

/** How long an agent has to take a granted job up before the requester gives up on it (and removes its ticket). */
const PICKUP_MS = 30_000;
/** Between two looks at the ledger when no change signal came. */
const POLL_MS = 1000;
/**
 * How long a requester waits, after a restore or clone target failed, for its agent to let go of the device (which it
 * does right after it records the failure): the failure says "delete it", and a delete while the node holds the volume
 * is refused. An agent that died in between lets go when it starts again; the requester does not wait for that.
 */
const LET_GO_MS = 30_000;

const TYPE_OF_KIND: Record<JobSpec['kind'], JobTicketType> = {
  snapshot: 'snapshot',
  backup: 'backup',
  restore: 'restore',
  clone: 'clone',
  attach: 'manual',
};

/** The name that makes a job's ticket ID (jobTicketId): what the job makes or reads, `manual` for an attach. */
function keyOf(job: JobSpec): string {
  switch (job.kind) {
    case 'snapshot':
      return job.snapshot;
    case 'backup':
      return job.backup;
    case 'restore':
      return job.backup;
    case 'clone':
      return job.target;
    case 'attach':
      return 'manual';
  }
}

/** Jobs that only read the volume: they may share an idle volume with other readers. */
function readsOnly(job: JobSpec): boolean {
  return job.kind === 'snapshot' || job.kind === 'backup' || (job.kind === 'clone' && job.role === 'source');
}

/** The nodes that hold the volume now (attaching, attached or detaching): a job never moves a volume in use. */
export function holdersOf(doc: VolumeDoc): string[] {
  return Object.entries(doc.status.nodes)
    .filter(([, entry]) => isInUse(entry.phase) || entry.phase === 'detaching')
    .map(([node]) => node);
}

/**
 * Which node does the job (docs/jobs.md, "Which node"). A shared volume's: the one asked for, else this node. Any
 * other volume's: the node that holds the volume when it is in use; else the
 * one asked for; else this node, or the volume's home when this node does not reach its image. Asking for another node
 * than the holder, or than the home, is refused.
 */
export function jobNode(ctx: Context, volume: string, doc: VolumeDoc | undefined, asked?: string): string {
  const holders = doc ? holdersOf(doc) : [];
  const wanted = asked === undefined ? undefined : checkNodeName(asked);
  // A shared volume is granted to every node that asks (ledger/shared.ts), and its jobs need no device: any node will do.
  if (doc?.spec.shared) return wanted ?? ctx.config.nodeName;
  if (holders.length > 0) {
    const holder = holders[0] as string;
    if (wanted !== undefined && !holders.includes(wanted)) {
      throw new LatchError(`volume ${volume} is in use on node ${holders.join(', ')}: a job on it runs there, not on node ${wanted}`);
    }
    return wanted ?? holder;
  }
  // An idle node-local volume: the job runs where its image lives (node/home.ts), never on a node that would refuse it.
  const home = doc?.status.home;
  if (home !== undefined && ctx.backend.localPool !== undefined) {
    // Under oneHost another node name may share this pool: its agent's set-up is then what refuses, if it does not.
    if (wanted !== undefined && !reachesHome(ctx, home, wanted) && ctx.config.oneHost !== true) {
      throw new LatchError(
        `volume ${volume} lives on node ${home.node} (its image is in the pool ${home.pool} there): a job on it runs there, not on node ${wanted}`,
      );
    }
    if (wanted === undefined && !reachesHome(ctx, home, ctx.config.nodeName)) return home.node;
  }
  return wanted ?? ctx.config.nodeName;
}

/** The job ticket for `job` on `node`: its ID is the same from every node (jobTicketId), so a repeat finds it. */
export function jobRequest(
  ctx: Context,
  volume: string,
  job: JobSpec,
  node: string,
  options: { readOnly?: boolean; owner?: string } = {},
): JobRequest {
  const type = TYPE_OF_KIND[job.kind];
  return {
    id: jobTicketId(type, volume, keyOf(job)),
    type,
    nodeID: node,
    parameters: { readOnly: options.readOnly ?? readsOnly(job), disableFrontend: true },
    job,
    requestedBy: { admin: true },
    ...(options.owner !== undefined && { owner: options.owner }),
  };
}

export interface WaitOptions {
  /** false: return once the ticket is added (`--no-wait`). */
  wait: boolean;
  /** Give up waiting after this long (the job goes on; its ticket stays). */
  timeoutMs: number;
  /** Create the volume in the same write when it does not exist (restore, clone target). */
  create?: NewVolumeSpec;
  /** How long an agent has to start a granted job (default PICKUP_MS). */
  pickupMs?: number;
  /** How long to wait for a failed restore's or clone target's node to let go of the volume (default LET_GO_MS). */
  letGoMs?: number;
  /** Told of each new state while waiting (for people: "waiting for the volume", "running", ...). */
  onProgress?: (message: string) => void;
}

/** How a request ended, as far as the requester saw. */
export type JobResult =
  /** --no-wait: the ticket is in the ledger. */
  | { outcome: 'requested'; ticket: string; node: string }
  /** The agent finished it and removed the ticket: status.jobs has it. */
  | { outcome: 'finished'; ticket: string; node: string; job: FinishedJob }
  /** Done but the ticket stays: a manual attach that succeeded, a restore or clone target that failed. */
  | { outcome: 'held'; ticket: string; node: string; status: JobStatus };

/**
 * Adds the job ticket (requestJob) and, unless told not to wait, waits for its outcome: the entry the agent adds to
 * status.jobs when it finishes the ticket, or a terminal job status on a ticket that stays. A granted job that no
 * agent starts within pickupMs is taken back (only while still unstarted) and reported as such.
 */
export async function requestAndWait(ctx: Context, volume: string, request: JobRequest, options: WaitOptions): Promise<JobResult> {
  const before = await ctx.ledger.get(volume);
  if (!before && !options.create) throw new LatchError(`volume ${volume} does not exist (latch volume list shows the volumes)`);
  const earlier = before && finishedJob(before, request.id);
  const doc = await ctx.ledger.requestJob(volume, request, options.create);
  if (!doc?.spec.tickets[request.id]) throw new LatchError(`volume ${volume} does not exist (latch volume list shows the volumes)`);
  const ticket = request.id;
  const node = request.nodeID;
  if (!options.wait) return { outcome: 'requested', ticket, node };

  const stop = new AbortController();
  const changes = ctx.ledger.store.watch?.('volumes', stop.signal)[Symbol.asyncIterator]();
  const nextChange = () =>
    changes?.next().then(
      () => true,
      () => false, // a broken watch: the poll goes on
    );
  let changed = nextChange();
  const deadline = Date.now() + options.timeoutMs;
  const pickupMs = options.pickupMs ?? PICKUP_MS;
  /** Since when the ticket has been granted with no job status: an agent should have taken it up by now. */
  let grantedSince: number | undefined;
  /** Since when the job has been seen done with its ticket kept (a failed one waits there for its node to let go). */
  let failedSince: number | undefined;
  let said = '';
  try {
    for (;;) {
      const now = await ctx.ledger.get(volume);
      const done = now && finishedJob(now, ticket);
      if (done && JSON.stringify(done) !== JSON.stringify(earlier)) return { outcome: 'finished', ticket, node, job: done };
      const current: Ticket | undefined = now?.spec.tickets[ticket];
      if (!now || !current) {
        throw new LatchError(
          `the job ticket on volume ${volume} was removed before its job finished (by a person, or the volume was deleted)`,
        );
      }
      const status = now.status.tickets[ticket];
      const job = status?.job;
      if (job && holdsAfter(current, job.state)) {
        failedSince ??= Date.now();
        const lettingGo =
          job.state === 'failed' && nodeHoldsDevice(now, job.node) && Date.now() - failedSince < (options.letGoMs ?? LET_GO_MS);
        if (!lettingGo) return { outcome: 'held', ticket, node, status: job };
      }
      const progress = job ? `${job.state} on node ${job.node}: ${job.message}` : `waiting: ${status?.message ?? 'not granted yet'}`;
      if (progress !== said) options.onProgress?.((said = progress));
      if (job === undefined && isSatisfied(now, ticket)) {
        grantedSince ??= Date.now();
        if (Date.now() - grantedSince >= pickupMs && (await takeBackUnstarted(ctx, volume, ticket))) {
          throw new LatchError(
            `no latch agent on node ${node} took the job up in ${Math.round(pickupMs / 1000)} s: is \`latch agent\` running there? ` +
              '(its ticket was removed)',
          );
        }
      } else {
        grantedSince = undefined;
      }
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new LatchError(
          `the job did not finish within ${Math.round(options.timeoutMs / 1000)} s; it goes on (ticket ${ticket} on volume ${volume}: ` +
            '`latch ticket list` shows it, and status.jobs its outcome once done)',
        );
      }
      const poll = sleep(Math.min(POLL_MS, left)).then(() => 'poll' as const);
      const woke = await Promise.race(changed ? [poll, changed] : [poll]);
      if (woke === true) changed = nextChange();
      else if (woke === false) changed = undefined;
    }
  } finally {
    stop.abort();
    await changes?.return?.();
  }
}

/** Done and holding its ticket: a manual attach that succeeded, a restore or clone target that failed. */
function holdsAfter(ticket: Ticket, state: JobStatus['state']): boolean {
  const job = ticket.job;
  if (state === 'succeeded') return job?.kind === 'attach';
  if (state === 'failed') return job?.kind === 'restore' || (job?.kind === 'clone' && job.role === 'target');
  return false;
}

/** Removes the job ticket if no agent started its job (one CAS write); says whether it did. */
export async function takeBackUnstarted(ctx: Context, volume: string, id: string): Promise<boolean> {
  let removed = false;
  await ctx.ledger.removeTicket(volume, (doc) => {
    removed = doc.status.tickets[id]?.job === undefined && doc.spec.tickets[id] !== undefined;
    return removed ? id : undefined;
  });
  return removed;
}

/** The job's outcome for people; a failed job is thrown as the error it was. */
export function describeOutcome(result: JobResult): string {
  switch (result.outcome) {
    case 'requested':
      return `asked node ${result.node} for it: ticket ${result.ticket} (latch ticket list shows how it goes)`;
    case 'finished': {
      const status = result.job.status;
      if (status.state !== 'succeeded') throw new LatchError(`the job on node ${result.node} ${status.state}: ${status.message}`);
      return status.message;
    }
    case 'held':
      if (result.status.state === 'failed') throw new LatchError(`the job on node ${result.node} failed: ${result.status.message}`);
      return result.status.message;
  }
}
