// Deterministic ticket IDs, like Kubernetes' CSI VolumeAttachment names: repeating a call finds the same ticket.
import { sha256 } from '@noble/hashes/sha2.js';
import { bytesToHex } from '@noble/hashes/utils.js';
import type { TicketType } from './types.js';

/**
 * Hex sha256 of a short string. Not node:crypto: every attach and isattached names its ticket, and loading node:crypto
 * cost those calls 2.5 ms of CPU (a tenth of a node start-up), where this audited pure-JS sha256 costs 0.1 ms. The
 * text's UTF-8 bytes from Buffer.from, which the call's reply uses anyway, rather than TextEncoder (two more of Node's
 * functions to compile).
 */
function sha256Hex(text: string): string {
  return bytesToHex(sha256(Buffer.from(text, 'utf8')));
}

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
