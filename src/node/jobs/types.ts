// What the node agent's job runner (jobs/runner.ts) asks of one kind of job (docs/jobs.md). The runner owns the
// ticket's life: it claims the grant, sets up the device (frontend disabled: nothing mounts it for a pod), records
// the job as running, calls run(), records the outcome, calls cleanUp() and releases the device, then finishes the
// ticket. A handler only does the work, and must be safe to call again after a kill at any point.
import type { Context } from '../../context.js';
import type { JobSpec, Ticket, VolumeDoc } from '../../ledger/types.js';

export type JobKind = JobSpec['kind'];
export type JobOf<K extends JobKind> = Extract<JobSpec, { kind: K }>;

export interface JobRun {
  ctx: Context;
  volume: string;
  ticket: Ticket;
  /** The volume's document when the job started. */
  doc: VolumeDoc;
  /** The volume's device on this node, set up (or found, when a pod here has it) before run(). */
  device: string;
  /** Aborted when the ticket is preempted or removed, or the agent stops: stop soon, leave nothing that looks complete. */
  signal: AbortSignal;
}

export interface JobOutcome {
  /** For people: what was done. */
  message: string;
  /** For the requester: what was made (small JSON). */
  result?: Record<string, unknown>;
  /** The filesystem now on the volume, when the job wrote it whole: the runner records it with the job's success. */
  filesystem?: string;
}

export interface JobHandler<K extends JobKind = JobKind> {
  kind: K;
  /**
   * Does the job. Names are fixed in the ticket, so a repeat finds what an interrupted run made: it finishes it or
   * starts over, and never reports as done something half-made. Throws to fail the job (the message is recorded).
   */
  run(job: JobOf<K>, run: JobRun): Promise<JobOutcome>;
  /** Undoes what run() set up beyond the device (a manual attach's mount) before the runner releases the device. */
  cleanUp?(job: JobOf<K>, run: Omit<JobRun, 'signal'>): Promise<void>;
}
