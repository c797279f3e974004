// waitforattach <devicePath> <json> (node): wait until the ledger grants this node the volume, set up its
// device (reusing one already set up), record it, and reply the device. The devicePath kubelet passes is the
// controller's attach reply, which cannot know a node's loop device: latch finds the device itself.
import { setTimeout as sleep } from 'node:timers/promises';
import { failure, success } from '../protocol/reply.js';
import { isInUse } from '../ledger/arbitrate.js';
import { claimGrant, setUpDevice } from './node-steps.js';
import { openLedger } from './services.js';
import type { OpCall } from './types.js';

const POLL_MS = 500;

export async function run(call: OpCall) {
  const { config } = call;
  const node = config.nodeName;
  const ledger = await openLedger(config);
  const name = await ledger.resolve(call.options!);
  call.facts.volume = name;
  call.facts.node = node;

  // Wait for the grant, and claim it (granted -> attaching) in the same compare-and-swap.
  const deadline = Date.now() + config.waitForAttachTimeout * 1000;
  let doc = await claimGrant(ledger, name, node);
  while (!isInUse(doc?.status.nodes[node]?.phase)) {
    if (Date.now() >= deadline) {
      const ticket = doc && Object.values(doc.spec.tickets).find((t) => t.nodeID === node);
      const why = !doc ? 'the volume does not exist' : ticket ? doc.status.tickets[ticket.id]?.message : 'no ticket for this node';
      return failure(`volume ${name} is not attached to node ${node} after ${config.waitForAttachTimeout} s: ${why}`);
    }
    await sleep(POLL_MS);
    doc = await claimGrant(ledger, name, node);
  }

  const { device } = await setUpDevice(config, name, doc!, call.facts);
  return success({ device });
}
