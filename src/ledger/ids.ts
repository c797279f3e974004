// Deterministic ticket IDs, like Kubernetes' CSI VolumeAttachment names: repeating a call finds the same ticket.
import { sha256Hex } from '../hash.js';
import type { TicketType } from './types.js';

/** A node's ticket (attach mode): `<type>-<sha256(pvOrVolumeName + driverName + nodeName)>`. */
export function ticketId(type: TicketType, pvOrVolumeName: string, driverName: string, nodeName: string): string {
  return `${type}-${sha256Hex(pvOrVolumeName + driverName + nodeName)}`;
}

/**
 * The workload ticket of one pod on one node (non-attach mode has one ticket per pod, so `latch ticket list` shows
 * every pod using the volume). It adds the pod key to what a node's ticket hashes, so the two never collide.
 */
export function podTicketId(pvName: string, driverName: string, node: string, podKey: string): string {
  return `workload-${sha256Hex(`${pvName}${driverName}${node}\0pod\0${podKey}`)}`;
}

/**
 * The ID of the workload ticket a pod's volume asks for, the one builder of it: keyed by the name detach and unmount
 * know (the PV's name, or the inline volume's). Without `podKey`, attach mode's ticket of the node (attach adds it,
 * waitforattach and isattached poll it, detach removes it); with it, non-attach mode's ticket of that pod on the node
 * (mount adds it, unmount removes it).
 */
export function workloadTicketId(pvName: string, driverName: string, node: string, podKey?: string): string {
  return podKey === undefined ? ticketId('workload', pvName, driverName, node) : podTicketId(pvName, driverName, node, podKey);
}

/** A ticket ID short enough for tables and messages: the type and the first 12 hex digits. */
export function shortTicketId(id: string): string {
  return `${id.slice(0, id.indexOf('-') + 13)}...`;
}

/**
 * A job ticket: `<type>-<sha256(volume + "\0" + key)>`, the same on every node, so that a repeated request (or a second
 * agent racing for a recurring slot) finds the same ticket. The key names the job: the snapshot's name, the backup's
 * name, the clone's target volume (on both volumes), the restore's backup, `manual` for a manual attach.
 */
export function jobTicketId(type: TicketType, volume: string, key: string): string {
  return `${type}-${sha256Hex(`${volume}\0${key}`)}`;
}
