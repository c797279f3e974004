// Fences (docs/ledger.md, "Fences"): taking a volume from a node that cannot be asked, in recorded steps.
import type { Fence, VolumeDoc } from '../types.js';
import { ticketsOfNode } from './queries.js';
import { reconcile } from './reconcile.js';

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

function union(a: string[], b: string[]): string[] {
  return [...new Set([...a, ...b])].sort();
}
