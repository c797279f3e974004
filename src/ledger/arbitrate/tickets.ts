// Tickets (docs/ledger.md, "Arbitration rules"): a new volume, and the tickets that ask for it or stop asking.
import type { FsType } from '../../filesystems.js';
import type { Ticket, VolumeDoc } from '../types.js';
import { ticketsOfNode } from './queries.js';
import { reconcile } from './reconcile.js';

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

/** After a node lost a ticket: a node that never touched the device just loses its grant; one that did must release. */
function dropNodeIfUnwanted(doc: VolumeDoc, node: string, now: string): void {
  const entry = doc.status.nodes[node];
  if (!entry || ticketsOfNode(doc, node).length > 0) return;
  if (entry.phase === 'granted') delete doc.status.nodes[node];
  else if (entry.phase !== 'detaching') doc.status.nodes[node] = { ...entry, phase: 'detaching', since: now };
}
