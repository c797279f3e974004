// The one rule every change ends with: grants, ticket statuses and the derived state recomputed from the tickets.
import type { TicketStatus, VolumeDoc } from '../types.js';
import { grantShared } from '../shared.js';
import { preemptor } from './preemption.js';
import { compareTickets, isFencedOff, ticketsOfNode } from './queries.js';
import { conditionsOf, stateOf, statusOf } from './status.js';

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
