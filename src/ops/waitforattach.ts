// waitforattach <devicePath> <json> (node): wait until the ledger grants this node the volume, set up its
// device (reusing one already set up), record it, and reply the device. The devicePath kubelet passes is the
// controller's attach reply, which cannot know a node's loop device: latch finds the device itself.
import { setTimeout as sleep } from 'node:timers/promises';
import { markAttached, markAttaching, markReleased } from '../ledger/arbitrate.js';
import { failure, success } from '../protocol/reply.js';
import { readMountInfo } from '../sys/mounts.js';
import { openBackend, openLedger } from './services.js';
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
  let doc = await ledger.update(name, (d) => (d && markAttaching(d, node, ledger.now())) ?? d);
  while (!holds(doc?.status.nodes[node]?.phase)) {
    if (Date.now() >= deadline) {
      const ticket = doc && Object.values(doc.spec.tickets).find((t) => t.nodeID === node);
      const why = !doc ? 'the volume does not exist' : ticket ? doc.status.tickets[ticket.id]?.message : 'no ticket for this node';
      return failure(`volume ${name} is not attached to node ${node} after ${config.waitForAttachTimeout} s: ${why}`);
    }
    await sleep(POLL_MS);
    doc = await ledger.update(name, (d) => (d && markAttaching(d, node, ledger.now())) ?? d);
  }

  const backend = await openBackend(config);
  if ((await backend.size(name)) === undefined) {
    if (doc!.status.filesystem) {
      return failure(
        `the image of volume ${name} is missing from the pool (${config.poolDir}) although it held a ` +
          `${doc!.status.filesystem} filesystem; refusing to create an empty one in its place`,
      );
    }
    await backend.create(name, doc!.spec.sizeBytes);
  }
  const device = await backend.attach(name);
  call.facts.device = device;

  const after = await ledger.update(name, (d) => (d && markAttached(d, node, device, ledger.now())) ?? d);
  if (after?.status.nodes[node]?.phase !== 'attached') {
    // The controller detached it while we were setting up: undo, unless something already mounted the device.
    const mounted = (await readMountInfo()).some((m) => m.source === device);
    if (!mounted) {
      await backend.release(name);
      await ledger.update(name, (d) => (d ? markReleased(d, node, ledger.now()) : d));
    }
    return failure(`volume ${name} was detached from node ${node} while its device was being set up`);
  }
  return success({ device });
}

function holds(phase: string | undefined): boolean {
  return phase === 'attaching' || phase === 'attached';
}
