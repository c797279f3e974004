// Preemption (docs/ledger.md, "Preemption"): when a more important request elsewhere takes the volume from its holders.
import { TICKET_PRIORITY, type Ticket, type VolumeDoc } from '../types.js';
import { isSatisfied } from './queries.js';

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
export function preemptor(doc: VolumeDoc, tickets: Ticket[], eligible: Ticket[]): Ticket | undefined {
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
