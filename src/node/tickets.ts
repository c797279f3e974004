// The workload ticket a pod's volume asks for: one per node in attach mode (attach), one per pod in non-attach mode
// (mount). Both name the volume the same way and record the PV name, because detach and unmount know nothing else.
import type { VolumeOptions } from '../contract/options.js';
import type { Context } from '../context.js';
import type { TicketRequest } from '../ledger/arbitrate.js';
import { podTicketId, ticketId } from '../ledger/ids.js';
import type { NewVolumeSpec } from '../ledger/ledger.js';

export interface WorkloadRequest {
  /** The volume's stable name. */
  name: string;
  ticket: TicketRequest;
  /** What the volume is created as when this is its first ticket. */
  create: NewVolumeSpec;
}

/** Which pod a non-attach mount is for: its key in the ticket ID, and its UID when the pod dir's path shows one. */
export interface PodOfMount {
  key: string;
  uid?: string;
}

/**
 * Resolves the volume, records a `volume` option's alias for its PV name, and builds the ticket of `node` (for a
 * pod: that pod's ticket on the node). Logs the volume and the ticket.
 */
export async function workloadRequest(ctx: Context, options: VolumeOptions, node: string, forPod?: PodOfMount): Promise<WorkloadRequest> {
  const { ledger, config } = ctx;
  // detach and unmount will only know this name, so it is what the ticket ID hashes.
  const pvName = options.pvOrVolumeName ?? options.name;
  const name = await ledger.resolve(options);
  if (options.volume !== undefined) await ledger.linkPv(pvName, options.volume);
  const id = forPod ? podTicketId(pvName, config.driverName, node, forPod.key) : ticketId('workload', pvName, config.driverName, node);
  ctx.log.volume = name;
  ctx.log.ticket = id;
  const pod = options.pod ?? (forPod?.uid !== undefined ? { uid: forPod.uid } : undefined);
  return {
    name,
    ticket: {
      id,
      type: 'workload',
      nodeID: node,
      parameters: { readOnly: options.readOnly },
      requestedBy: { pvName, ...(pod && { pod }), ...(options.fsGroup !== undefined && { fsGroup: options.fsGroup }) },
    },
    create: { sizeBytes: options.size ?? config.defaultSize, fsType: options.fsType ?? config.defaultFsType },
  };
}
