// detach <pvOrVolumeName> <nodeName> (controller, also its 6-minute force-detach): drop the node's ticket.
// The node keeps its hold until it confirms release (unmountdevice) or an admin fences it.
import { nodeName, pvName } from '../contract/args.js';
import { success } from '../contract/reply.js';
import { workloadTicketId } from '../ledger/ids.js';
import { defineOp } from './op.js';

export const op = defineOp({
  args: { pvOrVolumeName: pvName, nodeName },
  attachModeOnly: true,
  async run(ctx, { pvOrVolumeName, nodeName: node }) {
    const name = await ctx.ledger.volumeOfPv(pvOrVolumeName);
    ctx.log.volume = name;
    const doc = await ctx.ledger.removeTicket(name, workloadTicketId(pvOrVolumeName, ctx.config.driverName, node));
    const holding = doc?.status.nodes[node]?.phase === 'detaching';
    return success(holding ? { message: `volume ${name} stays fenced to node ${node} until it releases the device` } : {});
  },
});
