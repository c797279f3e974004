// What latch does to a volume document by itself, as pure rules (docs/ledger.md, "Automatic actions"): reaping
// expired and abandoned tickets, a node's release of a hold its own kernel shows it no longer has, and the cheap
// "still wanted" touch that tells a live request from an abandoned one. None of them can let two nodes hold a volume:
// removing a ticket never ends a node's hold (a node that had the device goes detaching), and a hold is released only
// on the node's proof that it has no device (the caller's duty: see node/self-release.ts).
import { finishJob, isSatisfied, markReleased, recordJob, removeTicket } from './arbitrate.js';
import type { AutomaticAction, Ticket, VolumeDoc } from './types.js';

/** How many automatic actions a volume's status keeps (the oldest go first). */
export const MAX_AUTOMATIC_ACTIONS = 20;

/** Whether the ticket has a time to live that has run out at `nowMs`. */
function isExpired(ticket: Ticket, nowMs: number): boolean {
  if (ticket.expiresAt === undefined) return false;
  const at = Date.parse(ticket.expiresAt);
  return Number.isFinite(at) && at <= nowMs;
}

/** When the ticket's requester last showed it still wants it (its last touch, else its creation). */
function lastWantedAt(ticket: Ticket): number {
  const seen = ticket.lastSeen === undefined ? Number.NaN : Date.parse(ticket.lastSeen);
  const created = Date.parse(ticket.createdAt);
  return Math.max(Number.isFinite(seen) ? seen : Number.NEGATIVE_INFINITY, Number.isFinite(created) ? created : Number.NEGATIVE_INFINITY);
}

/**
 * A waiting workload ticket that no attach, isattached or waitforattach has touched for `afterMs`: the controller
 * retries a wanted attach far more often than that, so the pod that wanted it is gone (or went elsewhere).
 */
function isAbandoned(doc: VolumeDoc, ticket: Ticket, nowMs: number, afterMs: number): boolean {
  return ticket.type === 'workload' && !isSatisfied(doc, ticket.id) && nowMs - lastWantedAt(ticket) > afterMs;
}

/**
 * Removes expired tickets and, when `abandonedAfterMs` is given, abandoned waiting ones; records each in the status.
 * Returns the document unchanged (the same object) when nothing is to be reaped.
 */
export function reapTickets(doc: VolumeDoc, now: string, abandonedAfterMs?: number): { doc: VolumeDoc; reaped: AutomaticAction[] } {
  const nowMs = Date.parse(now);
  const reaped: AutomaticAction[] = [];
  let next = doc;
  for (const ticket of Object.values(doc.spec.tickets)) {
    let message: string | undefined;
    if (isExpired(ticket, nowMs)) {
      message = `${ticket.type} ticket${ticket.owner ? ` of ${ticket.owner}` : ''} expired at ${ticket.expiresAt}`;
    } else if (abandonedAfterMs !== undefined && isAbandoned(doc, ticket, nowMs, abandonedAfterMs)) {
      message =
        `waiting workload ticket${ticket.requestedBy.pvName ? ` for PV ${ticket.requestedBy.pvName}` : ''} abandoned: ` +
        `not asked for since ${ticket.lastSeen ?? ticket.createdAt} (more than ${Math.round(abandonedAfterMs / 1000)} s)`;
    }
    if (message === undefined) continue;
    next = ticket.job ? reapJob(next, ticket.id, message, now) : removeTicket(next, ticket.id, now);
    reaped.push({ at: now, kind: isExpired(ticket, nowMs) ? 'expired' : 'abandoned', node: ticket.nodeID, ticket: ticket.id, message });
  }
  return reaped.length === 0 ? { doc, reaped } : { doc: recordAutomatic(next, reaped), reaped };
}

/**
 * A reaped job ticket goes the way a finished one does, so that its requester finds the outcome in status.jobs: a job
 * that had not come to an end is recorded as failed, saying why it was reaped.
 */
function reapJob(doc: VolumeDoc, id: string, message: string, now: string): VolumeDoc {
  const state = doc.status.tickets[id]?.job?.state;
  const ended = state === 'succeeded' || state === 'failed' || state === 'ending';
  return finishJob(ended ? doc : recordJob(doc, id, { state: 'failed', message }, now), id, now);
}

/**
 * Records that the ticket's requester still wants it, at most once per `everyMs` (so a caller polling every few
 * seconds writes once a minute, not every time). Only waiting tickets are touched: a satisfied one is never reaped.
 */
export function touchTicket(doc: VolumeDoc, id: string, now: string, everyMs: number): VolumeDoc {
  const ticket = doc.spec.tickets[id];
  if (!ticket || isSatisfied(doc, id) || Date.parse(now) - lastWantedAt(ticket) < everyMs) return doc;
  const next = structuredClone(doc);
  const touched = next.spec.tickets[id];
  if (touched) touched.lastSeen = now;
  return next;
}

/**
 * The node proved from its own kernel that it has no device of the volume: its attaching or detaching hold ends
 * (granted again while its tickets still want it there). Any other phase is left alone: `attached` holds are the
 * admin's (a device that vanished under a running pod needs a person), and `granted` needs no release.
 */
export function releaseHoldWithoutDevice(doc: VolumeDoc, node: string, now: string): { doc: VolumeDoc; action?: AutomaticAction } {
  const entry = doc.status.nodes[node];
  if (!entry || (entry.phase !== 'attaching' && entry.phase !== 'detaching')) return { doc };
  const action: AutomaticAction = {
    at: now,
    kind: 'released',
    node,
    message: `node ${node} had no device of the volume while ${entry.phase} (since ${entry.since}): its hold was released`,
  };
  return { doc: recordAutomatic(markReleased(doc, node, now), [action]), action };
}

function recordAutomatic(doc: VolumeDoc, actions: AutomaticAction[]): VolumeDoc {
  const next = structuredClone(doc);
  next.status.automatic = [...(next.status.automatic ?? []), ...actions].slice(-MAX_AUTOMATIC_ACTIONS);
  return next;
}
