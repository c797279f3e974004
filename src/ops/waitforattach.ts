// waitforattach <devicePath> <json> (node): wait until the ledger grants this node the volume, set up its device
// (reusing one already set up), record it, and reply the device. The devicePath kubelet passes is the controller's
// attach reply, which cannot know a node's device: latch finds the device itself.
import { setTimeout as sleep } from 'node:timers/promises';
import { optionalPath, volumeOptions } from '../contract/args.js';
import { failure, success } from '../contract/reply.js';
import { isFencedOff, isInUse } from '../ledger/arbitrate.js';
import { ticketId } from '../ledger/ids.js';
import { setUpDevice } from '../node/device.js';
import { clearOwnFence } from '../node/fence.js';
import { awayFromHome } from '../node/home.js';
import { withVolumeLock } from '../node/lock.js';
import { clearHoldToCheck, markHoldToCheck } from '../node/self-release.js';
import { attachShared } from '../node/shared.js';
import { checkCaller } from '../node/tickets.js';
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
    const id = ticketId('workload', json.pvOrVolumeName ?? json.name, config.driverName, node);
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

    // Claim (granted -> attaching) and set up under the node's volume lock, with a marker on disk: if this call dies
    // before the device is recorded, the next call on this node checks the hold (node/self-release.ts).
    return withVolumeLock(config, name, async () => {
      await markHoldToCheck(config, name);
      const claimed = await ledger.claimGrant(name, node);
      if (!claimed || !isInUse(claimed.status.nodes[node]?.phase)) {
        await clearHoldToCheck(config, name);
        return failure(`volume ${name} was withdrawn from node ${node} while it was waiting for it; kubelet tries again`);
      }
      if (claimed.spec.shared) {
        await clearHoldToCheck(config, name); // nothing is mounted before mountdevice: there is no hold to check
        return attachShared(ctx, name, claimed);
      }
      const { device } = await setUpDevice(ctx, name, claimed);
      await clearHoldToCheck(config, name);
      return success({ device });
    });
  },
});

/** The node's entry lets it claim: granted, or already attaching/attached (a repeated call). */
function isGrantedHere(phase: string | undefined): boolean {
  return phase === 'granted' || phase === 'attaching' || phase === 'attached';
}
