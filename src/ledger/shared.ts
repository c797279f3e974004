// The arbitration rule of shared (ReadWriteMany) volumes, a CephFS subvolume that many nodes may mount read-write at
// once (docs/ledger.md, "Shared volumes"). Pure, like arbitrate.ts, which calls it from reconcile() in place of the
// one-writer rule for a document whose spec says `shared`.
//
// - Every node with a ticket that may share (a workload, a person's attach, a snapshot, a backup, a clone's source, a
//   maintenance reservation) is granted the volume, one node entry per node whatever its number of pods: the seeds'
//   share type. Read-only when every ticket of the node is.
// - A ticket that needs the volume alone (admin, restore, clone target) waits until every other node has left, and
//   while it waits no node joins (so that it is not starved); once granted, nobody joins until it is gone.
// - A node fenced off the volume is not eligible (the caller passes only eligible tickets), as for block volumes.
import type { NodeAttachment, Ticket, VolumeDoc } from './types.js';

/** Whether the ticket needs the shared volume to itself. */
function needsSharedVolumeAlone(ticket: Ticket): boolean {
  if (ticket.type === 'admin' || ticket.type === 'restore') return true;
  return ticket.type === 'clone' && ticket.job?.kind === 'clone' && ticket.job.role === 'target';
}

/**
 * Why a ticket that needs the shared volume alone is not satisfied although its own node holds the volume (for a
 * shared ticket there): other nodes hold it too. undefined when it is not such a ticket or nobody else holds it.
 */
export function sharedWaitMessage(doc: VolumeDoc, ticket: Ticket): string | undefined {
  if (!doc.spec.shared || !needsSharedVolumeAlone(ticket)) return undefined;
  const others = Object.keys(doc.status.nodes).filter((n) => n !== ticket.nodeID);
  if (others.length === 0) return undefined;
  return `a ${ticket.type} ticket needs shared volume ${doc.name} alone: waiting for node ${others.sort().join(', ')} to leave it`;
}

/** Grants a shared volume in place (`doc` is the caller's private copy); `eligible` sorted best first. */
export function grantShared(doc: VolumeDoc, eligible: Ticket[], now: string): void {
  const nodes = doc.status.nodes;
  const ofNode = (node: string) => Object.values(doc.spec.tickets).filter((t) => t.nodeID === node);
  const grant = (node: string): NodeAttachment => ({
    phase: 'granted',
    readOnly: ofNode(node).every((t) => t.parameters.readOnly),
    since: now,
  });
  const holders = Object.keys(nodes);
  // A node that holds it for a ticket that needs it alone: nobody joins.
  if (holders.some((n) => nodes[n]?.phase !== 'detaching' && ofNode(n).some(needsSharedVolumeAlone))) return;
  const alone = eligible.find(needsSharedVolumeAlone);
  if (alone) {
    if (holders.length === 0) nodes[alone.nodeID] = grant(alone.nodeID);
    return;
  }
  for (const ticket of eligible) {
    const entry = nodes[ticket.nodeID];
    if (entry === undefined) nodes[ticket.nodeID] = grant(ticket.nodeID);
    // Granted read-only but not taken up yet, and now a read-write ticket there: upgrade it, as for block volumes.
    else if (entry.phase === 'granted' && entry.readOnly && !ticket.parameters.readOnly) entry.readOnly = false;
  }
}
