// attach <json> <nodeName> (controller): create the volume lazily, add the node's workload ticket, arbitrate.
// Success only when this node holds the volume; otherwise a Failure naming the holder (the controller retries).
import { nodeName, volumeOptions } from '../contract/args.js';
import { failure, success } from '../contract/reply.js';
import { isSatisfied } from '../ledger/arbitrate.js';
import { awayFromHome, homeViewOf } from '../node/home.js';
import { workloadRequest } from '../node/tickets.js';
import { defineOp } from './op.js';

export const op = defineOp({
  args: { json: volumeOptions, nodeName },
  attachModeOnly: true,
  async run(ctx, { json, nodeName: node }) {
    const { name, ticket, create, caller, existing } = await workloadRequest(ctx, json, node);
    // A volume whose image lives in another node's pool is refused before any ticket is written (node/home.ts). From
    // the configuration, not the backend: kube-controller-manager's bundle has no backend (src/sea/control.ts).
    const view = homeViewOf(ctx.config);
    if (view.backend.localPool !== undefined) {
      const away = awayFromHome(view, existing, node);
      if (away !== undefined) return failure(away);
    }
    const doc = await ctx.ledger.addTicket(name, ticket, create, caller);
    if (doc && isSatisfied(doc, ticket.id)) return success();
    // Still wanted: the controller retries a failed attach, and each retry keeps the waiting ticket from being reaped.
    await ctx.ledger.touchTicket(name, ticket.id, ctx.config.ticketTouchSeconds * 1000);
    const why = doc?.status.tickets[ticket.id]?.message ?? 'not granted';
    return failure(`volume ${name} cannot be attached to node ${node} yet: ${why}`);
  },
});
