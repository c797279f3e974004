// isattached <json> <nodeName> (controller, every reconcile): true iff the node's ticket is satisfied.
import { nodeName, volumeOptions } from '../contract/args.js';
import { success } from '../contract/reply.js';
import { isSatisfied } from '../ledger/arbitrate.js';
import { nodeWorkloadTicketId } from '../node/tickets.js';
import { defineOp } from './op.js';

export const op = defineOp({
  args: { json: volumeOptions, nodeName },
  attachModeOnly: true,
  async run(ctx, { json, nodeName: node }) {
    const name = await ctx.ledger.resolve(json);
    const id = nodeWorkloadTicketId(ctx.config, json, node);
    const doc = await ctx.ledger.get(name);
    ctx.log.volume = name;
    const attached = doc !== undefined && isSatisfied(doc, id);
    // A waiting ticket is still wanted (nothing is written for a satisfied one: the reaper never takes those).
    if (doc?.spec.tickets[id] && !attached) await ctx.ledger.touchTicket(name, id, ctx.config.ticketTouchSeconds * 1000);
    // Always send the boolean: a missing "attached" reads as false to the controller.
    return success({ attached });
  },
});
