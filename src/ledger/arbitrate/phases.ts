// Node phases (docs/ledger.md, "Node phases"): what a node reports of its device, granted to attached to released.
import type { VolumeDoc } from '../types.js';
import { compareTickets, isFencedOff, ticketsOfNode } from './queries.js';
import { reconcile } from './reconcile.js';

/** The node starts setting up the device. Refused (undefined) unless the ledger granted it the volume. */
export function markAttaching(doc: VolumeDoc, node: string, now: string, client?: string): VolumeDoc | undefined {
  const entry = doc.status.nodes[node];
  if (!entry || entry.phase === 'detaching') return undefined;
  // A client named before the device exists (a shared volume's cephx entity) is recorded where none is yet, so that a
  // fence of another node spares the sessions this node is about to open; a later record (markAttached) refines it.
  const named = client !== undefined && entry.client === undefined ? { client } : {};
  if (entry.phase !== 'granted') {
    if (!('client' in named)) return doc;
    const next = structuredClone(doc);
    next.status.nodes[node] = { ...entry, ...named };
    return next;
  }
  // Being fenced: a grant it had not taken up yet is not taken up now (the fencer may have listed its clients already).
  if (isFencedOff(doc, node)) return undefined;
  const next = structuredClone(doc);
  next.status.nodes[node] = { ...entry, phase: 'attaching', since: now, ...named };
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
