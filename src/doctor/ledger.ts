// doctor: the ledger against the kernel on this node. Holds without a device, mounts of pool devices the ledger
// does not know, and loop devices over pool images without a hold are each an error with the command that fixes it.
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import { inventory, LedgerReadError, liveDevice, type Inventory } from '../host/inventory.js';
import { isInUse, ticketsOfNode } from '../ledger/arbitrate.js';
import { shortTicketId } from '../ledger/ids.js';
import { sh, type AddFinding, type Finding } from './findings.js';

/** What the ledger and the kernel hold here; undefined (with an error finding) when the ledger cannot be read. */
export async function readInventory(ctx: Context, config: Config, add: AddFinding): Promise<Inventory | undefined> {
  let held: Inventory;
  try {
    held = await inventory(ctx.ledger, config);
  } catch (err) {
    if (!(err instanceof LedgerReadError)) throw err;
    add({
      check: 'ledger',
      severity: 'error',
      message: `the ledger cannot be read: ${err.message}`,
      ...(config.store.type === 'file'
        ? { note: `the state directory must be readable by root (ls -la ${config.stateDir})` }
        : { note: `check that etcd at ${config.store.endpoints.join(', ')} is reachable` }),
    });
    return undefined;
  }
  add({ check: 'ledger', severity: 'ok', message: `${held.volumes.length} volume(s) in the ledger` });
  for (const d of held.damaged) {
    add({
      check: 'ledger',
      severity: 'error',
      message: `the ledger document of volume ${d.name} cannot be read: ${d.reason}`,
      note:
        `nothing that lists volumes (reaping, jobs, fencing, this check of its devices) acts on ${d.name} until it is repaired; ` +
        `the other volumes are checked as usual`,
    });
  }
  return held;
}

/** Reports where the ledger and the kernel disagree on this node; returns how many problems it reported. */
export function checkLedgerAgainstKernel(held: Inventory, add: AddFinding): number {
  const { node } = held;
  let problems = 0;
  // Holds of this node whose device is gone.
  for (const doc of held.volumes) {
    const entry = doc.status.nodes[node];
    if (!entry || !isInUse(entry.phase)) continue;
    if (liveDevice(held, doc.name)) continue;
    problems++;
    const tickets = ticketsOfNode(doc, node).map((t) => shortTicketId(t.id));
    add({
      check: 'ledger',
      severity: entry.phase === 'attached' ? 'error' : 'warning',
      message:
        `stale ticket: volume ${doc.name} is ${entry.phase} on node ${node} in the ledger (${entry.device ? `device ${entry.device}, ` : ''}since ${entry.since}` +
        `${tickets.length > 0 ? `; ticket(s) ${tickets.join(', ')}` : ''}), but no loop device is set up over its image` +
        (entry.phase === 'attaching' ? ' (if a waitforattach is running right now, run latch doctor again)' : ''),
      fix: `latch volume release ${doc.name} --node ${node} --node-is-down`,
      note: `safe: without a device nothing on ${node} can write to it; a pod that still wants it gets it back through kubelet's next waitforattach`,
    });
  }

  const holds = new Set(held.holds.map((doc) => doc.name));
  // A damaged document may hold its device here: reported above, and its devices are not called orphans.
  const unreadable = new Set(held.damaged.map((d) => d.name));
  // Mounts of pool devices the ledger does not know about.
  for (const d of held.devices) {
    if (holds.has(d.volume) || unreadable.has(d.volume)) continue;
    for (const target of d.mountPoints) {
      problems++;
      add({
        check: 'mounts',
        severity: 'error',
        message: `${d.device} (volume ${d.volume}) is mounted at ${target}, but the ledger does not know that node ${node} holds ${d.volume}`,
        fix: `umount ${sh(target)}`,
        note: `first make sure nothing uses it: findmnt -R ${sh(target)}`,
      });
    }
  }

  // Loop devices over pool images without a hold in the ledger.
  for (const d of held.devices) {
    if ((holds.has(d.volume) && !d.deleted) || unreadable.has(d.volume)) continue;
    problems++;
    const why = d.deleted
      ? `its image ${d.backingFile} was deleted`
      : held.volumes.some((doc) => doc.name === d.volume)
        ? `the ledger has no hold of node ${node} on volume ${d.volume}`
        : `volume ${d.volume} is not in the ledger`;
    add({
      check: 'devices',
      severity: 'error',
      message: `orphan loop device: ${d.device} is set up over ${d.backingFile}, but ${why}`,
      fix: `losetup -d ${d.device}`,
      ...(d.mountPoints.length > 0 && { note: `after unmounting ${d.mountPoints.join(', ')} (see the mounts finding)` }),
    });
  }
  return problems;
}

/** The finding when no check of the ledger against the kernel found anything. */
export function agreement(held: Inventory): Finding {
  return {
    check: 'ledger',
    severity: 'ok',
    message: `ledger and kernel agree on node ${held.node}: ${held.devices.length} loop device(s) of the pool, each held in the ledger`,
  };
}
