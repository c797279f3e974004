// latch ticket remove: clear a stuck request safely (by ID or a unique prefix of it); unknown tickets are fine.
import { LatchError } from '../../errors.js';
import { nodeHoldsDevice } from '../../ledger/arbitrate.js';
import type { VolumeDoc } from '../../ledger/types.js';
import { configOf, type CommandIO } from '../io.js';
import { getVolume } from '../volume-doc.js';

export interface TicketRemoveOptions {
  volume: string;
  /** A ticket ID or a unique prefix of one. */
  ticket: string;
  /** Remove a workload ticket even though its node still holds the device. */
  force?: boolean;
}

export async function ticketRemove(options: TicketRemoveOptions, io: CommandIO): Promise<void> {
  const { volume } = options;
  const { ledger } = io.context(configOf(io));
  const id = findTicket(await getVolume(ledger, volume), options.ticket);
  if (!id) {
    io.out(`volume ${volume} has no ticket ${options.ticket}; nothing to do\n`);
    return;
  }
  const doc = await ledger.removeTicket(volume, id, (d) => {
    const t = d.spec.tickets[id];
    if (t && t.type === 'workload' && nodeHoldsDevice(d, t.nodeID) && !options.force) {
      throw new LatchError(
        `ticket ${id} belongs to a workload on node ${t.nodeID}, which still holds the device ` +
          `(${d.status.nodes[t.nodeID]?.phase}). Removing it does not free the volume: it stays detaching until ` +
          `${t.nodeID} unmounts it (or, if the node is down, latch volume release ${volume} --node ${t.nodeID} --node-is-down), ` +
          'and kubelet may still be using it. Repeat with --force if you are sure.',
      );
    }
  });
  io.out(`ticket ${id} removed; volume ${volume} is ${doc?.status.state}\n`);
}

function findTicket(doc: VolumeDoc, idOrPrefix: string): string | undefined {
  if (doc.spec.tickets[idOrPrefix]) return idOrPrefix;
  const matches = Object.keys(doc.spec.tickets).filter((id) => id.startsWith(idOrPrefix));
  if (matches.length > 1) throw new LatchError(`"${idOrPrefix}" matches ${matches.length} tickets; give more of the ID`);
  return matches[0];
}
