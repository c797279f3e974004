// waitforattach <devicePath> <json> (node): wait until the ledger grants this node the volume, set up its device
// (reusing one already set up), record it, and reply the device. The devicePath kubelet passes is the controller's
// attach reply, which cannot know a node's device: latch finds the device itself.
import { setTimeout as sleep } from 'node:timers/promises';
import { optionalPath, volumeOptions } from '../contract/args.js';
import { failure, success } from '../contract/reply.js';
import { isFencedOff, isInUse } from '../ledger/arbitrate.js';
import { setUpDevice } from '../node/device.js';
import { clearOwnFence } from '../node/fence.js';
import { defineOp } from './op.js';

const POLL_MS = 500;

export const op = defineOp({
  args: { devicePath: optionalPath, json: volumeOptions },
  attachModeOnly: true,
  async run(ctx, { json }) {
    const { ledger, config } = ctx;
    const node = config.nodeName;
    const name = await ledger.resolve(json);
    ctx.log.volume = name;
    ctx.log.node = node;

    // Wait for the grant, and claim it (granted -> attaching) in the same compare-and-swap.
    const deadline = ctx.clock() + config.waitForAttachTimeout * 1000;
    let doc = await ledger.claimGrant(name, node);
    while (!doc || !isInUse(doc.status.nodes[node]?.phase)) {
      // Fenced off the volume earlier: clear the old mapping first, then the ledger may grant it here again.
      if (doc && isFencedOff(doc, node)) await clearOwnFence(ctx, name, doc);
      if (ctx.clock() >= deadline) {
        const ticket = doc && Object.values(doc.spec.tickets).find((t) => t.nodeID === node);
        const why = !doc ? 'the volume does not exist' : ticket ? doc.status.tickets[ticket.id]?.message : 'no ticket for this node';
        return failure(`volume ${name} is not attached to node ${node} after ${config.waitForAttachTimeout} s: ${why}`);
      }
      await sleep(POLL_MS);
      doc = await ledger.claimGrant(name, node);
    }

    const { device } = await setUpDevice(ctx, name, doc);
    return success({ device });
  },
});
