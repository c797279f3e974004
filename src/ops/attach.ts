// attach <json> <nodeName> (controller): create the volume lazily, add the node's workload ticket, arbitrate.
// Success only when this node holds the volume; otherwise a Failure naming the holder (the controller retries).
import { addTicket, isSatisfied, newVolume } from '../ledger/arbitrate.js';
import { ticketId } from '../ledger/ids.js';
import { failure, success } from '../protocol/reply.js';
import { openLedger } from './services.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  const { config } = call;
  const options = call.options!;
  const node = call.args.nodeName!;
  const ledger = await openLedger(config);
  // detach will only know this name, so it is what the ticket ID hashes.
  const pvName = options.pvOrVolumeName ?? options.name;
  const name = await ledger.resolve(options);
  if (options.volume !== undefined) await ledger.linkPv(pvName, options.volume);
  const id = ticketId('workload', pvName, config.driverName, node);
  call.facts.volume = name;
  call.facts.ticket = id;

  const now = ledger.now();
  const doc = await ledger.update(name, (current) =>
    addTicket(
      current ?? newVolume(name, options.size ?? config.defaultSize, options.fsType ?? config.defaultFsType, now),
      { id, type: 'workload', nodeID: node, parameters: { readOnly: options.readOnly }, requestedBy: { pvName } },
      now,
    ),
  );
  if (doc && isSatisfied(doc, id)) return success();
  const why = doc?.status.tickets[id]?.message ?? 'not granted';
  return failure(`volume ${name} cannot be attached to node ${node} yet: ${why}`);
}
