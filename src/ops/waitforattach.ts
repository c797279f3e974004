// waitforattach <devicePath> <json> (node): wait until the ledger grants this node the volume, set up its device
// (reusing one already set up), record it, and reply the device. The devicePath kubelet passes is the controller's
// attach reply, which cannot know a node's device: latch finds the device itself.
import { setTimeout as sleep } from 'node:timers/promises';
import { optionalPath, volumeOptions } from '../contract/args.js';
import { failure, success } from '../contract/reply.js';
import { isFencedOff } from '../ledger/arbitrate.js';
import { claimAndSetUpDevice, claimGrant } from '../node/device.js';
import { clearOwnFence } from '../node/fence.js';
import { awayFromHome } from '../node/home.js';
import { withVolumeLock } from '../node/lock.js';
import { clearHoldToCheck, markHoldToCheck } from '../node/self-release.js';
import { attachShared } from '../node/shared.js';
import { checkCaller, nodeWorkloadTicketId } from '../node/tickets.js';
import { defineOp } from './op.js';

const POLL_MS = 500;

export const op = defineOp({
  args: { devicePath: optionalPath, json: volumeOptions },
  attachModeOnly: true,
  releasesMarkedHolds: true,
  async run(ctx, { json }) {
    const { ledger, config } = ctx;
    const node = config.nodeName;
    const name = await ledger.resolve(json);
    ctx.log.volume = name;
    ctx.log.node = node;
    // This node's workload ticket: polling it says "still wanted" (at most once per ticketTouchSeconds), so the
    // reaper never takes a ticket whose pod is still starting.
    const id = nodeWorkloadTicketId(config, json, node);
    const touchMs = config.ticketTouchSeconds * 1000;

    // Wait until the ledger grants this node the volume (or it already has it).
    const deadline = ctx.clock() + config.waitForAttachTimeout * 1000;
    let doc = await ledger.touchTicket(name, id, touchMs);
    if (doc) await checkCaller(ctx, json, name, doc);
    while (!doc || !isGrantedHere(doc.status.nodes[node]?.phase)) {
      // Its image lives in another node's pool: no grant will ever make it reachable here (node/home.ts).
      const away = awayFromHome(ctx, doc, node);
      if (away !== undefined) return failure(away);
      // Fenced off the volume earlier: clear the old mapping first, then the ledger may grant it here again.
      if (doc && isFencedOff(doc, node)) await clearOwnFence(ctx, name, doc);
      if (ctx.clock() >= deadline) {
        const ticket = doc && Object.values(doc.spec.tickets).find((t) => t.nodeID === node);
        const why = !doc ? 'the volume does not exist' : ticket ? doc.status.tickets[ticket.id]?.message : 'no ticket for this node';
        return failure(`volume ${name} is not attached to node ${node} after ${config.waitForAttachTimeout} s: ${why}`);
      }
      await sleep(POLL_MS);
      doc = await ledger.touchTicket(name, id, touchMs);
    }

    // Claim (granted -> attaching) and set up under the node's volume lock.
    return withVolumeLock(config, name, async () => {
      const withdrawn = () => failure(`volume ${name} was withdrawn from node ${node} while it was waiting for it; kubelet tries again`);
      if (doc.spec.shared) {
        // Nothing is mounted before mountdevice: a call that dies between the claim and the record leaves an
        // attaching hold with no mount, which the marker has the next call (or the agent) release.
        await markHoldToCheck(config, name);
        const claimed = await claimGrant(ctx, name);
        const reply = claimed ? await attachShared(ctx, name, claimed) : withdrawn();
        await clearHoldToCheck(config, name);
        return reply;
      }
      const setUp = await claimAndSetUpDevice(ctx, name);
      if (!setUp) return withdrawn();
      return success({ device: setUp.device });
    });
  },
});

/** The node's entry lets it claim: granted, or already attaching/attached (a repeated call). */
function isGrantedHere(phase: string | undefined): boolean {
  return phase === 'granted' || phase === 'attaching' || phase === 'attached';
}
