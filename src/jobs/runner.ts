// The node agent's job runner (docs/jobs.md, "The runner"): for each job ticket of this node it starts the job once
// the ledger grants the volume here (device set up with the frontend disabled: nothing mounts it for a pod), aborts
// it when the ticket is preempted or removed, and once it is done releases the device (unless another ticket of this
// node still needs it) and finishes the ticket. It keeps nothing the ledger does not hold: a runner started after a
// kill finds 'running' jobs that no process here runs, and redoes them (handlers are idempotent by name).
import type { Context } from '../context.js';
import { JobInterruptedError, errorMessage } from '../errors.js';
import { isSatisfied, jobTicketsOfNode, nodeHoldsDevice, type JobUpdate } from '../ledger/arbitrate.js';
import type { JobStatus, Ticket, VolumeDoc } from '../ledger/types.js';
import { releaseDevice, setUpDevice } from '../node/device.js';
import { handlerOf } from '../node/jobs/index.js';
import type { JobRun } from '../node/jobs/types.js';
import { withVolumeLock } from '../node/lock.js';

/** A job this process runs. */
interface Running {
  volume: string;
  ticket: string;
  abort: AbortController;
  done: Promise<void>;
}

type Log = (entry: Record<string, unknown>) => void;

/** Job states after which the runner lets go (unless the kind keeps its ticket: keepsTicket). */
const TERMINAL: readonly JobStatus['state'][] = ['succeeded', 'failed', 'ending'];

/**
 * Whether a finished job keeps its ticket: a manual attach that succeeded holds the device until `latch volume
 * detach` (state 'ending'); a restore or clone target that failed left a half-made volume nobody may use.
 */
function keepsTicket(ticket: Ticket, state: JobStatus['state']): boolean {
  const job = ticket.job;
  if (state === 'succeeded') return job?.kind === 'attach';
  if (state === 'failed') return job?.kind === 'restore' || (job?.kind === 'clone' && job.role === 'target');
  return false;
}

/** Whether this ticket of the node needs the node's device now (so another job's end must not release it). */
function needsDevice(doc: VolumeDoc, ticket: Ticket): boolean {
  if (ticket.type === 'workload') return true;
  if (!ticket.job) return false; // admin and maintenance reservations set up no device
  const state = doc.status.tickets[ticket.id]?.job?.state;
  if (state === 'succeeded' && ticket.job.kind === 'attach') return true;
  if (state !== undefined && state !== 'running') return false;
  return isSatisfied(doc, ticket.id);
}

export class JobRunner {
  private readonly running = new Map<string, Running>();
  /** Per volume, the end of the chain of looks at its tickets: one at a time, so a job is never started twice. */
  private readonly looks = new Map<string, Promise<void>>();
  private stopping = false;
  /** The damaged documents the last pass logged: a pass runs on every ledger change, the log says each once. */
  private damagedLogged = '';

  constructor(
    /** A context for one piece of work (a fresh log over the agent's store and backend). */
    private readonly context: () => Context,
    private readonly log: Log,
  ) {}

  /** How many jobs this process runs now. */
  get active(): number {
    return this.running.size;
  }

  /**
   * One look at every volume: starts the jobs granted here, aborts those that lost their grant or ticket, lets go of
   * what finished jobs held. Returns without waiting for the jobs it started.
   */
  async pass(): Promise<void> {
    const ctx = this.context();
    const node = ctx.config.nodeName;
    const seen = new Set<string>();
    const { docs, damaged } = await ctx.ledger.list();
    // A damaged document shows no tickets: its volume's jobs are neither started nor aborted until it reads again.
    const unreadable = new Set(damaged.map((d) => d.name));
    const damagedNow = JSON.stringify(damaged);
    if (damagedNow !== this.damagedLogged) for (const d of damaged) this.log({ volume: d.name, error: `its jobs wait: ${d.reason}` });
    this.damagedLogged = damagedNow;
    for (const doc of docs) {
      const tickets = jobTicketsOfNode(doc, node);
      for (const ticket of tickets) seen.add(ticket.id);
      for (const ticket of tickets) {
        try {
          await this.look(doc.name, ticket.id);
        } catch (err) {
          this.log({ volume: doc.name, ticket: ticket.id, error: errorMessage(err) });
        }
      }
    }
    // A job whose ticket is gone (removed by a person, its volume deleted): stop it.
    for (const run of this.running.values()) {
      if (!seen.has(run.ticket) && !unreadable.has(run.volume)) run.abort.abort(new Error('its ticket was removed'));
    }
  }

  /** Waits for every job this process started (and the release and finish that follow each). */
  async settle(): Promise<void> {
    while (this.running.size > 0) await Promise.all([...this.running.values()].map((r) => r.done));
  }

  /** The agent stops: jobs are aborted and left 'running' in the ledger, for the next agent on this node to redo. */
  async stop(): Promise<void> {
    this.stopping = true;
    for (const run of this.running.values()) run.abort.abort(new Error('the agent is stopping'));
    await this.settle();
  }

  /** Acts on one job ticket of this node as the ledger has it now, after any look at the same volume in progress. */
  private look(volume: string, id: string, ran?: Ticket): Promise<void> {
    const next = (this.looks.get(volume) ?? Promise.resolve()).then(() => this.lookNow(volume, id, ran));
    const tail = next.catch(() => undefined);
    this.looks.set(volume, tail);
    void tail.then(() => {
      if (this.looks.get(volume) === tail) this.looks.delete(volume);
    });
    return next;
  }

  /** `ran`: the ticket of a job this process just ran (its device is this runner's to let go of, even if it is gone). */
  private async lookNow(volume: string, id: string, ran?: Ticket): Promise<void> {
    const ctx = this.context();
    const doc = await ctx.ledger.get(volume);
    const ticket = doc?.spec.tickets[id];
    const mine = this.running.get(id);
    if (!doc || !ticket?.job) {
      mine?.abort.abort(new Error('its ticket was removed'));
      // Removed while it ran here: what the job set up goes too (no ticket wants it; the node is detaching).
      if (doc && ran && nodeHoldsDevice(doc, ctx.config.nodeName)) await this.letGo(ctx, volume, ran);
      return;
    }
    const satisfied = isSatisfied(doc, id);
    const job = doc.status.tickets[id]?.job;
    if (mine) {
      // Rule 1 for a job running here: preempted (or no longer granted), or asked to end.
      if (!satisfied) mine.abort.abort(new Error('preempted: a ticket of higher priority wants the volume'));
      else if (job?.state === 'ending') mine.abort.abort(new Error('asked to end'));
      return;
    }
    if (!satisfied) {
      // Rule 1 after a kill or a preemption: let go of what this node may still hold for the job.
      if (job !== undefined && nodeHoldsDevice(doc, ctx.config.nodeName)) await this.letGo(ctx, volume, ticket);
      return;
    }
    if (job === undefined || job.state === 'running') {
      // Rule 2: never started, or started by an agent that is gone. One job at a time per volume in this process.
      if (this.stopping || [...this.running.values()].some((r) => r.volume === volume)) return;
      this.start(volume, ticket);
      return;
    }
    // Rule 3: done (or asked to end).
    if (TERMINAL.includes(job.state)) await this.finish(ctx, doc, ticket, job.state);
  }

  private start(volume: string, ticket: Ticket): void {
    const abort = new AbortController();
    const entry: Running = { volume, ticket: ticket.id, abort, done: Promise.resolve() };
    this.running.set(ticket.id, entry);
    entry.done = this.run(volume, ticket, abort.signal)
      .catch((err: unknown) => this.log({ volume, ticket: ticket.id, error: errorMessage(err) }))
      .finally(() => this.running.delete(ticket.id))
      .then(async () => {
        // What to do next is what the ledger says now: finish it, let go after a preemption, or nothing (stopping).
        if (!this.stopping)
          await this.look(volume, ticket.id, ticket).catch((err: unknown) =>
            this.log({ volume, ticket: ticket.id, error: errorMessage(err) }),
          );
      });
  }

  /** Starts the job in the ledger, sets the device up, runs the handler and records the outcome. */
  private async run(volume: string, ticket: Ticket, signal: AbortSignal): Promise<void> {
    const ctx = this.context();
    const node = ctx.config.nodeName;
    const job = ticket.job;
    if (!job) return;
    const handler = await handlerOf(job);
    const started = await ctx.ledger.startJob(volume, ticket.id, node);
    if (!started) return; // the volume is gone
    const attempt = started.status.tickets[ticket.id]?.job?.attempts;
    this.log({ volume, ticket: ticket.id, job: job.kind, state: 'running', attempt });
    let update: JobUpdate;
    try {
      const { device, doc } = await withVolumeLock(ctx.config, volume, async () => {
        // A shared volume has no device: the node's grant is recorded, and the handler mounts what it needs itself.
        if (started.spec.shared) return (await import('../node/shared.js')).setUpSharedForJob(ctx, volume);
        await ctx.ledger.claimGrant(volume, node);
        const current = (await ctx.ledger.get(volume)) ?? started;
        return setUpDevice(ctx, volume, current);
      });
      signal.throwIfAborted();
      const outcome = await handler.run(job, { ctx, volume, ticket, doc, device, signal } satisfies JobRun);
      signal.throwIfAborted();
      update = {
        state: 'succeeded',
        message: outcome.message,
        ...(outcome.result !== undefined && { result: outcome.result }),
        ...(outcome.filesystem !== undefined && { filesystem: outcome.filesystem }),
      };
    } catch (err) {
      if (signal.aborted) {
        // Not a failure: the job is redone once the volume is granted here again (or by the next agent).
        const why = errorMessage(signal.reason);
        update = { state: 'running', message: `interrupted (${why}); it is redone when the volume is granted on ${node} again` };
      } else if (err instanceof JobInterruptedError) {
        // What it read changed under it (the handler published nothing): the look that follows this run starts it again.
        update = { state: 'running', message: `interrupted (${errorMessage(err)})` };
      } else if (!isSatisfied((await ctx.ledger.get(volume)) ?? started, ticket.id)) {
        // The grant went (a preemption) before the abort reached us: redone later as well.
        update = { state: 'running', message: `interrupted (the volume was taken from ${node}); it is redone when granted again` };
      } else {
        update = { state: 'failed', message: errorMessage(err) };
      }
    }
    await ctx.ledger.recordJob(volume, ticket.id, update);
    this.log({ volume, ticket: ticket.id, job: job.kind, state: update.state, message: update.message });
  }

  /** Rule 3: undo the handler's extras, release the device unless the node still needs it, remove the ticket. */
  private async finish(ctx: Context, doc: VolumeDoc, ticket: Ticket, state: JobStatus['state']): Promise<void> {
    const volume = doc.name;
    if (keepsTicket(ticket, state)) {
      // A failed restore or clone target lets go of the device (once) but keeps its ticket; a manual attach keeps both.
      if (state === 'failed' && nodeHoldsDevice(doc, ctx.config.nodeName)) await this.letGo(ctx, volume, ticket);
      return;
    }
    await this.letGo(ctx, volume, ticket);
    await ctx.ledger.finishJob(volume, ticket.id);
    this.log({ volume, ticket: ticket.id, job: ticket.job?.kind, finished: state });
  }

  /** cleanUp, then release the device and confirm, unless another ticket of this node needs it (a pod's, a job's). */
  private async letGo(ctx: Context, volume: string, ticket: Ticket): Promise<void> {
    const job = ticket.job;
    if (!job) return;
    const node = ctx.config.nodeName;
    await withVolumeLock(ctx.config, volume, async () => {
      const doc = await ctx.ledger.get(volume);
      if (!doc) return;
      const handler = await handlerOf(job);
      const shared = doc.spec.shared ? await import('../node/shared.js') : undefined;
      const device = shared ? shared.sharedDeviceId(volume) : ((await ctx.backend.findDevice(volume)) ?? '');
      if (handler.cleanUp) await handler.cleanUp?.(job, { ctx, volume, ticket, doc, device });
      const needed = Object.values(doc.spec.tickets).some((t) => t.nodeID === node && t.id !== ticket.id && needsDevice(doc, t));
      if (needed || !nodeHoldsDevice(doc, node)) return;
      const release = shared ? (await import('../node/shared.js')).releaseSharedForJob : releaseDevice;
      const busy = await release(ctx, volume);
      if (busy !== undefined) this.log({ volume, ticket: ticket.id, kept: busy, why: 'the device is mounted on this node' });
    });
  }
}
