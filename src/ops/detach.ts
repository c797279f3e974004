// detach <pvOrVolumeName> <nodeName> (controller, also its 6-minute force-detach): drop the node's ticket.
// The node keeps its hold until it confirms release (unmountdevice) or an admin fences it.
import { removeTicket } from '../ledger/arbitrate.js';
import { ticketId } from '../ledger/ids.js';
import { success } from '../protocol/reply.js';
import { openLedger } from './services.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  const pvName = call.args.pvOrVolumeName!;
  const ledger = await openLedger(call.config);
  const name = await ledger.volumeOfPv(pvName);
  const id = ticketId('workload', pvName, call.config.driverName, call.args.nodeName!);
  call.facts.volume = name;
  const now = ledger.now();
  const doc = await ledger.update(name, (current) => (current ? removeTicket(current, id, now) : current));
  const holding = doc?.status.nodes[call.args.nodeName!]?.phase === 'detaching';
  return success(holding ? { message: `volume ${name} stays fenced to node ${call.args.nodeName} until it releases the device` } : {});
}
