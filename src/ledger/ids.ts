// Deterministic ticket IDs, like Kubernetes' CSI VolumeAttachment names: repeating a call finds the same ticket.
import { createHash } from 'node:crypto';
import type { TicketType } from './types.js';

export function ticketId(type: TicketType, pvOrVolumeName: string, driverName: string, nodeName: string): string {
  return `${type}-${createHash('sha256')
    .update(pvOrVolumeName + driverName + nodeName)
    .digest('hex')}`;
}
