// A volume's ledger document as the admin commands read and show it.
import { LatchError } from '../errors.js';
import type { Ledger } from '../ledger/ledger.js';
import { ticketsOfNode } from '../ledger/arbitrate.js';
import type { Ticket, VolumeDoc } from '../ledger/types.js';
import { checkVolumeName } from '../names.js';

/** The volume's document; a LatchError saying how to find the volumes when there is none. */
export async function getVolume(ledger: Ledger, name: string): Promise<VolumeDoc> {
  checkVolumeName(name);
  const doc = await ledger.get(name);
  if (!doc) throw new LatchError(`volume ${name} does not exist (latch volume list shows the volumes)`);
  return doc;
}

/** The nodes holding the volume, e.g. "node-a(attached) node-b(detaching,ro)". */
export function describeNodes(doc: VolumeDoc): string {
  return Object.entries(doc.status.nodes)
    .map(([n, e]) => `${n}(${e.phase}${e.readOnly ? ',ro' : ''})`)
    .join(' ');
}

/** Whether the node has a ticket on the volume or an entry in its status.nodes (any phase). */
export function concernsNode(doc: VolumeDoc, node: string): boolean {
  return ticketsOfNode(doc, node).length > 0 || doc.status.nodes[node] !== undefined;
}

/** Who asked for a ticket, e.g. "admin" or "pv pv-data pod default/web". */
export function describeRequester(by: Ticket['requestedBy']): string {
  if (by.admin) return 'admin';
  const pod = by.pod?.name ? ` pod ${by.pod.namespace ?? ''}/${by.pod.name}` : '';
  return `${by.pvName ? `pv ${by.pvName}` : ''}${pod}` || '-';
}
