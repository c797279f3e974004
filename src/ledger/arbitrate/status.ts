// The ticket statuses and the volume state that reconcile derives, in the seeds' status shape (conditions included).
import type { Condition, JobStatus, NodeAttachment, Ticket, TicketStatus, VolumeDoc, VolumeState } from '../types.js';
import { sharedWaitMessage } from '../shared.js';
import { isFencedOff } from './queries.js';

/** A restore's or a clone target's ticket: its job writes the whole volume, which nothing else may use until it is done. */
function fillsVolume(ticket: Ticket): boolean {
  return ticket.type === 'restore' || (ticket.type === 'clone' && ticket.job?.kind === 'clone' && ticket.job.role === 'target');
}

export function statusOf(doc: VolumeDoc, ticket: Ticket, sorted: Ticket[]): TicketStatus {
  const base = { generation: ticket.generation };
  const own = doc.status.nodes[ticket.nodeID];
  if (own && own.phase !== 'detaching') {
    if (own.readOnly && !ticket.parameters.readOnly) {
      return {
        ...base,
        satisfied: false,
        reason: 'ReadOnlyAttachment',
        message: `read-write wanted, but the volume is attached read-only on node ${ticket.nodeID}; it must be detached first`,
      };
    }
    const alone = sharedWaitMessage(doc, ticket);
    if (alone !== undefined) return { ...base, satisfied: false, reason: 'Waiting', message: alone };
    const old = doc.status.tickets[ticket.id];
    const had = old?.satisfied === true && old.generation === ticket.generation;
    const filling = fillsVolume(ticket) || had ? undefined : sorted.find((t) => t.nodeID === ticket.nodeID && fillsVolume(t));
    if (filling !== undefined) {
      // The node holds the volume for a restore or clone that is filling it: another ticket of the same node (a pod's)
      // would get the half-made volume through that grant. It waits, as one of another node's does, until that ticket
      // goes (a ticket that had the volume before keeps it: a pod's device is never cut).
      return {
        ...base,
        satisfied: false,
        reason: 'Waiting',
        message: `volume ${doc.name} is being filled by a ${filling.type} job (ticket ${filling.id}); nothing else uses it until that is done`,
      };
    }
    return { ...base, satisfied: true, reason: 'Attached', message: `attached to node ${ticket.nodeID}` };
  }
  if (own) {
    // Its node still has the device but is letting it go to a more important ticket elsewhere (preemption).
    return {
      ...base,
      satisfied: false,
      reason: 'Preempted',
      message: `preempted: node ${ticket.nodeID} is letting the volume go for a ticket of higher priority elsewhere; this ticket is granted again once the volume is free`,
    };
  }
  if (isFencedOff(doc, ticket.nodeID)) {
    return {
      ...base,
      satisfied: false,
      reason: 'Fenced',
      message:
        `node ${ticket.nodeID} was fenced off the volume; it gets it again once it has cleared its old mapping ` +
        `(its unmountdevice, unmount or waitforattach for the volume does, or latch node clear-fences there)`,
    };
  }
  const others = Object.entries(doc.status.nodes).filter(([n]) => n !== ticket.nodeID);
  const releasing = others.find(([, e]) => e.phase === 'detaching');
  if (releasing) {
    const [node] = releasing;
    return {
      ...base,
      satisfied: false,
      reason: 'Detaching',
      message:
        `still detaching from node ${node}: waiting for node ${node} to release the device ` +
        `(if the node is down: latch volume release ${doc.name} --node ${node} --node-is-down)`,
    };
  }
  const holder = others[0];
  if (holder) {
    const [node] = holder;
    const holdingTicket = sorted.find((t) => t.nodeID === node);
    return {
      ...base,
      satisfied: false,
      reason: 'AttachedElsewhere',
      message: `attached to node ${node}${holdingTicket ? ` (ticket ${holdingTicket.id})` : ''}`,
    };
  }
  return { ...base, satisfied: false, reason: 'Waiting', message: 'waiting for the volume to be granted' };
}

export function stateOf(entries: NodeAttachment[]): VolumeState {
  if (entries.length === 0) return 'detached';
  if (entries.some((e) => e.phase === 'detaching')) return 'detaching';
  if (entries.some((e) => e.phase === 'granted' || e.phase === 'attaching')) return 'attaching';
  return 'attached';
}

/**
 * The ticket's conditions: Satisfied always, Job once an agent started the job. Times move only on change:
 * lastTransitionTime when status changes, lastProbeTime when reason or message change, so that reconciling a document
 * in which nothing changed gives the same document (the ledger writes nothing for it).
 */
export function conditionsOf(status: TicketStatus, job: JobStatus | undefined, old: Condition[] | undefined, now: string): Condition[] {
  const satisfied = { status: status.satisfied ? 'True' : 'False', reason: status.reason, message: status.message } as const;
  const conditions = [timed('Satisfied', satisfied, old, now)];
  if (job) conditions.push(timed('Job', jobCondition(job, status.satisfied), old, now));
  return conditions;
}

function jobCondition(job: JobStatus, satisfied: boolean): Pick<Condition, 'status' | 'reason' | 'message'> {
  switch (job.state) {
    case 'running':
      return satisfied
        ? { status: 'Unknown', reason: 'Running', message: job.message }
        : { status: 'Unknown', reason: 'Preempted', message: `interrupted: the ticket lost the volume (${job.message})` };
    case 'ending':
      return { status: 'Unknown', reason: 'Ending', message: job.message };
    case 'succeeded':
      return { status: 'True', reason: 'Succeeded', message: job.message };
    case 'failed':
      return { status: 'False', reason: 'Failed', message: job.message };
  }
}

function timed(
  type: Condition['type'],
  value: Pick<Condition, 'status' | 'reason' | 'message'>,
  old: Condition[] | undefined,
  now: string,
): Condition {
  const before = old?.find((c) => c.type === type);
  const sameProbe = before !== undefined && before.reason === value.reason && before.message === value.message;
  return {
    type,
    ...value,
    lastProbeTime: sameProbe ? before.lastProbeTime : now,
    lastTransitionTime: before !== undefined && before.status === value.status ? before.lastTransitionTime : now,
  };
}
