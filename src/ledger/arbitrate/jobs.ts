// Job tickets (docs/ledger.md, "Jobs"): work the node agent does for a ticket, from request to its kept end.
import { isDeepStrictEqual } from 'node:util';
import { LatchError } from '../../errors.js';
import { shortTicketId } from '../ids.js';
import {
  JOB_TICKET_TYPES,
  type FinishedJob,
  type JobSpec,
  type JobStatus,
  type JobTicketType,
  type Ticket,
  type VolumeDoc,
} from '../types.js';
import { isSatisfied, ticketsOfNode } from './queries.js';
import { reconcile } from './reconcile.js';
import { addTicket, removeTicket, type TicketRequest } from './tickets.js';

/** How many finished jobs a volume's status keeps (the oldest go first). */
export const MAX_FINISHED_JOBS = 20;

export type JobRequest = TicketRequest & { job: JobSpec };

/** The job kind each job ticket type carries. */
const KIND_OF_TYPE: Record<JobTicketType, JobSpec['kind']> = {
  restore: 'restore',
  manual: 'attach',
  snapshot: 'snapshot',
  backup: 'backup',
  clone: 'clone',
};

/**
 * Adds a job ticket. The same ID asking for the same job on the same node again changes nothing (its job status is
 * kept), except that a job that failed and kept its ticket (a restore or clone target) is asked for afresh: its status
 * goes, so an agent starts it again. The same ID asking for anything else is refused.
 */
export function requestJob(doc: VolumeDoc, request: JobRequest, now: string): VolumeDoc {
  const kind = (JOB_TICKET_TYPES as readonly string[]).includes(request.type) ? KIND_OF_TYPE[request.type as JobTicketType] : undefined;
  if (kind !== request.job.kind) {
    throw new LatchError(`a ${request.type} ticket cannot carry a ${request.job.kind} job`);
  }
  const existing = doc.spec.tickets[request.id];
  if (!existing) return addTicket(doc, request, now);
  if (
    existing.nodeID !== request.nodeID ||
    existing.type !== request.type ||
    existing.parameters.readOnly !== request.parameters.readOnly ||
    !isDeepStrictEqual(existing.job, request.job)
  ) {
    throw new LatchError(
      `a job named ${shortTicketId(request.id)} is already asked for on volume ${doc.name}: ${describeJob(existing)}; ` +
        'wait for it to finish (or end it) before asking for something else under that name',
    );
  }
  if (doc.status.tickets[request.id]?.job?.state !== 'failed') return doc;
  const next = structuredClone(doc);
  delete next.status.tickets[request.id]?.job;
  return reconcile(next, now);
}

function describeJob(ticket: Ticket): string {
  const job = ticket.job;
  const what = !job
    ? 'not a job'
    : job.kind === 'snapshot'
      ? `snapshot ${job.snapshot}`
      : job.kind === 'backup'
        ? `backup ${job.backup}`
        : job.kind === 'restore'
          ? `restore from backup ${job.backup}`
          : job.kind === 'clone'
            ? `clone ${job.source} -> ${job.target} (${job.role})`
            : `manual attach${job.mount || job.mountPath !== undefined ? ', mounted' : ''}`;
  return `${ticket.type} ticket (${what}) for node ${ticket.nodeID}`;
}

/**
 * An agent on `node` starts (or, after a kill, restarts) the ticket's job: running, one attempt more. Refused unless
 * the job ticket exists, is for `node`, is satisfied, and its job is neither done nor asked to end.
 */
export function startJob(doc: VolumeDoc, id: string, node: string, now: string): VolumeDoc {
  const ticket = doc.spec.tickets[id];
  if (!ticket?.job) throw new LatchError(`volume ${doc.name} has no job ticket ${shortTicketId(id)}`);
  if (ticket.nodeID !== node) throw new LatchError(`job ticket ${shortTicketId(id)} is for node ${ticket.nodeID}, not ${node}`);
  const status = doc.status.tickets[id];
  if (!isSatisfied(doc, id)) {
    throw new LatchError(`job ticket ${shortTicketId(id)} is not granted on node ${node}: ${status?.message ?? 'no status yet'}`);
  }
  const previous = status?.job;
  if (previous && previous.state !== 'running') {
    throw new LatchError(`job ticket ${shortTicketId(id)} is ${previous.state}: it is not started again`);
  }
  const next = structuredClone(doc);
  const own = next.status.tickets[id];
  if (own) own.job = { state: 'running', node, startedAt: now, attempts: (previous?.attempts ?? 0) + 1, message: 'started' };
  return reconcile(next, now);
}

/** What a job's runner records of it. */
export interface JobUpdate {
  state: JobStatus['state'];
  message: string;
  result?: Record<string, unknown>;
  /**
   * The filesystem a job that wrote the volume whole (a restore, a clone) left on it: recorded with the job's state in
   * one write, so that no reader sees a filesystem on a volume whose job has not finished writing it.
   */
  filesystem?: string;
}

/**
 * Records how far the job got. finishedAt is set when it succeeded or failed. A job asked to end stays 'ending' unless
 * it failed. No ticket, or the same record again: nothing changes.
 */
export function recordJob(doc: VolumeDoc, id: string, update: JobUpdate, now: string): VolumeDoc {
  const ticket = doc.spec.tickets[id];
  if (!ticket?.job) return doc;
  const previous = doc.status.tickets[id]?.job;
  const state = previous?.state === 'ending' && update.state !== 'failed' ? 'ending' : update.state;
  const result = update.result ?? previous?.result;
  const filesystem = update.filesystem ?? doc.status.filesystem;
  if (
    previous &&
    previous.state === state &&
    previous.message === update.message &&
    isDeepStrictEqual(previous.result, result) &&
    filesystem === doc.status.filesystem
  ) {
    return doc;
  }
  const done = state === 'succeeded' || state === 'failed' || update.state === 'succeeded';
  const job: JobStatus = {
    state,
    node: previous?.node ?? ticket.nodeID,
    startedAt: previous?.startedAt ?? now,
    ...(done && { finishedAt: now }),
    attempts: previous?.attempts ?? 0,
    message: update.message,
    ...(result !== undefined && { result }),
  };
  const next = structuredClone(doc);
  const own = next.status.tickets[id];
  if (!own) return doc;
  own.job = job;
  if (filesystem !== undefined) next.status.filesystem = filesystem;
  return reconcile(next, now);
}

/**
 * The job is over: ONE change removes its ticket and keeps how it ended in status.jobs (newest last, at most
 * MAX_FINISHED_JOBS). No ticket: nothing changes. A job no agent started is kept as ended before it started.
 */
export function finishJob(doc: VolumeDoc, id: string, now: string): VolumeDoc {
  const ticket = doc.spec.tickets[id];
  if (!ticket) return doc;
  if (!ticket.job) throw new LatchError(`ticket ${shortTicketId(id)} of volume ${doc.name} is not a job ticket`);
  const status: JobStatus = doc.status.tickets[id]?.job ?? {
    state: 'ending',
    node: ticket.nodeID,
    startedAt: now,
    finishedAt: now,
    attempts: 0,
    message: 'ended before any agent started it',
  };
  const finished: FinishedJob = {
    ticket: id,
    type: ticket.type as JobTicketType,
    node: ticket.nodeID,
    job: ticket.job,
    status: { ...status, finishedAt: status.finishedAt ?? now },
  };
  return keepFinished(removeTicket(doc, id, now), finished);
}

/**
 * A job a command ran itself, beside a pod, without a ticket (`latch backup create` on the node that holds the
 * volume): its outcome is kept in status.jobs as a finished ticket's is (same shape, same bound), so that whatever
 * reads the history sees it. The same record again (a compare-and-swap retry, a repeated write) changes nothing.
 */
export function recordDirectJob(doc: VolumeDoc, finished: FinishedJob & { direct: true }): VolumeDoc {
  if ((doc.status.jobs ?? []).some((j) => isDeepStrictEqual(j, finished))) return doc;
  return keepFinished(structuredClone(doc), finished);
}

/** Appends to status.jobs (newest last), keeping the newest MAX_FINISHED_JOBS. Changes `doc`. */
function keepFinished(doc: VolumeDoc, finished: FinishedJob): VolumeDoc {
  doc.status.jobs = [...(doc.status.jobs ?? []), finished].slice(-MAX_FINISHED_JOBS);
  return doc;
}

/**
 * A person asks the job to end (`latch volume detach` of a manual attach): a job no agent started is finished at once;
 * a running one, or a manual attach that is set up, goes 'ending' and its agent lets go. A job that is done already
 * (or a failed one that keeps its ticket) is left as it is. No ticket: nothing changes.
 */
export function endJob(doc: VolumeDoc, id: string, now: string): VolumeDoc {
  const ticket = doc.spec.tickets[id];
  if (!ticket?.job) return doc;
  const job = doc.status.tickets[id]?.job;
  if (!job) return finishJob(doc, id, now);
  if (job.state !== 'running' && !(job.state === 'succeeded' && ticket.job.kind === 'attach')) return doc;
  return recordJob(doc, id, { state: 'ending', message: 'asked to end' }, now);
}

/** The node's job tickets on the volume (the node agent's work list). */
export function jobTicketsOfNode(doc: VolumeDoc, node: string): Ticket[] {
  return ticketsOfNode(doc, node).filter((t) => t.job !== undefined);
}

/** How the job of ticket `id` ended: the latest entry for it in status.jobs. */
export function finishedJob(doc: VolumeDoc, id: string): FinishedJob | undefined {
  return [...(doc.status.jobs ?? [])].reverse().find((j) => j.ticket === id);
}
