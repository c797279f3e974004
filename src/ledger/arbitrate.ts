// Pure arbitration: (volume document, request) -> new document. No I/O, no clock except the `now` passed in.
// The rules it implements: docs/ledger.md, "Arbitration rules" and "Node phases".
import { isDeepStrictEqual } from 'node:util';
import { LatchError } from '../errors.js';
import type { FsType } from '../filesystems.js';
import { shortTicketId } from './ids.js';
import { grantShared, sharedWaitMessage } from './shared.js';
import {
  JOB_TICKET_TYPES,
  TICKET_PRIORITY,
  type Condition,
  type Fence,
  type FinishedJob,
  type JobSpec,
  type JobStatus,
  type JobTicketType,
  type NodeAttachment,
  type NodePhase,
  type Ticket,
  type TicketStatus,
  type VolumeDoc,
  type VolumeState,
} from './types.js';

export function newVolume(name: string, sizeBytes: number, fsType: FsType, now: string): VolumeDoc {
  return {
    apiVersion: 'latch/v1',
    name,
    createdAt: now,
    spec: { sizeBytes, fsType, tickets: {}, generationCounter: 0 },
    status: { state: 'detached', currentNodes: [], nodes: {}, tickets: {} },
  };
}

export type TicketRequest = Omit<Ticket, 'generation' | 'createdAt'>;

/** Adds a ticket, or keeps it as it is when the same ID asks for the same thing (generation unchanged). */
export function addTicket(doc: VolumeDoc, request: TicketRequest, now: string): VolumeDoc {
  const next = structuredClone(doc);
  const existing = next.spec.tickets[request.id];
  if (
    existing &&
    existing.nodeID === request.nodeID &&
    existing.type === request.type &&
    existing.parameters.readOnly === request.parameters.readOnly
  ) {
    // Same request again: refresh who asked (pod info may be new), nothing else.
    existing.requestedBy = { ...existing.requestedBy, ...request.requestedBy };
    // Owner and time to live (issue 15): a repeated `ticket add` may name a new owner or extend the ticket's life.
    if (request.owner !== undefined) existing.owner = request.owner;
    if (request.expiresAt !== undefined) existing.expiresAt = request.expiresAt;
    return reconcile(next, now);
  }
  next.spec.generationCounter += 1;
  next.spec.tickets[request.id] = { ...request, generation: next.spec.generationCounter, createdAt: now };
  // A changed ticket starts unsatisfied; reconcile decides afresh.
  delete next.status.tickets[request.id];
  const node = next.status.nodes[request.nodeID];
  if (node?.phase === 'detaching') {
    // The node still has the device and is wanted again there: it keeps it (it never let go).
    node.phase = 'attaching';
    node.since = now;
  }
  if (existing && existing.nodeID !== request.nodeID) dropNodeIfUnwanted(next, existing.nodeID, now);
  return reconcile(next, now);
}

/** Removes a ticket; an unknown ID changes nothing. A node that loses its last ticket must still confirm release. */
export function removeTicket(doc: VolumeDoc, id: string, now: string): VolumeDoc {
  const ticket = doc.spec.tickets[id];
  if (!ticket) return doc;
  const next = structuredClone(doc);
  delete next.spec.tickets[id];
  delete next.status.tickets[id];
  dropNodeIfUnwanted(next, ticket.nodeID, now);
  return reconcile(next, now);
}

/** The node starts setting up the device. Refused (undefined) unless the ledger granted it the volume. */
export function markAttaching(doc: VolumeDoc, node: string, now: string): VolumeDoc | undefined {
  const entry = doc.status.nodes[node];
  if (!entry || entry.phase === 'detaching') return undefined;
  if (entry.phase !== 'granted') return doc;
  // Being fenced: a grant it had not taken up yet is not taken up now (the fencer may have listed its clients already).
  if (isFencedOff(doc, node)) return undefined;
  const next = structuredClone(doc);
  next.status.nodes[node] = { ...entry, phase: 'attaching', since: now };
  return reconcile(next, now);
}

/**
 * The node has the device, served by the storage client `client` where the backend names one (kept from an earlier
 * record when it does not). Refused (undefined) unless it was attaching or attached.
 */
export function markAttached(doc: VolumeDoc, node: string, device: string, now: string, client?: string): VolumeDoc | undefined {
  const entry = doc.status.nodes[node];
  if (!entry || entry.phase === 'granted' || entry.phase === 'detaching') return undefined;
  if (entry.phase === 'attached' && entry.device === device && (client === undefined || entry.client === client)) return doc;
  const next = structuredClone(doc);
  const known = client ?? entry.client;
  next.status.nodes[node] = { ...entry, phase: 'attached', device, since: now, ...(known === undefined ? {} : { client: known }) };
  // The seed's lastAttachedBy: who the node reached attached for (its most important ticket), not a later device change.
  const by = entry.phase === 'attached' ? undefined : ticketsOfNode(next, node).sort(compareTickets)[0];
  if (by) next.status.lastAttachedBy = { ticket: by.id, type: by.type, node, at: now };
  return reconcile(next, now);
}

/**
 * The node confirms its device is released (unmounted, loop device gone). If tickets still want the volume there
 * it stays granted to the node; otherwise the node lets go, and a waiting ticket elsewhere may be granted.
 */
export function markReleased(doc: VolumeDoc, node: string, now: string): VolumeDoc {
  const entry = doc.status.nodes[node];
  if (!entry) return doc;
  const next = structuredClone(doc);
  if (ticketsOfNode(next, node).length > 0) {
    if (entry.phase === 'granted') return doc;
    next.status.nodes[node] = { phase: 'granted', readOnly: entry.readOnly, since: now };
  } else {
    delete next.status.nodes[node];
  }
  return reconcile(next, now);
}

/** The admin fence: the node is down. Its tickets and its hold on the volume go, whatever it may still have. */
export function releaseDeadNode(doc: VolumeDoc, node: string, now: string): VolumeDoc {
  const next = structuredClone(doc);
  for (const ticket of ticketsOfNode(next, node)) {
    delete next.spec.tickets[ticket.id];
    delete next.status.tickets[ticket.id];
  }
  delete next.status.nodes[node];
  return reconcile(next, now);
}

// ---- fences (docs/ledger.md, "Fences") ------------------------------------------------------------------------------

/**
 * Step 1 of fencing `node`: the intent, recorded before the storage is told. From here on the node is not granted the
 * volume again until it clears its mapping; its hold stays until the storage confirms the fence (completeFence).
 * `clients` are the instances about to be refused; fencing again adds to them.
 */
export function beginFence(doc: VolumeDoc, node: string, reason: string, clients: string[], now: string): VolumeDoc {
  const next = structuredClone(doc);
  const fences = (next.status.fences ??= {});
  const old = fences[node];
  const fence: Fence = {
    state: 'fencing',
    since: old && old.clearedAt === undefined ? old.since : now,
    reason,
    clients: union(old && old.clearedAt === undefined ? old.clients : [], clients),
  };
  fences[node] = fence;
  return reconcile(next, now);
}

/**
 * Step 2: the storage refuses `clients`, so nothing the node still has can write; only now does its hold go, with its
 * tickets, as in releaseDeadNode. Refused (undefined) without a fence begun for the node.
 */
export function completeFence(doc: VolumeDoc, node: string, clients: string[], now: string): VolumeDoc | undefined {
  const fence = doc.status.fences?.[node];
  if (!fence) return undefined;
  const next = releaseDeadNode(doc, node, now);
  const fences = (next.status.fences ??= {});
  fences[node] = { ...fence, state: 'fenced', clients: union(fence.clients, clients) };
  return next;
}

/**
 * The node has shown from its kernel state that nothing of the volume is mapped there: it may be granted the volume
 * again (with a new client instance, which the old blocklist entries do not match). Nothing changes without a fence.
 */
export function markFenceCleared(doc: VolumeDoc, node: string, now: string): VolumeDoc {
  const fence = doc.status.fences?.[node];
  if (!fence || fence.clearedAt !== undefined) return doc;
  const next = structuredClone(doc);
  const fences = (next.status.fences ??= {});
  fences[node] = { ...fence, clearedAt: now };
  return reconcile(next, now);
}

/** The storage no longer refuses the node's old clients: the record goes. Only a cleared fence is ever lifted. */
export function removeFence(doc: VolumeDoc, node: string, now: string): VolumeDoc {
  const fence = doc.status.fences?.[node];
  if (!fence || fence.clearedAt === undefined) return doc;
  const next = structuredClone(doc);
  const fences = next.status.fences ?? {};
  delete fences[node];
  if (Object.keys(fences).length === 0) delete next.status.fences;
  return reconcile(next, now);
}

/** Whether the node is fenced off the volume and has not cleared its mapping yet (then it is never granted it). */
export function isFencedOff(doc: VolumeDoc, node: string): boolean {
  const fence = doc.status.fences?.[node];
  return fence !== undefined && fence.clearedAt === undefined;
}

function union(a: string[], b: string[]): string[] {
  return [...new Set([...a, ...b])].sort();
}

/** True when the ticket is satisfied for its current generation. */
export function isSatisfied(doc: VolumeDoc, id: string): boolean {
  const ticket = doc.spec.tickets[id];
  const status = doc.status.tickets[id];
  return !!ticket && !!status && status.satisfied && status.generation === ticket.generation;
}

/** Whether a node with this phase has taken the volume up: it is setting up, or has, the device. */
export function isInUse(phase: NodePhase | undefined): boolean {
  return phase === 'attaching' || phase === 'attached';
}

/** Whether a node holds (or may still have) the device: in use, or not yet confirmed released. */
export function nodeHoldsDevice(doc: VolumeDoc, node: string): boolean {
  const phase = doc.status.nodes[node]?.phase;
  return isInUse(phase) || phase === 'detaching';
}

/** Order in which waiting tickets are chosen: higher priority first, then the smallest ID. */
function compareTickets(a: Ticket, b: Ticket): number {
  const byPriority = TICKET_PRIORITY[b.type] - TICKET_PRIORITY[a.type];
  if (byPriority !== 0) return byPriority;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

/** Recomputes grants, ticket statuses and the derived state. Idempotent: reconcile(reconcile(d)) equals reconcile(d). */
export function reconcile(doc: VolumeDoc, now: string): VolumeDoc {
  const next = doc; // callers pass a private copy
  const tickets = Object.values(next.spec.tickets).sort(compareTickets);
  // A node fenced off the volume is not granted it until it has cleared its old mapping.
  const eligible = tickets.filter((t) => !isFencedOff(next, t.nodeID));
  const nodes = next.status.nodes;
  const everyTicketReadOnly = tickets.length > 0 && tickets.every((t) => t.parameters.readOnly);

  for (const [node, entry] of Object.entries(nodes)) {
    if (entry.phase === 'granted' && ticketsOfNode(next, node).length === 0) delete nodes[node];
  }

  const readOnlyMany = everyTicketReadOnly && Object.values(nodes).every((e) => e.readOnly && e.phase !== 'detaching');
  const shared = next.spec.shared === true; // ReadWriteMany: ledger/shared.ts grants it
  if (!shared && !readOnlyMany && preemptor(next, tickets, eligible)) {
    // The holders' maintenance gives way: a grant not taken up goes at once; a node with the device lets go first.
    for (const [node, entry] of Object.entries(nodes)) {
      if (entry.phase === 'granted') delete nodes[node];
      else if (entry.phase !== 'detaching') nodes[node] = { ...entry, phase: 'detaching', since: now };
    }
  }

  const holders = Object.keys(nodes);
  if (shared) {
    grantShared(next, eligible, now);
  } else if (holders.length === 0) {
    // Fully detached: the best ticket wins; with only read-only tickets, every node may have it.
    const winner = eligible[0];
    if (winner) {
      const chosen = everyTicketReadOnly ? [...new Set(eligible.map((t) => t.nodeID))] : [winner.nodeID];
      for (const node of chosen) {
        nodes[node] = { phase: 'granted', readOnly: ticketsOfNode(next, node).every((t) => t.parameters.readOnly), since: now };
      }
    }
  } else if (readOnlyMany) {
    // Read-only-many: more nodes may join while every holder and every ticket is read-only.
    for (const ticket of eligible) {
      nodes[ticket.nodeID] ??= { phase: 'granted', readOnly: true, since: now };
    }
  } else {
    // A read-write ticket on a node that was granted read-only but has not touched the device yet: upgrade it.
    const [onlyNode, ...more] = holders;
    const only = onlyNode === undefined ? undefined : nodes[onlyNode];
    if (
      more.length === 0 &&
      onlyNode !== undefined &&
      only?.phase === 'granted' &&
      only.readOnly &&
      ticketsOfNode(next, onlyNode).some((t) => !t.parameters.readOnly)
    ) {
      only.readOnly = false;
    }
  }

  const statuses: Record<string, TicketStatus> = {};
  for (const ticket of tickets) {
    const old = next.status.tickets[ticket.id];
    // A status of an earlier generation is another request's: its job and conditions do not carry over.
    const kept = old?.generation === ticket.generation ? old : undefined;
    const status = statusOf(next, ticket, tickets);
    const job = kept?.job;
    statuses[ticket.id] = { ...status, conditions: conditionsOf(status, job, kept?.conditions, now), ...(job && { job }) };
  }
  next.status.tickets = statuses;
  next.status.currentNodes = Object.entries(nodes)
    .filter(([, e]) => e.phase !== 'granted')
    .map(([n]) => n)
    .sort();
  next.status.state = stateOf(Object.values(nodes));
  return next;
}

// ---- preemption (docs/ledger.md, "Preemption") -----------------------------------------------------------------

/**
 * Whether the ticket only reads or reserves for upkeep, so that a more important request elsewhere may take the volume
 * from its node: a maintenance reservation, a snapshot, a backup, or the source side of a clone. Never a workload
 * (a pod's device), a person's attach or reservation, a restore or a clone target (data being written).
 */
function isPreemptible(ticket: Ticket): boolean {
  if (ticket.type === 'maintenance') return true;
  const job = ticket.job;
  return job?.kind === 'snapshot' || job?.kind === 'backup' || (job?.kind === 'clone' && job.role === 'source');
}

/**
 * The waiting ticket that takes the volume from its holders, if any: the best eligible ticket on a node that does not
 * hold the volume, when its priority is above every ticket of the holders and each of those is preemptible. While a
 * holder is letting go already (detaching) and no other holder is in use, there is nothing left to take.
 */
function preemptor(doc: VolumeDoc, tickets: Ticket[], eligible: Ticket[]): Ticket | undefined {
  const nodes = doc.status.nodes;
  if (!Object.values(nodes).some((e) => e.phase !== 'detaching')) return undefined;
  const held = tickets.filter((t) => nodes[t.nodeID] !== undefined);
  if (!held.every(isPreemptible)) return undefined;
  const top = Math.max(0, ...held.map((t) => TICKET_PRIORITY[t.type]));
  const waiting = eligible.find((t) => nodes[t.nodeID] === undefined);
  return waiting && TICKET_PRIORITY[waiting.type] > top ? waiting : undefined;
}

/**
 * Whether the ticket lost the volume to a more important one: its node is letting the volume go while the ticket still
 * wants it (reason Preempted), or its job had started and the ticket is no longer satisfied.
 */
export function isPreempted(doc: VolumeDoc, id: string): boolean {
  const status = doc.status.tickets[id];
  if (!doc.spec.tickets[id] || !status) return false;
  if (status.reason === 'Preempted') return true;
  const state = status.job?.state;
  return (state === 'running' || state === 'ending') && !isSatisfied(doc, id);
}

// ---- conditions (the seeds' status shape) --------------------------------------------------------------------

/**
 * The ticket's conditions: Satisfied always, Job once an agent started the job. Times move only on change:
 * lastTransitionTime when status changes, lastProbeTime when reason or message change, so that reconciling a document
 * in which nothing changed gives the same document (the ledger writes nothing for it).
 */
function conditionsOf(status: TicketStatus, job: JobStatus | undefined, old: Condition[] | undefined, now: string): Condition[] {
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

function statusOf(doc: VolumeDoc, ticket: Ticket, sorted: Ticket[]): TicketStatus {
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

function stateOf(entries: NodeAttachment[]): VolumeState {
  if (entries.length === 0) return 'detached';
  if (entries.some((e) => e.phase === 'detaching')) return 'detaching';
  if (entries.some((e) => e.phase === 'granted' || e.phase === 'attaching')) return 'attaching';
  return 'attached';
}

/** The node's tickets on the volume, of any type (an admin ticket for the node also keeps the volume there). */
export function ticketsOfNode(doc: VolumeDoc, node: string): Ticket[] {
  return Object.values(doc.spec.tickets).filter((t) => t.nodeID === node);
}

/** After a node lost a ticket: a node that never touched the device just loses its grant; one that did must release. */
function dropNodeIfUnwanted(doc: VolumeDoc, node: string, now: string): void {
  const entry = doc.status.nodes[node];
  if (!entry || ticketsOfNode(doc, node).length > 0) return;
  if (entry.phase === 'granted') delete doc.status.nodes[node];
  else if (entry.phase !== 'detaching') doc.status.nodes[node] = { ...entry, phase: 'detaching', since: now };
}

// ---- job tickets: work the node agent does for a ticket (docs/ledger.md, "Jobs") ------------------------------

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

/**
 * Records how far the job got. finishedAt is set when it succeeded or failed. A job asked to end stays 'ending' unless
 * it failed. No ticket, or the same record again: nothing changes.
 */
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
  const next = removeTicket(doc, id, now);
  next.status.jobs = [...(next.status.jobs ?? []), finished].slice(-MAX_FINISHED_JOBS);
  return next;
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
