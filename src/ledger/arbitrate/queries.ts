// Questions about a volume document, answered without changing it: who holds the volume, in which phase, whether a
// ticket is satisfied, whether a node is fenced off. Every other part of arbitration builds on these.
import { TICKET_PRIORITY, type NodePhase, type Ticket, type VolumeDoc } from '../types.js';

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

/** Whether the node is fenced off the volume and has not cleared its mapping yet (then it is never granted it). */
export function isFencedOff(doc: VolumeDoc, node: string): boolean {
  const fence = doc.status.fences?.[node];
  return fence !== undefined && fence.clearedAt === undefined;
}

/** The node's tickets on the volume, of any type (an admin ticket for the node also keeps the volume there). */
export function ticketsOfNode(doc: VolumeDoc, node: string): Ticket[] {
  return Object.values(doc.spec.tickets).filter((t) => t.nodeID === node);
}

/** Order in which waiting tickets are chosen: higher priority first, then the smallest ID. */
export function compareTickets(a: Ticket, b: Ticket): number {
  const byPriority = TICKET_PRIORITY[b.type] - TICKET_PRIORITY[a.type];
  if (byPriority !== 0) return byPriority;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}
