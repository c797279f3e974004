// isattached <json> <nodeName> (controller, every reconcile): true iff the node's ticket is satisfied.
import { isSatisfied } from '../ledger/arbitrate.js';
import { ticketId } from '../ledger/ids.js';
import { success } from '../protocol/reply.js';
import { openLedger } from './services.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  const options = call.options!;
  const ledger = await openLedger(call.config);
  const name = await ledger.resolve(options);
  const id = ticketId('workload', options.pvOrVolumeName ?? options.name, call.config.driverName, call.args.nodeName!);
  const doc = await ledger.get(name);
  call.facts.volume = name;
  // Always send the boolean: a missing "attached" reads as false to the controller.
  return success({ attached: doc !== undefined && isSatisfied(doc, id) });
}
